"""``rbln-device-plugin inspect``: what the node has, what the kubelet is told, and why.

Pure. One read-only pass over the host (``command``) produces ``HostFacts`` (``facts``).
This module runs them through the daemon's own policy, the very functions a scan and a
new resource plugin use (``screen`` and ``inventory_from``, then ``DeviceTable`` with a
fresh ``HealthHistory`` per resource), and explains every device: the resource it is
advertised under, or why it is not. ``preferredreport`` answers a ``GetPreferredAllocation``
the way the resource plugin would; rendering (table and JSON) lives in ``render``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from rbln_device_plugin.host.sysfs import SysfsDevice
from rbln_device_plugin.inspect.facts import HostFacts, SmiOutcome, identity
from rbln_device_plugin.inspect.findings import Finding, Severity
from rbln_device_plugin.model import resources
from rbln_device_plugin.model.cdispec import CdiState, SpecVerdict
from rbln_device_plugin.model.devicetable import DeviceTable, Entry
from rbln_device_plugin.model.health import HealthHistory, StatusReading
from rbln_device_plugin.model.inventory import (
    SYSFS_MISSING_HINT,
    SYSFS_MISSING_KIND,
    SYSFS_MISSING_MSG,
    UNSEEN_KIND,
    VF_RESOURCES,
    Device,
    DeviceFacts,
    Problem,
    SmiRecord,
    SriovFacts,
    inventory_from,
    natural_key,
    parse_numa,
    resource_for,
    screen,
    vf_hosts,
)

if TYPE_CHECKING:
    from rbln_device_plugin.inspect.drareport import ModeReport

# Resource names are fixed: the summary always shows all three, so a missing one is a 0.
RESOURCES: Final = resources.RESOURCE_NAMES
EXIT_OK: Final = 0
EXIT_PROBLEMS: Final = 1
_NOT_READ: Final = StatusReading(None, "status not read")


@dataclass(frozen=True, slots=True)
class WhyNot:
    kind: str  # a Problem kind, or "hosting-vfs", "not-listed", "discovery-failed"
    reason: str  # short enough for a table cell


@dataclass(frozen=True, slots=True)
class Row:
    """One device that rbln-smi lists or that sysfs shows."""

    name: str | None
    bus_id: str | None
    product: str = ""
    pci_device_id: str = ""
    numa: int | None = None
    sid: str = ""
    parent_bus_id: str | None = None
    listed: bool = False  # rbln-smi lists it
    in_sysfs: bool = False  # sysfs shows it (driver class entry or Rebellions PCI function)
    resource: str | None = None
    why_not: WhyNot | None = None  # set iff resource is None
    health: str | None = None  # Healthy / Unhealthy; only for advertised devices
    status: str | None = None  # as the daemon reports it; None: no usable name to read
    status_detail: str = ""  # why the status file is unreadable
    pci_path: tuple[str, ...] | None = None
    pci_path_error: str = ""


@dataclass(frozen=True, slots=True)
class ResourceSummary:
    name: str
    devices: int
    healthy: int
    unhealthy: int


@dataclass(frozen=True)
class Report:
    facts: HostFacts
    rows: tuple[Row, ...]
    resources: tuple[ResourceSummary, ...]
    findings: tuple[Finding, ...]
    # What each resource plugin would hold after its first scan, by device ID (only
    # advertised resources appear).
    tables: Mapping[str, Mapping[str, Entry]]
    mode: ModeReport | None = None  # which mode runs and, in dra mode, what it publishes

    @property
    def advertised(self) -> int:
        return sum(summary.devices for summary in self.resources)

    @property
    def errors(self) -> int:
        return sum(1 for finding in self.findings if finding.severity is Severity.ERROR)

    @property
    def exit_code(self) -> int:
        # "Nothing advertised" is itself an error finding, so errors decide alone.
        return EXIT_PROBLEMS if self.errors else EXIT_OK


def build_report(host: HostFacts) -> Report:
    """Explain every device of the node, as the daemon's first scan would treat it."""
    explainer = _Explainer(host)
    explainer.malformed_entries()
    explainer.records()
    explainer.sysfs_only()
    explainer.findings.extend(cdi_findings(host.cdi))
    return explainer.report()


