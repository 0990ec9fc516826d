"""Stops that land at any await point: nothing swallows a caller's cancellation, and a
scan loop stopped in the middle of a scan leaves no plugin server or socket behind."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from rbln_device_plugin import options
from rbln_device_plugin.host.scan import Scanner, ScanResult
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.runtime.manager import Manager
from rbln_device_plugin.telemetry.tracing import disabled
from rbln_device_plugin.waits import in_thread, unless_stopped
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import materialize
from rbln_device_plugin_sim.state import HOLD, Fault

from . import faulty_daemon
from .daemon_process import DaemonProcess
from .fault_helpers import NPU, wait_until


async def test_a_cancelled_caller_of_unless_stopped_stays_cancelled() -> None:
    stop = asyncio.Event()
    cleaning = asyncio.Event()

    async def slow_to_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cleaning.set()
            await asyncio.sleep(0.2)  # its cleanup takes a while
            raise

    async def caller() -> bool:
        return await unless_stopped(slow_to_cancel(), stop)

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)
    stop.set()  # unless_stopped now cancels the work and waits for its cleanup...
    await cleaning.wait()
    task.cancel()  # ...while its own caller is cancelled: that must not be lost
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_unless_stopped_reports_a_stop_and_a_completion() -> None:
    stop = asyncio.Event()
    assert await unless_stopped(asyncio.sleep(0), stop)
    stop.set()
    assert not await unless_stopped(asyncio.sleep(3600), stop)


async def test_in_thread_passes_results_and_errors() -> None:
    assert await in_thread(lambda: 42, "t") == 42
    with pytest.raises(ZeroDivisionError):
        await in_thread(lambda: 1 // 0, "t")


@pytest.mark.parametrize("steps", [*range(0, 40), 60, 90, 140, 200])
async def test_a_loop_stopped_at_any_point_of_its_first_scan_leaves_no_socket(
    short_tmp: Path, steps: int
) -> None:
    node = materialize(preset("rebel-sriov"), short_tmp / "node")
    config = options.parse([*node.daemon_args("1h")], {})
    kubelet = KubeletStub(config.kubelet_dir)
    await kubelet.start()
    try:
        services = SharedServices(config, disabled().tracer)
        scanned = asyncio.Event()

        class Announcing(Scanner):
            async def scan(self) -> ScanResult:
                result = await super().scan()
                scanned.set()  # rbln-smi is done: the plugins start from here on
                return result

        manager = Manager(
            services,
            scanner=Announcing(
                sysfs_root=node.sysfs_root, smi_path=node.smi_path, hostio=services.hostio
            ),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run(stop))
        await scanned.wait()
        for _ in range(steps):  # one event-loop step each: every await point gets its turn
            await asyncio.sleep(0)
        task.cancel() if steps % 2 else stop.set()
        await asyncio.gather(task, return_exceptions=True)
        left = sorted(p.name for p in config.kubelet_dir.iterdir() if p.is_socket())
        assert left == ["kubelet.sock"], (steps, left)
        assert manager.plugins == {}
    finally:
        await kubelet.stop()


async def test_a_scan_that_fails_while_stopping_is_said_and_exits_1_with_sockets_removed(
    short_tmp: Path,
) -> None:
    """The real daemon process (with a scan that fails when cancelled, see faulty_daemon),
    stopped by SIGTERM while the simulator holds its scan's rbln-smi."""
    node = materialize(preset("rebel-4"), short_tmp / "node")
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    daemon = DaemonProcess(
        node.daemon_args("300ms"),
        command=(sys.executable, str(Path(faulty_daemon.__file__))),
    )
    try:
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        node.inject_fault(Fault(HOLD, commands=("list",), remaining=1))
        # A scan is in flight once its rbln-smi is held.
        await wait_until(lambda: bool(node.held()), 30, "the held scan")
        daemon.send(signal.SIGTERM)
        code = await asyncio.to_thread(daemon.proc.wait, 20)
        daemon.stop()
        assert code == options.EXIT_FAILURE, (daemon.records[-5:], daemon.stderr[-2000:])
        (failed,) = daemon.find("Device manager failed while stopping")
        assert failed["level"] == "error" and faulty_daemon.INJECTED in str(failed["err"])
        assert daemon.find("Shutdown complete")
        assert sorted(p.name for p in node.kubelet_dir.iterdir() if p.is_socket()) == [
            "kubelet.sock"
        ]
        assert node.held() == []  # the held rbln-smi was killed with the scan
    finally:
        daemon.kill()
        node.release_held()
        await kubelet.stop()
