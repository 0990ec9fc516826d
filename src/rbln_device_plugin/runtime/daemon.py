"""Process lifecycle: signals, health service, tracing, the manager, orderly shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import warnings
from typing import Final

from rbln_device_plugin.config import Config
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.runtime.healthcheck import HealthcheckError, HealthService
from rbln_device_plugin.runtime.instancelock import InstanceLock, InstanceLockError
from rbln_device_plugin.runtime.kubeletdir import KubeletDirectory
from rbln_device_plugin.runtime.manager import Manager
from rbln_device_plugin.telemetry import metrics_setup, tracing
from rbln_device_plugin.telemetry.logs import get_logger

SHUTDOWN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# Everything must be down within the kubelet's patience; tracing gets its own 5 s bound
# inside this budget only when spans are pending.
SHUTDOWN_BUDGET_S: Final = 4.0

log = get_logger()


def run(config: Config) -> int:
    """Run the daemon until a shutdown signal; return the process exit code."""
    _watch_children_with_pidfds()
    try:
        return asyncio.run(_serve(config))
    except Exception as exc:
        log.error("Unexpected internal error; exiting", err=exc, exc_info=True)
        return 1


def _watch_children_with_pidfds() -> None:
    """Learn of rbln-smi's exit from a pidfd on the event loop, not a thread per process.

    Python 3.11's default starts a waiter thread for every subprocess (every scan, every
    Allocate); 3.12 and later already use pidfds where the kernel has them.
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # kernel before 5.3, or seccomp forbids it: keep the default
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())


async def _serve(config: Config) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if not received:
            log.info("Shutdown signal received", signal=sig.name)
        received.append(sig)
        stop.set()

    for sig in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)

    health: HealthService | None = None
    if config.healthcheck_enabled:
        health = HealthService(config.healthcheck_port)
        try:
            await health.start()
        except HealthcheckError as exc:
            log.error("Cannot start healthcheck service", err=exc)
            return 1
    else:
        log.info("Healthcheck service disabled", healthcheckPort=config.healthcheck_port)

    instance = InstanceLock(config.kubelet_dir)
    try:
        try:
            # The lock and the sockets live in the kubelet's directory, which only the
            # kubelet creates: on a machine that is not (yet) a node, wait for it.
            if not await KubeletDirectory(config.kubelet_dir).wait(stop) or not (
                await instance.acquire(stop)
            ):
                log.info("Shutdown complete", signal=received[0].name if received else None)
                return 0
        except InstanceLockError as exc:
            log.error("Cannot take the instance lock", err=exc)
            return 1
        return await _serve_locked(config, stop, received, health, instance)
    finally:
        instance.release()
        if health is not None:
            await health.stop(grace=0.2)
        for sig in SHUTDOWN_SIGNALS:
            loop.remove_signal_handler(sig)


async def _serve_locked(
    config: Config,
    stop: asyncio.Event,
    received: list[signal.Signals],
    health: HealthService | None,
    instance: InstanceLock,
) -> int:
    tracer = tracing.setup(config)
    recorder = await metrics_setup.start(config)

    async def mark_ready() -> None:
        if health is not None:
            await health.set_serving(True)

    manager = Manager(
        config,
        tracer=tracer.tracer,
        on_first_scan=mark_ready,
        hostio=HostIO(metrics=recorder),
        on_scan=instance.ensure_held,
        metrics=recorder,
    )
    manager_task = asyncio.create_task(manager.run(stop), name="manager")
    stop_task = asyncio.create_task(stop.wait(), name="stop-signal")
    exit_code = 0
    try:
        done, _ = await asyncio.wait({manager_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if manager_task in done and not stop.is_set():
            failure = manager_task.exception()
            log.error("Device manager stopped unexpectedly", err=failure or "returned")
            exit_code = 1
        started = time.monotonic()
        stop.set()
        if health is not None:
            await health.set_serving(False)
        try:
            await asyncio.wait_for(asyncio.shield(manager_task), SHUTDOWN_BUDGET_S)
        except TimeoutError:
            log.warning("Device manager did not stop in time; cancelling")
            manager_task.cancel()
            await asyncio.gather(manager_task, return_exceptions=True)
        except Exception:
            pass  # already reported above
        await asyncio.gather(tracer.shutdown(), recorder.shutdown())
        log.info(
            "Shutdown complete",
            signal=received[0].name if received else None,
            durationMs=round((time.monotonic() - started) * 1000, 1),
        )
    finally:
        stop_task.cancel()
    return exit_code
