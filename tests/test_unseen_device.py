"""One device that rbln-smi lists but sysfs does not show, while sysfs shows the rest.

The README: "Unknown PCI information only affects that device; valid paths between the
other selected devices remain usable". The Go plugin classifies such a device as not
partitioned (``TestProbeSRIOV/device missing from sysfs``) and its preferred allocation
keeps it with an unknown placement (``TestPCIAllocationExamples/missing mandatory PCI keeps
other distances``). rbln-smi's own listing still rules a VF or a PF hosting VFs out.
Everything here runs the daemon (or ``inspect``, or the DRA publisher) against a simulated
node whose sysfs lacks that one device's PCI directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from rbln_device_plugin.dra import slices
from rbln_device_plugin_sim.layout import Layout, preset
from rbln_device_plugin_sim.node import SimNode

from .dra_scan import scanned
from .inprocess import running

NPU, VF1, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"
UNSEEN = "Skipping device that sysfs does not show"
ALL = [f"rbln{i}" for i in range(7)]

pytestmark = pytest.mark.asyncio(loop_scope="module")


def rebel_readme() -> Layout:
    """The README's PCI tree on REBEL (CR13) devices, as Go's standard PCI fixture has it:
    rbln6 has no ``bus/pci/devices`` entry at all."""
    base = preset("readme-example")
    devices = tuple(dataclasses.replace(d, product="RBLN-CR13") for d in base.devices)
    assert base.device("rbln6").pci_path is None
    return Layout("rebel-readme", devices)


def unlink(*names: str) -> Callable[[SimNode], None]:
    """A ``prepare`` step: these devices' ``bus/pci/devices`` links are gone."""

    def prepare(node: SimNode) -> None:
        for name in names:
            node.pci_link(node.layout.device(name).bus_id).unlink()

    return prepare


async def test_a_rebel_pf_sysfs_does_not_show_is_a_whole_npu_and_allocates() -> None:
    # Go's TestProbeSRIOV "device missing from sysfs": not partitioned, so rebellions.ai/npu.
    async with running("rebel-4", interval="1h", prepare=unlink("rbln3")) as h:
        view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        assert view.health("rbln3") == "Healthy"
        assert not h.daemon.find(UNSEEN)
        assert not h.daemon.find("Skipping device with indeterminate SR-IOV state")
        # Allocate runs the RSD sequence for it like for any PF.
        response = await h.kubelet.allocate(NPU, [["rbln3", "rbln0"]])
        (container,) = response.container_responses
        dev = h.node.dev_root
        assert [(d.container_path, d.host_path) for d in container.devices] == [
            ("/dev/rsd0", str(dev / "rsd1")),
            ("/dev/rbln3", str(dev / "rbln3")),
            ("/dev/rbln0", str(dev / "rbln0")),
        ]
        assert {gid: sorted(n) for gid, n in h.node.groups().items() if gid != "0"} == {
            "1": ["rbln0", "rbln3"]
        }


async def test_a_required_rebel_pf_without_pci_data_keeps_the_other_distances() -> None:
    # Go's TestPCIAllocationExamples "missing mandatory PCI keeps other distances", and the
    # README's row "Include 6, choose 3": rbln6 kept, the known pair rbln0/rbln2 chosen.
    async with running(rebel_readme(), interval="1h") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 7)
        for available in (ALL, [*reversed(ALL), "rbln6"]):  # Go's second pass, duplicate kept
            assert await h.kubelet.preferred(NPU, available, ["rbln6"], 3) == [
                "rbln6",
                "rbln0",
                "rbln2",
            ]
        # Without it, the unknown placement counts against a combination, as any other
        # unreadable PCI path does.
        assert await h.kubelet.preferred(NPU, ["rbln0", "rbln4", "rbln6"], ["rbln0"], 2) == [
            "rbln0",
            "rbln4",
        ]
        response = await h.kubelet.allocate(NPU, [["rbln6"]])
        assert [d.container_path for d in response.container_responses[0].devices] == [
            "/dev/rsd0",
            "/dev/rbln6",
        ]


async def test_an_unseen_pf_whose_vfs_rbln_smi_lists_is_not_advertised() -> None:
    # rebel-sriov: rbln1 (listed) hosts rbln1-0 in vf-1; rbln2 is a plain PF.
    async with running("rebel-sriov", interval="1h", prepare=unlink("rbln1")) as h:
        view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 2)
        assert sorted(view.ids) == ["rbln2", "rbln3"]
        (record,) = await h.daemon.await_log(UNSEEN, device="rbln1")
        assert record["level"] == "error"
        assert record["reason"] == "rbln-smi lists VFs of it: a PF hosting VFs is not advertised"
        # Its VF cannot read the partition mode through it: not advertised either.
        assert h.daemon.find("Skipping device with indeterminate SR-IOV state", device="rbln1-0")
        assert VF1 not in h.kubelet.resources()
        assert len((await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)).ids) == 4


async def test_a_vf_sysfs_does_not_show_is_not_advertised() -> None:
    async with running("rebel-sriov", interval="1h", prepare=unlink("rbln0-2")) as h:
        view = await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 3)
        assert "rbln0-2" not in view.ids
        (record,) = await h.daemon.await_log(UNSEEN, device="rbln0-2")
        assert "a VF by its rbln-smi name" in record["reason"]
        npu = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 2)
        assert "rbln0-2" not in npu.ids


async def test_the_dra_publisher_offers_it_whole_without_a_pcie_root() -> None:
    async with scanned(rebel_readme()) as node:
        entries = node.entries()
        assert sorted(entries[NPU]) == sorted(ALL)
        pool = slices.build_pool("node-a", entries)
        assert pool.omissions == ()
        published = {d["name"]: d["attributes"] for s in pool.slices for d in s.devices}
        rbln6 = published["rbln6"]
        assert "resource.kubernetes.io/pcieRoot" not in rbln6
        bus = node.sim.layout.device("rbln6").bus_id
        assert rbln6["resource.kubernetes.io/pciBusID"] == {"string": bus}
        assert rbln6["deviceType"] == {"string": "npu"}
        assert published["rbln0"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
