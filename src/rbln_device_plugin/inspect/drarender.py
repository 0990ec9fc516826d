"""The mode part of ``inspect``'s output: table lines and the JSON document's ``mode``.

Pure; ``render`` places both in the report. The ``mode`` object follows
``report.schema.json``.
"""

from __future__ import annotations

from typing import Any

from rbln_device_plugin.dra.names import DRIVER_NAME
from rbln_device_plugin.inspect.drafacts import DEVICE_PLUGIN, DRA, SOCKET, PathSeen
from rbln_device_plugin.inspect.drareport import ClaimView, ModeReport, Published
from rbln_device_plugin.inspect.textcells import DASH, cell, columns

# ----------------------------------------------------------------------------- JSON


def mode_document(mode: ModeReport | None) -> dict[str, Any] | None:
    if mode is None:
        return None
    facts = mode.facts
    checkpoint = facts.checkpoint
    return {
        "configured": facts.mode,
        "nodeName": facts.node_name or None,
        "driver": DRIVER_NAME,
        "devicePluginDir": facts.device_plugin_dir,
        "devicePluginDirError": facts.device_plugin_dir_error or None,
        "sockets": [_socket(s) for s in (*facts.device_plugin_sockets, *facts.dra_sockets)],
        "published": None if mode.published is None else _published(mode.published),
        "checkpoint": None
        if checkpoint is None
        else {
            "path": checkpoint.path,
            "present": checkpoint.present,
            "error": checkpoint.error or None,
            "claims": [_claim(claim) for claim in mode.claims],
        },
    }


def _socket(seen: PathSeen) -> dict[str, Any]:
    return {
        "mode": seen.mode,
        "role": seen.role,
        "path": seen.path,
        "found": seen.kind,
        "error": seen.error or None,
    }


def _published(published: Published) -> dict[str, Any]:
    return {
        "pool": published.pool,
        "slices": list(published.slices),
        "error": published.error or None,
        "devices": [
            {
                "name": d.name,
                "slice": d.slice,
                "deviceType": d.device_type,
                "pciBusID": d.pci_bus_id,
                "pcieRoot": d.pcie_root,
                "numaNode": d.numa,
                "healthy": d.healthy,
                "status": d.status,
            }
            for d in published.devices
        ],
        "leftOut": [
            {"device": o.device, "attribute": o.attribute or None, "reason": o.reason}
            for o in published.omissions
        ],
    }


def _claim(claim: ClaimView) -> dict[str, Any]:
    return {
        "uid": claim.uid,
        "namespace": claim.entry.namespace,
        "name": claim.entry.name,
        "state": claim.entry.state,
        "cdiSpecFile": None if claim.spec is None else claim.spec.path,
        "cdiSpecFound": None if claim.spec is None else claim.spec.kind,
        "devices": [
            {
                "request": d.prepared.request,
                "pool": d.prepared.pool,
                "device": d.prepared.device,
                "cdiDeviceIDs": list(d.prepared.cdi_device_ids),
                "published": d.published,
                "healthy": d.healthy,
            }
            for d in claim.devices
        ],
    }


# ----------------------------------------------------------------------------- table


def mode_line(mode: ModeReport) -> str:
    """The header's ``mode:`` line: the configured mode and what the node shows of it."""
    facts = mode.facts
    node = f", node {cell(facts.node_name)}" if facts.node_name else ""
    own = [s for s in mode.sockets(facts.mode) if s.kind == SOCKET]
    other = [s for s in mode.sockets(mode.other_mode) if s.kind == SOCKET]
    serving = "its socket is here" if own else "no socket of it here"
    if other:
        serving += f"; {mode.other_mode} socket here too (see problems)"
    return f"{facts.mode}{node} ({serving})"


def mode_lines(mode: ModeReport) -> list[str]:
    """The sockets of both modes; in dra mode what is published and prepared."""
    facts = mode.facts
    lines: list[str] = []
    rows = [_socket_row(s) for s in facts.device_plugin_sockets]
    if not facts.device_plugin_sockets:
        why = facts.device_plugin_dir_error or "none of this plugin's"
        rows.append([DEVICE_PLUGIN, f"({cell(why)})", cell(facts.device_plugin_dir, 200), DASH])
    rows += [_socket_row(s) for s in facts.dra_sockets]
    lines += columns(["MODE", "SOCKET", "PATH", "FOUND"], rows)
    if mode.published is not None:
        lines += ["", *_published_lines(mode.published)]
    if facts.mode == DRA:
        lines += ["", *_claim_lines(mode)]
    return lines


def _socket_row(seen: PathSeen) -> list[str]:
    found = f"{seen.kind}: {seen.error}" if seen.error else seen.kind
    return [seen.mode, cell(seen.role), cell(seen.path, 200), cell(found)]


def _published_lines(published: Published) -> list[str]:
    if published.error:
        return [f"ResourceSlices: cannot be built ({cell(published.error)})"]
    count = len(published.slices)
    head = (
        f"ResourceSlice devices (pool {cell(published.pool)}, driver {DRIVER_NAME}, "
        f"{count} slice{'s' if count != 1 else ''}: {cell(', '.join(published.slices), 200)}):"
    )
    if not published.devices:
        return [head, "(no device to publish)"]
    rows = [
        [
            cell(d.name),
            cell(d.device_type or DASH),
            cell(d.pci_bus_id or DASH),
            cell(d.pcie_root or DASH),
            DASH if d.numa is None else str(d.numa),
            DASH if d.healthy is None else str(d.healthy).lower(),
            cell(d.status or DASH),
        ]
        for d in published.devices
    ]
    header = ["DEVICE", "DEVICE TYPE", "PCI BUS ID", "PCIE ROOT", "NUMA", "HEALTHY", "STATUS"]
    return [head, *columns(header, rows)]


def _claim_lines(mode: ModeReport) -> list[str]:
    checkpoint = mode.facts.checkpoint
    if checkpoint is None:
        return []
    where = cell(checkpoint.path, 200)
    if checkpoint.error:
        return [f"Prepared claims: checkpoint {where} is unusable (see problems)"]
    if not checkpoint.present:
        return [f"Prepared claims: none (no checkpoint at {where})"]
    if not mode.claims:
        return [f"Prepared claims: none (checkpoint {where})"]
    rows = [
        [
            cell(f"{claim.entry.namespace}/{claim.entry.name}"),
            cell(claim.uid),
            claim.entry.state,
            cell(", ".join(d.prepared.device for d in claim.devices) or DASH),
            DASH if claim.spec is None else _spec_found(claim.spec),
        ]
        for claim in mode.claims
    ]
    return [
        f"Prepared claims ({len(mode.claims)}, checkpoint {where}):",
        *columns(["CLAIM", "UID", "STATE", "DEVICES", "CDI SPEC"], rows),
    ]


def _spec_found(spec: PathSeen) -> str:
    return "present" if spec.kind == "file" else cell(spec.error or spec.kind)
