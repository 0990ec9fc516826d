"""One inventory scan: rbln-smi once, sysfs facts, classification.

Status files are not read here: each resource plugin reads them itself, under the lock
of its health history, so that scan and Allocate observations apply in read order.

A scan of an unchanged node should cost next to nothing, so the scanner remembers what
cannot have changed: the parsed listing while ``rbln-smi`` prints the same bytes, the
SR-IOV facts while the listing is the same (VFs come and go with the partition), and
the PCI path of every bus ID that stayed listed (a device that moves or is re-plugged
leaves the listing first, and a bus ID that comes back is read afresh). Failed and
stalled reads are always tried again. sysfs is read off the event loop with a bounded
wait (see ``host.hostio``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.host.smi import (
    DEFAULT_CANDIDATES,
    INVENTORY_TIMEOUT_S,
    DiscoveryError,
    SmiError,
    locate_rbln_smi,
    parse_inventory,
    run_smi,
)
from rbln_device_plugin.host.sysfs import (
    missing_roots,
    pci_device_dir,
    read_pci_path,
    read_sriov,
)
from rbln_device_plugin.model.inventory import (
    Device,
    DeviceFacts,
    Inventory,
    Problem,
    Screening,
    SmiRecord,
    SriovFacts,
    inventory_from,
    screen,
    with_sysfs_missing,
)
from rbln_device_plugin.model.looks import LookSchedule
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.metrics import NOOP, Metrics

log = get_logger()

__all__ = [
    "DiscoveryError",
    "FactsCache",
    "ProblemLog",
    "ScanResult",
    "Scanner",
]

PciPath = tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class ScanResult:
    # Resource name -> its devices; resources without devices are absent.
    resources: Mapping[str, tuple[Device, ...]]
    # Everything excluded this scan (already logged by the Scanner when new).
    problems: tuple[Problem, ...] = ()


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


class FactsCache:
    """The sysfs facts that are still valid, per lowercase bus ID."""

    def __init__(self) -> None:
        self.pci_paths: dict[str, PciPath] = {}
        self.sriov: dict[str, SriovFacts] = {}

    def listing_changed(self, listed: Sequence[str]) -> None:
        """A new listing: SR-IOV facts and unreadable paths go; so do absent bus IDs."""
        keep = set(listed)
        self.sriov.clear()
        self.pci_paths = {
            bus_id: path
            for bus_id, path in self.pci_paths.items()
            if bus_id in keep and path is not None
        }


def sriov_key(root: Path | str, bus_id: str) -> str:
    return os.path.join(pci_device_dir(root, bus_id), "sriov_numvfs")


@dataclass(frozen=True, slots=True)
class ScanLimits:
    """How a scan finds and runs ``rbln-smi``: where to look before $PATH when no path is
    configured, and how long one listing may take."""

    timeout: float = INVENTORY_TIMEOUT_S
    candidates: Sequence[Path] = DEFAULT_CANDIDATES


class Scanner:
    """Discovers devices; one instance per daemon so problem logging stays deduplicated."""

    def __init__(
        self,
        *,
        sysfs_root: Path = Path("/sys"),
        smi_path: Path | None = None,
        hostio: HostIO,
        metrics: Metrics = NOOP,
        limits: ScanLimits = ScanLimits(),
    ) -> None:
        self.sysfs_root = sysfs_root
        self._metrics = metrics
        self.timeout = limits.timeout
        # Finds the rbln-smi to run (it may be installed after the start): again when the
        # one found could not be started, and at least once a backup period.
        self._locate = partial(locate_rbln_smi, smi_path, limits.candidates)
        self._binary: Path | None = None
        self._lookups = LookSchedule()
        self._hostio = hostio
        self.problems = ProblemLog()
        self.facts = FactsCache()
        # The last listing, its records and what it gave, while the output stays the same.
        self._last_output: str | None = None
        self._screening = Screening(())
        self._parse_problems: tuple[Problem, ...] = ()
        self._last_inventory: Inventory | None = None
        self._facts_complete = False  # every fact of the last inventory is in the cache
        # Some device's PCI directory did not exist in the last facts read.
        self._unseen = False
        # The sysfs directories the last scan found missing with the PCI one (see
        # ``sysfs.missing_roots``); () when sysfs shows PCI devices.
        self._missing: tuple[str, ...] = ()

    def locate(self) -> Path:
        # Looked up per scan: the driver package may be installed after the daemon starts.
        return self._locate()

    async def scan(self) -> ScanResult:
        """Run discovery once. Raises DiscoveryError when the node's inventory is unknown."""
        binary = self._binary
        cached = binary is not None and not self._lookups.due(time.monotonic())
        if binary is None or not cached:
            binary = await self._lookup()
        try:
            text = await run_smi(binary, ["-j"], self.timeout, metrics=self._metrics)
        except SmiError as exc:
            if cached and exc.result == m.SMI_NOT_STARTED:
                await self._lookup()  # gone or changed since it was found: say which
            raise DiscoveryError(str(exc)) from exc
        inventory = await self.inventory(text)
        problems: Sequence[Problem] = inventory.problems
        if self._missing:
            problems = with_sysfs_missing(str(self.sysfs_root), self._missing, problems)
        self.problems.update(problems)
        return ScanResult(resources=inventory.resources, problems=tuple(problems))

    async def _lookup(self) -> Path:
        self._binary = None
        self._lookups.looking(time.monotonic())
        binary = await self._hostio.call("rbln-smi lookup", self.locate)
        if isinstance(binary, Stalled):
            raise DiscoveryError(f"looking for rbln-smi: {binary}")
        self._binary = binary
        return binary

    async def inventory(self, text: str) -> Inventory:
        """Everything a scan does after rbln-smi returned: parse, sysfs facts, classify."""
        last = self._last_inventory
        if text == self._last_output and last is not None and self._facts_complete:
            return last  # the same listing, every fact of it known: the same inventory
        if text != self._last_output:
            records, parse_problems = parse_inventory(text)  # DiscoveryError: cache untouched
            self._last_output = text
            self._screening = screen(records)
            self._parse_problems = tuple(parse_problems)
            self._last_inventory = None
            self.facts.listing_changed([record.bus_id for record in self._screening.kept])
        facts = await self._facts(self._screening.kept)
        self._missing = await self._missing_roots() if self._unseen else ()
        classified = inventory_from(self._screening, facts, sysfs_missing=bool(self._missing))
        inventory = Inventory(classified.resources, (*self._parse_problems, *classified.problems))
        self._last_inventory = inventory
        # Only this method changes the cache: what it holds now stays until the next read.
        self._facts_complete = self._facts_cached()
        return inventory

    async def _missing_roots(self) -> tuple[str, ...]:
        """Why a device was unseen: the sysfs directories that do not exist when the PCI one
        is among them (a sysfs root that is not the host's), else () (one device is gone)."""
        root = self.sysfs_root
        missing = await self._hostio.call(str(root), partial(missing_roots, root))
        return () if isinstance(missing, Stalled) else missing  # a slow look proves nothing

    def _facts_cached(self) -> bool:
        """Every kept record's facts are in the cache, and none was unseen (read again)."""
        cache = self.facts
        return not self._unseen and all(
            r.bus_id in cache.sriov and r.bus_id in cache.pci_paths for r in self._screening.kept
        )

    async def _facts(self, records: Sequence[SmiRecord]) -> dict[str, DeviceFacts]:
        """Facts for every record, reading only what the cache lacks."""
        root = self.sysfs_root
        cache = self.facts
        need_sriov = [r.bus_id for r in records if r.bus_id not in cache.sriov]
        need_path = [r.bus_id for r in records if r.bus_id not in cache.pci_paths]
        sriov = dict(cache.sriov)
        paths = dict(cache.pci_paths)
        if need_sriov or need_path:
            calls: list[Call[SriovFacts | PciPath]] = [
                Call(sriov_key(root, bus_id), partial(read_sriov, root, bus_id))
                for bus_id in need_sriov
            ]
            calls += [
                Call(pci_device_dir(root, bus_id), partial(read_pci_path, root, bus_id))
                for bus_id in need_path
            ]
            results = await self._hostio.map(calls)
            for bus_id, result in zip(need_sriov, results, strict=False):
                facts = result if isinstance(result, SriovFacts) else SriovFacts(error=str(result))
                sriov[bus_id] = facts
                if not facts.error and not facts.unseen:  # read again next scan
                    cache.sriov[bus_id] = facts
            for bus_id, result in zip(need_path, results[len(need_sriov) :], strict=True):
                if isinstance(result, Stalled | SriovFacts):
                    paths[bus_id] = None  # unknown for now; read again next scan
                else:
                    paths[bus_id] = cache.pci_paths[bus_id] = result
        self._unseen = any(facts.unseen for facts in sriov.values())
        facts_by_bus = {
            r.bus_id: DeviceFacts(sriov=sriov[r.bus_id], pci_path=paths[r.bus_id]) for r in records
        }
        return facts_by_bus
