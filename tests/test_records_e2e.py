"""What the running daemon's records look like, checked against docs/logging.md.

Key order, the logging page's sample record, how odd status values and an empty rbln-smi
listing are reported: each through the daemon's runtime and its own logger, in-process
(tests/inprocess.py), on a simulated node.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from rbln_device_plugin_sim.layout import generate

from .inprocess import daemon_with, running

NPU = "rebellions.ai/npu"
LOGGING_PAGE = Path(__file__).resolve().parent.parent / "docs" / "logging.md"
COUNTS = ["deviceCount", "healthyCount", "unhealthyCount"]
_TS = re.compile(r'"ts":"[^"]*"')


def _readme_sample() -> str:
    """The one-line JSON sample record in the logging page's record format section."""
    section = LOGGING_PAGE.read_text().split("\n## Record format\n", 1)[1].split("\n## ", 1)[0]
    (sample,) = re.findall(r"```json\n(.*?)\n```", section, re.DOTALL)
    return sample


async def test_readme_sample_record_is_what_the_daemon_writes() -> None:
    # The logging page's scene: eight devices, rbln3 goes from READY to FAULT.
    async with running(generate(2, 4), level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 8)
        await h.daemon.await_log("Device exposed", count=8)
        h.node.set_status("rbln3", 4)
        await h.daemon.await_log("Device state changed", device="rbln3")
        (line,) = [raw for raw in h.daemon.lines if '"msg":"Device state changed"' in raw]
    # Byte for byte, except the timestamp.
    assert _TS.sub('"ts":"-"', _readme_sample()) == _TS.sub('"ts":"-"', line.strip())


