"""Repeated failures said once: the first one, and each new reason, are worth a record.

A kubelet that is not there fails every registration on every scan; an operator needs
to read that once, then again only when something changes, and once more when it works.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FailureStreak:
    """Consecutive failures of one kind of attempt, and the reason of the last one."""

    reason: str | None = None
    failures: int = 0

    def failed(self, reason: str) -> bool:
        """Count a failure; True when it deserves a record (the first, or a new reason)."""
        self.failures += 1
        worth_saying = reason != self.reason
        self.reason = reason
        return worth_saying

    def failed_quietly(self) -> None:
        """Count a failure that another record explains: it keeps the last reason, so
        the next failure of that reason is not news, and a new one still is."""
        self.failures += 1

    def succeeded(self) -> int:
        """End the streak; how many failures it held (0: nothing to report)."""
        failures = self.failures
        self.reason, self.failures = None, 0
        return failures