_SHOWN_SPEC_FILES: Final = 16


def cdi_findings(verdict: SpecVerdict | None) -> list[Finding]:
    """What the CDI spec check found, as warnings: the devices still reach the kubelet,
    but a CDI-enabled runtime refuses every NPU container without the spec."""
    if verdict is None:
        return []
    out: list[Finding] = []
    base: dict[str, Any] = {"cdiDevices": list(verdict.wanted)}
    if verdict.state is CdiState.MISSING:
        details = {**base}
        if verdict.conflicts:
            details["conflicts"] = {d: list(p) for d, p in verdict.conflicts.items()}
        out.append(
            Finding(
                Severity.WARNING,
                "cdi-spec-missing",
                "No CDI spec defines the NPU CDI device; containerd 2.x (and other runtimes "
                "with CDI on) refuse NPU containers with CreateContainerError until the RBLN "
                "container toolkit writes it",
                details=details,
            )
        )
    elif verdict.state is CdiState.UNKNOWN:
        details = {**base}
        if verdict.unseen:
            details["notVisible"] = dict(verdict.unseen)
        if verdict.unchecked:
            details["notChecked"] = dict(list(verdict.unchecked.items())[:_SHOWN_SPEC_FILES])
        out.append(
            Finding(
                Severity.WARNING,
                "cdi-spec-unknown",
                "Cannot tell whether a CDI spec defines the NPU CDI device (a spec directory "
                "is not visible here, or a file could not be checked)",
                details=details,
            )
        )
    for path, reason in list(verdict.malformed.items())[:_SHOWN_SPEC_FILES]:
        out.append(
            Finding(
                Severity.WARNING,
                "cdi-spec-unusable",
                "CDI spec file is unusable; the container runtimes skip it",
                details={"path": path, "reason": reason},
            )
        )
    return out


