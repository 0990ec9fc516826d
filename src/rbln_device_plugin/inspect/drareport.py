"""The mode part of ``inspect``: which mode runs, what dra mode publishes and prepared (pure).

``drafacts`` gathers what the node shows; this module explains it. The devices a dra
daemon publishes are computed by the daemon's own ``dra.slices.build_pool`` from the very
tables the device part of the report holds (what a first scan offers), so the list is
the ResourceSlices' devices, attribute for attribute. The findings:

- a socket of the other mode: one node must not offer its NPUs both ways (warning: the
  configured mode still works, but the kubelet may place pods on both);
- a device or attribute the slices leave out (error and warning, as the publisher logs);
- in dra mode, a checkpoint the daemon cannot use (error: the daemon does not start), a
  prepared claim whose device this scan does not publish (error: its pod holds a device
  the node no longer offers), one whose device is Unhealthy (warning: the device's own
  ``unhealthy`` error already counts), and a prepared claim without its CDI spec file
  (error: the runtime cannot resolve the claim's CDI devices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from rbln_device_plugin.dra import checkpoint as cp
from rbln_device_plugin.dra import names, slices
from rbln_device_plugin.dra.slices import Omission
from rbln_device_plugin.inspect.drafacts import DEVICE_PLUGIN, DRA, SOCKET, ModeFacts, PathSeen
from rbln_device_plugin.inspect.findings import Finding, Severity
from rbln_device_plugin.model.devicetable import Entry

_SPEC_FILE: Final = "file"


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One device of the node's ResourceSlices, by its published attributes."""

    name: str
    slice: str
    device_type: str | None
    pci_bus_id: str | None
    pcie_root: str | None
    numa: int | None
    healthy: bool | None
    status: str | None


@dataclass(frozen=True, slots=True)
class Published:
    pool: str
    slices: tuple[str, ...]
    devices: tuple[PublishedDevice, ...]
    omissions: tuple[Omission, ...] = ()
    error: str = ""  # the pool cannot be built


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    prepared: cp.PreparedDevice
    published: bool
    healthy: bool | None  # None: not published


@dataclass(frozen=True, slots=True)
class ClaimView:
    uid: str
    entry: cp.ClaimEntry
    devices: tuple[ClaimDevice, ...]
    spec: PathSeen | None  # None: the UID cannot name a file


@dataclass(frozen=True, slots=True)
class ModeReport:
    facts: ModeFacts
    published: Published | None  # dra mode only
    claims: tuple[ClaimView, ...]
    findings: tuple[Finding, ...]

    @property
    def other_mode(self) -> str:
        return DEVICE_PLUGIN if self.facts.mode == DRA else DRA

    def sockets(self, mode: str) -> tuple[PathSeen, ...]:
        facts = self.facts
        return facts.dra_sockets if mode == DRA else facts.device_plugin_sockets


def build_mode_report(facts: ModeFacts, tables: Mapping[str, Mapping[str, Entry]]) -> ModeReport:
    findings = socket_findings(facts)
    published: Published | None = None
    claims: tuple[ClaimView, ...] = ()
    if facts.mode == DRA:
        published = publish(facts.node_name, tables)
        findings += omission_findings(published)
        claims, claim_problems = explain_claims(facts, published)
        findings += claim_problems
    return ModeReport(facts, published, claims, tuple(findings))


def socket_findings(facts: ModeFacts) -> list[Finding]:
    other = DEVICE_PLUGIN if facts.mode == DRA else DRA
    sockets = facts.dra_sockets if other == DRA else facts.device_plugin_sockets
    present = [s.path for s in sockets if s.kind == SOCKET]
    if not present:
        return []
    return [
        Finding(
            Severity.WARNING,
            "other-mode-socket",
            f"A {other} mode socket is on the node while the mode is {facts.mode}: one node "
            "must not offer its NPUs both ways (another instance of the other mode runs, or "
            "its socket was left behind)",
            details={"mode": other, "paths": present},
        )
    ]


def publish(node: str, tables: Mapping[str, Mapping[str, Entry]]) -> Published:
    """The devices the daemon's ResourceSlices would hold after this scan."""
    try:
        pool = slices.build_pool(node, tables)
    except ValueError as exc:
        return Published(node, (), (), error=str(exc))
    devices = tuple(
        _published(desired.name, device) for desired in pool.slices for device in desired.devices
    )
    return Published(pool.node, pool.names, devices, pool.omissions)


