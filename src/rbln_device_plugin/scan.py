"""One inventory scan: rbln-smi once, sysfs facts, classification.

Status files are not read here: each resource plugin reads them itself, under the lock
of its health history, so that scan and Allocate observations apply in read order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rbln_device_plugin.host.smi import (
    DEFAULT_CANDIDATES,
    INVENTORY_TIMEOUT_S,
    DiscoveryError,
    SmiError,
    locate_rbln_smi,
    parse_inventory,
    run_smi,
)
from rbln_device_plugin.host.sysfs import read_device_facts
from rbln_device_plugin.inventory import Device, Inventory, Problem, classify, select_records
from rbln_device_plugin.logs import get_logger

log = get_logger()

__all__ = [
    "DiscoveryError",
    "ProblemLog",
    "ScanResult",
    "Scanner",
    "inventory_from_output",
]


@dataclass(frozen=True, slots=True)
class ScanResult:
    # Resource name -> its devices; resources without devices are absent.
    resources: Mapping[str, tuple[Device, ...]]
    # Everything excluded this scan (already logged by the Scanner when new).
    problems: tuple[Problem, ...] = ()
    duration_ms: float = 0.0

    @property
    def device_count(self) -> int:
        return sum(len(devices) for devices in self.resources.values())


def inventory_from_output(sysfs_root: Path, text: str) -> Inventory:
    """Everything a scan does after rbln-smi returned: parse, sysfs facts, classification."""
    records, parse_problems = parse_inventory(text)
    kept, select_problems = select_records(records)
    facts = {record.bus_id: read_device_facts(sysfs_root, record.bus_id) for record in kept}
    inventory = classify(kept, facts)
    problems = (*parse_problems, *select_problems, *inventory.problems)
    return Inventory(inventory.resources, problems)


class ProblemLog:
    """Logs each problem when it appears; again only after it went away and came back."""

    def __init__(self) -> None:
        self._active: set[str] = set()

    def update(self, problems: Sequence[Problem]) -> list[Problem]:
        """Record this scan's problems; returns (and logs) the new ones."""
        current: dict[str, Problem] = {}
        for problem in problems:
            current.setdefault(problem.key, problem)
        fresh = [p for key, p in current.items() if key not in self._active]
        self._active = set(current)
        for problem in fresh:
            log.error(problem.message, **problem.fields)
        return fresh

    @property
    def active(self) -> frozenset[str]:
        return frozenset(self._active)


class Scanner:
    """Discovers devices; one instance per daemon so problem logging stays deduplicated."""

    def __init__(
        self,
        *,
        sysfs_root: Path = Path("/sys"),
        smi_path: Path | None = None,
        timeout: float = INVENTORY_TIMEOUT_S,
        candidates: Sequence[Path] = DEFAULT_CANDIDATES,
        search_path: str | None = None,
    ) -> None:
        self.sysfs_root = sysfs_root
        self.smi_path = smi_path
        self.timeout = timeout
        self._candidates = tuple(candidates)
        self._search_path = search_path
        self.problems = ProblemLog()

    def locate(self) -> Path:
        # Looked up per scan: the driver package may be installed after the daemon starts.
        return locate_rbln_smi(self.smi_path, self._candidates, self._search_path)

    async def scan(self) -> ScanResult:
        """Run discovery once. Raises DiscoveryError when the node's inventory is unknown."""
        started = time.monotonic()
        binary = self.locate()
        try:
            text = await run_smi(binary, ["-j"], self.timeout)
        except SmiError as exc:
            raise DiscoveryError(str(exc)) from exc
        inventory = inventory_from_output(self.sysfs_root, text)
        self.problems.update(inventory.problems)
        return ScanResult(
            resources=inventory.resources,
            problems=inventory.problems,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
        )
