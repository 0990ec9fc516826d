"""Process lifecycle: signals, health service, instance lock, the manager, orderly shutdown.

Start: health service (liveness SERVING at once), metrics (so a waiting instance shows
on a dashboard, its ``instance_state`` saying what it waits for), the kubelet's directory
(waited for, never created), instance lock (a second instance waits here, readiness
NOT_SERVING; liveness too while the lock's directory cannot be made), tracing, the scan
loop; readiness turns SERVING after the first scan.

Shutdown, in this order, after the first SIGTERM, SIGINT, SIGHUP or SIGQUIT:

1. readiness NOT_SERVING;
2. the scan loop stops: a scan in progress is cancelled (its ``rbln-smi`` killed), the
   kubelet watch and the registration tasks are cancelled, every plugin server stops
   (0.5 s grace each, in parallel, so its ListAndWatch stream ends) and removes its
   socket. All of step 2 gets ``SHUTDOWN_BUDGET_S`` (4 s); past it the manager task is
   cancelled;
3. tracing flushes pending spans and metrics stop (the Prometheus endpoint closes, an
   OTLP push sends its last export), side by side, each at most 5 s, and only when on;
4. ``Shutdown complete``; the instance locks are released (a waiting instance starts
   now); the health server stops (0.2 s grace);
5. back in ``cli``: the stderr relay gets 1 s to pass on what gRPC wrote last, and the
   log queue 2 s to reach stdout; both only take that long when their output blocks.

Without tracing and with stdout drained, the exit comes within 5 s of the signal (the
README's promise). A host read that never returns holds nothing: it runs on a daemon
thread that is never joined. A second signal during all this exits at once with
128 + the signal's number (143 for SIGTERM, 130 for SIGINT), skipping what is left.
Signals are handled on a thread of their own from the daemon's first line until the
process ends (see ``signalcatch`` and ``signals``): one that arrives before this loop
exists stops it the moment it starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

from rbln_device_plugin import aiotasks, options
from rbln_device_plugin.config import MODE_DRA, Config
from rbln_device_plugin.core.devices import NodeDevices
from rbln_device_plugin.dra.names import DRIVER_NAME
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.host.kubeletdir import KubeletDirectory
from rbln_device_plugin.host.paths import ensure_dir
from rbln_device_plugin.kubelet.events import HandoverNews
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.kubelet.session import KubeletSession
from rbln_device_plugin.runtime import signals as shutdown_signals
from rbln_device_plugin.runtime.handover import Handover, HandoverHooks, new_token
from rbln_device_plugin.runtime.healthcheck import HealthcheckError, HealthService
from rbln_device_plugin.runtime.instancelock import ANCHOR_NAME, InstanceLock, InstanceLockError
from rbln_device_plugin.runtime.manager import FrontEnd, FrontEndFactory, Manager, ScanHooks
from rbln_device_plugin.runtime.signals import ShutdownSignals
from rbln_device_plugin.runtime.watchdog import ScanWatchdog
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry import metrics_setup, tracing
from rbln_device_plugin.telemetry.logs import get_logger

if TYPE_CHECKING:
    from rbln_device_plugin.dra.session import DraParts

SHUTDOWN_BUDGET_S: Final = 4.0

log = get_logger()


def run(config: Config) -> int:
    """Run the daemon until a shutdown signal; return the process exit code."""
    signals = shutdown_signals.install()  # normally done by cli, before the first record
    try:
        return asyncio.run(_serve(config, signals))
    except Exception as exc:
        log.error("Unexpected internal error; exiting", err=exc, exc_info=True)
        return options.EXIT_FAILURE


async def _serve(config: Config, signals: ShutdownSignals) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals.attach(loop, stop)  # stop is set now if a signal came before the loop
    try:
        return await serve(config, stop, lambda: _name(signals))
    finally:
        signals.detach()


def _no_signal() -> str | None:
    return None


async def serve(
    config: Config,
    stop: asyncio.Event,
    signal_name: Callable[[], str | None] = _no_signal,
) -> int:
    """The daemon's runtime on the running loop until ``stop`` is set; the exit code.

    Everything after the options are parsed: health service, metrics, instance lock, the
    scan loop, the orderly shutdown. The process around it (signals, the stderr relay,
    the log queue's last flush) is ``run``'s and ``cli``'s; tests run this in-process
    with a stop event of their own (``tests/inprocess.py``). ``signal_name`` names the
    signal that set ``stop``, for the ``Shutdown complete`` record.
    """
    health: HealthService | None = None
    if config.healthcheck_enabled:
        health = HealthService(config.healthcheck_port)
        try:
            await health.start()
        except HealthcheckError as exc:
            log.error("Cannot start healthcheck service", err=exc)
            return options.EXIT_FAILURE
    else:
        log.info("Healthcheck service disabled", healthcheckPort=config.healthcheck_port)

    recorder = await metrics_setup.start(config)  # before any wait: a waiting instance shows
    dra_parts: DraParts | None = None
    if config.mode == MODE_DRA:
        from rbln_device_plugin.dra.session import ApiSetupError, api_parts

        try:
            dra_parts = api_parts(config, recorder)
        except ApiSetupError as exc:
            log.error("Cannot configure the API server client", err=exc)
            await recorder.shutdown()
            if health is not None:
                await health.stop(grace=0.2)
            return options.EXIT_FAILURE
    # The daemon's one runner of blocking host calls: the lock files, then the scans.
    hostio = HostIO(metrics=recorder)
    dra = dra_parts is not None
    # The anchor beside the RSD lock is shared by both modes: one node runs one of them.
    anchor = config.rsd_lock_path.parent / ANCHOR_NAME
    instance = InstanceLock(_lock_dir(config), hostio, anchor)
    over: Handover | None = None
    if config.installation and not dra:  # only an installation hands over (runtime.handover)
        over = Handover(config, new_token(), hostio, instance)
    elif config.installation:
        log.info(
            "Surge hand-over is a device-plugin mode feature; in dra mode a new instance "
            "waits for the running one",
            installation=config.installation,
        )
    try:
        try:
            # The lock and the sockets live in the kubelet's directory, which only the
            # kubelet creates: on a machine that is not (yet) a node, wait for it.
            recorder.instance_state(m.STATE_WAITING_FOR_KUBELET_DIR)
            waited = await KubeletDirectory(_kubelet_made_dir(config), hostio).wait(stop)
            if waited and dra:
                await _make_lock_dir(config, hostio)
            recorder.instance_state(m.STATE_WAITING_FOR_LOCK)
            unusable = partial(_lock_dir_unusable, recorder, health)
            take_over = over.take_over if over is not None else None
            if not waited or not await instance.acquire(stop, unusable, take_over):
                await recorder.shutdown()
                log.info("Shutdown complete", signal=signal_name())
                return options.EXIT_OK
        except InstanceLockError as exc:
            log.error("Cannot take the instance lock", err=exc)
            return options.EXIT_FAILURE
        if over is not None and not instance.taken_over:
            over.close()  # a hand-over whose descriptors could not be used: locked anew
        recorder.instance_state(m.STATE_TAKING_OVER if instance.taken_over else m.STATE_SERVING)
        held = _Locked(
            config, stop, signal_name, health, instance, recorder, hostio, over, dra_parts
        )
        return await _serve_locked(held)
    finally:
        if over is not None:
            over.close()
        if dra_parts is not None:
            from rbln_device_plugin.dra.session import close_parts

            await close_parts(dra_parts)
        await recorder.shutdown()  # at once when _serve_locked has stopped it already
        instance.release()
        hostio.close()
        if health is not None:
            await health.stop(grace=0.2)


def _lock_dir(config: Config) -> Path:
    """Where the instance lock's own files live: the kubelet's device-plugin directory,
    or in dra mode the driver's directory under the kubelet's plugins."""
    if config.mode == MODE_DRA:
        return config.kubelet_plugins_path / DRIVER_NAME
    return config.kubelet_dir


def _kubelet_made_dir(config: Config) -> Path:
    """The directory only the kubelet creates, waited for before anything else."""
    if config.mode == MODE_DRA:
        return config.kubelet_plugins_registry_path
    return config.kubelet_dir


async def _make_lock_dir(config: Config, hostio: HostIO) -> None:
    path = _lock_dir(config)
    made = await hostio.call(str(path), partial(ensure_dir, path))
    if isinstance(made, Stalled):
        raise InstanceLockError(f"cannot create {path}: {made}")


async def _lock_dir_unusable(recorder: m.Metrics, health: HealthService | None, now: bool) -> None:
    """The instance lock's directory cannot be made (or can again): waiting for another
    instance is progress, waiting for this is not, so liveness says so (the chart's probe
    then restarts the pod, and its restarts show) and so does the instance state."""
    recorder.instance_state(m.STATE_LOCK_DIR_UNUSABLE if now else m.STATE_WAITING_FOR_LOCK)
    if health is not None:
        await health.set_alive(not now)


def _name(signals: ShutdownSignals) -> str | None:
    return signals.first.name if signals.first is not None else None


@dataclass(frozen=True, slots=True)
class _Locked:
    """What serving holds once the instance lock is taken."""

    config: Config
    stop: asyncio.Event
    signal_name: Callable[[], str | None]
    health: HealthService | None
    instance: InstanceLock
    recorder: m.Metrics
    hostio: HostIO
    handover: Handover | None = None
    dra: DraParts | None = None  # dra mode: the API server's claim reads and slice writes


async def _serve_locked(held: _Locked) -> int:
    traces = tracing.setup(held.config)  # the tracer, and the exporter behind it when on
    watchdog = ScanWatchdog(held.config.scan_stall_limit, partial(_set_alive, held.health))
    over = held.handover
    services = SharedServices(
        held.config, traces.tracer, held.hostio, held.recorder,
        instance_token=over.socket_token if over is not None else "",
    )  # fmt: skip
    manager = Manager(
        services, _scan_hooks(held, watchdog), front_end=_front_end(services, held.dra)
    )
    stop, instance = held.stop, held.instance
    if isinstance(manager.session, KubeletSession):
        instance.follow(manager.session.watch.state)  # the legacy lock file's directory
    manager_task = aiotasks.start(manager.run(stop), "manager")
    side_tasks = [aiotasks.start(_registered(held, manager.session), "registered")]
    if over is not None:
        assert isinstance(manager.session, KubeletSession)  # no hand-over in dra mode
        hooks = _handover_hooks(held.recorder, manager.session)
        side_tasks.append(aiotasks.start(over.run(stop, hooks), "handover"))
    lock_watch = aiotasks.start(instance.watch(stop), "instance-lock-watch")
    stop_task = aiotasks.start(stop.wait(), "stop-signal")
    lost_task = aiotasks.start(instance.lost.wait(), "instance-lock-lost")
    try:
        done, _ = await asyncio.wait(
            {manager_task, stop_task, lost_task}, return_when=asyncio.FIRST_COMPLETED
        )
        exit_code = _why_stopping(held, manager_task, manager_task in done)
        started = time.monotonic()
        # Stepping down: no Allocate is answered from here on (a successor's endpoint is
        # the kubelet's to use), and a successor hears it before the streams end.
        services.stepping_down.set()
        if over is not None:
            await over.step_down()
        stop.set()
        if held.health is not None:
            await held.health.set_ready(False)
        if not await _stop_manager(manager_task):
            exit_code = options.EXIT_FAILURE
        if over is not None:
            over.stepped_down()
        watchdog.close()
        await asyncio.gather(traces.shutdown(), held.recorder.shutdown())
        log.info(
            "Shutdown complete",
            signal=held.signal_name(),
            durationMs=round((time.monotonic() - started) * 1000, 1),
        )
    finally:
        await aiotasks.cancel_and_wait(
            stop_task, lost_task, lock_watch, *side_tasks, title="shutdown"
        )
    return exit_code


def _front_end(services: SharedServices, parts: DraParts | None) -> FrontEndFactory | None:
    """The DRA kubelet plugin in dra mode; None: the device plugin's session."""
    if parts is None:
        return None
    from rbln_device_plugin.dra.session import DraSession

    def make(devices: NodeDevices, wake: asyncio.Event) -> FrontEnd:
        return DraSession(
            services.config, services.hostio, services.metrics, services.rsd_queue,
            devices, wake, parts,
        )  # fmt: skip

    return make


async def _registered(held: _Locked, session: FrontEnd) -> None:
    """The ``registered`` health service (the chart's readiness in surge mode) turns
    SERVING once every resource is registered; a predecessor hears ``serving`` then."""
    await session.registered.wait()
    if held.health is not None and not held.stop.is_set():
        await held.health.set_registered(True)
    if held.handover is not None:
        await held.handover.registered()


def _handover_hooks(recorder: m.Metrics, session: KubeletSession) -> HandoverHooks:
    async def successor_serving() -> None:
        session.handover(HandoverNews(handed_over=True))
        recorder.instance_state(m.STATE_HANDED_OVER)

    async def successor_gone(_: bool) -> None:
        # The successor may have registered (whether or not it said so in time): with
        # one endpoint per resource (1.34) the kubelet would still point at it, so the
        # plugins start anew and register.
        session.handover(HandoverNews(handed_over=False, restart=True))
        recorder.instance_state(m.STATE_SERVING)

    async def predecessor_leaving() -> None:
        session.handover(HandoverNews(predecessor_leaving=True))

    async def predecessor_gone() -> None:
        recorder.instance_state(m.STATE_SERVING)

    return HandoverHooks(successor_serving, successor_gone, predecessor_leaving, predecessor_gone)


def _scan_hooks(held: _Locked, watchdog: ScanWatchdog) -> ScanHooks:
    health, instance = held.health, held.instance

    async def mark_ready() -> None:
        if health is not None:
            await health.set_ready(True)

    async def scan_started() -> None:
        watchdog.scan_started()  # a lock check that stalls is part of a stuck scan
        await instance.scan_check()

    async def kubelet_restarted() -> None:
        await instance.check()  # kubelets before 1.33 delete the legacy lock file at start

    return ScanHooks(
        first_scan=mark_ready,
        scan_start=scan_started,
        scan_end=watchdog.scan_finished,
        kubelet_restart=kubelet_restarted,
    )


async def _set_alive(health: HealthService | None, alive: bool) -> None:
    if health is not None:
        await health.set_alive(alive)


def _why_stopping(held: _Locked, manager_task: asyncio.Task[None], manager_ended: bool) -> int:
    """The exit code the stop begins with: a lost lock or a manager that ended says so."""
    loss = held.instance.loss
    if loss is not None and not held.stop.is_set():
        log.error(
            "Instance lock lost; another instance may serve this kubelet directory; exiting",
            lockPath=str(loss.path), holderPid=loss.holder_pid, reason=loss.reason,
            exitCode=options.EXIT_LOCK_LOST,
        )  # fmt: skip
        return options.EXIT_LOCK_LOST
    if manager_ended and not held.stop.is_set():
        failure = manager_task.exception()
        log.error("Device manager stopped unexpectedly", err=failure or "returned")
        return options.EXIT_FAILURE
    return options.EXIT_OK


async def _stop_manager(manager_task: asyncio.Task[None]) -> bool:
    """Let the manager stop within the budget, else cancel it; False when stopping itself
    failed (sockets may be left, and that must be heard)."""
    failed_before = manager_task.done()  # its failure, if any, is reported already
    try:
        if not await aiotasks.wait_for_end(manager_task, SHUTDOWN_BUDGET_S):
            log.warning("Device manager did not stop in time; cancelling")
            await aiotasks.cancel_and_wait(manager_task)
    except Exception as exc:
        if not failed_before:
            log.error("Device manager failed while stopping", err=exc, exc_info=True)
            return False
    return True