class _Explainer:
    """Builds one report: rows and findings accumulate, in rbln-smi's order, then sysfs."""

    def __init__(self, host: HostFacts) -> None:
        self.host = host
        self.rows: list[Row] = []
        self.findings: list[Finding] = [] if host.smi.ok else [_discovery_finding(host.smi)]
        if host.sysfs_missing:
            self.findings.append(
                Finding(
                    Severity.ERROR,
                    SYSFS_MISSING_KIND,
                    SYSFS_MISSING_MSG,
                    details={
                        "path": host.sysfs_missing[0],
                        "missing": list(host.sysfs_missing),
                        "hint": SYSFS_MISSING_HINT,
                    },
                )
            )
        self.tables: dict[str, dict[str, Entry]] = {}
        self._sysfs_bus_ids = {d.bus_id for d in host.sysfs_devices if d.bus_id is not None}
        self._sysfs_names = {d.name for d in host.sysfs_devices if d.name is not None}

    def malformed_entries(self) -> None:
        for parsed in self.host.smi.entries:
            if parsed.problem is None:
                continue
            name, bus_id = identity(parsed)
            row = Row(
                name,
                bus_id,
                listed=True,
                in_sysfs=self._in_sysfs(name, bus_id),
                why_not=_why(parsed.problem),
            )
            self.rows.append(self._status(row, name))
            self.findings.append(_from_problem(parsed.problem, name, bus_id))

    def records(self) -> None:
        """Screening, classification and first-scan health: the daemon's own functions."""
        records = [parsed.record for parsed in self.host.smi.entries if parsed.record]
        screening = screen(records)
        missing = bool(self.host.sysfs_missing)
        hosts = vf_hosts(screening.kept)
        offered = inventory_from(screening, self.host.facts, sysfs_missing=missing).resources
        for resource, devices in offered.items():
            table = DeviceTable(HealthHistory())  # a new plugin's: a first scan's verdicts
            table.apply_scan(devices, {device.name: self._reading(device) for device in devices})
            self.tables[resource] = dict(table.entries)
        advertised = {
            name: (resource, entry)
            for resource, table in self.tables.items()
            for name, entry in table.items()
        }
        for record, rejected in screening.outcomes:
            row = self._record_row(record)
            if rejected is not None:
                self.rows.append(self._status(replace(row, why_not=_why(rejected)), record.name))
                self.findings.append(_from_problem(rejected, record.name, record.bus_id))
                continue
            facts = self.host.facts.get(record.bus_id, DeviceFacts())
            row = replace(
                row,
                parent_bus_id=facts.sriov.parent_bus_id,
                pci_path=facts.pci_path,
                pci_path_error=facts.pci_path_error,
            )
            if record.name in advertised:
                resource, entry = advertised[record.name]
                self.rows.append(self._advertised(row, resource, entry))
                self.findings += _advertised_findings(resource, entry, facts)
                continue
            _, excluded = resource_for(
                record, facts.sriov, hosts_vfs=record.name in hosts, sysfs_missing=missing
            )
            if excluded is None:  # a PF in a supported partition mode: its VFs carry it
                why = WhyNot("hosting-vfs", _hosting(facts.sriov))
            else:
                why = _why(excluded)
                self.findings.append(_from_problem(excluded, record.name, record.bus_id))
            self.rows.append(self._status(replace(row, why_not=why), record.name))

    def sysfs_only(self) -> None:
        """Devices sysfs shows that no rbln-smi entry names."""
        names = {row.name for row in self.rows if row.name is not None}
        bus_ids = {row.bus_id.lower() for row in self.rows if row.bus_id is not None}
        for device in self.host.sysfs_devices:
            if device.name in names or device.bus_id in bus_ids:
                continue
            row, finding = _sysfs_only(self.host, device)
            self.rows.append(self._status(row, device.name))
            if finding is not None:
                self.findings.append(finding)

    def report(self) -> Report:
        rows = sorted(self.rows, key=lambda row: _natural(row.name, row.bus_id))
        if not self.tables:
            reason = _nothing_reason(self.host, rows)
            self.findings.append(
                Finding(
                    Severity.ERROR,
                    "nothing-advertised",
                    "No device is advertised to the kubelet",
                    details={"reason": reason},
                )
            )
        order = {
            "discovery-failed": 0, "rbln-smi-not-found": 0, SYSFS_MISSING_KIND: 0,
            "nothing-advertised": 2,
        }  # fmt: skip
        findings = sorted(
            self.findings, key=lambda f: (order.get(f.kind, 1), _natural(f.device, f.bus_id))
        )
        resources = tuple(_summary(name, self.tables.get(name)) for name in RESOURCES)
        return Report(self.host, tuple(rows), resources, tuple(findings), self.tables)

    def _in_sysfs(self, name: str | None, bus_id: str | None) -> bool:
        return (name is not None and name in self._sysfs_names) or (
            bus_id is not None and bus_id.lower() in self._sysfs_bus_ids
        )

    def _record_row(self, record: SmiRecord) -> Row:
        return Row(
            name=record.name,
            bus_id=record.bus_id,
            product=record.product,
            pci_device_id=record.pci_device_id,
            numa=parse_numa(record.numa_node),
            sid=record.sid,
            listed=True,
            in_sysfs=self._in_sysfs(record.name, record.bus_id),
        )

    def _status(self, row: Row, name: str | None) -> Row:
        """The raw status reading of a device that is not advertised (no health verdict)."""
        reading = self.host.statuses.get(name) if name is not None else None
        if reading is None:
            return row
        return replace(row, status=reading.name, status_detail=reading.reason)

    def _reading(self, device: Device) -> StatusReading:
        return self.host.statuses.get(device.name, _NOT_READ)

    def _advertised(self, row: Row, resource: str, entry: Entry) -> Row:
        reading = self.host.statuses.get(entry.device.name, _NOT_READ)
        return replace(
            row,
            resource=resource,
            health=entry.verdict.health.value,
            status=entry.verdict.describe(),
            status_detail=reading.reason,
        )


def _advertised_findings(resource: str, entry: Entry, facts: DeviceFacts) -> list[Finding]:
    device = entry.device
    out: list[Finding] = []
    if not entry.healthy:
        out.append(
            Finding(
                Severity.ERROR,
                "unhealthy",
                "Device is Unhealthy; no new container is given it",
                device.name,
                device.bus_id,
                {"resourceName": resource, "status": entry.verdict.describe()},
            )
        )
    if device.pci_path is None:
        out.append(
            Finding(
                Severity.WARNING,
                "pci-path-unreadable",
                "PCI path unreadable; preferred allocation counts the device as unmeasured",
                device.name,
                device.bus_id,
                {"resourceName": resource, "reason": facts.pci_path_error or "unknown"},
            )
        )
    return out


