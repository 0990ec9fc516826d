"""``inspect`` output: the report as a table for people, or as one JSON document.

Pure. The JSON document follows ``report.schema.json`` (shipped next to this
module and described in the README); bump ``SCHEMA_VERSION`` on any incompatible change.
Text that comes from the host (names, bus IDs, error messages) is escaped in the table,
so a hostile rbln-smi cannot move the cursor or forge lines on an operator's terminal.
"""

from __future__ import annotations

import re
from typing import Any, Final

from rbln_device_plugin.inspect.drarender import mode_document, mode_line, mode_lines
from rbln_device_plugin.inspect.facts import SmiOutcome
from rbln_device_plugin.inspect.findings import Finding
from rbln_device_plugin.inspect.preferredreport import Choice, PreferredReport, score_levels
from rbln_device_plugin.inspect.report import Report, Row
from rbln_device_plugin.inspect.textcells import DASH as _DASH
from rbln_device_plugin.inspect.textcells import cell as _cell
from rbln_device_plugin.inspect.textcells import columns as _columns
from rbln_device_plugin.model.cdispec import CdiState, SpecVerdict

SCHEMA_VERSION: Final = 1


# ----------------------------------------------------------------------------- JSON


def to_document(report: Report, preferred: PreferredReport | None, version: str) -> dict[str, Any]:
    smi = report.facts.smi
    return {
        "schemaVersion": SCHEMA_VERSION,
        "version": version,
        "config": dict(report.facts.config),
        "discovery": {
            "ok": smi.ok,
            "rblnSmi": smi.path,
            "durationMs": smi.duration_ms,
            "error": smi.error or None,
            "tried": list(smi.tried),
            "entries": len(smi.entries),
        },
        "devices": [_device(row) for row in report.rows],
        "resources": [
            {
                "resourceName": s.name,
                "deviceCount": s.devices,
                "healthyCount": s.healthy,
                "unhealthyCount": s.unhealthy,
            }
            for s in report.resources
        ],
        "problems": [_problem(finding) for finding in report.findings],
        "preferred": None if preferred is None else _preferred(preferred),
        "cdi": _cdi(report.facts.cdi),
        "mode": mode_document(report.mode),
        "advertisedCount": report.advertised,
        "exitCode": report.exit_code,
    }


