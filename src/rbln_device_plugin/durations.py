"""Go-style durations ("5s", "200ms", "1m30s"): parsed as Go parses them, printed as
Go's ``time.Duration.String`` prints them, so flags and records read like the Go plugin's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Nanoseconds per unit, as Go's time package spells them (µ is U+00B5, μ is U+03BC).
_UNIT_NS: Final[Mapping[str, int]] = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_ASCII_DIGITS: Final = frozenset("0123456789")
_MAX_NS: Final = 1 << 63


def parse_duration(text: str) -> float:
    """Parse a Go duration ("5s", "200ms", "1m30s", "1.5h") into seconds.

    Exactly the strings ``time.ParseDuration`` accepts, to the nanosecond (see
    ``parse_duration_ns``). The sign is kept so the caller can reject negative values
    with its own message.
    """
    return parse_duration_ns(text) / 1e9


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration``, step for step: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+``.

    ASCII digits only, no spaces, a unit on every term ("0" alone is the exception),
    int64 nanoseconds (overflow is an error), fractions truncated to the nanosecond the
    way Go's float64 step truncates them. ValueError says what Go would say.
    """
    rest = text
    negative = False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while rest:
        if not (rest[0] == "." or rest[0] in _ASCII_DIGITS):
            raise ValueError(f"invalid duration {text!r}")
        whole, rest, overflow = _leading_int(rest)
        if overflow:
            raise ValueError(f"invalid duration {text!r} (out of range)")
        had_whole = whole is not None
        fraction, scale, had_fraction = 0, 1.0, False
        if rest[:1] == ".":
            fraction, scale, rest, had_fraction = _leading_fraction(rest[1:])
        if not had_whole and not had_fraction:
            raise ValueError(f"invalid duration {text!r}")
        end = 0
        while end < len(rest) and rest[end] != "." and rest[end] not in _ASCII_DIGITS:
            end += 1
        if end == 0:
            raise ValueError(f"missing unit in duration {text!r} (units: ns, us, ms, s, m, h)")
        unit_text, rest = rest[:end], rest[end:]
        unit = _UNIT_NS.get(unit_text)
        if unit is None:
            raise ValueError(
                f"unknown unit {unit_text!r} in duration {text!r} (units: ns, us, ms, s, m, h)"
            )
        value = whole or 0
        if value > _MAX_NS // unit:
            raise ValueError(f"invalid duration {text!r} (out of range)")
        value *= unit
        if fraction > 0:
            value += int(float(fraction) * (float(unit) / scale))
            if value > _MAX_NS:
                raise ValueError(f"invalid duration {text!r} (out of range)")
        total += value
        if total > _MAX_NS:
            raise ValueError(f"invalid duration {text!r} (out of range)")
    if negative:
        return -total
    if total > _MAX_NS - 1:
        raise ValueError(f"invalid duration {text!r} (out of range)")
    return total


def _leading_int(text: str) -> tuple[int | None, str, bool]:
    """Go's leadingInt: the digits' value (None: no digits), the rest, and overflow."""
    value = 0
    index = 0
    while index < len(text) and text[index] in _ASCII_DIGITS:
        if value > _MAX_NS // 10:
            return None, text, True
        value = value * 10 + ord(text[index]) - 48
        if value > _MAX_NS:
            return None, text, True
        index += 1
    return (value if index else None), text[index:], False


def _leading_fraction(text: str) -> tuple[int, float, str, bool]:
    """Go's leadingFraction: digits past the point, their scale, the rest, any consumed."""
    value = 0
    scale = 1.0
    index = 0
    overflow = False
    while index < len(text) and text[index] in _ASCII_DIGITS:
        digit = ord(text[index]) - 48
        index += 1
        if overflow:
            continue
        if value > (_MAX_NS - 1) // 10:
            overflow = True
            continue
        candidate = value * 10 + digit
        if candidate > _MAX_NS:
            overflow = True
            continue
        value = candidate
        scale *= 10
    return value, scale, text[index:], index > 0


def format_duration(seconds: float) -> str:
    """Render seconds exactly as Go's ``time.Duration.String`` does.

    "0s", "250ms", "1.5µs", "5s", "1m30s", "1h30m0s": below one second the largest
    fitting sub-second unit; from one second on hours and minutes are printed whenever a
    larger unit is present, and seconds always, with trailing fractional zeros dropped.
    """
    nanos = round(seconds * 1e9)
    sign = "-" if nanos < 0 else ""
    left = abs(nanos)
    if left < 1_000_000_000:
        if left == 0:
            return "0s"
        if left < 1_000:
            return f"{sign}{left}ns"
        if left < 1_000_000:
            return f"{sign}{_fraction(left, 3)}µs"
        return f"{sign}{_fraction(left, 6)}ms"
    text = f"{_fraction(left % 60_000_000_000, 9)}s"
    minutes = left // 60_000_000_000
    if minutes:
        text = f"{minutes % 60}m{text}"
        if minutes >= 60:
            text = f"{minutes // 60}h{text}"
    return sign + text


def _fraction(value: int, digits: int) -> str:
    """``value / 10**digits`` in decimal, without trailing zeros (Go's fmtFrac)."""
    whole, part = divmod(value, 10**digits)
    decimals = f"{part:0{digits}d}".rstrip("0")
    return f"{whole}.{decimals}" if decimals else str(whole)
