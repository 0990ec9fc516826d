"""The host-layer data inspect relies on: why a PCI path is unreadable, which devices sysfs
shows, every path the rbln-smi search tried, and per-entry / per-record outcomes.

The daemon keeps using the same functions, so each test also checks that its existing
answer did not change.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rbln_device_plugin.host import sysfs as sysfs_module
from rbln_device_plugin.host.smi import (
    DiscoveryError,
    SmiNotFound,
    locate_rbln_smi,
    parse_entries,
    parse_inventory,
)
from rbln_device_plugin.host.sysfs import (
    SysfsDevice,
    explain_pci_path,
    list_sysfs_devices,
    read_device_facts,
    read_pci_path,
)
from rbln_device_plugin.model.inventory import SmiRecord, screen_records, select_records
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import materialize, short_tempdir

from .test_sysfs import add_pci_device

BDF = "0000:05:00.0"


@pytest.fixture(params=["o_path", "realpath"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "realpath":
        monkeypatch.setattr(sysfs_module, "_O_PATH", 0)
    return str(request.param)


def link_dir(root: Path) -> Path:
    path = root / "bus" / "pci" / "devices"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------- PCI path reasons


def test_a_readable_path_has_no_reason(tmp_path: Path, resolver: str) -> None:
    chain = ["pci0000:00", "0000:00:01.0", BDF]
    add_pci_device(tmp_path, chain)
    assert explain_pci_path(tmp_path, BDF) == (tuple(chain), "")
    facts = read_device_facts(tmp_path, BDF)
    assert (facts.pci_path, facts.pci_path_error) == (tuple(chain), "")


def test_missing_link(tmp_path: Path, resolver: str) -> None:
    path, why = explain_pci_path(tmp_path, BDF)
    assert path is None
    assert why == f"{tmp_path}/bus/pci/devices/{BDF} does not exist"


def test_dangling_link_names_its_target(tmp_path: Path, resolver: str) -> None:
    (link_dir(tmp_path) / BDF).symlink_to("../../../devices/pci0000:00/gone")
    path, why = explain_pci_path(tmp_path, BDF)
    assert path is None
    assert why.endswith(
        f"{BDF} -> ../../../devices/pci0000:00/gone does not resolve to a directory"
    )


def test_a_non_pci_segment_is_named(tmp_path: Path, resolver: str) -> None:
    add_pci_device(tmp_path, ["pci0000:00", "0000:00:01.0", "virtual-bridge", BDF])
    path, why = explain_pci_path(tmp_path, BDF)
    assert path is None
    assert "'virtual-bridge' below the host bridge is not a BDF" in why
    assert read_device_facts(tmp_path, BDF).pci_path_error == why


def test_no_host_bridge(tmp_path: Path, resolver: str) -> None:
    add_pci_device(tmp_path, ["platform", "0000:00:01.0", BDF])
    assert "has no pciDDDD:BB host bridge" in explain_pci_path(tmp_path, BDF)[1]


def test_link_to_another_device(tmp_path: Path, resolver: str) -> None:
    target = add_pci_device(tmp_path, ["pci0000:00", "0000:00:01.0", "0000:06:00.0"])
    (link_dir(tmp_path) / BDF).symlink_to(target)
    assert f"not to a directory named {BDF}" in explain_pci_path(tmp_path, BDF)[1]


def test_regular_file_instead_of_a_link(tmp_path: Path, resolver: str) -> None:
    (link_dir(tmp_path) / BDF).write_text("")
    assert "is neither a directory nor a link to one" in explain_pci_path(tmp_path, BDF)[1]


def test_invalid_bus_id_is_never_used_as_a_path(tmp_path: Path) -> None:
    assert explain_pci_path(tmp_path, "../../etc") == (
        None,
        "bus ID '../../etc' is not a PCI address",
    )
    assert read_pci_path(tmp_path, "../../etc") is None


# --------------------------------------------------------------------- sysfs listing


def test_sysfs_lists_the_unlisted_pf_of_a_partitioned_node() -> None:
    root = short_tempdir()
    try:
        node = materialize(preset("rebel-sriov"), root)
        found = list_sysfs_devices(node.sysfs_root)
        expected = {(d.name, d.bus_id) for d in node.layout.devices}
        assert {(d.name, d.bus_id) for d in found} == expected
        assert ("rbln0", "0000:17:00.0") in expected  # rbln-smi does not list this PF
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_sysfs_listing_filters_by_vendor_and_name_shape(tmp_path: Path) -> None:
    ours = add_pci_device(tmp_path, ["pci0000:00", "0000:00:01.0", BDF])
    (ours / "vendor").write_text("0x1eff\n")
    theirs = add_pci_device(tmp_path, ["pci0000:00", "0000:00:02.0", "0000:06:00.0"])
    (theirs / "vendor").write_text("0x10de\n")
    klass = tmp_path / "class" / "rebellions"
    (klass / "rbln1").mkdir(parents=True)
    (klass / "rbln1" / "device").symlink_to("../../../devices/pci0000:00/0000:00:03.0/0000:07:00.0")
    (klass / "rsd0").mkdir()  # not a device name: ignored
    (klass / "rbln2").mkdir()  # no device link: listed without a bus ID
    assert list_sysfs_devices(tmp_path) == [
        SysfsDevice("rbln1", "0000:07:00.0"),
        SysfsDevice("rbln2", None),
        SysfsDevice(None, BDF),
    ]


def test_sysfs_listing_of_an_empty_root_is_empty(tmp_path: Path) -> None:
    assert list_sysfs_devices(tmp_path / "missing") == []


# --------------------------------------------------------------------- rbln-smi search


def test_not_found_lists_candidates_then_path_without_repeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a" / "rbln-smi", tmp_path / "b" / "rbln-smi"
    monkeypatch.setenv("PATH", os.pathsep.join([str(first.parent), str(tmp_path / "c")]))
    with pytest.raises(SmiNotFound) as caught:
        locate_rbln_smi(None, [first, second])
    assert caught.value.tried == (first, second, tmp_path / "c" / "rbln-smi")
    assert isinstance(caught.value, DiscoveryError)  # the daemon still catches it
    assert str(tmp_path / "c") in str(caught.value)


def test_configured_but_unusable_names_only_that_path(tmp_path: Path) -> None:
    with pytest.raises(SmiNotFound) as caught:
        locate_rbln_smi(tmp_path / "nope")
    assert caught.value.tried == (tmp_path / "nope",)


# --------------------------------------------------------------------- per-entry outcomes


def test_parse_entries_keeps_the_raw_entry_of_a_malformed_one() -> None:
    good = {"device": "rbln0", "name": "RBLN-CA25", "pci": {"bus_id": BDF}}
    bad = {"device": "rbln1", "name": "RBLN-CA25"}
    text = json.dumps({"devices": [good, bad]})
    first, second = parse_entries(text)
    assert first.record is not None and first.problem is None
    assert second.record is None and second.raw == bad
    assert second.problem is not None and second.problem.kind == "malformed-entry"
    records, problems = parse_inventory(text)
    assert records == [first.record] and problems == [second.problem]


def test_screen_records_gives_each_record_its_outcome_in_order() -> None:
    records = [
        SmiRecord("rbln0", "RBLN-CA25", "0000:0A:00.0"),
        SmiRecord("rbln1", "RBLN-CA25", "0000:0a:00.0"),
        SmiRecord("bad name", "RBLN-CA25", "0000:0b:00.0"),
    ]
    outcomes = list(screen_records(records))
    assert [(r.name, r.bus_id, p.kind if p else None) for r, p in outcomes] == [
        ("rbln0", "0000:0a:00.0", None),
        ("rbln1", "0000:0a:00.0", "duplicate"),
        ("bad name", "0000:0b:00.0", "invalid-name"),
    ]
    kept, problems = select_records(records)
    assert [r.name for r in kept] == ["rbln0"]
    assert [p.kind for p in problems] == ["duplicate", "invalid-name"]
