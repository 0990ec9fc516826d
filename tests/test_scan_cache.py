"""The scan cache: an unchanged node costs no sysfs reads, and no change is missed.

Real sysfs trees and the simulated rbln-smi; the only instrument is a HostIO that
records which files each scan touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.host.scan import Scanner, ScanResult
from rbln_device_plugin.model.inventory import RESOURCE_NPU, RESOURCE_NPU_VF1, RESOURCE_NPU_VF4
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize

from .fault_helpers import wait_until

T = TypeVar("T")


class RecordingIO(HostIO):
    def __init__(self) -> None:
        super().__init__(timeout=5)
        self.keys: list[str] = []

    async def map(self, calls: Sequence[Call[T]]) -> list[T | Stalled]:
        self.keys += [call.key for call in calls]
        return await super().map(calls)

    def take(self) -> list[str]:
        keys, self.keys = self.keys, []
        return [k for k in keys if k != "rbln-smi lookup"]


def node_and_scanner(root: Path, layout: str) -> tuple[SimNode, Scanner, RecordingIO]:
    node = materialize(preset(layout), root / "node")
    io = RecordingIO()
    scanner = Scanner(sysfs_root=node.sysfs_root, smi_path=node.smi_path, hostio=io)
    return node, scanner, io


def device(result: ScanResult, resource: str, name: str):  # type: ignore[no-untyped-def]
    return next(d for d in result.resources[resource] if d.name == name)


async def test_an_unchanged_node_is_not_read_again(short_tmp: Path) -> None:
    node, scanner, io = node_and_scanner(short_tmp, "rebel-sriov")
    first = await scanner.scan()
    assert io.take()  # the first scan reads SR-IOV files and PCI links
    second = await scanner.scan()
    assert io.take() == []
    assert second.resources == first.resources
    # A change of the listing (here: a status field) reads SR-IOV facts again, but the
    # PCI links of bus IDs that stayed listed are kept.
    node.set_status("rbln3", 4)
    await scanner.scan()
    touched = io.take()
    assert touched and all(key.endswith("sriov_numvfs") for key in touched)


async def test_a_device_that_moved_is_seen_at_its_new_place(short_tmp: Path) -> None:
    node, scanner, _ = node_and_scanner(short_tmp, "rebel-4")
    before = device(await scanner.scan(), RESOURCE_NPU, "rbln2")
    old = node.layout.device("rbln2")
    new_bus = "0000:61:00.0"
    assert old.pci_path is not None
    moved = dataclasses.replace(
        old, bus_id=new_bus, pci_path=("pci0000:60", "0000:60:01.0", new_bus)
    )
    node.remove_device("rbln2")
    node.add_device(moved)
    after = device(await scanner.scan(), RESOURCE_NPU, "rbln2")
    assert (before.bus_id, after.bus_id) == (old.bus_id, new_bus)
    assert after.pci_path == ("pci0000:60", "0000:60:01.0", new_bus)


async def test_a_changed_vf_count_is_seen_on_the_next_scan(short_tmp: Path) -> None:
    node, scanner, _ = node_and_scanner(short_tmp, "rebel-sriov")
    first = await scanner.scan()
    assert [d.name for d in first.resources[RESOURCE_NPU_VF1]] == ["rbln1-0"]
    node.repartition("rbln1", 4)  # vf-1 -> vf-4
    second = await scanner.scan()
    assert RESOURCE_NPU_VF1 not in second.resources
    assert {f"rbln1-{k}" for k in range(4)} <= {d.name for d in second.resources[RESOURCE_NPU_VF4]}
    node.repartition("rbln1", 0)  # vf-4 -> not partitioned: the PF itself
    third = await scanner.scan()
    assert "rbln1" in {d.name for d in third.resources[RESOURCE_NPU]}
    assert not any(d.name.startswith("rbln1-") for d in third.resources[RESOURCE_NPU_VF4])


async def test_a_bus_id_that_comes_back_is_read_afresh(short_tmp: Path) -> None:
    node, scanner, _ = node_and_scanner(short_tmp, "rebel-4")
    old = node.layout.device("rbln1")
    assert device(await scanner.scan(), RESOURCE_NPU, "rbln1").pci_path == old.pci_path
    node.remove_device("rbln1")
    assert "rbln1" not in {d.name for d in (await scanner.scan()).resources[RESOURCE_NPU]}
    # Same bus ID, re-plugged behind another bridge.
    replugged = dataclasses.replace(
        old, pci_path=("pci0000:70", "0000:70:02.0", "0000:71:00.0", old.bus_id)
    )
    node.add_device(replugged)
    back = device(await scanner.scan(), RESOURCE_NPU, "rbln1")
    assert back.pci_path == replugged.pci_path


async def test_a_failed_sriov_read_is_tried_again(short_tmp: Path) -> None:
    node, scanner, _ = node_and_scanner(short_tmp, "rebel-4")
    bus_id = node.layout.device("rbln3").bus_id
    numvfs = node.pci_link(bus_id) / "sriov_numvfs"
    numvfs.write_text("garbage\n")
    first = await scanner.scan()
    assert "rbln3" not in {d.name for d in first.resources[RESOURCE_NPU]}
    numvfs.write_text("0\n")  # the output of rbln-smi did not change
    second = await scanner.scan()
    assert "rbln3" in {d.name for d in second.resources[RESOURCE_NPU]}


async def test_a_pci_link_that_never_resolves_costs_only_that_devices_path(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """realpath on a hung mount: no FIFO can make it block, so the reader is held here."""
    import threading

    from rbln_device_plugin.host import scan

    node = materialize(preset("rebel-4"), short_tmp / "node")
    stuck_bus = node.layout.device("rbln2").bus_id
    release = threading.Event()
    real = scan.read_pci_path

    def read_pci_path(root: Path | str, bus_id: str) -> tuple[str, ...] | None:
        if bus_id == stuck_bus:
            release.wait(30)
        return real(root, bus_id)

    monkeypatch.setattr(scan, "read_pci_path", read_pci_path)
    # Generous: the healthy devices' reads must finish within it even on a loaded machine.
    io = HostIO(timeout=1.0)
    scanner = Scanner(sysfs_root=node.sysfs_root, smi_path=node.smi_path, hostio=io)
    try:
        first = await scanner.scan()
        assert device(first, RESOURCE_NPU, "rbln2").pci_path is None
        for name in ("rbln0", "rbln1", "rbln3"):
            assert device(first, RESOURCE_NPU, name).pci_path is not None
        # While it stays stuck, later scans do not wait for it again.
        assert device(await scanner.scan(), RESOURCE_NPU, "rbln2").pci_path is None
        assert io.threads <= 2
    finally:
        release.set()
    await wait_until(lambda: not io.stuck, 30, "the held read to return")
    again = await scanner.scan()
    assert device(again, RESOURCE_NPU, "rbln2").pci_path == node.layout.device("rbln2").pci_path
