"""Go's ``strconv.ParseInt(s, 0, 64)`` and ``strconv.ParseBool``: how the Go plugin reads
every integer and boolean setting.

urfave/cli and Go's flag package read integer flags and variables with it, so the same
text means the same number here: an optional sign, a base prefix (``0x``, ``0o``, ``0b``,
or a bare leading ``0`` for octal), ``_`` between digits, and nothing else. Python's
``int()`` would also take spaces, full-width digits (U+FF10 to U+FF19) and ``1__0``, which the Go
plugin refuses. ``ParseBool`` takes twelve spellings exactly, with no space around them
(`` true`` is an error in Go, so it is one here).
"""

from __future__ import annotations

from typing import Final

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_PREFIX_BASES: Final = {"b": 2, "o": 8, "x": 16}
_DIGITS: Final = "0123456789abcdefghijklmnopqrstuvwxyz"
GO_TRUE: Final = frozenset({"1", "t", "T", "true", "TRUE", "True"})
GO_FALSE: Final = frozenset({"0", "f", "F", "false", "FALSE", "False"})


def parse_go_bool(text: str) -> bool:
    """The value Go's ``strconv.ParseBool`` gives ``text``; ValueError where Go fails."""
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean")


def parse_go_int(text: str) -> int:
    """The value Go parses from ``text``; ValueError (syntax or range) where Go fails."""
    body = text
    negative = False
    if body[:1] in ("+", "-"):
        negative = body[0] == "-"
        body = body[1:]
    value = _parse_unsigned(text, body)
    if negative:
        value = -value
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{text!r} is out of range for a 64-bit integer")
    return value


def _parse_unsigned(original: str, body: str) -> int:
    if not body:
        raise ValueError(f"{original!r} is not an integer")
    base = 10
    digits = body
    if body[0] == "0":
        prefix = body[1:2].lower()
        if len(body) >= 3 and prefix in _PREFIX_BASES:
            base, digits = _PREFIX_BASES[prefix], body[2:]
        else:
            base, digits = 8, body[1:]
    value = 0
    underscores = False
    for char in digits:
        if char == "_":
            underscores = True
            continue
        digit = _DIGITS.find(char.lower()) if char.isascii() else -1
        if digit < 0 or digit >= base:
            raise ValueError(f"{original!r} is not an integer")
        value = value * base + digit
    if underscores and not _underscores_ok(original):
        raise ValueError(f"{original!r} is not an integer (misplaced '_')")
    return value


def _underscores_ok(text: str) -> bool:
    """Go's underscoreOK: each '_' sits between two digits (a base prefix counts as one)."""
    if text[:1] in ("+", "-"):
        text = text[1:]
    saw = "^"
    index = 0
    hexadecimal = False
    if len(text) >= 2 and text[0] == "0" and text[1].lower() in _PREFIX_BASES:
        index = 2
        saw = "0"
        hexadecimal = text[1].lower() == "x"
    for char in text[index:]:
        if "0" <= char <= "9" or (hexadecimal and "a" <= char.lower() <= "f"):
            saw = "0"
            continue
        if char == "_":
            if saw != "0":
                return False
            saw = "_"
            continue
        if saw == "_":
            return False
        saw = "!"
    return saw != "_"
