"""inspect's policy without processes: facts in, explained rows, problems and exit code out.

Each test builds ``HostFacts`` the way the read-only pass would and checks what an
operator reads in the report: the resource or the reason, the health the kubelet would
get, the problems, the exit status, and the preferred allocation with its runner-up.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rbln_device_plugin.host.smi import parse_entries
from rbln_device_plugin.host.sysfs import SysfsDevice
from rbln_device_plugin.inspect.facts import HostFacts, SmiOutcome, wanted_reads
from rbln_device_plugin.inspect.findings import Severity
from rbln_device_plugin.inspect.preferredreport import explain_preferred
from rbln_device_plugin.inspect.render import render_table, to_document
from rbln_device_plugin.inspect.report import Report, Row, build_report
from rbln_device_plugin.model.health import StatusReading
from rbln_device_plugin.model.inventory import DeviceFacts, SriovFacts
from rbln_device_plugin.topology import Candidate, candidate_from_device, score

READY = StatusReading(0)


def entry(
    name: Any,
    bus: Any,
    product: str = "RBLN-CA25",
    *,
    sid: str = "0000000022502229",
    numa: str = "0",
) -> dict[str, Any]:
    return {
        "npu": 0,
        "name": product,
        "sid": sid,
        "device": name,
        "pci": {"dev": "1250", "bus_id": bus, "numa_node": numa},
    }


def path_of(bus: str) -> tuple[str, ...]:
    return ("pci0000:00", "0000:00:01.0", bus)


def host(
    entries: Sequence[Any],
    *,
    sriov: Mapping[str, SriovFacts] | None = None,
    statuses: Mapping[str, StatusReading] | None = None,
    sysfs: Sequence[SysfsDevice] = (),
    unreadable_paths: Mapping[str, str] | None = None,
) -> HostFacts:
    """Facts for these rbln-smi entries; every bus ID has a PCI path unless told otherwise."""
    parsed = tuple(parse_entries(json.dumps({"devices": list(entries)})))
    bus_ids, names = wanted_reads(parsed, sysfs)
    unreadable = unreadable_paths or {}
    facts = {
        bus: DeviceFacts(
            sriov=(sriov or {}).get(bus, SriovFacts()),
            pci_path=None if bus in unreadable else path_of(bus),
            pci_path_error=unreadable.get(bus, ""),
        )
        for bus in bus_ids
    }
    readings = {name: (statuses or {}).get(name, READY) for name in names}
    return HostFacts(
        smi=SmiOutcome("/usr/bin/rbln-smi", entries=parsed, duration_ms=12.0),
        sysfs_devices=tuple(sysfs),
        facts=facts,
        statuses=readings,
        config={"sysfsRoot": "/sys", "rblnSmi": "(search)"},
    )


def row(report: Report, name: str) -> Row:
    return next(r for r in report.rows if r.name == name)


def kinds(report: Report) -> list[tuple[str, str | None]]:
    return [(f.kind, f.device) for f in report.findings]


# ----------------------------------------------------------------------------- rows


def test_a_clean_node_is_advertised_healthy_and_exits_0() -> None:
    report = build_report(host([entry("rbln0", "0000:05:00.0"), entry("rbln1", "0000:06:00.0")]))
    assert [(r.name, r.resource, r.health, r.status) for r in report.rows] == [
        ("rbln0", "rebellions.ai/npu", "Healthy", "READY"),
        ("rbln1", "rebellions.ai/npu", "Healthy", "READY"),
    ]
    assert [(s.name, s.devices, s.healthy) for s in report.resources] == [
        ("rebellions.ai/npu", 2, 2),
        ("rebellions.ai/npu-vf1", 0, 0),
        ("rebellions.ai/npu-vf4", 0, 0),
    ]
    assert report.findings == ()
    assert report.exit_code == 0


def test_a_fault_is_unhealthy_an_error_and_exit_1() -> None:
    facts = host(
        [entry("rbln0", "0000:05:00.0"), entry("rbln1", "0000:06:00.0")],
        statuses={"rbln1": StatusReading(4)},
    )
    report = build_report(facts)
    assert (row(report, "rbln1").health, row(report, "rbln1").status) == ("Unhealthy", "FAULT")
    assert report.resources[0].unhealthy == 1
    assert kinds(report) == [("unhealthy", "rbln1")]
    assert report.exit_code == 1


def test_an_unreadable_status_is_healthy_on_a_first_scan_with_its_reason() -> None:
    missing = StatusReading(None, "/sys/class/rebellions/rbln0/status does not exist")
    report = build_report(host([entry("rbln0", "0000:05:00.0")], statuses={"rbln0": missing}))
    only = row(report, "rbln0")
    assert (only.health, only.status) == ("Healthy", "UNREADABLE")
    assert only.status_detail.endswith("does not exist")
    assert report.exit_code == 0


@pytest.mark.parametrize(
    ("bad", "kind", "reason"),
    [
        (entry("../../etc", "0000:05:00.0"), "invalid-name", "invalid name"),
        (entry("rbln0", "05:00.0"), "invalid-bus-id", "invalid PCI bus ID"),
        (entry("rbln0", "0000:05:00.0", "OTHER-NPU"), "unsupported-product", "unsupported product"),
        ({"device": "rbln0", "name": "RBLN-CA25"}, "malformed-entry", "malformed rbln-smi entry"),
    ],
)
def test_excluded_entries_say_why_and_carry_the_daemons_problem(
    bad: dict[str, Any], kind: str, reason: str
) -> None:
    report = build_report(host([entry("rbln9", "0000:09:00.0"), bad]))
    excluded = next(r for r in report.rows if r.resource is None)
    assert excluded.why_not is not None
    assert (excluded.why_not.kind, excluded.why_not.reason) == (kind, reason)
    assert [f.kind for f in report.findings] == [kind]
    assert report.findings[0].severity is Severity.ERROR
    assert report.exit_code == 1
    assert row(report, "rbln9").resource == "rebellions.ai/npu"


def test_duplicates_keep_the_first_entry() -> None:
    report = build_report(host([entry("rbln0", "0000:05:00.0"), entry("rbln1", "0000:05:00.0")]))
    assert row(report, "rbln0").resource == "rebellions.ai/npu"
    assert row(report, "rbln1").why_not is not None
    assert row(report, "rbln1").why_not.kind == "duplicate"  # type: ignore[union-attr]
    assert report.findings[0].details["reason"] == "bus ID already listed by an earlier entry"


PF, VF0, VF1 = "0000:17:00.0", "0000:17:00.1", "0000:17:00.2"


def test_unsupported_vf_count_explains_every_vf_and_hides_the_pf() -> None:
    sriov = {
        PF: SriovFacts(vf_count=2),
        VF0: SriovFacts(parent_bus_id=PF, vf_count=2),
        VF1: SriovFacts(parent_bus_id=PF, vf_count=2),
    }
    facts = host([entry("rbln0", PF), entry("rbln0-0", VF0), entry("rbln0-1", VF1)], sriov=sriov)
    report = build_report(facts)
    assert [(r.name, r.why_not.reason if r.why_not else r.resource) for r in report.rows] == [
        ("rbln0", "has 2 VFs, an unsupported count"),
        ("rbln0-0", "parent PF has 2 VFs, an unsupported count"),
        ("rbln0-1", "parent PF has 2 VFs, an unsupported count"),
    ]
    assert row(report, "rbln0-1").parent_bus_id == PF
    assert {f.kind for f in report.findings} == {"unsupported-vf-count", "nothing-advertised"}
    assert report.advertised == 0
    assert report.exit_code == 1


def test_a_pf_hosting_vf4_is_explained_not_blamed() -> None:
    sriov = {PF: SriovFacts(vf_count=4), VF0: SriovFacts(parent_bus_id=PF, vf_count=4)}
    report = build_report(host([entry("rbln0", PF), entry("rbln0-0", VF0)], sriov=sriov))
    assert row(report, "rbln0").why_not is not None
    assert row(report, "rbln0").why_not.kind == "hosting-vfs"  # type: ignore[union-attr]
    assert row(report, "rbln0-0").resource == "rebellions.ai/npu-vf4"
    assert report.findings == ()
    assert report.exit_code == 0


def test_indeterminate_sriov_state_names_the_file() -> None:
    bad = SriovFacts(error="malformed /sys/bus/pci/devices/0000:05:00.0/sriov_numvfs: 'x'")
    report = build_report(host([entry("rbln0", "0000:05:00.0")], sriov={"0000:05:00.0": bad}))
    assert kinds(report)[0] == ("sriov-indeterminate", "rbln0")
    assert "sriov_numvfs" in report.findings[0].details["reason"]


def test_sysfs_devices_rbln_smi_does_not_list() -> None:
    sysfs = [
        SysfsDevice("rbln0", "0000:05:00.0"),  # listed: merged into its row
        SysfsDevice("rbln1", "0000:06:00.0"),  # not listed: an error
        SysfsDevice("rbln2", PF),  # hosts VFs: rbln-smi may leave such a PF out
        SysfsDevice(None, "0000:99:00.0"),  # a Rebellions function without a driver entry
    ]
    sriov = {PF: SriovFacts(vf_count=4)}
    report = build_report(host([entry("rbln0", "0000:05:00.0")], sysfs=sysfs, sriov=sriov))
    assert [r.name for r in report.rows] == ["rbln0", "rbln1", "rbln2", None]
    assert row(report, "rbln0").in_sysfs and row(report, "rbln0").listed
    assert not row(report, "rbln1").listed
    assert kinds(report) == [("not-listed", "rbln1"), ("not-listed", None)]
    hosting = row(report, "rbln2").why_not
    assert hosting is not None and hosting.reason == "hosts 4 VFs, not listed by rbln-smi"


def test_discovery_failure_still_shows_what_sysfs_has() -> None:
    failed = HostFacts(
        SmiOutcome("/usr/bin/rbln-smi", "`/usr/bin/rbln-smi -j` exited with code 1: boom"),
        sysfs_devices=(SysfsDevice("rbln0", "0000:05:00.0"),),
        statuses={"rbln0": READY},
    )
    report = build_report(failed)
    assert [f.kind for f in report.findings] == ["discovery-failed", "nothing-advertised"]
    assert "boom" in report.findings[0].details["err"]
    assert row(report, "rbln0").why_not is not None
    assert row(report, "rbln0").why_not.kind == "discovery-failed"  # type: ignore[union-attr]
    assert row(report, "rbln0").status == "READY"
    assert report.exit_code == 1


def test_rbln_smi_not_found_lists_every_path_tried() -> None:
    tried = ("/usr/bin/rbln-smi", "/host/usr/bin/rbln-smi", "/opt/bin/rbln-smi")
    report = build_report(HostFacts(SmiOutcome(None, "rbln-smi not found (...)", tried)))
    assert report.findings[0].kind == "rbln-smi-not-found"
    assert report.findings[0].details["tried"] == list(tried)
    assert report.rows == ()
    assert report.findings[-1].details["reason"] == "device discovery failed"


def test_an_unreadable_pci_path_is_a_warning_with_its_reason() -> None:
    why = "/sys/bus/pci/devices/0000:06:00.0 does not exist"
    facts = host(
        [entry("rbln0", "0000:05:00.0"), entry("rbln1", "0000:06:00.0")],
        unreadable_paths={"0000:06:00.0": why},
    )
    report = build_report(facts)
    assert row(report, "rbln1").pci_path_error == why
    assert [(f.severity, f.kind, f.device) for f in report.findings] == [
        (Severity.WARNING, "pci-path-unreadable", "rbln1")
    ]
    assert report.exit_code == 0  # placement is degraded, nothing is lost


def test_rows_are_in_natural_order() -> None:
    names = ["rbln10", "rbln2", "rbln0-1", "rbln0", "rbln1"]
    report = build_report(host([entry(n, f"0000:{i + 1:02x}:00.0") for i, n in enumerate(names)]))
    assert [r.name for r in report.rows] == ["rbln0", "rbln0-1", "rbln1", "rbln2", "rbln10"]


def test_hostile_names_never_become_reads_and_are_escaped_in_the_table() -> None:
    hostile = "rbln0\x1b[2J\nrbln1"
    facts = host([entry(hostile, "0000:05:00.0"), entry("rbln1", "../../etc/x")])
    # Only the shapes the inventory accepts are ever read.
    assert set(facts.statuses) == {"rbln1"}
    assert set(facts.facts) == {"0000:05:00.0"}
    table = render_table(build_report(facts), None)
    assert "\x1b" not in table
    assert "rbln0\\x1b[2J\\nrbln1" in table


def test_json_document_mirrors_the_table_facts() -> None:
    report = build_report(host([entry("rbln0", "0000:05:00.0")], statuses={"rbln0": READY}))
    document = to_document(report, None, "9.9.9")
    assert document["exitCode"] == 0
    assert document["devices"][0]["resourceName"] == "rebellions.ai/npu"
    assert document["devices"][0]["pciPath"] == list(path_of("0000:05:00.0"))
    assert document["resources"][0]["deviceCount"] == 1
    json.dumps(document)  # plain JSON types only


# ----------------------------------------------------------------------------- preferred

TREE: dict[str, tuple[str, ...] | None] = {
    "rbln0": ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"),
    "rbln1": ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0"),
    "rbln2": ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:01.0"),
    "rbln3": ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:01.0"),
    "rbln4": ("pci0000:00", "0000:00:02.0", "0000:05:00.0"),
    "rbln5": ("pci0000:80", "0000:80:01.0", "0000:81:00.0"),
    "rbln6": None,  # no PCI path
}


def tree_report(
    numa: Mapping[str, str] | None = None, sid: Mapping[str, str] | None = None
) -> Report:
    entries = [
        entry(
            name,
            path[-1] if path else "0000:90:00.0",
            sid=(sid or {}).get(name, f"{i + 1:016d}"),
            numa=(numa or {}).get(name, "0"),
        )
        for i, (name, path) in enumerate(TREE.items())
    ]
    facts = host(entries)
    paths = {path[-1]: path for path in TREE.values() if path is not None}
    fixed = {bus: DeviceFacts(pci_path=paths.get(bus)) for bus in facts.facts}
    return build_report(HostFacts(facts.smi, facts.sysfs_devices, fixed, facts.statuses))


def brute_force(
    cands: Mapping[str, Candidate], available: Sequence[str], must: Sequence[str], size: int
) -> list[Any]:
    rest = [d for d in available if d not in must]
    return sorted(
        score([*must, *combo], cands) for combo in itertools.combinations(rest, size - len(must))
    )


def test_preferred_gives_the_winner_and_the_true_runner_up() -> None:
    answer = explain_preferred(tree_report(), "rebellions.ai/npu", 2, None, [])
    assert answer.winner is not None and answer.runner_up is not None
    assert answer.winner.device_ids == ("rbln0", "rbln2")
    assert answer.runner_up.device_ids == ("rbln1", "rbln3")  # as close: IDs decide
    assert answer.decided_by == "device_ids"


@pytest.mark.parametrize("seed", range(12))
def test_runner_up_matches_exhaustive_ranking(seed: int) -> None:
    rng = random.Random(seed)
    names = list(TREE)
    numa = {n: rng.choice("01") for n in names}
    sid = {n: f"{rng.randrange(3) + 1:016d}" for n in names}
    report = tree_report(numa, sid)
    available = rng.sample(names, rng.randrange(3, len(names) + 1))
    must = rng.sample(available, rng.randrange(0, 2))
    size = rng.randrange(max(len(must), 1), len(available) + 1)
    answer = explain_preferred(report, "rebellions.ai/npu", size, available, must)
    table = report.tables["rebellions.ai/npu"]
    cands = {name: candidate_from_device(e.device) for name, e in table.items()}
    ranking = brute_force(cands, available, must, size)
    assert answer.winner is not None
    assert answer.winner.score == ranking[0]
    if len(ranking) == 1:
        assert answer.runner_up is None
    else:
        assert answer.runner_up is not None
        assert answer.runner_up.score == ranking[1]
        assert answer.runner_up.device_ids[: len(set(must))] == tuple(dict.fromkeys(must))


def test_shortcuts_have_a_score_but_no_runner_up() -> None:
    report = tree_report()
    everything = explain_preferred(report, "rebellions.ai/npu", 2, ["rbln4", "rbln1"], [])
    assert everything.shortcut == "all-available"
    assert everything.winner is not None and everything.winner.device_ids == ("rbln1", "rbln4")
    assert everything.winner.score.max_distance == 6
    assert everything.runner_up is None
    mandatory = explain_preferred(report, "rebellions.ai/npu", 1, None, ["rbln5"])
    assert mandatory.shortcut == "must-include" and mandatory.runner_up is None


@pytest.mark.parametrize(
    ("resource", "size", "available", "must", "reason"),
    [
        ("rebellions.ai/npu", 3, ["rbln0", "rbln1"], [], "exceeds the 2 available"),
        ("rebellions.ai/npu", 1, ["rbln0", "rbln99"], [], "'rbln99' is not managed"),
        ("rebellions.ai/npu", -1, None, [], "is negative"),
        ("rebellions.ai/npu-vf4", 1, None, [], "not advertised on this node"),
    ],
)
def test_fallbacks_name_the_plugins_reason(
    resource: str, size: int, available: list[str] | None, must: list[str], reason: str
) -> None:
    answer = explain_preferred(tree_report(), resource, size, available, must)
    assert answer.winner is None
    assert reason in answer.fallback
    table = render_table(tree_report(), answer)
    assert "answer: [] (fallback to the kubelet" in table


def test_default_available_leaves_unhealthy_devices_out() -> None:
    facts = host(
        [entry("rbln0", "0000:05:00.0"), entry("rbln1", "0000:06:00.0")],
        statuses={"rbln0": StatusReading(4)},
    )
    answer = explain_preferred(build_report(facts), "rebellions.ai/npu", 1, None, [])
    assert answer.available == ("rbln1",)
    assert answer.winner is not None and answer.winner.device_ids == ("rbln1",)
