"""Go-style durations ("5s", "200ms", "1m30s"): parsed as Go parses them, printed as
Go's ``time.Duration.String`` prints them, so flags and records read like the Go plugin's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

_DURATION_UNITS: Final[Mapping[str, float]] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_TERM: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration ("5s", "200ms", "1m30s", "1.5h") into seconds.

    The sign is kept so the caller can reject negative values with its own message.
    """
    raw = text.strip()
    body = raw[1:] if raw[:1] in ("+", "-") else raw
    sign = -1.0 if raw.startswith("-") else 1.0
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    position = 0
    while position < len(body):
        match = _DURATION_TERM.match(body, position)
        if match is None:
            raise ValueError(
                f"invalid duration {text!r} (expected a number with a unit: ns, us, ms, s, m, h)"
            )
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    return sign * total


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
