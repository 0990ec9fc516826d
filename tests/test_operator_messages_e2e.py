"""What an operator reads when the kubelet or discovery is away: said once, and once more
when it is back. The real daemon against a simulated node, with and without a kubelet."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from rbln_device_plugin.api import KUBELET_SOCKET
from rbln_device_plugin.host import pluginsocket
from rbln_device_plugin.host.kubeletdir import FOUND_MSG, MISSING_MSG
from rbln_device_plugin.model.resources import socket_name
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.state import Fault

from .daemon_process import DaemonProcess
from .fault_helpers import NPU, VF1, VF4, next_reconcile, wait_until
from .inprocess import daemon_on

REG_FAILED = "Device plugin registration failed; retrying next scan"
REGISTERED = "Registered device plugin with kubelet"
OVERTAKEN = "Device plugin registration overtaken by a kubelet restart or a removed socket"
SOCKET_REMOVED = "Device plugin socket was removed; restarting the plugin"
DISCOVERY_FAILED = "Device discovery failed; reporting zero devices until it recovers"
RECOVERED = "Device discovery recovered"
SRIOV = (NPU, VF1, VF4)


@asynccontextmanager
async def node_without_kubelet(layout: str) -> AsyncIterator[SimNode]:
    root = short_tempdir()
    try:
        yield materialize(preset(layout), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def by_resource(records: list[dict[str, object]]) -> dict[object, int]:
    counts: dict[object, int] = {}
    for record in records:
        counts[record["resourceName"]] = counts.get(record["resourceName"], 0) + 1
    return counts


async def test_no_kubelet_is_one_error_per_resource_and_reason_then_one_record_on_success() -> None:
    async with node_without_kubelet("rebel-sriov") as node, daemon_on(node, "200ms") as daemon:
        # Several scans, each retrying every registration.
        for _ in range(4):
            await next_reconcile(daemon)
        await daemon.await_log(REG_FAILED, where=lambda r: r["failedAttempts"] >= 3)
        errors = [r for r in daemon.find(REG_FAILED) if r["level"] == "error"]
        assert by_resource(errors) == dict.fromkeys(SRIOV, 1), errors
        assert all("No such file or directory" in str(r["err"]) for r in errors)

        # A new reason (something listens nowhere at kubelet.sock) is said once more.
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(node.kubelet_dir / KUBELET_SOCKET))
        try:
            await daemon.await_log(
                REG_FAILED, where=lambda r: "Connection refused" in str(r["err"]), count=3
            )
            for _ in range(3):
                await next_reconcile(daemon)
        finally:
            dead.close()
            (node.kubelet_dir / KUBELET_SOCKET).unlink()
        errors = [r for r in daemon.find(REG_FAILED) if r["level"] == "error"]
        assert by_resource(errors) == dict.fromkeys(SRIOV, 2), errors

        async with KubeletStub(node.kubelet_dir) as kubelet:
            for resource in SRIOV:
                await kubelet.wait_for(resource)
            registered = await daemon.await_log(REGISTERED, count=3)
            await next_reconcile(daemon)
    assert by_resource(registered) == dict.fromkeys(SRIOV, 1)
    failed_before = {r["resourceName"]: r["failedAttempts"] for r in registered}
    # A failure the removal of kubelet.sock overtook is counted too, in a record of its own.
    failures = [r for r in daemon.records if r["msg"] in (REG_FAILED, OVERTAKEN)]
    last_failure = {r["resourceName"]: r["failedAttempts"] for r in failures}
    assert failed_before == last_failure  # every failed attempt is counted, none invented
    # Each failure is an error only when its reason differs from the one before; the
    # repeats are kept at debug: there when asked for, silent at info.
    previous: dict[object, object] = {}
    for record in daemon.find(REG_FAILED):
        said_before = previous.get(record["resourceName"]) == record["err"]
        assert record["level"] == ("debug" if said_before else "error"), record
        previous[record["resourceName"]] = record["err"]


async def test_a_registration_that_never_failed_carries_no_failure_count() -> None:
    async with (
        node_without_kubelet("rebel-4") as node,
        KubeletStub(node.kubelet_dir),
        daemon_on(node, "200ms") as daemon,
    ):
        (record,) = await daemon.await_log(REGISTERED)
    assert "failedAttempts" not in record
    assert not daemon.find(REG_FAILED)


async def silent_kubelet_holding_a_registration(node: SimNode) -> KubeletStub:
    """A kubelet that has received the daemon's Register and not answered it yet."""
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    kubelet.go_silent()
    return kubelet


async def test_a_kubelet_restart_under_a_registration_is_no_registration_error() -> None:
    """A storm of kubelet restarts (ci9) cut registrations short; each was an error
    record although the restart explains it and the daemon registers again anyway."""
    async with node_without_kubelet("rebel-4") as node:
        kubelet = await silent_kubelet_holding_a_registration(node)
        try:
            async with daemon_on(node, "200ms") as daemon:
                await wait_until(lambda: bool(kubelet.silent_calls), 10, "a held Register call")
                await kubelet.restart()  # the held Register is cut off with the old server
                kubelet.speak()
                await kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
                (registered,) = await daemon.await_log(REGISTERED)
        finally:
            await kubelet.stop()
    assert not [r for r in daemon.records if r["level"] == "error"]
    assert not daemon.find(REG_FAILED), daemon.find(REG_FAILED)
    (overtaken,) = daemon.find(OVERTAKEN)
    assert overtaken["level"] == "debug" and overtaken["resourceName"] == NPU
    # The attempt the restart cut short is counted, as the registration metric counts it.
    assert registered["failedAttempts"] == 1, registered