def _cdi(verdict: SpecVerdict | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {
        "state": verdict.state.value,
        "cdiDevices": list(verdict.wanted),
        "specFiles": dict(verdict.found),
        "missing": list(verdict.missing),
        "notVisible": dict(verdict.unseen),
        "notChecked": dict(verdict.unchecked),
        "unusable": dict(verdict.malformed),
    }


def _device(row: Row) -> dict[str, Any]:
    return {
        "device": row.name,
        "product": row.product or None,
        "pciDeviceID": row.pci_device_id or None,
        "pciBusID": row.bus_id,
        "numa": row.numa,
        "sid": row.sid or None,
        "parentBusID": row.parent_bus_id,
        "listedBySmi": row.listed,
        "inSysfs": row.in_sysfs,
        "resourceName": row.resource,
        "whyNot": None
        if row.why_not is None
        else {"kind": row.why_not.kind, "reason": row.why_not.reason},
        "health": row.health,
        "status": row.status,
        "statusDetail": row.status_detail or None,
        "pciPath": None if row.pci_path is None else list(row.pci_path),
        "pciPathError": row.pci_path_error or None,
    }


def _problem(finding: Finding) -> dict[str, Any]:
    return {
        "severity": finding.severity.value,
        "kind": finding.kind,
        "message": finding.message,
        "device": finding.device,
        "pciBusID": finding.bus_id,
        "details": dict(finding.details),
    }


def _preferred(answer: PreferredReport) -> dict[str, Any]:
    def choice(which: Choice | None) -> dict[str, Any] | None:
        if which is None:
            return None
        return {"deviceIDs": list(which.device_ids), "score": score_levels(which.score)}

    return {
        "resourceName": answer.resource,
        "allocationSize": answer.size,
        "available": list(answer.available),
        "mustInclude": list(answer.must_include),
        "deviceIDs": [] if answer.winner is None else list(answer.winner.device_ids),
        "fallback": answer.fallback or None,
        "shortcut": answer.shortcut,
        "winner": choice(answer.winner),
        "runnerUp": choice(answer.runner_up),
        "decidedBy": answer.decided_by,
        "note": answer.runner_up_note or None,
    }


# ----------------------------------------------------------------------------- table


def render_table(report: Report, preferred: PreferredReport | None) -> str:
    facts = report.facts
    smi = facts.smi
    lines: list[str] = []
    if smi.ok:
        took = f", {smi.duration_ms:.0f} ms" if smi.duration_ms is not None else ""
        source = f"{_cell(smi.path or '?')} ({len(smi.entries)} entries{took})"
    else:
        source = f"{_cell(smi.path) if smi.path else 'not found'} (FAILED, see problems)"
    lines.append(f"rbln-smi: {source}")
    lines.append(f"sysfs:    {_cell(str(facts.config.get('sysfsRoot', '?')))}")
    if facts.cdi is not None:
        lines.append(f"cdi:      {_cdi_line(facts.cdi)}")
    if report.mode is not None:
        lines.append(f"mode:     {mode_line(report.mode)}")
    lines.append("")
    lines += _columns(
        [
            "DEVICE",
            "PRODUCT",
            "PCI BUS ID",
            "NUMA",
            "SID",
            "PARENT PF",
            "RESOURCE (OR WHY NOT)",
            "HEALTH",
            "STATUS",
            "PCI PATH",
        ],
        [_row_cells(row) for row in report.rows],
    )
    if not report.rows:
        lines.append(f"(no device: {_smi_listing(smi)})")
    elif any(row.health == "Healthy" and row.status_detail for row in report.rows):
        lines.append(
            "(Healthy with an UNREADABLE status: the device has no readable status file and "
            "was never read Unhealthy, as with VFs and older drivers)"
        )
    lines.append("")
    lines += _columns(
        ["RESOURCE", "DEVICES", "HEALTHY", "UNHEALTHY"],
        [[s.name, str(s.devices), str(s.healthy), str(s.unhealthy)] for s in report.resources],
    )
    lines.append("")
    if report.mode is not None:
        lines += [*mode_lines(report.mode), ""]
    if report.findings:
        lines.append(f"Problems ({len(report.findings)}):")
        lines += [f"  {_finding_line(finding)}" for finding in report.findings]
    else:
        lines.append("Problems: none")
    if preferred is not None:
        lines.append("")
        lines += _preferred_lines(preferred)
    lines.append("")
    verdict = "OK" if report.exit_code == 0 else "NOT OK"
    warnings = len(report.findings) - report.errors
    lines.append(
        f"{verdict}: {report.advertised} device{'s' if report.advertised != 1 else ''} "
        f"advertised, {report.errors} error{'s' if report.errors != 1 else ''}, "
        f"{warnings} warning{'s' if warnings != 1 else ''} (exit {report.exit_code})"
    )
    return "\n".join(lines) + "\n"


def _cdi_line(verdict: SpecVerdict) -> str:
    devices = ", ".join(verdict.wanted)
    if verdict.state is CdiState.PRESENT:
        files = ", ".join(sorted(set(verdict.found.values())))
        return f"{_cell(devices)} defined in {_cell(files, limit=200)}"
    if verdict.state is CdiState.MISSING:
        return f"{_cell(devices)} MISSING from every spec directory (see problems)"
    return f"{_cell(devices)}: cannot tell (see problems)"


def _smi_listing(smi: SmiOutcome) -> str:
    """What rbln-smi said about devices, without claiming it ran when it did not."""
    if smi.ok:
        return "rbln-smi lists none and sysfs shows none"
    if smi.duration_ms is None:
        return "rbln-smi did not run and sysfs shows none; see problems"
    return "rbln-smi failed and sysfs shows none; see problems"


_STATUS_FILE: Final = re.compile(r"\S*/status\b")


def _status_cell(row: Row) -> str:
    """The status, and for an unreadable one the reason, with the path said in words."""
    status = row.status or _DASH
    if not row.status_detail or not status.startswith("UNREADABLE"):
        return _cell(status)
    reason = _STATUS_FILE.sub("status file", row.status_detail)
    return _cell(f"{status} ({reason})")


def _row_cells(row: Row) -> list[str]:
    if row.resource is not None:
        advertised = row.resource
    elif row.why_not is not None:
        advertised = f"({row.why_not.reason})"
    else:
        advertised = _DASH
    if row.pci_path is not None:
        pci = "/".join(row.pci_path)
    else:
        pci = f"unreadable: {row.pci_path_error}" if row.pci_path_error else _DASH
    return [
        _cell(row.name or _DASH),
        _cell(row.product or _DASH),
        _cell(row.bus_id or _DASH),
        _DASH if row.numa is None else str(row.numa),
        _cell(row.sid or _DASH),
        row.parent_bus_id or _DASH,
        _cell(advertised),
        row.health or _DASH,
        _status_cell(row),
        _cell(pci, limit=200),
    ]


def _finding_line(finding: Finding) -> str:
    subject = finding.device or finding.bus_id
    head = f"{finding.severity.value:<7} " + (f"{_cell(subject)}: " if subject else "")
    details = " ".join(
        f"{key}={_cell(_detail(value), limit=300)}" for key, value in finding.details.items()
    )
    return head + _cell(finding.message, limit=200) + (f"  {details}" if details else "")


def _detail(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    return str(value)


def _preferred_lines(answer: PreferredReport) -> list[str]:
    must = ", ".join(answer.must_include) or "none"
    lines = [
        f"Preferred allocation for {answer.resource}: size {answer.size}, "
        f"{len(answer.available)} available, must include {_cell(must)}"
    ]
    if answer.winner is None:
        lines.append(f"  answer: [] (fallback to the kubelet: {_cell(answer.fallback)})")
        return lines
    if not answer.winner.device_ids:
        lines.append("  answer: [] (size 0: nothing to choose)")
        return lines
    shortcut = f" (shortcut: {answer.shortcut}, no search)" if answer.shortcut else ""
    lines.append(f"  answer: {', '.join(answer.winner.device_ids)}{shortcut}")
    winner = score_levels(answer.winner.score)
    runner = score_levels(answer.runner_up.score) if answer.runner_up is not None else None
    rows = [
        [name, _level(value), _DASH if runner is None else _level(runner[name])]
        for name, value in winner.items()
    ]
    lines += [f"  {line}" for line in _columns(["LEVEL", "WINNER", "RUNNER-UP"], rows)]
    if answer.runner_up is None:
        lines.append("  runner-up: none (no other selection satisfies the request)")
    else:
        decided = answer.decided_by or "nothing (equal)"
        lines.append(f"  runner-up: {', '.join(answer.runner_up.device_ids)}; decided by {decided}")
    if answer.runner_up_note:
        lines.append(f"  note: {answer.runner_up_note}")
    return lines


def _level(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)