def _published(slice_name: str, device: slices.DeviceJSON) -> PublishedDevice:
    attributes: Mapping[str, Mapping[str, Any]] = device["attributes"]

    def value(name: str, kind: type[Any]) -> Any:
        found = attributes.get(name, {})
        raw = next(iter(found.values()), None)
        return raw if isinstance(raw, kind) else None

    return PublishedDevice(
        name=device["name"],
        slice=slice_name,
        device_type=value(slices.ATTR_DEVICE_TYPE, str),
        pci_bus_id=value(slices.ATTR_PCI_BUS_ID, str),
        pcie_root=value(slices.ATTR_PCIE_ROOT, str),
        numa=value(slices.ATTR_NUMA, int),
        healthy=value(slices.ATTR_HEALTHY, bool),
        status=value(slices.ATTR_STATUS, str),
    )


def omission_findings(published: Published) -> list[Finding]:
    out: list[Finding] = []
    if published.error:
        out.append(
            Finding(
                Severity.ERROR,
                "resourceslice-unbuildable",
                "The node's ResourceSlices cannot be built",
                details={"err": published.error},
            )
        )
    for left in published.omissions:
        whole = not left.attribute
        out.append(
            Finding(
                Severity.ERROR if whole else Severity.WARNING,
                "resourceslice-device-left-out" if whole else "resourceslice-attribute-left-out",
                "Device left out of the ResourceSlices"
                if whole
                else "Device attribute left out of the ResourceSlices",
                left.device,
                details={"reason": left.reason} | ({} if whole else {"attribute": left.attribute}),
            )
        )
    return out


def explain_claims(
    facts: ModeFacts, published: Published
) -> tuple[tuple[ClaimView, ...], list[Finding]]:
    seen = facts.checkpoint
    if seen is None:
        return (), []
    if seen.error:
        return (), [
            Finding(
                Severity.ERROR,
                "checkpoint-unusable",
                "The DRA checkpoint cannot be used; the daemon does not start with it",
                details={"path": seen.path, "err": seen.error},
            )
        ]
    if seen.checkpoint is None:
        return (), []
    by_name = {device.name: device for device in published.devices}
    views: list[ClaimView] = []
    findings: list[Finding] = []
    claims = seen.checkpoint.claims
    for uid in sorted(claims, key=lambda u: (claims[u].namespace, claims[u].name, u)):
        entry = claims[uid]
        claim = f"{entry.namespace}/{entry.name}"
        base = {"claim": claim, "uid": uid}
        devices = []
        for prepared in entry.devices:
            found = by_name.get(prepared.device)
            healthy = None if found is None else found.healthy
            devices.append(ClaimDevice(prepared, found is not None, healthy))
            findings += _device_findings(prepared.device, found, base)
        spec = facts.spec_files.get(uid)
        views.append(ClaimView(uid, entry, tuple(devices), spec))
        problem = names.claim_uid_problem(uid)
        if problem is not None:
            findings.append(
                Finding(Severity.ERROR, "claim-uid-invalid", problem, details={"claim": claim})
            )
        elif entry.state == cp.COMPLETED and spec is not None and spec.kind != _SPEC_FILE:
            findings.append(
                Finding(
                    Severity.ERROR,
                    "claim-cdi-spec-missing",
                    "A prepared claim's CDI spec file is missing; the container runtime "
                    "cannot resolve its CDI devices",
                    details={**base, "path": spec.path, "found": spec.error or spec.kind},
                )
            )
    return tuple(views), findings


def _device_findings(
    device: str, found: PublishedDevice | None, base: Mapping[str, str]
) -> list[Finding]:
    if found is None:
        return [
            Finding(
                Severity.ERROR,
                "claim-device-not-published",
                "A prepared claim's device is not published by this scan; the claim's pod "
                "holds a device the node no longer offers",
                device,
                details=dict(base),
            )
        ]
    if found.healthy is False:
        return [
            Finding(
                Severity.WARNING,
                "claim-device-unhealthy",
                "A prepared claim's device is published Unhealthy",
                device,
                found.pci_bus_id,
                {**base, "status": found.status},
            )
        ]
    return []