def _sysfs_only(host: HostFacts, device: SysfsDevice) -> tuple[Row, Finding | None]:
    """A device sysfs shows but rbln-smi does not list."""
    facts = host.facts.get(device.bus_id, DeviceFacts()) if device.bus_id else DeviceFacts()
    sriov = facts.sriov
    finding: Finding | None = None
    if not host.smi.ok:
        why = WhyNot("discovery-failed", "no rbln-smi inventory")
    elif sriov.parent_bus_id is None and sriov.vf_count and not sriov.error:
        why = WhyNot("hosting-vfs", _hosting(sriov) + ", not listed by rbln-smi")
    else:
        why = WhyNot("not-listed", "not listed by rbln-smi")
        finding = Finding(
            Severity.ERROR,
            "not-listed",
            "Device in sysfs is not listed by rbln-smi",
            device.name,
            device.bus_id,
        )
    row = Row(
        name=device.name,
        bus_id=device.bus_id,
        parent_bus_id=sriov.parent_bus_id,
        in_sysfs=True,
        why_not=why,
        pci_path=facts.pci_path,
        pci_path_error=facts.pci_path_error if device.bus_id else "no PCI device link in sysfs",
    )
    return row, finding


def _hosting(sriov: SriovFacts) -> str:
    count = sriov.vf_count or 0
    unsupported = "" if count in VF_RESOURCES else ", an unsupported count"
    return f"hosts {count} VF{'s' if count != 1 else ''}{unsupported}"


def _why(problem: Problem) -> WhyNot:
    return WhyNot(problem.kind, _short_reason(problem))


_SHORT_REASONS: Final[Mapping[str, str]] = {
    "invalid-name": "invalid name",
    "invalid-bus-id": "invalid PCI bus ID",
    "unsupported-product": "unsupported product",
    "duplicate": "duplicate entry",
    "sriov-indeterminate": "indeterminate SR-IOV state",
    "malformed-entry": "malformed rbln-smi entry",
    UNSEEN_KIND: "sysfs does not show it",
}


def _short_reason(problem: Problem) -> str:
    if problem.kind == "unsupported-vf-count":
        count = problem.fields.get("vfCount")
        who = "parent PF has" if "parentBusID" in problem.fields else "has"
        return f"{who} {count} VFs, an unsupported count"
    return _SHORT_REASONS.get(problem.kind, problem.message)


def _from_problem(problem: Problem, name: str | None, bus_id: str | None) -> Finding:
    # Device, bus ID and product are already columns of the row.
    details = {k: v for k, v in problem.fields.items() if k not in ("device", "busID", "product")}
    return Finding(Severity.ERROR, problem.kind, problem.message, name, bus_id, details)


def _discovery_finding(smi: SmiOutcome) -> Finding:
    if smi.tried:
        # A configured path that is unusable is named as such; a search lists its stops.
        message = smi.error if smi.path else "rbln-smi not found; discovery cannot run"
        return Finding(
            Severity.ERROR, "rbln-smi-not-found", message, details={"tried": list(smi.tried)}
        )
    return Finding(
        Severity.ERROR,
        "discovery-failed",
        "Device discovery failed; the daemon reports zero devices until it recovers",
        details={"err": smi.error},
    )


def _nothing_reason(host: HostFacts, rows: Sequence[Row]) -> str:
    if not host.smi.ok:
        return "device discovery failed"
    if not rows:
        return "neither rbln-smi nor sysfs shows any device"
    return "every device is excluded (see the other problems)"


def _summary(name: str, table: Mapping[str, Entry] | None) -> ResourceSummary:
    entries = list((table or {}).values())
    healthy = sum(1 for entry in entries if entry.healthy)
    return ResourceSummary(name, len(entries), healthy, len(entries) - healthy)


def _natural(name: str | None, bus_id: str | None) -> tuple[Any, ...]:
    """rbln2 before rbln10, rbln0 before rbln0-0; unnamed devices last, by bus ID."""
    if name is None:
        return (1, (), bus_id or "")
    return (0, natural_key(name), bus_id or "")
