"""The kubelet session as a state machine: events from stale plugin instances change
nothing, and a bug while handling one event is said without ending the session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from rbln_device_plugin.api import API_VERSION
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.host.scan import ScanResult
from rbln_device_plugin.kubelet.events import PluginRef, RegistrationEnded, StreamLost
from rbln_device_plugin.kubelet.session import STREAM_LOSS_GRACE_S, Kubelet, KubeletSession
from rbln_device_plugin.model.inventory import RESOURCE_NPU, Device

from .inprocess import ScriptedScanner, managing, until


def device(index: int) -> Device:
    return Device(
        f"rbln{index}", "RBLN-CA25", "1250", f"0000:{index + 5:02x}:00.0", 0, "", None, None
    )


def two_devices(_: int) -> ScanResult:
    return ScanResult({RESOURCE_NPU: (device(0), device(1))})


async def test_a_stream_lost_by_a_replaced_plugin_instance_changes_nothing(short_tmp: Path) -> None:
    scanner = ScriptedScanner(two_devices)
    with capture_logs() as logs:
        async with managing(short_tmp, scanner) as (manager, kubelet):
            await until(lambda: any(r.accepted for r in kubelet.registrations), "a registration")
            await until(lambda: manager.plugins[RESOURCE_NPU].registered, "the registration")
            current = manager.plugins[RESOURCE_NPU].ref
            stale = PluginRef(RESOURCE_NPU, current.serial + 100)
            manager.session.events.put_nowait(StreamLost(stale))
            await asyncio.sleep(STREAM_LOSS_GRACE_S * 3)  # the grace, and its judgement
            assert manager.plugins[RESOURCE_NPU].ref == current
            assert manager.plugins[RESOURCE_NPU].registered  # not marked lost
            assert manager.session.kubelet is Kubelet.SERVING
    said = [e["event"] for e in logs]
    assert "ListAndWatch stream ended; registering again" not in said
    assert "Kubelet is not serving; waiting for it to start again" not in said
    assert len([r for r in kubelet.registrations if r.accepted]) == 1


async def test_a_bug_in_one_event_is_said_and_the_session_goes_on(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = KubeletSession._registration_ended
    failed: list[RegistrationEnded] = []

    async def first_fails(self: KubeletSession, event: RegistrationEnded) -> None:
        if not failed:
            failed.append(event)
            raise RuntimeError("bug while handling a registration")
        await real(self, event)

    monkeypatch.setattr(KubeletSession, "_registration_ended", first_fails)
    scanner = ScriptedScanner(two_devices)
    with capture_logs() as logs:
        async with managing(short_tmp, scanner) as (manager, _):
            await until(lambda: bool(failed), "the failing event")
            calls = scanner.calls
            await until(lambda: scanner.calls >= calls + 3, "scans after the failure")
            # The attempt that hit the bug was not held waiting for its answer.
            assert failed[0].handled.done()
            assert manager.plugins[RESOURCE_NPU].registered
    (bug,) = [e for e in logs if e["event"] == "Kubelet session event failed"]
    assert bug["log_level"] == "error"
    assert bug["sessionEvent"].startswith("RegistrationEnded(")
    assert bug["exc_info"] is True


async def test_a_registration_connects_afresh_while_another_connection_to_the_kubelet_fails(
    short_tmp: Path,
) -> None:
    """During a kubelet restart another client of kubelet.sock in the process (another
    resource's attempt) can still hold a failing connection when the kubelet is back:
    gRPC's shared subchannel would hand the plugins' registrations that failure
    (UNAVAILABLE at once, the old "No such file or directory") although the kubelet
    answers again."""
    scanner = ScriptedScanner(two_devices)
    async with managing(short_tmp, scanner) as (manager, kubelet):
        await until(lambda: any(r.accepted for r in kubelet.registrations), "a registration")
        await until(lambda: manager.plugins[RESOURCE_NPU].registered, "the registration")
        await kubelet.stop()
        failing = grpc.aio.insecure_channel(f"unix:{kubelet.socket_path}")
        try:
            for _ in range(3):  # several failures: the shared connection backs off
                with pytest.raises(grpc.aio.AioRpcError):
                    await api_pb2_grpc.RegistrationStub(failing).Register(
                        api_pb2.RegisterRequest(version=API_VERSION), timeout=1
                    )
            accepted = len([r for r in kubelet.registrations if r.accepted])
            with capture_logs() as logs:
                await kubelet.start()
                await until(
                    lambda: len([r for r in kubelet.registrations if r.accepted]) > accepted,
                    "the registration with the kubelet back",
                )
        finally:
            await failing.close()
    failed = [e for e in logs if "registration failed" in e["event"]]
    assert not failed, failed
