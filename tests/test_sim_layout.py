"""Layouts as data: presets, the generator, JSON round trips, and what is rejected."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_device_plugin_sim.layout import PRESETS, Layout, LayoutError, SimDevice, generate, preset
from rbln_device_plugin_sim.node import SimError, SimNode, materialize, short_tempdir


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("rbln-t-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _hierarchy(node: SimNode, bus_id: str) -> list[str]:
    real = Path(os.path.realpath(node.pci_link(bus_id)))
    return list(real.relative_to(node.sysfs_root.resolve() / "devices").parts)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_materialises_and_round_trips(name: str, root: Path) -> None:
    layout = preset(name)
    assert Layout.from_json(layout.to_json()) == layout
    node = materialize(layout, root / "n")
    reopened = SimNode.open(node.root)
    assert reopened.layout == layout
    for dev in layout.devices:
        assert (node.dev_root / dev.name).is_file()
        if dev.pci_path is not None:
            assert _hierarchy(node, dev.bus_id) == list(dev.pci_path)
        else:
            assert not node.pci_link(dev.bus_id).exists()


def test_atom_max_8_has_realistic_cards() -> None:
    layout = preset("atom-max-8")
    assert [d.name for d in layout.devices] == [f"rbln{i}" for i in range(32)]
    assert {d.product for d in layout.devices} == {"RBLN-CA25"}
    sids = Counter(d.sid for d in layout.devices)
    assert len(sids) == 8 and set(sids.values()) == {4}
    assert all(len(sid) == 16 and sid.isdigit() for sid in sids)
    numa_of_card = {d.sid: d.numa for d in layout.devices}
    assert list(numa_of_card.values()) == ["0"] * 4 + ["1"] * 4
    # Root, root port, switch up, switch down, endpoint; each chip on its own bus.
    assert {len(d.pci_path or ()) for d in layout.devices} == {5}
    assert len({d.bus_id.split(":")[1] for d in layout.devices}) == 32
    card0 = [d for d in layout.devices if d.sid == "0000000022502229"]
    assert len({d.pci_path[:3] for d in card0 if d.pci_path}) == 1  # one switch per card


def test_generate_builds_large_nodes_without_bus_clashes() -> None:
    layout = generate(16, 4, 2)
    assert len(layout.devices) == 64
    assert len({d.bus_id for d in layout.devices}) == 64
    assert Counter(d.numa for d in layout.devices) == {"0": 32, "1": 32}
    with pytest.raises(LayoutError):
        generate(0, 4)


def test_rebel_4_and_sriov_presets() -> None:
    assert [d.pci_dev for d in preset("rebel-4").devices] == ["2130"] * 4
    sriov = preset("rebel-sriov")
    vfs = [d for d in sriov.devices if d.is_vf]
    assert [v.name for v in vfs] == ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3", "rbln1-0"]
    assert {v.pci_dev for v in vfs} == {"2131"}
    assert [v.bus_id for v in vfs[:4]] == [f"0000:17:00.{k}" for k in range(1, 5)]
    assert not sriov.device("rbln0").listed and sriov.device("rbln1").listed
    assert sriov.device("rbln1-0").status is None
    assert preset("rebel-sriov-bad").device("rbln0").sriov_numvfs == 2


def test_readme_example_matches_the_drawn_tree() -> None:
    layout = preset("readme-example")

    def distance(a: str, b: str) -> int:
        pa, pb = layout.device(a).pci_path, layout.device(b).pci_path
        assert pa is not None and pb is not None
        common = 0
        while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
            common += 1
        return len(pa) + len(pb) - 2 * common

    assert (distance("rbln0", "rbln2"), distance("rbln0", "rbln1")) == (2, 4)
    assert distance("rbln0", "rbln4") == 6
    assert layout.device("rbln5").pci_path[0] != layout.device("rbln0").pci_path[0]  # type: ignore[index]
    assert layout.device("rbln6").pci_path is None
    assert len({d.sid for d in layout.devices}) == 7


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"devices": [1]}',
        '{"devices": [{"name": "rbln0"}]}',
        '{"devices": [{"name": "rbln0", "npu": 0, "product": "RBLN-CA25",'
        ' "bus_id": "0000:01:00.0", "colour": "red"}]}',
    ],
)
def test_malformed_layout_json_is_a_clear_error(text: str) -> None:
    with pytest.raises(LayoutError):
        Layout.from_json(text)


def test_inconsistent_layouts_are_rejected() -> None:
    dev = SimDevice("rbln0", 0, "RBLN-CA25", "0000:01:00.0")
    with pytest.raises(LayoutError, match="duplicate name"):
        Layout("x", (dev, dataclasses.replace(dev, npu=1, bus_id="0000:02:00.0")))
    with pytest.raises(LayoutError, match="BDF"):
        Layout("x", (dataclasses.replace(dev, bus_id="0000:1:00.0"),))
    with pytest.raises(LayoutError, match="pci_path"):
        Layout("x", (dataclasses.replace(dev, pci_path=("pci0000:00", "../../etc")),))
    with pytest.raises(LayoutError, match="physfn"):
        Layout("x", (dataclasses.replace(dev, physfn="0000:09:00.0"),))
    with pytest.raises(LayoutError, match="unknown preset"):
        preset("nope")


def test_materialise_refuses_long_roots_and_existing_nodes(root: Path) -> None:
    with pytest.raises(SimError, match="too long"):
        materialize(preset("rebel-4"), root / ("x" * 80))
    materialize(preset("rebel-4"), root / "n")
    with pytest.raises(SimError, match="already"):
        materialize(preset("rebel-4"), root / "n")
    with pytest.raises(SimError, match="no simulated node"):
        SimNode.open(root / "missing")


def test_layout_file_is_plain_json_an_operator_can_edit(root: Path) -> None:
    node = materialize(preset("readme-example"), root / "n")
    data = json.loads(node.layout_path.read_text())
    assert data["name"] == "readme-example"
    assert data["devices"][6]["pci_path"] is None
