"""Hand-over between two instances of one installation, through the real daemon: a
surge successor takes over while the running instance still serves, and faults at each
step leave nothing behind and never two installations serving.

The kubelet stand-in keeps one endpoint per resource (a new registration replaces the
old one, as the 1.34 kubelet does for Allocate); tests/test_kubelet_peer.py runs the
same hand-over against the kubelet's own device manager, 1.34 and 1.37.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import pytest

from rbln_device_plugin.config import HANDOVER_SOCKET_NAME, Config
from rbln_device_plugin.host.scan import ScanResult
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.resources import instance_token_of
from rbln_device_plugin.runtime.handover import HANDED_OVER_MSG, TOOK_OVER_MSG
from rbln_device_plugin.runtime.instancelock import ANCHOR_NAME
from rbln_device_plugin.telemetry.tracing import disabled

from .daemon_process import DaemonProcess
from .fault_helpers import NPU, FaultHarness, launch, lock_is_free
from .inprocess import ScriptedScanner, managing
from .probes import health, health_port
from .test_instance import WAITING, lock_holders
from .test_manager import device

INSTALLATION = "kube-system/rbln-device-plugin"
ONE = ["--installation", INSTALLATION, "--healthcheck-port", "0"]
REFUSED = "Hand-over refused; waiting for the instance lock"
EXIT_WAIT_S = 20.0


def plugin_sockets(h: FaultHarness) -> dict[str, list[str]]:
    """Our plugin sockets in the kubelet directory, by instance token."""
    found: dict[str, list[str]] = {}
    for path in h.node.kubelet_dir.iterdir():
        token = instance_token_of(path.name)
        if token is not None and path.is_socket():
            found.setdefault(token, []).append(path.name)
    return found


def holds(pid: int, path: Path) -> bool:
    """Does process ``pid`` have ``path``'s file open (its copy of a shared flock)?"""
    info = os.stat(path)
    fd_dir = Path(f"/proc/{pid}/fd")
    for entry in fd_dir.iterdir():
        try:
            found = os.stat(entry)
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino):
            return True
    return False


def held_by(h: FaultHarness, *daemons: DaemonProcess) -> bool:
    """The anchor is locked, and exactly ``daemons`` (alive) hold it open."""
    return not lock_is_free(anchor(h)) and all(holds(d.proc.pid, anchor(h)) for d in daemons)


def successor(h: FaultHarness, *args: str) -> DaemonProcess:
    return DaemonProcess([*h.node.daemon_args(h.interval), *args])


def anchor(h: FaultHarness) -> Path:
    return h.node.rsd_lock_path.parent / ANCHOR_NAME


async def registered(daemon: DaemonProcess) -> None:
    port = await health_port(daemon)
    for _ in range(200):
        if await health(port, "registered") == "SERVING":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never registered: {daemon.records[-10:]}")


def endpoint_token(h: FaultHarness) -> str | None:
    view = h.kubelet.view(NPU)
    return instance_token_of(view.endpoint) if view is not None else None


async def test_a_successor_of_the_same_installation_takes_over_while_the_first_serves() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await registered(h.daemon)
        first = h.daemon
        (old_token,) = plugin_sockets(h)
        second = successor(h, *ONE)
        try:
            await registered(second)
            # Both serve: each on sockets of its own, the kubelet's newest endpoint is the
            # successor's, and the lock is held by both processes (one open file).
            tokens = plugin_sockets(h)
            assert len(tokens) == 2 and old_token in tokens
            (new_token,) = set(tokens) - {old_token}
            await h.kubelet.wait_for(NPU, lambda v: instance_token_of(v.endpoint) == new_token)
            assert held_by(h, first, second)
            assert not second.find(WAITING)
            assert first.stop() == 0
            (handed,) = first.find(HANDED_OVER_MSG)
            assert handed["successorPid"] == second.proc.pid and handed["successorRegistered"]
            (took,) = await second.await_log(TOOK_OVER_MSG)
            assert took["predecessorPid"] == first.proc.pid
            # The successor alone now: its sockets, its lock, its devices at the kubelet.
            assert plugin_sockets(h) == {new_token: tokens[new_token]}
            assert held_by(h, second)
            view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            assert instance_token_of(view.endpoint) == new_token and view.ended is None
            assert second.proc.poll() is None
        finally:
            second.kill()
        assert second.proc.wait(EXIT_WAIT_S) is not None


async def test_another_installation_still_waits_for_the_holder() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await registered(h.daemon)
        other = successor(h, "--installation", "gpu-operator/rbln", "--healthcheck-port", "0")
        plain = successor(h, "--healthcheck-port", "0")
        try:
            (refused,) = await other.await_log(REFUSED)
            assert "another installation" in refused["reason"]
            await other.await_log(WAITING)
            await plain.await_log(WAITING)
            assert lock_holders(anchor(h)) == {h.daemon.proc.pid}
            assert not holds(other.proc.pid, anchor(h)) and not holds(plain.proc.pid, anchor(h))
            assert len(plugin_sockets(h)) == 1
            assert h.daemon.stop() == 0
            # Exactly one of the two takes the lock; the other keeps waiting.
            await asyncio.sleep(1.5)
            started = [d for d in (other, plain) if d.find("Instance lock acquired; starting")]
            assert len(started) == 1
            (holder,) = started
            assert lock_holders(anchor(h)) == {holder.proc.pid}
        finally:
            other.kill()
            plain.kill()


