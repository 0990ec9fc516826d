"""Health policy: driver lifecycle codes, and the per-plugin health history.

Pure logic. The status file holds the kernel driver's lifecycle code; only READY (0) is
Healthy. An unreadable status (missing file, read error, malformed value) is Healthy by
compatibility default, except that a device once observed Unhealthy stays Unhealthy
until a later read actually returns READY.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

_LIFECYCLE_NAMES: Final = {
    0: "READY",
    1: "BUSY",
    2: "PROBING",
    3: "INIT",
    4: "FAULT",
    5: "FINISH",
}
UNREADABLE: Final = "UNREADABLE"
# Every 64-bit value prints in full; longer integers are shortened in names and logs.
_SHOWN_CODE_DIGITS: Final = 20


class Health(StrEnum):
    HEALTHY = HEALTHY
    UNHEALTHY = UNHEALTHY


@dataclass(frozen=True, slots=True)
class StatusReading:
    """One read of a status file. ``code`` is None when the status could not be read."""

    code: int | None
    # Why the read failed (missing file, OS error, malformed contents); empty on success.
    reason: str = ""

    @property
    def name(self) -> str:
        if self.code is None:
            return UNREADABLE
        known = _LIFECYCLE_NAMES.get(self.code)
        return known if known is not None else f"UNKNOWN({_show_code(self.code)})"

    @property
    def readable(self) -> bool:
        return self.code is not None


def _show_code(code: int) -> str:
    digits = str(abs(code))
    if len(digits) > _SHOWN_CODE_DIGITS:
        digits = f"{digits[: _SHOWN_CODE_DIGITS - 4]}...{len(digits)} digits"
    return f"-{digits}" if code < 0 else digits


# Longer than any sysfs attribute (one page): int() is never asked for a huge conversion.
MAX_STATUS_CHARS: Final = 4096


def parse_status(text: str) -> StatusReading:
    """Parse status file contents: a decimal integer with optional surrounding whitespace.

    Any integer is a lifecycle code, however long: only 0 is READY, every other value is
    ``UNKNOWN(n)`` or a named state, and Unhealthy. Only a non-integer is malformed.
    """
    stripped = text.strip()
    body = stripped[1:] if stripped[:1] in "+-" else stripped
    # int() also accepts "1_000" and non-ASCII digits, which no driver writes.
    if not body or not body.isascii() or not body.isdigit() or len(body) > MAX_STATUS_CHARS:
        shown = stripped if len(stripped) <= 32 else stripped[:32] + "..."
        return StatusReading(None, f"malformed status {shown!r}")
    return StatusReading(int(stripped))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The effective health of a device after one observation."""

    health: Health
    # The lifecycle name to show: the reading's, so an unreadable status that keeps a
    # device Unhealthy is shown as UNREADABLE, never as a recovery.
    status: str
    # For an Unhealthy verdict caused by history: the last numeric non-READY status seen.
    last_unhealthy_status: str | None = None

    def describe(self) -> str:
        if self.last_unhealthy_status and self.status == UNREADABLE:
            return f"{self.status} (last read {self.last_unhealthy_status})"
        return self.status


class HealthHistory:
    """Health history of one resource, keyed by device ID.

    Scans and Allocate's final check feed the same instance. The caller applies
    observations in the order they were read (the resource plugin holds one lock around
    each batch of reads and the ``observe`` calls that follow).
    """

    def __init__(self) -> None:
        # Device ID -> lifecycle name of the unresolved Unhealthy observation.
        self._unresolved: dict[str, str] = {}

    def observe(self, device_id: str, reading: StatusReading) -> Verdict:
        if reading.code == 0:
            self._unresolved.pop(device_id, None)
            return Verdict(Health.HEALTHY, reading.name)
        if reading.code is not None:
            self._unresolved[device_id] = reading.name
            return Verdict(Health.UNHEALTHY, reading.name)
        previous = self._unresolved.get(device_id)
        if previous is not None:
            return Verdict(Health.UNHEALTHY, reading.name, previous)
        return Verdict(Health.HEALTHY, reading.name)

    def unresolved(self, device_id: str) -> str | None:
        """The lifecycle name of an unresolved Unhealthy observation, if any."""
        return self._unresolved.get(device_id)

    def __len__(self) -> int:
        """Devices with an unresolved Unhealthy observation (tests read it)."""
        return len(self._unresolved)
