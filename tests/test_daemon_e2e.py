"""The daemon end to end: simulated node, kubelet stub, the daemon's runtime.

Behaviour (registration, ListAndWatch, health, discovery failures, kubelet restarts) runs
in-process (tests/inprocess.py); signals and the process's descriptors need the real
daemon process (simnode.running, fault_helpers.launch)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from rbln_device_plugin_sim.state import Fault

from .fault_helpers import assert_settles, launch, take_baseline
from .inprocess import running
from .simnode import running as running_process

NPU = "rebellions.ai/npu"
VF1 = "rebellions.ai/npu-vf1"
VF4 = "rebellions.ai/npu-vf4"
# The README promises exit within 5 s of a shutdown signal; twice that leaves room for a
# loaded machine and still fails a shutdown that hangs.
SHUTDOWN_GUARD_S = 10.0


def numa_of(view: object) -> dict[str, int | None]:
    return {
        d.ID: (d.topology.nodes[0].ID if d.topology.nodes else None)
        for d in view.devices  # type: ignore[attr-defined]
    }


async def test_atom_max_8_registers_32_devices_with_numa() -> None:
    async with running("atom-max-8") as h:
        view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        assert sorted(view.ids) == sorted(f"rbln{i}" for i in range(32))
        assert view.count("Healthy") == 32
        numa = numa_of(view)
        assert numa["rbln0"] == 0 and numa["rbln31"] == 1
        expected = {d.name: int(d.numa) for d in h.node.layout.devices}
        assert numa == expected
        (reg,) = [r for r in h.kubelet.registrations if r.accepted]
        assert reg.version == "v1beta1"
        assert reg.endpoint == "rbln-device-plugin-rebellions-ai-npu.sock"
        assert reg.preferred_allocation is True
        assert h.kubelet.resources() == [NPU]


async def test_rebel_sriov_advertises_vfs_and_plain_pfs_only() -> None:
    async with running("rebel-sriov") as h:
        vf4 = await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)
        vf1 = await h.kubelet.wait_for(VF1, lambda v: len(v.devices) == 1)
        npu = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 2)
        assert sorted(vf4.ids) == ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"]
        assert vf1.ids == ["rbln1-0"]
        assert vf1.health("rbln1-0") == "Healthy"  # a VF without a status file
        assert sorted(npu.ids) == ["rbln2", "rbln3"]  # PFs hosting VFs are not advertised
        assert sorted(h.sockets()) == [
            "kubelet.sock",
            "rbln-device-plugin-rebellions-ai-npu-vf1.sock",
            "rbln-device-plugin-rebellions-ai-npu-vf4.sock",
            "rbln-device-plugin-rebellions-ai-npu.sock",
        ]


async def test_unsupported_vf_count_is_excluded_and_logged() -> None:
    async with running("rebel-sriov-bad") as h:
        vf4 = await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)
        npu = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 1)
        assert sorted(vf4.ids) == ["rbln1-0", "rbln1-1", "rbln1-2", "rbln1-3"]
        assert npu.ids == ["rbln2"]
        assert h.kubelet.resources() == [NPU, VF4]
        # rbln-smi does not list the PF (0000:17:00.0, 2 VFs); each of its VFs says why.
        skipped = await h.daemon.await_log(
            "Skipping VF of a PF with an unsupported VF count", count=2
        )
        assert sorted(r["device"] for r in skipped) == ["rbln0-0", "rbln0-1"]
        assert all(r["level"] == "error" and r["parentBusID"] == "0000:17:00.0" for r in skipped)
        assert all(r["vfCount"] == 2 for r in skipped)


async def test_status_change_reaches_kubelet_and_steady_node_sends_nothing() -> None:
    async with running("rebel-4", interval="300ms") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.daemon.await_log("Reconciled device inventory", count=5)
        view = h.kubelet.view(NPU)
        assert view is not None and view.messages == 1  # nothing changed: nothing sent

        h.node.set_status("rbln3", 4)
        view = await h.kubelet.wait_for(NPU, lambda v: v.health("rbln3") == "Unhealthy")
        assert view.messages == 2
        (change,) = await h.daemon.await_log("Device state changed", device="rbln3")
        assert change["level"] == "warn"
        assert change["resourceName"] == NPU
        assert (change["health"], change["status"]) == ("Unhealthy", "FAULT")
        assert (change["previousHealth"], change["previousStatus"]) == ("Healthy", "READY")
        assert (change["deviceCount"], change["healthyCount"], change["unhealthyCount"]) == (
            4, 3, 1,
        )  # fmt: skip

        h.node.set_status("rbln3", 0)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln3") == "Healthy")
        (recovered,) = await h.daemon.await_log(
            "Device state changed", device="rbln3", health="Healthy"
        )
        assert recovered["level"] == "info"


async def test_registration_and_exposed_records() -> None:
    async with running("rebel-4") as h:
        h.node.set_status("rbln1", 4)  # already faulted when first seen
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        (reg,) = await h.daemon.await_log("Registered device plugin with kubelet")
        assert reg["resourceName"] == NPU
        assert (reg["deviceCount"], reg["healthyCount"], reg["unhealthyCount"]) == (4, 3, 1)
        assert reg["socketPath"].endswith("rbln-device-plugin-rebellions-ai-npu.sock")
        exposed = await h.daemon.await_log("Device exposed", count=4)
        by_device = {r["device"]: r for r in exposed}
        assert by_device["rbln1"]["level"] == "warn"
        assert by_device["rbln1"]["status"] == "FAULT"
        assert by_device["rbln0"]["level"] == "info"
        assert by_device["rbln0"]["product"] == "RBLN-CR13"
        assert by_device["rbln0"]["pciDeviceID"] == "2130"
        assert by_device["rbln0"]["numa"] == 0
        assert by_device["rbln0"]["pciBusID"] == h.node.layout.device("rbln0").bus_id


async def test_discovery_failure_stops_plugins_and_recovery_restarts_them() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.inject_fault(Fault("error", commands=("list",)))
        await h.daemon.await_log("Stopped device plugin for absent resource", resourceName=NPU)
        failures = await h.daemon.await_log(
            "Device discovery failed; reporting zero devices until it recovers", count=2
        )
        assert all(r["level"] == "error" and "rbln-smi" in r["err"] for r in failures)
        assert h.sockets() == ["kubelet.sock"]
        h.node.clear_faults()
        await h.daemon.await_log("Registered device plugin with kubelet", count=2)
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and len(v.devices) == 4)
        assert view.count("Healthy") == 4


@pytest.mark.slow  # waits out the 5 s rbln-smi limit
async def test_garbage_and_hanging_rbln_smi_are_discovery_failures() -> None:
    async with running("rebel-4", interval="200ms") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.inject_fault(Fault("garbage", commands=("list",)))
        (failure,) = await h.daemon.await_log(
            "Device discovery failed; reporting zero devices until it recovers"
        )
        assert "JSON" in failure["err"] or "json" in failure["err"]
        h.node.clear_faults()
        h.node.inject_fault(Fault("hang", commands=("list",)))
        (hung,) = await h.daemon.await_log(
            "Device discovery failed; reporting zero devices until it recovers",
            timeout=20,
            where=lambda r: "timed out" in r["err"],
        )
        assert "rbln-smi" in hung["err"] and "-j" in hung["err"]
        h.node.clear_faults()
        await h.kubelet.wait_for(NPU, lambda v: v.generation >= 2 and len(v.devices) == 4, 20)


async def test_history_survives_disappearance_and_a_kubelet_restart() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln2", 4)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln2") == "Unhealthy")
        device = h.node.layout.device("rbln2")
        h.node.remove_device("rbln2")
        await h.kubelet.wait_for(NPU, lambda v: "rbln2" not in v.ids)
        (gone,) = await h.daemon.await_log("Device disappeared from inventory", device="rbln2")
        assert gone["level"] == "warn" and gone["deviceCount"] == 3
        h.node.add_device(device)
        h.node.set_status("rbln2", "garbage")  # unreadable: history keeps it Unhealthy
        view = await h.kubelet.wait_for(NPU, lambda v: "rbln2" in v.ids)
        assert view.health("rbln2") == "Unhealthy"
        (back,) = await h.daemon.await_log("Device appeared in inventory", device="rbln2")
        assert back["level"] == "warn" and back["status"].startswith("UNREADABLE")

        # A new plugin instance, the same history: still Unhealthy in its first list.
        await h.kubelet.restart()
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and len(v.devices) == 4)
        assert view.messages == 1 and view.health("rbln2") == "Unhealthy"
        h.node.set_status("rbln2", 0)  # a READY read resolves it
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln2") == "Healthy")


# What the daemon says when the kubelet's streams end because the kubelet exited.
KUBELET_GONE = "Kubelet is not serving; waiting for it to start again"
STREAM_LOST = "ListAndWatch stream ended; registering again"


async def test_a_kubelet_restart_that_takes_seconds_logs_no_error_and_no_lost_stream() -> None:
    """A real kubelet restart (seen on the real node, tests/test_realnode.py): the process
    exits, its kubelet.sock stays behind refusing connections for the seconds until the
    next kubelet starts. That is a restart, not a lost stream, and no error."""
    resources = [NPU, VF1, VF4]
    async with running("rebel-sriov", interval="300ms") as h:
        for resource in resources:
            await h.kubelet.wait_for(resource, lambda v: len(v.devices) > 0)
        mark = len(h.daemon.records)
        await h.kubelet.die()
        # The daemon's reaction to the ended streams, before the next kubelet starts.
        reaction, *_ = await h.daemon.await_log(
            None, where=lambda r: r["msg"] in (KUBELET_GONE, STREAM_LOST)
        )
        await asyncio.sleep(1.0)  # a few scans with the kubelet down: still no error
        await h.kubelet.start()
        await h.daemon.await_log("Detected kubelet socket recreation; restarting device plugins")
        for resource in resources:
            await h.kubelet.wait_for(resource, lambda v: v.generation >= 2 and v.messages > 0)
        later = h.daemon.records[mark:]
        assert reaction["msg"] == KUBELET_GONE and reaction["level"] == "info", reaction
        assert [r for r in later if r["level"] == "error"] == []
        assert STREAM_LOST not in [r["msg"] for r in later]
        # Once per outage, not once per resource or per scan.
        assert [r["msg"] for r in later].count(KUBELET_GONE) == 1


async def test_dropped_stream_is_reregistered() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.kubelet.drop_stream(NPU)
        await h.daemon.await_log("ListAndWatch stream ended; registering again")
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and v.messages >= 1)
        assert len(view.devices) == 4


@pytest.mark.slow
async def test_kubelet_restarts_twenty_times_without_leaks() -> None:
    resources = [NPU, VF1, VF4]
    async with launch("rebel-sriov", interval="1s") as h:
        for resource in resources:
            await h.kubelet.wait_for(resource, lambda v: len(v.devices) > 0)
        base = await take_baseline(h, resources)
        for generation in range(2, 22):
            await h.kubelet.restart()
            for resource in resources:
                await h.kubelet.wait_for(
                    resource, lambda v, g=generation: v.generation >= g and v.messages > 0
                )
        # Back to the idle baseline: descriptors, tasks, one stream and one socket per
        # resource (the replaced servers' grace periods end on their own).
        await assert_settles(h, base, resources)
        # Each restart was detected once: every detection precedes the re-registration it
        # causes, so once the daemon has exited all of them are in the records.
        assert await asyncio.to_thread(h.daemon.stop) == 0
        detected = "Detected kubelet socket recreation; restarting device plugins"
        assert len(h.daemon.find(detected)) == 20


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
async def test_shutdown_removes_sockets_and_ends_streams(sig: signal.Signals) -> None:
    async with running_process("rebel-sriov") as h:
        for resource in (NPU, VF1, VF4):
            await h.kubelet.wait_for(resource, lambda v: len(v.devices) > 0)
        code = await asyncio.to_thread(h.daemon.stop, sig, SHUTDOWN_GUARD_S)
        assert code == 0
        assert h.sockets() == ["kubelet.sock"]
        for resource in (NPU, VF1, VF4):
            await h.kubelet.wait_for(resource, lambda v: v.ended is not None)


async def test_the_device_plugin_mode_maps_no_tls_library() -> None:
    """OpenSSL's libraries (libssl, libcrypto: about 4 MiB resident) are for dra mode's API
    server client; a device-plugin daemon that has scanned, registered and looked for a
    DRA checkpoint (a node switched between the modes) has neither mapped."""
    async with running_process("rebel-4", interval="100ms") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.daemon.await_log("Device exposed", count=4)
        await asyncio.sleep(0.5)  # a few scans more
        maps = Path(f"/proc/{h.daemon.proc.pid}/maps").read_text()
    mapped = {line.rsplit("/", 1)[-1].split(".")[0] for line in maps.splitlines() if ".so" in line}
    assert not mapped & {"libssl", "libcrypto", "_ssl"}, sorted(
        mapped & {"libssl", "libcrypto", "_ssl"}
    )
