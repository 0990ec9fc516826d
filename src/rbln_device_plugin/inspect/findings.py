"""What a report names as wrong, and how much it matters: shared by the node report
(``report``) and the mode report (``drareport``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    # Costs the node an advertised or healthy device, or its whole inventory: exit 1.
    ERROR = "error"
    # Degrades placement only (the device is still advertised and usable): exit 0.
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Finding:
    """A problem the report names: the daemon's own Problem records plus inspect's."""

    severity: Severity
    kind: str
    message: str
    device: str | None = None
    bus_id: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