async def test_inventory_records_list_their_keys_in_catalogue_order() -> None:
    async with running("rebel-4", level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        (registered,) = await h.daemon.await_log("Registered device plugin with kubelet")
        exposed = await h.daemon.await_log("Device exposed", count=4)
        h.node.set_status("rbln1", 4)
        (changed,) = await h.daemon.await_log("Device state changed", device="rbln1")
        device = h.node.layout.device("rbln2")
        h.node.remove_device("rbln2")
        (gone,) = await h.daemon.await_log("Device disappeared from inventory")
        h.node.add_device(device)
        (back,) = await h.daemon.await_log("Device appeared in inventory")
    head = ["ts", "level", "msg", "resourceName"]
    assert list(registered) == ["ts", "level", "msg", "resourceName", *COUNTS, "socketPath"]
    assert all(
        list(r) == [*head, "device", "product", "pciDeviceID", "pciBusID", "numa", "health",
                    "status"]
        for r in exposed
    )  # fmt: skip
    assert list(changed) == [
        *head, "device", "health", "status", "previousHealth", "previousStatus", *COUNTS,
    ]  # fmt: skip
    assert list(gone) == [*head, "device", "health", "status", *COUNTS]
    assert list(back) == [*head, "device", "pciBusID", "health", "status", *COUNTS]


async def test_a_huge_integer_status_is_unknown_and_unhealthy() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln1", "1000000000000000000\n")
        view = await h.kubelet.wait_for(NPU, lambda v: v.health("rbln1") == "Unhealthy")
        assert view.count("Healthy") == 3
        (changed,) = await h.daemon.await_log("Device state changed", device="rbln1")
        assert changed["level"] == "warn"
        assert changed["status"] == "UNKNOWN(1000000000000000000)"
        h.node.set_status("rbln2", "7" * 300)
        (longer,) = await h.daemon.await_log("Device state changed", device="rbln2")
        assert longer["status"] == "UNKNOWN(7777777777777777...300 digits)"
        assert longer["health"] == "Unhealthy"


def _fake_smi(directory: Path, document: str) -> Path:
    script = directory / "rbln-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{document}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _args(tmp: Path, smi: Path) -> list[str]:
    (tmp / "kubelet").mkdir(exist_ok=True)  # the kubelet's to create; a node has it
    return [
        "--kubelet-device-plugin-path", str(tmp / "kubelet"),
        "--cdi-root", str(tmp / "cdi"),
        "--sysfs-root", str(tmp / "sys"),
        "--dev-root", str(tmp / "dev"),
        "--rbln-smi", str(smi),
        "--rsd-lock-path", str(tmp / "rsd.lock"),
        "--healthcheck-port", "-1",
        "--device-scan-interval", "200ms",
    ]  # fmt: skip


async def test_null_devices_is_an_empty_node_not_a_discovery_failure(short_tmp: Path) -> None:
    smi = _fake_smi(short_tmp, '{"KMD_version": "1.2.0", "devices": null}')
    async with daemon_with(_args(short_tmp, smi)) as daemon:
        # Said once: the scanner parses a listing again only when its bytes change.
        null = await daemon.await_log(
            "rbln-smi listed no devices (devices is null); treating it as an empty list"
        )
        reconciled = await daemon.await_log("Reconciled device inventory", count=2)
    assert all(r["level"] == "debug" for r in null)
    assert all(r["deviceCount"] == 0 for r in reconciled)
    assert not [r for r in daemon.records if r["level"] == "error"]


async def test_missing_devices_key_is_still_a_discovery_failure(short_tmp: Path) -> None:
    smi = _fake_smi(short_tmp, '{"KMD_version": "1.2.0"}')
    async with daemon_with(_args(short_tmp, smi)) as daemon:
        (failure,) = await daemon.await_log(
            "Device discovery failed; reporting zero devices until it recovers"
        )
    assert failure["level"] == "error" and "'devices'" in failure["err"]


# ------------------------------------------------------------ status, disappearance, restart
async def test_every_failed_status_read_says_why_at_debug_only() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln1", None)  # missing file
        h.node.set_status("rbln2", "garbage")  # parse error
        missing = await h.daemon.await_log("Cannot read device status", device="rbln1")
        malformed = await h.daemon.await_log("Cannot read device status", device="rbln2")
        for records, path in ((missing, "rbln1"), (malformed, "rbln2")):
            assert all(r["level"] == "debug" for r in records)
            assert all(r["path"] == str(h.node.status_path(path)) for r in records)
        assert "does not exist" in missing[0]["err"]
        assert "malformed status" in malformed[0]["err"]
    # At info, nothing of the kind is written.
    async with running("rebel-4", level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln1", None)
        await h.daemon.await_log("Device state changed", device="rbln1", status="UNREADABLE")
        assert not h.daemon.find("Cannot read device status")


async def test_a_whole_resource_vanishing_logs_each_device_as_disappeared() -> None:
    async with running("rebel-sriov", level="info") as h:
        vf1 = "rebellions.ai/npu-vf1"
        view = await h.kubelet.wait_for(vf1)
        gone = view.ids
        for name in gone:
            h.node.remove_device(name)
        records = await h.daemon.await_log(
            "Device disappeared from inventory", count=len(gone), resourceName=vf1
        )
        await h.daemon.await_log("Stopped device plugin for absent resource", resourceName=vf1)
    assert sorted(r["device"] for r in records) == sorted(gone)
    assert all(r["level"] == "warn" for r in records)
    assert all((r["deviceCount"], r["healthyCount"], r["unhealthyCount"]) == (0, 0, 0)
               for r in records)  # fmt: skip


async def test_a_kubelet_restart_is_not_reported_as_a_lost_stream() -> None:
    async with running("rebel-4", level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        for generation in (2, 3):
            await h.kubelet.restart()
            await h.kubelet.wait_for(
                NPU, lambda v, g=generation: v.generation == g and v.messages > 0
            )
        await h.daemon.await_log(
            "Detected kubelet socket recreation; restarting device plugins", count=2
        )
        assert not h.daemon.find("ListAndWatch stream ended; registering again")
        # A stream that ends on its own still says so.
        await h.kubelet.drop_stream(NPU)
        (lost,) = await h.daemon.await_log("ListAndWatch stream ended; registering again")
        assert lost["level"] == "warn"
        await h.kubelet.wait_for(NPU, lambda v: v.generation == 4)
