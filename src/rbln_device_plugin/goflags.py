"""A command line read by Go's flag package rules, rewritten for argparse.

The Go plugin parses its command line with urfave/cli v2, which hands it to Go's
``flag.FlagSet.Parse`` (``parseOne`` in src/flag/flag.go) without short-option handling
(the plugin leaves ``UseShortOptionHandling`` off) and without reordering. Its rules:

- a flag is ``-name`` or ``--name``, with ``=value`` or not; a third dash, or a name
  starting with ``=``, is "bad flag syntax";
- a flag that takes a value takes the next word when it has no ``=value``, whatever that
  word is (``-1s``, ``--x``);
- a boolean flag takes no separate word: ``-name`` is true, ``-name=false`` false, and in
  ``-name false`` the ``false`` is an argument;
- ``--`` ends the flags, and so does the first word that is not a flag (``-`` alone is
  one); every word from there on is an argument, which the plugin refuses.

``normalise`` applies these rules and gives argparse only ``--name=value`` words (and
``--help`` / ``--version``), so argparse never has to guess which word is a value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rbln_device_plugin.goints import parse_go_bool


class FlagError(ValueError):
    """A command line Go's flag package refuses; the text is Go's own message."""


@dataclass(frozen=True, slots=True)
class FlagTable:
    """Every flag by its name without dashes, each mapped to the spelling argparse knows."""

    # Flags that take a value: ``-name value`` or ``-name=value``.
    values: Mapping[str, str]
    # Boolean settings: ``-name`` is ``--name=true``; the value is judged later, with the
    # setting's own message.
    booleans: Mapping[str, str]
    # Boolean flags that act at once (help, version): given when true, left out when false.
    switches: Mapping[str, str]


def _split(word: str) -> tuple[str, str | None]:
    """``-name=value`` -> (name, value); no ``=``: (name, None). Raises FlagError."""
    name = word[2:] if word.startswith("--") else word[1:]
    if not name or name[0] in "-=":
        raise FlagError(f"bad flag syntax: {word}")
    # "equals cannot be first": the name is at least one character.
    head, equals, value = name.partition("=")
    return head, (value if equals else None)


def normalise(argv: Sequence[str], table: FlagTable) -> list[str]:
    """``argv`` as Go reads it, in the spelling argparse reads the same way.

    Raises FlagError with Go's message (naming the flag as it was written, where Go
    writes one dash) for an unknown flag, bad flag syntax, a missing
    value, a switch with a value that is not a Go boolean, and for arguments.
    """
    out: list[str] = []
    index = 0
    bare = ""  # the boolean flag just before, given without "=": "-name false" reads wrong
    while index < len(argv):
        word = argv[index]
        if word == "--":
            index += 1
            break
        if len(word) < 2 or not word.startswith("-"):
            break  # the first argument ends the flags
        index += 1
        name, value = _split(word)
        spelled = word.partition("=")[0]  # messages name the flag as it was written
        bare = spelled if value is None and name in table.booleans else ""
        if name in table.switches:
            if value is None or _go_bool(value, spelled):
                out.append(table.switches[name])
        elif name in table.booleans:
            out.append(f"{table.booleans[name]}={'true' if value is None else value}")
        elif name in table.values:
            if value is None:
                if index == len(argv):
                    raise FlagError(f"flag needs an argument: {spelled}")
                value = argv[index]
                index += 1
            out.append(f"{table.values[name]}={value}")
        else:
            raise FlagError(f"flag provided but not defined: {spelled}")
    if index < len(argv):
        # The Go plugin's Before: "arguments not supported: %v" of the remaining words.
        message = f"arguments not supported: [{' '.join(argv[index:])}]"
        if bare and _is_go_bool(argv[index]):
            message += f" (a boolean flag takes no separate value: {bare}={argv[index]})"
        raise FlagError(message)
    return out


def _is_go_bool(text: str) -> bool:
    try:
        parse_go_bool(text)
    except ValueError:
        return False
    return True


def _go_bool(value: str, spelled: str) -> bool:
    try:
        return parse_go_bool(value)
    except ValueError:
        raise FlagError(f'invalid boolean value "{value}" for {spelled}: parse error') from None
