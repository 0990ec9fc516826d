"""The Scanner against every simulated-node preset, plus discovery failures via faults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import DiscoveryError, ScanLimits, Scanner, ScanResult
from rbln_device_plugin.host.sysfs import read_status
from rbln_device_plugin.model.inventory import RESOURCE_NPU, RESOURCE_NPU_VF1, RESOURCE_NPU_VF4
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize
from rbln_device_plugin_sim.state import Fault


@pytest.fixture
def sim(short_tmp: Path) -> Iterator[SimNode]:
    yield materialize(preset("rebel-sriov"), short_tmp / "node")


def load(short_tmp: Path, name: str) -> SimNode:
    return materialize(preset(name), short_tmp / "node")


@pytest.fixture
def scanner(hostio: HostIO) -> Callable[..., Scanner]:
    def make(node: SimNode, timeout: float = 5.0) -> Scanner:
        return Scanner(
            sysfs_root=node.sysfs_root,
            smi_path=node.smi_path,
            hostio=hostio,
            limits=ScanLimits(timeout=timeout),
        )

    return make


def inventory(result: ScanResult) -> dict[str, list[str]]:
    return {r: [d.name for d in ds] for r, ds in result.resources.items()}


async def test_atom_max_8(short_tmp: Path, scanner: Callable[..., Scanner]) -> None:
    node = load(short_tmp, "atom-max-8")
    result = await scanner(node).scan()
    assert inventory(result) == {RESOURCE_NPU: [f"rbln{i}" for i in range(32)]}
    assert result.problems == ()
    devices = list(result.resources[RESOURCE_NPU])
    assert {d.numa for d in devices[:16]} == {0} and {d.numa for d in devices[16:]} == {1}
    assert len({d.sid for d in devices}) == 8  # four chips per card share a SID
    # The PCI hierarchy read back from sysfs is the one the simulator built.
    assert [d.pci_path for d in devices] == [dev.pci_path for dev in node.layout.devices]
    assert all(read_status(node.sysfs_root, d.name).name == "READY" for d in devices)


async def test_rebel_4(short_tmp: Path, scanner: Callable[..., Scanner]) -> None:
    result = await scanner(load(short_tmp, "rebel-4")).scan()
    assert inventory(result) == {RESOURCE_NPU: ["rbln0", "rbln1", "rbln2", "rbln3"]}
    assert {d.product for d in result.resources[RESOURCE_NPU]} == {"RBLN-CR13"}


async def test_rebel_sriov(sim: SimNode, scanner: Callable[..., Scanner]) -> None:
    result = await scanner(sim).scan()
    assert inventory(result) == {
        RESOURCE_NPU_VF4: ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"],
        RESOURCE_NPU_VF1: ["rbln1-0"],
        RESOURCE_NPU: ["rbln2", "rbln3"],
    }
    assert result.problems == ()
    vf1 = result.resources[RESOURCE_NPU_VF1][0]
    assert vf1.parent_bus_id == "0000:2a:00.0"
    assert read_status(sim.sysfs_root, vf1.name).name == "UNREADABLE"  # no status file


async def test_rebel_sriov_bad(short_tmp: Path, scanner: Callable[..., Scanner]) -> None:
    with capture_logs() as logs:
        result = await scanner(load(short_tmp, "rebel-sriov-bad")).scan()
    assert inventory(result) == {
        RESOURCE_NPU_VF4: ["rbln1-0", "rbln1-1", "rbln1-2", "rbln1-3"],
        RESOURCE_NPU: ["rbln2"],
    }
    errors = [(e["event"], e["device"]) for e in logs if e["log_level"] == "error"]
    assert errors == [
        ("Skipping VF of a PF with an unsupported VF count", "rbln0-0"),
        ("Skipping VF of a PF with an unsupported VF count", "rbln0-1"),
    ]


async def test_readme_example(short_tmp: Path, scanner: Callable[..., Scanner]) -> None:
    result = await scanner(load(short_tmp, "readme-example")).scan()
    devices = {d.name: d for d in result.resources[RESOURCE_NPU]}
    assert sorted(devices) == [f"rbln{i}" for i in range(7)]
    assert devices["rbln6"].pci_path is None
    assert devices["rbln5"].pci_path == ("pci0000:80", "0000:80:01.0", "0000:81:00.0")


async def test_status_changes_are_seen_by_the_next_scan(
    sim: SimNode, scanner: Callable[..., Scanner]
) -> None:
    sim.set_status("rbln2", 4)
    sim.set_status("rbln3", "garbage")
    result = await scanner(sim).scan()
    statuses = {
        d.name: read_status(sim.sysfs_root, d.name).name for d in result.resources[RESOURCE_NPU]
    }
    assert statuses == {"rbln2": "FAULT", "rbln3": "UNREADABLE"}


async def test_failing_rbln_smi_is_a_discovery_failure(
    sim: SimNode, scanner: Callable[..., Scanner]
) -> None:
    sim.inject_fault(Fault("error", ("list",), exit_code=3, message="driver gone"))
    with pytest.raises(DiscoveryError, match=r"exited with code 3 .*driver gone"):
        await scanner(sim).scan()


async def test_hanging_rbln_smi_is_bounded_by_the_timeout(
    sim: SimNode, scanner: Callable[..., Scanner]
) -> None:
    # The fault hangs for an hour: a scan that waited for the tool would hang the test.
    sim.inject_fault(Fault("hang", ("list",)))
    with pytest.raises(DiscoveryError, match="timed out"):
        await scanner(sim, timeout=0.5).scan()


async def test_garbage_from_rbln_smi_is_a_discovery_failure(
    sim: SimNode, scanner: Callable[..., Scanner]
) -> None:
    sim.inject_fault(Fault("garbage", ("list",)))
    with pytest.raises(DiscoveryError, match="invalid JSON"):
        await scanner(sim).scan()


async def test_recovers_after_the_fault_is_cleared(
    sim: SimNode, scanner: Callable[..., Scanner]
) -> None:
    sim.inject_fault(Fault("garbage", ("list",)))
    scan = scanner(sim)
    with pytest.raises(DiscoveryError):
        await scan.scan()
    sim.clear_faults()
    assert device_count(await scan.scan()) == 7


def device_count(result: ScanResult) -> int:
    return sum(len(devices) for devices in result.resources.values())
