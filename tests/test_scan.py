"""Scanner end to end: a fake rbln-smi script plus a real sysfs-like tree in a tmp dir."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin.host.scan import DiscoveryError, Scanner, ScanResult
from rbln_device_plugin.host.sysfs import read_status
from rbln_device_plugin.model.inventory import RESOURCE_NPU, RESOURCE_NPU_VF4


class Node:
    """A tiny node: sysfs tree, an rbln-smi that prints ``output.json``."""

    def __init__(self, root: Path) -> None:
        self.sysfs = root / "sys"
        self.output = root / "output.json"
        self.calls = root / "calls"
        self.smi = root / "rbln-smi"
        self.smi.write_text(
            f"#!{sys.executable}\nimport sys\n"
            f"open({str(self.calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
            f"sys.stdout.write(open({str(self.output)!r}).read())\n"
        )
        self.smi.chmod(0o755)
        self.devices: list[dict[str, Any]] = []

    def add(
        self,
        name: str,
        bus: str,
        product: str = "RBLN-CA25",
        *,
        status: str | None = "0",
        numvfs: int | None = None,
        physfn: str | None = None,
        numa: str = "0",
    ) -> None:
        self.devices.append(
            {
                "npu": len(self.devices),
                "name": product,
                "sid": "0000000022502229",
                "device": name,
                "pci": {"dev": "1250", "bus_id": bus, "numa_node": numa},
            }
        )
        target = self.sysfs / "devices" / "pci0000:00" / "0000:00:01.0" / bus
        target.mkdir(parents=True, exist_ok=True)
        links = self.sysfs / "bus" / "pci" / "devices"
        links.mkdir(parents=True, exist_ok=True)
        if not (links / bus).is_symlink():
            (links / bus).symlink_to(os.path.relpath(target, links))
        if numvfs is not None:
            (target / "sriov_numvfs").write_text(f"{numvfs}\n")
        if physfn is not None:
            (target / "physfn").symlink_to(f"../{physfn}")
        if status is not None:
            self.set_status(name, status)
        self.publish()

    def set_status(self, name: str, status: str) -> None:
        path = self.sysfs / "class" / "rebellions" / name / "status"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(status + "\n")

    def publish(self) -> None:
        self.output.write_text(json.dumps({"KMD_version": "1", "devices": self.devices}))

    def scanner(self, **kw: Any) -> Scanner:
        return Scanner(sysfs_root=self.sysfs, smi_path=self.smi, **kw)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def names(result: ScanResult, sysfs_root: Path) -> dict[str, list[tuple[str, str]]]:
    """Devices per resource with the status a plugin would read for each."""
    return {
        r: [(d.name, read_status(sysfs_root, d.name).name) for d in ds]
        for r, ds in result.resources.items()
    }


async def test_scan_reports_devices_with_status_and_facts(node: Node) -> None:
    node.add("rbln0", "0000:05:00.0")
    node.add("rbln1", "0000:06:00.0", status="4", numa="-1")
    result = await node.scanner().scan()
    assert names(result, node.sysfs) == {RESOURCE_NPU: [("rbln0", "READY"), ("rbln1", "FAULT")]}
    second = result.resources[RESOURCE_NPU][1]
    assert second.numa is None
    assert second.pci_path == ("pci0000:00", "0000:00:01.0", "0000:06:00.0")
    assert result.device_count == 2


async def test_scan_runs_rbln_smi_exactly_once(node: Node) -> None:
    for i in range(8):
        node.add(f"rbln{i}", f"0000:{i + 5:02x}:00.0")
    await node.scanner().scan()
    assert node.calls.read_text() == "-j\n"


async def test_partitioned_node_advertises_vfs_and_hides_their_pf(node: Node) -> None:
    node.add("rbln0", "0000:17:00.0", "RBLN-CR13", numvfs=4)
    for k in range(4):
        node.add(
            f"rbln0-{k}", f"0000:17:00.{k + 1}", "RBLN-CR13", status=None, physfn="0000:17:00.0"
        )
    node.add("rbln1", "0000:18:00.0", "RBLN-CR13")
    result = await node.scanner().scan()
    assert names(result, node.sysfs) == {
        RESOURCE_NPU_VF4: [(f"rbln0-{k}", "UNREADABLE") for k in range(4)],
        RESOURCE_NPU: [("rbln1", "READY")],
    }
    assert result.resources[RESOURCE_NPU_VF4][0].parent_bus_id == "0000:17:00.0"


async def test_empty_node_has_no_resources(node: Node) -> None:
    node.publish()
    assert (await node.scanner().scan()).resources == {}


async def test_missing_binary_is_a_discovery_failure(tmp_path: Path) -> None:
    scanner = Scanner(
        sysfs_root=tmp_path, candidates=[tmp_path / "nope"], search_path=str(tmp_path)
    )
    with pytest.raises(DiscoveryError, match="rbln-smi not found"):
        await scanner.scan()


async def test_failing_tool_is_a_discovery_failure(node: Node) -> None:
    node.smi.write_text(
        f"#!{sys.executable}\nimport sys\nprint('no driver', file=sys.stderr)\nsys.exit(2)\n"
    )
    with pytest.raises(DiscoveryError, match=r"exited with code 2 .*no driver"):
        await node.scanner().scan()


async def test_garbage_output_is_a_discovery_failure(node: Node) -> None:
    node.output.write_text("Segmentation fault (core dumped)")
    with pytest.raises(DiscoveryError, match="invalid JSON"):
        await node.scanner().scan()


async def test_hanging_tool_is_a_discovery_failure_bounded_by_the_timeout(node: Node) -> None:
    node.smi.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match="timed out"):
        await node.scanner(timeout=0.3).scan()
    assert time.monotonic() - started < 4


async def test_binary_is_looked_up_on_every_scan(tmp_path: Path, node: Node) -> None:
    node.add("rbln0", "0000:05:00.0")
    late = tmp_path / "late" / "rbln-smi"
    scanner = Scanner(sysfs_root=node.sysfs, candidates=[late], search_path=str(tmp_path / "empty"))
    with pytest.raises(DiscoveryError):
        await scanner.scan()
    late.parent.mkdir()
    late.symlink_to(node.smi)
    assert names(await scanner.scan(), node.sysfs) == {RESOURCE_NPU: [("rbln0", "READY")]}


async def test_problem_is_logged_once_while_it_persists(node: Node) -> None:
    node.add("rbln0", "0000:05:00.0")
    node.add("rbln1", "0000:06:00.0", product="RBLN-ZZ99")
    scanner = node.scanner()
    with capture_logs() as logs:
        for _ in range(3):
            result = await scanner.scan()
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


async def test_problem_is_logged_again_after_it_went_away_and_came_back(node: Node) -> None:
    node.add("rbln0", "0000:05:00.0")
    node.add("rbln1", "0000:06:00.0", product="RBLN-ZZ99")
    scanner = node.scanner()
    bad = node.devices.pop()
    with capture_logs() as logs:
        node.devices.append(bad)
        node.publish()
        await scanner.scan()
        node.devices.pop()
        node.publish()
        await scanner.scan()
        node.devices.append(bad)
        node.publish()
        await scanner.scan()
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "Skipping unsupported device"
    ] * 2


async def test_discovery_failure_does_not_reset_problem_memory(node: Node) -> None:
    node.add("rbln1", "0000:06:00.0", product="RBLN-ZZ99")
    scanner = node.scanner()
    with capture_logs() as logs:
        await scanner.scan()
        node.output.write_text("garbage")
        with pytest.raises(DiscoveryError):
            await scanner.scan()
        node.publish()
        await scanner.scan()
    assert len([e for e in logs if e["log_level"] == "error"]) == 1


async def test_malformed_entry_and_sriov_problems_surface_through_the_scan(node: Node) -> None:
    node.add("rbln0", "0000:17:00.0", "RBLN-CR13", numvfs=2)
    node.add("rbln0-0", "0000:17:00.1", "RBLN-CR13", physfn="0000:17:00.0")
    node.devices.append({"device": "rbln9"})
    node.publish()
    with capture_logs() as logs:
        result = await node.scanner().scan()
    assert result.resources == {}
    assert sorted(e["event"] for e in logs) == [
        "Skipping PF with an unsupported VF count",
        "Skipping VF of a PF with an unsupported VF count",
        "Skipping malformed rbln-smi device entry",
    ]
