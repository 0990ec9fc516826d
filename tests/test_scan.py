"""Scanner end to end on small simulated nodes: the simulator's rbln-smi and sysfs tree."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import DiscoveryError, ScanLimits, Scanner, ScanResult
from rbln_device_plugin.host.sysfs import read_status
from rbln_device_plugin.model import looks
from rbln_device_plugin.model.inventory import RESOURCE_NPU, RESOURCE_NPU_VF4
from rbln_device_plugin_sim.layout import Layout, SimDevice, make_vfs
from rbln_device_plugin_sim.node import SimNode, materialize
from rbln_device_plugin_sim.state import Fault

from .fault_helpers import smi_calls, trace_smi


def chip(
    name: str,
    bus: str,
    product: str = "RBLN-CA25",
    *,
    npu: int,
    status: str | None = "0\n",
    numvfs: int | None = None,
    numa: str = "0",
) -> SimDevice:
    """One device on its own root port of host bridge pci0000:00."""
    return SimDevice(
        name=name,
        npu=npu,
        product=product,
        bus_id=bus,
        sid="0000000022502229",
        numa=numa,
        pci_path=("pci0000:00", "0000:00:01.0", bus),
        status=status,
        sriov_numvfs=numvfs,
    )


def build(root: Path, *devices: SimDevice) -> SimNode:
    return materialize(Layout("scan-test", tuple(devices)), root / "node")


@pytest.fixture
def scanner(hostio: HostIO) -> Callable[[SimNode], Scanner]:
    return lambda node: Scanner(sysfs_root=node.sysfs_root, smi_path=node.smi_path, hostio=hostio)


def names(result: ScanResult, sysfs_root: Path) -> dict[str, list[tuple[str, str]]]:
    """Devices per resource with the status a plugin would read for each."""
    return {
        r: [(d.name, read_status(sysfs_root, d.name).name) for d in ds]
        for r, ds in result.resources.items()
    }


async def test_scan_reports_devices_with_status_and_facts(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    node = build(
        short_tmp,
        chip("rbln0", "0000:05:00.0", npu=0),
        chip("rbln1", "0000:06:00.0", npu=1, status="4\n", numa="-1"),
    )
    result = await scanner(node).scan()
    assert names(result, node.sysfs_root) == {
        RESOURCE_NPU: [("rbln0", "READY"), ("rbln1", "FAULT")]
    }
    second = result.resources[RESOURCE_NPU][1]
    assert second.numa is None
    assert second.pci_path == ("pci0000:00", "0000:00:01.0", "0000:06:00.0")
    assert device_count(result) == 2


async def test_scan_runs_rbln_smi_exactly_once(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    node = build(short_tmp, *(chip(f"rbln{i}", f"0000:{i + 5:02x}:00.0", npu=i) for i in range(8)))
    calls = trace_smi(node)
    await scanner(node).scan()
    assert [c.args for c in smi_calls(calls)] == ["-j"]


async def test_partitioned_node_advertises_vfs_and_hides_their_pf(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    pf = chip("rbln0", "0000:17:00.0", "RBLN-CR13", npu=0, numvfs=4)
    vfs = [dataclasses.replace(vf, status=None) for vf in make_vfs(pf, 4, 1)]
    node = build(short_tmp, pf, *vfs, chip("rbln1", "0000:18:00.0", "RBLN-CR13", npu=5))
    result = await scanner(node).scan()
    assert names(result, node.sysfs_root) == {
        RESOURCE_NPU_VF4: [(f"rbln0-{k}", "UNREADABLE") for k in range(4)],
        RESOURCE_NPU: [("rbln1", "READY")],
    }
    assert result.resources[RESOURCE_NPU_VF4][0].parent_bus_id == "0000:17:00.0"


async def test_empty_node_has_no_resources(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    assert (await scanner(build(short_tmp)).scan()).resources == {}


async def test_missing_binary_is_a_discovery_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostio: HostIO
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    scanner = Scanner(
        sysfs_root=tmp_path, hostio=hostio, limits=ScanLimits(candidates=[tmp_path / "nope"])
    )
    with pytest.raises(DiscoveryError, match="rbln-smi not found"):
        await scanner.scan()


# A failing, garbled or hanging rbln-smi: see test_scan_presets (the same simulator faults).


async def test_a_binary_installed_after_the_start_is_found_by_the_next_scan(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, hostio: HostIO
) -> None:
    node = build(short_tmp, chip("rbln0", "0000:05:00.0", npu=0))
    late = short_tmp / "late" / "rbln-smi"
    monkeypatch.setenv("PATH", str(short_tmp / "empty"))
    scanner = Scanner(
        sysfs_root=node.sysfs_root, hostio=hostio, limits=ScanLimits(candidates=[late])
    )
    with pytest.raises(DiscoveryError):
        await scanner.scan()
    late.parent.mkdir()
    late.symlink_to(node.smi_path)
    assert names(await scanner.scan(), node.sysfs_root) == {RESOURCE_NPU: [("rbln0", "READY")]}


async def test_a_binary_that_went_away_is_named_as_not_found_at_once(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, hostio: HostIO
) -> None:
    node = build(short_tmp, chip("rbln0", "0000:05:00.0", npu=0))
    found = short_tmp / "bin" / "rbln-smi"
    found.parent.mkdir()
    found.symlink_to(node.smi_path)
    monkeypatch.setenv("PATH", str(short_tmp / "empty"))
    scanner = Scanner(
        sysfs_root=node.sysfs_root, hostio=hostio, limits=ScanLimits(candidates=[found])
    )
    await scanner.scan()
    found.unlink()  # the driver package removed: the one found cannot be started
    with pytest.raises(DiscoveryError, match="rbln-smi not found"):
        await scanner.scan()


async def test_a_preferred_binary_installed_later_is_used_from_the_backup_look_on(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, hostio: HostIO
) -> None:
    """The binary found is run without a look per scan; a better candidate that appears
    meanwhile is found by the next backup look, not later."""
    monkeypatch.setattr(looks, "BACKUP_S", 0.3)
    node = build(short_tmp, chip("rbln0", "0000:05:00.0", npu=0))
    preferred, fallback = short_tmp / "driver" / "rbln-smi", short_tmp / "bin" / "rbln-smi"
    fallback.parent.mkdir()
    fallback.symlink_to(node.smi_path)
    monkeypatch.setenv("PATH", str(short_tmp / "empty"))
    scanner = Scanner(
        sysfs_root=node.sysfs_root,
        hostio=hostio,
        limits=ScanLimits(candidates=[preferred, fallback]),
    )
    marker = short_tmp / "preferred-ran"
    await scanner.scan()
    preferred.parent.mkdir()
    preferred.write_text(f'#!/bin/sh\n: > {marker}\nexec {node.smi_path} "$@"\n')
    preferred.chmod(0o755)
    await scanner.scan()
    assert not marker.exists()  # within the backup period: the one found keeps running
    await asyncio.sleep(0.35)
    assert names(await scanner.scan(), node.sysfs_root) == {RESOURCE_NPU: [("rbln0", "READY")]}
    assert marker.exists()


UNSUPPORTED = chip("rbln1", "0000:06:00.0", "RBLN-ZZ99", npu=1)


async def test_problem_is_logged_once_while_it_persists(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    node = build(short_tmp, chip("rbln0", "0000:05:00.0", npu=0), UNSUPPORTED)
    scan = scanner(node)
    with capture_logs() as logs:
        for _ in range(3):
            result = await scan.scan()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert errors == [
        {
            "event": "Skipping unsupported device",
            "log_level": "error",
            "device": "rbln1",
            "product": "RBLN-ZZ99",
            "busID": "0000:06:00.0",
            "reason": "product is not RBLN-CA* or RBLN-CR*",
        }
    ]
    assert len(result.problems) == 1  # still reported as data on every scan


async def test_problem_is_logged_again_after_it_went_away_and_came_back(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    node = build(short_tmp, chip("rbln0", "0000:05:00.0", npu=0), UNSUPPORTED)
    scan = scanner(node)
    with capture_logs() as logs:
        await scan.scan()
        node.remove_device("rbln1")
        await scan.scan()
        node.add_device(UNSUPPORTED)
        await scan.scan()
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "Skipping unsupported device"
    ] * 2


async def test_discovery_failure_does_not_reset_problem_memory(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    node = build(short_tmp, UNSUPPORTED)
    scan = scanner(node)
    with capture_logs() as logs:
        await scan.scan()
        node.inject_fault(Fault("garbage", ("list",), remaining=1))
        with pytest.raises(DiscoveryError):
            await scan.scan()
        await scan.scan()
    assert len([e for e in logs if e["log_level"] == "error"]) == 1


async def test_malformed_entry_and_sriov_problems_surface_through_the_scan(
    short_tmp: Path, scanner: Callable[[SimNode], Scanner]
) -> None:
    pf = chip("rbln0", "0000:17:00.0", "RBLN-CR13", npu=0, numvfs=2)
    node = build(short_tmp, pf, *make_vfs(pf, 2, 1))
    with node.store.transaction() as state:
        state.devices.append({"device": "rbln9"})  # no product, no bus ID
    with capture_logs() as logs:
        result = await scanner(node).scan()
    assert result.resources == {}
    assert sorted((e["event"], e.get("device")) for e in logs) == [
        ("Skipping PF with an unsupported VF count", "rbln0"),
        ("Skipping VF of a PF with an unsupported VF count", "rbln0-0"),
        ("Skipping VF of a PF with an unsupported VF count", "rbln0-1"),
        ("Skipping malformed rbln-smi device entry", None),
    ]


def device_count(result: ScanResult) -> int:
    return sum(len(devices) for devices in result.resources.values())
