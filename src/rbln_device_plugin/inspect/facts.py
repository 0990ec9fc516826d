"""What one read-only pass over the host saw, for ``inspect`` (plain data).

``command`` gathers it (rbln-smi entry by entry, sysfs facts, status readings);
``report`` explains it; ``wanted_reads`` says which sysfs reads the report needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rbln_device_plugin.host.smi import ParsedEntry
from rbln_device_plugin.host.sysfs import SysfsDevice
from rbln_device_plugin.inspect.drafacts import ModeFacts
from rbln_device_plugin.model.cdispec import SpecVerdict
from rbln_device_plugin.model.health import StatusReading
from rbln_device_plugin.model.inventory import DeviceFacts, is_valid_bus_id, is_valid_name


@dataclass(frozen=True, slots=True)
class SmiOutcome:
    """What running ``rbln-smi -j`` gave."""

    path: str | None  # the binary that ran (or the configured one that is unusable)
    error: str = ""  # why discovery failed; empty when the inventory was read
    tried: tuple[str, ...] = ()  # rbln-smi not found: every path looked at, in order
    entries: tuple[ParsedEntry, ...] = ()
    duration_ms: float | None = None

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True, slots=True)
class HostFacts:
    """Everything one read-only pass saw."""

    smi: SmiOutcome
    sysfs_devices: tuple[SysfsDevice, ...] = ()
    facts: Mapping[str, DeviceFacts] = field(default_factory=dict)  # by lowercase BDF
    statuses: Mapping[str, StatusReading] = field(default_factory=dict)  # by device name
    config: Mapping[str, Any] = field(default_factory=dict)  # Config.describe()
    # The sysfs directories that do not exist when the PCI one is among them (see
    # ``sysfs.missing_roots``): the sysfs root is not the host's.
    sysfs_missing: tuple[str, ...] = ()
    cdi: SpecVerdict | None = None  # the CDI spec check, as the daemon makes it
    mode: ModeFacts | None = None  # the mode's sockets, checkpoint and claims' spec files


def wanted_reads(
    entries: Iterable[ParsedEntry], sysfs_devices: Iterable[SysfsDevice]
) -> tuple[list[str], list[str]]:
    """(bus IDs, names) whose sysfs facts and status files the report needs.

    Only shapes the inventory accepts: nothing else ever becomes a sysfs path.
    """
    bus_ids: dict[str, None] = {}
    names: dict[str, None] = {}
    for entry in entries:
        name, bus_id = identity(entry)
        if bus_id is not None and is_valid_bus_id(bus_id):
            bus_ids[bus_id.lower()] = None
        if name is not None and is_valid_name(name):
            names[name] = None
    for device in sysfs_devices:
        if device.bus_id is not None:
            bus_ids[device.bus_id] = None
        if device.name is not None:
            names[device.name] = None
    return list(bus_ids), list(names)


def identity(entry: ParsedEntry) -> tuple[str | None, str | None]:
    """Name and bus ID of an entry, from its record or, when malformed, its raw fields."""
    if entry.record is not None:
        return entry.record.name, entry.record.bus_id
    raw = entry.raw if isinstance(entry.raw, Mapping) else {}
    pci = raw.get("pci")
    name = raw.get("device")
    bus_id = pci.get("bus_id") if isinstance(pci, Mapping) else None
    return (
        name if isinstance(name, str) else None,
        bus_id if isinstance(bus_id, str) else None,
    )