async def test_a_successor_killed_before_it_is_registered_leaves_nothing_behind() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await registered(h.daemon)
        (old_token,) = plugin_sockets(h)
        second = successor(h, *ONE)
        await second.await_log("Taking over from the running instance")
        second.kill()  # SIGKILL: its sockets and its copy of the lock stay behind it
        second.proc.wait(EXIT_WAIT_S)
        await h.daemon.await_log("The successor ended before this instance stopped; serving on")
        # Its plugins start anew (the kubelet may point at the successor's endpoint).
        await h.daemon.await_log("Registered device plugin with kubelet", count=2)
        assert set(plugin_sockets(h)) == {old_token}
        assert held_by(h, h.daemon)
        view = await h.kubelet.wait_for(
            NPU, lambda v: instance_token_of(v.endpoint) == old_token and len(v.devices) == 4
        )
        assert view.ended is None
        # It hands over again to the next successor.
        third = successor(h, *ONE)
        try:
            await registered(third)
        finally:
            third.kill()


async def test_the_holder_killed_during_the_hand_over_leaves_the_successor_serving() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await registered(h.daemon)
        first = h.daemon
        (old_token,) = plugin_sockets(h)
        second = successor(h, *ONE)
        try:
            await second.await_log("Taking over from the running instance")
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(EXIT_WAIT_S)
            await second.await_log(TOOK_OVER_MSG)
            await registered(second)
            tokens = plugin_sockets(h)
            assert old_token not in tokens and len(tokens) == 1
            assert held_by(h, second)
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4 and v.ended is None)
            # And it answers the next successor itself.
            assert (h.node.rsd_lock_path.parent / HANDOVER_SOCKET_NAME).is_socket()
            assert second.stop() == 0
            assert plugin_sockets(h) == {}
            assert lock_is_free(anchor(h))
        finally:
            second.kill()


async def test_a_kubelet_restart_during_the_hand_over_leaves_the_successor_registered() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await registered(h.daemon)
        first = h.daemon
        (old_token,) = plugin_sockets(h)
        second = successor(h, *ONE)
        try:
            await registered(second)
            (new_token,) = set(plugin_sockets(h)) - {old_token}
            before = len(first.find("Registered device plugin with kubelet"))
            await h.kubelet.restart()
            await h.kubelet.wait_for(
                NPU, lambda v: instance_token_of(v.endpoint) == new_token and v.generation >= 3
            )
            await second.await_log(
                "Registered device plugin with kubelet", count=2, resourceName=NPU
            )
            # A few scans later the holder has still registered nothing again: the
            # successor's endpoint is the kubelet's only one.
            await asyncio.sleep(1.0)
            assert len(first.find("Registered device plugin with kubelet")) == before
            assert endpoint_token(h) == new_token
            assert first.stop() == 0
            assert second.proc.poll() is None
            view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            assert instance_token_of(view.endpoint) == new_token and view.ended is None
            assert set(plugin_sockets(h)) == {new_token}
        finally:
            second.kill()


async def test_another_installation_arriving_during_the_hand_over_waits_for_both() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await registered(h.daemon)
        first = h.daemon
        second = successor(h, *ONE)
        other = successor(h, "--installation", "gpu-operator/rbln", "--healthcheck-port", "0")
        try:
            await registered(second)
            await other.await_log(WAITING)
            # The holder leaves: the successor still holds the lock, the other waits on.
            assert first.stop() == 0
            await second.await_log(TOOK_OVER_MSG)
            await asyncio.sleep(1.0)
            assert not other.find("Instance lock acquired; starting")
            assert not holds(other.proc.pid, anchor(h))
            assert held_by(h, second)
            # Only once both are gone does the other installation serve, alone.
            assert second.stop() == 0
            await other.await_log("Instance lock acquired; starting")
            await registered(other)
            assert held_by(h, other) and lock_holders(anchor(h)) == {other.proc.pid}
        finally:
            second.kill()
            other.kill()


async def test_both_killed_during_the_hand_over_leave_nothing_the_next_start_keeps() -> None:
    async with launch("rebel-4", extra_args=ONE) as h:
        await registered(h.daemon)
        first = h.daemon
        second = successor(h, *ONE)
        try:
            await registered(second)
            (new_token,) = set(plugin_sockets(h)) - {""}
            first.proc.send_signal(signal.SIGKILL)
            second.proc.send_signal(signal.SIGKILL)
            first.proc.wait(EXIT_WAIT_S)
            second.proc.wait(EXIT_WAIT_S)
            assert lock_is_free(anchor(h))  # the kernel let go of both copies
            third = h.new_daemon()
            (removed,) = await third.await_log("Removed plugin sockets left by earlier instances")
            assert all(new_token in name for name in removed["sockets"])
            await registered(third)
            assert set(plugin_sockets(h)) == {""}  # a free lock: the fixed names
        finally:
            second.kill()


async def test_an_instance_that_began_to_step_down_answers_no_allocate(short_tmp: Path) -> None:
    """The kubelet's other endpoint (a successor's) is the one to answer: a leaving
    instance refuses with UNAVAILABLE from the first moment of its stop."""
    made: list[SharedServices] = []

    def services(config: Config) -> SharedServices:
        made.append(SharedServices(config, disabled().tracer))
        return made[0]

    scanner = ScriptedScanner(lambda _: ScanResult({NPU: (device(0), device(1))}))
    async with managing(short_tmp, scanner, services=services) as (_, kubelet):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 2)
        made[0].stepping_down.set()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.allocate(NPU, [["rbln0"]])
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in str(refused.value.details())