async def test_a_plugin_socket_removed_under_a_registration_is_said_once_as_the_removal() -> None:
    """The kubelet's call back to a socket that is gone fails the registration: the
    removal is the news (a warning, and a new socket), not a registration error."""
    async with node_without_kubelet("rebel-4") as node:
        kubelet = await silent_kubelet_holding_a_registration(node)
        try:
            async with daemon_on(node, "200ms") as daemon:
                await wait_until(lambda: bool(kubelet.silent_calls), 10, "a held Register call")
                (node.kubelet_dir / kubelet.silent_calls[0].endpoint).unlink()
                kubelet.speak()
                (removed,) = await daemon.await_log(SOCKET_REMOVED)
                await kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        finally:
            await kubelet.stop()
    assert not [r for r in daemon.records if r["level"] == "error"]
    assert not daemon.find(REG_FAILED), daemon.find(REG_FAILED)
    assert removed["level"] == "warn"
    (overtaken,) = daemon.find(OVERTAKEN)
    assert "GetDevicePluginOptions" in str(overtaken["err"]), overtaken


async def test_a_kubelet_directory_removed_just_before_a_bind_is_the_directory_warning_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kubelet directory deleted while the daemon restarted a plugin (ci, run 1 of
    2026-12-02): the scan saw the directory, the bind found it gone, and the plugin's
    start failure was an error record beside the directory's own warning."""
    clear = pluginsocket.clear
    removed: list[Path] = []

    def directory_gone_first(socket_path: Path) -> object:
        if not removed:  # once: the first bind after the kubelet's directory went
            removed.append(socket_path.parent)
            shutil.rmtree(socket_path.parent)
        return clear(socket_path)

    async with (
        node_without_kubelet("rebel-4") as node,
        KubeletStub(node.kubelet_dir) as kubelet,
        daemon_on(node, "200ms") as daemon,
    ):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        monkeypatch.setattr(pluginsocket, "clear", directory_gone_first)
        (node.kubelet_dir / socket_name(NPU)).unlink()  # the plugin starts again
        (missing,) = await daemon.await_log(MISSING_MSG)
        await next_reconcile(daemon)
        await kubelet.restart()  # a kubelet makes its directory again
        await kubelet.wait_for(NPU, lambda v: v.generation >= 2 and v.messages > 0)
    assert removed == [node.kubelet_dir]
    assert not [r for r in daemon.records if r["level"] == "error"]
    assert missing["level"] == "warn" and len(daemon.find(MISSING_MSG)) == 1
    (failed_start,) = daemon.find("Cannot start device plugin server; retrying next scan")
    assert failed_start["level"] == "debug" and "does not exist" in str(failed_start["err"])


async def test_discovery_recovery_is_one_info_record_naming_the_failed_scans() -> None:
    async with node_without_kubelet("rebel-4") as node:
        node.inject_fault(Fault("error", ("list",), remaining=3))
        async with (
            KubeletStub(node.kubelet_dir) as kubelet,
            daemon_on(node, "200ms", level="info") as daemon,
        ):
            (recovered,) = await daemon.await_log(RECOVERED)
            await kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            node.inject_fault(Fault("error", ("list",), remaining=1))
            await daemon.await_log(RECOVERED, count=2)
    assert recovered["level"] == "info"
    assert recovered["failedScans"] == 3 == len(daemon.find(DISCOVERY_FAILED)) - 1
    assert recovered["deviceCount"] == 4
    assert [r["failedScans"] for r in daemon.find(RECOVERED)] == [3, 1]
    # The recovery comes after the last failure and before the registration it allows.
    messages = [r["msg"] for r in daemon.records]
    assert messages.index(RECOVERED) > messages.index(DISCOVERY_FAILED)
    assert messages.index(RECOVERED) < messages.index(REGISTERED)


async def test_a_missing_kubelet_directory_is_waited_for_once_and_never_created() -> None:
    async with node_without_kubelet("rebel-4") as node:
        node.kubelet_dir.rmdir()
        async with daemon_on(node, "200ms", level="info") as daemon:
            (missing,) = await daemon.await_log(MISSING_MSG)
            # Before this change the daemon made the directory before it could log a
            # record; now nothing makes it while the daemon waits.
            assert not node.kubelet_dir.exists()
            assert not [r for r in daemon.records if r["msg"] == REG_FAILED]
            async with KubeletStub(node.kubelet_dir) as kubelet:  # the kubelet makes it
                (found,) = await daemon.await_log(FOUND_MSG)
                await kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
    assert missing["level"] == "warn" and missing["path"] == str(node.kubelet_dir)
    assert found["level"] == "info" and found["path"] == str(node.kubelet_dir)
    assert len(daemon.find(MISSING_MSG)) == 1


async def test_debug_shows_no_grpc_loop_notices() -> None:
    async with (
        node_without_kubelet("rebel-sriov") as node,
        KubeletStub(node.kubelet_dir) as kubelet,
    ):
        daemon = DaemonProcess(node.daemon_args("200ms"), level="debug")
        try:
            for resource in SRIOV:
                await kubelet.wait_for(resource)
            await kubelet.allocate(NPU, [["rbln2"]])
            await next_reconcile(daemon)
        finally:
            assert await asyncio.to_thread(daemon.stop) == 0
    grpc_records = [r for r in daemon.records if r.get("component") == "grpc"]
    assert not [r for r in grpc_records if "Loaded running loop" in r["msg"]]
    # gRPC's other debug records still come through.
    assert any("AsyncIOEngine" in r["msg"] for r in grpc_records), grpc_records
