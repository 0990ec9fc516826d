"""The scan loop: inventory snapshots -> one ResourcePlugin per resource name.

The manager owns the set of plugins; each plugin owns its device state and registration.

It scans at start and then on a fixed schedule (no drift, no overlap), starts, updates
and stops plugins to match each snapshot, registers them with the kubelet, re-registers
after the kubelet's stream ends, and restarts everything when the kubelet recreates its
socket (see ``kubelet.watch``).

Nothing here waits for the kubelet: each registration is a task of its own with the
kubelet API's 10 s limit, so a kubelet that accepts ``Register`` and never answers
delays neither the other resources nor the scans, and the health service turns SERVING
after the first scan whatever the kubelet does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

from rbln_device_plugin.host.paths import FileIdentity
from rbln_device_plugin.host.scan import DiscoveryError, Scanner
from rbln_device_plugin.kubelet import cdi
from rbln_device_plugin.kubelet.plugin import RegistrationError, ResourcePlugin
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.kubelet.watch import KubeletSocketWatch, kubelet_serving
from rbln_device_plugin.model.health import HealthHistory
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.runtime.cdicheck import CdiSpecCheck
from rbln_device_plugin.runtime.kubeletdir import KubeletDirectory
from rbln_device_plugin.runtime.streaks import FailureStreak
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import unless_stopped, wait_any

# A kubelet restart also ends every stream. Wait this long for its new socket before
# treating an ended stream as lost on its own (and saying so).
STREAM_LOSS_GRACE_S: Final = 0.5

log = get_logger()


async def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class ScanHooks:
    """What the daemon around the scan loop hears of it."""

    first_scan: Callable[[], Awaitable[None]] = _nothing  # after the first scan
    scan_start: Callable[[], Awaitable[None]] = _nothing
    scan_end: Callable[[], None] = lambda: None
    # Before the plugins register again with a restarted kubelet.
    kubelet_restart: Callable[[], Awaitable[None]] = _nothing


class Manager:
    def __init__(
        self,
        services: SharedServices,
        hooks: ScanHooks = ScanHooks(),
        scanner: Scanner | None = None,
    ) -> None:
        config = services.config
        self._config = config
        self._services = services
        self._metrics = services.metrics
        self._hooks = hooks
        self._hostio = services.hostio
        self._scanner = scanner or Scanner(
            sysfs_root=config.sysfs_root,
            smi_path=config.rbln_smi,
            hostio=self._hostio,
            metrics=self._metrics,
        )
        self.plugins: dict[str, ResourcePlugin] = {}
        # One health history per resource, for as long as the resource is offered: a
        # kubelet restart (or a deleted socket) replaces the plugin but not what it knew,
        # so a faulted device whose status turns unreadable stays Unhealthy afterwards.
        self._histories: dict[str, HealthHistory] = {}
        # Set to scan now and keep the schedule: a kubelet restart, a lost stream, or a
        # plugin that wants a rescan (Allocate found the node changed since the last scan).
        self._wake = services.rescan_wanted
        self.kubelet_socket_watch = KubeletSocketWatch(
            config.kubelet_dir, self._kubelet_restarted, self._hostio
        )
        self._kubelet_dir = KubeletDirectory(config.kubelet_dir, self._hostio)
        self.cdi_check = CdiSpecCheck(config, self._hostio, self._metrics)
        self._cdi_check_failed = False
        # Said once, again on a new reason, and once more when it ends (see streaks).
        self._discovery_failures = FailureStreak()
        self._registration_failures: dict[str, FailureStreak] = {}
        self._start_failures: dict[str, FailureStreak] = {}
        self._restart_pending = False
        # The kubelet's streams ended and its kubelet.sock refuses connections: it exited
        # (a restart's first half, or a crash). No registration until its successor's new
        # kubelet.sock, which restarts every plugin as any kubelet restart does.
        self._kubelet_down = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.scans = 0
        # Device IDs per resource after the previous scan (None before the first one), for
        # the appeared/disappeared counters: what the kubelet was offered, whatever
        # plugin instance offered it.
        self._offered: dict[str, frozenset[str]] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        await self.kubelet_socket_watch.prime()  # the kubelet.sock found at start: no restart
        await self._clean_cdi()
        await self._check_cdi_spec()  # once before the first scan: its record comes first
        watcher = asyncio.create_task(self.kubelet_socket_watch.run(stop), name="kubelet-watch")
        loop = asyncio.get_running_loop()
        interval = self._config.scan_interval
        next_scan = loop.time()
        try:
            while not stop.is_set():
                if not await unless_stopped(self._scan_once(), stop):
                    break
                if self.scans == 1:
                    await self._hooks.first_scan()
                now = loop.time()
                if next_scan <= now:
                    next_scan += interval
                    if next_scan <= now:  # a scan outlasted the interval: skip, don't pile up
                        next_scan = now + interval
                # Woken early (kubelet restart, lost stream): reconcile now, keep the schedule.
                await wait_any(stop, self._wake, timeout=max(0.0, next_scan - loop.time()))
                self._wake.clear()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._stop_all()

    async def _scan_once(self) -> None:
        await self._hooks.scan_start()
        try:
            await self._restart_if_kubelet_restarted()
            await self._reconcile()
            await self._check_cdi_spec()
        finally:
            self._hooks.scan_end()

    async def _check_cdi_spec(self) -> None:
        """The CDI spec check, after the kubelet got its devices; it never stops a scan."""
        try:
            await self.cdi_check.check()
        except Exception as exc:  # a bug on odd spec files must not end the scan loop
            if not self._cdi_check_failed:
                log.error("CDI spec check failed", err=repr(exc), exc_info=True)
            self._cdi_check_failed = True
        else:
            self._cdi_check_failed = False

    # ----------------------------------------------------------------- scanning
    async def _reconcile(self) -> None:
        started = time.monotonic()
        self.scans += 1
        wanted, outcome = await self._discover()
        # The kubelet may have restarted while rbln-smi ran: restart first, register once.
        await self._restart_if_kubelet_restarted()
        if self._kubelet_down and await self._kubelet_serving():
            self._kubelet_down = False  # serving again on the same socket: register
        await self._stop_absent(wanted)
        await self._sync_all(wanted)
        self._record(wanted, outcome, started)

    async def _discover(self) -> tuple[Mapping[str, Sequence[Device]], str]:
        """The devices each resource should offer, and the scan's metrics outcome."""
        try:
            result = await self._scanner.scan()
            wanted = {name: devices for name, devices in result.resources.items() if devices}
        except DiscoveryError as exc:
            log.error("Device discovery failed; reporting zero devices until it recovers", err=exc)
            self._discovery_failures.failed(str(exc))
            return {}, m.SCAN_DISCOVERY_FAILED
        except Exception as exc:  # a bug on odd input must not end the scan loop
            log.error(
                "Device discovery failed; reporting zero devices until it recovers",
                err=f"internal error: {exc!r}", exc_info=True,
            )  # fmt: skip
            self._discovery_failures.failed(repr(exc))
            return {}, m.SCAN_DISCOVERY_FAILED
        failed_scans = self._discovery_failures.succeeded()
        if failed_scans:
            log.info(
                "Device discovery recovered",
                failedScans=failed_scans,
                deviceCount=_device_count(wanted),
            )
        return wanted, m.OK

    async def _stop_absent(self, wanted: Mapping[str, Sequence[Device]]) -> None:
        for resource in sorted(set(self.plugins) - set(wanted)):
            # Kept in self.plugins until stopped: a stop of the loop meanwhile (see run)
            # still finds it, so its server and socket never outlive the daemon.
            plugin = self.plugins[resource]
            await plugin.update(())  # every device disappears, and is logged as such
            await plugin.stop()
            del self.plugins[resource]
            self._histories.pop(resource, None)
            self._registration_failures.pop(resource, None)
            self._start_failures.pop(resource, None)
            log.info("Stopped device plugin for absent resource", resourceName=resource)

    async def _sync_all(self, wanted: Mapping[str, Sequence[Device]]) -> None:
        # New plugin sockets go into the kubelet's directory, which only the kubelet makes.
        can_start = await self._kubelet_dir.present() if wanted else True
        for resource in sorted(wanted):
            try:
                await self._sync_plugin(resource, wanted[resource], can_start)
            except Exception as exc:  # one resource's trouble must not cost the others
                log.error(
                    "Cannot update device plugin; retrying next scan",
                    resourceName=resource, err=exc, exc_info=True,
                )  # fmt: skip

    def _record(self, wanted: Mapping[str, Sequence[Device]], outcome: str, started: float) -> None:
        """The scan's metrics and its debug record."""
        if self._metrics.enabled:
            self._count_changes(wanted)
        self._metrics.scan(outcome, time.monotonic() - started)
        log.debug(
            "Reconciled device inventory",
            resourceCount=len(self.plugins),
            deviceCount=_device_count(wanted),
            durationMs=round((time.monotonic() - started) * 1000, 2),
            tasks=len(asyncio.all_tasks()),
            streams=sum(plugin.open_streams for plugin in self.plugins.values()),
        )

    def _count_changes(self, wanted: Mapping[str, Sequence[Device]]) -> None:
        offered = {name: frozenset(d.name for d in devices) for name, devices in wanted.items()}
        before, self._offered = self._offered, offered
        if before is None:
            return  # the first scan sets the baseline: a start is not a change
        for resource in sorted(set(before) | set(offered)):
            old, new = before.get(resource, frozenset()), offered.get(resource, frozenset())
            self._metrics.inventory_changes(resource, len(new - old), len(old - new))

    async def _sync_plugin(
        self, resource: str, devices: Sequence[Device], can_start: bool = True
    ) -> None:
        plugin = self.plugins.get(resource)
        if plugin is not None and not await plugin.socket_intact():
            # With the kubelet down this is its successor cleaning the directory.
            emit = log.debug if self._kubelet_down else log.warning
            emit(
                "Device plugin socket was removed; restarting the plugin",
                resourceName=resource, socketPath=str(plugin.socket_path),
            )  # fmt: skip
            await plugin.stop()
            del self.plugins[resource]
            plugin = None
        if plugin is None:
            if not can_start:
                return
            plugin = ResourcePlugin(
                resource,
                self._services,
                self._histories.setdefault(resource, HealthHistory()),
                self._stream_lost,
            )
            # Recorded before it starts, for the same reason as in _stop_absent.
            self.plugins[resource] = plugin
            streak = self._start_failures.setdefault(resource, FailureStreak())
            try:
                await plugin.start()
            except (OSError, RuntimeError) as exc:
                if not await self._kubelet_dir.present():
                    # The directory went between the scan's look and the bind: its own
                    # warning says so, and the plugin starts when the kubelet makes it.
                    emit = log.debug
                else:
                    # Each scan retries; the same reason is said once (a directory where
                    # the socket belongs stays until someone removes it), a new one again.
                    emit = log.error if streak.failed(str(exc)) else log.debug
                emit(
                    "Cannot start device plugin server; retrying next scan",
                    resourceName=resource, socketPath=str(plugin.socket_path), err=exc,
                    failedAttempts=streak.failures,
                )  # fmt: skip
                await plugin.stop()
                del self.plugins[resource]
                return
            failed_starts = streak.succeeded()
            if failed_starts:
                log.info(
                    "Device plugin server started",
                    resourceName=resource, socketPath=str(plugin.socket_path),
                    failedAttempts=failed_starts,
                )  # fmt: skip
        await plugin.update(devices)
        if not self._kubelet_down:
            kubelet = self.kubelet_socket_watch.identity  # the kubelet this attempt talks to
            plugin.register_in_background(partial(self._registration_ended, plugin, kubelet))

    async def _registration_ended(
        self,
        plugin: ResourcePlugin,
        kubelet: FileIdentity | None,
        failure: RegistrationError | None,
    ) -> None:
        streak = self._registration_failures.setdefault(plugin.resource, FailureStreak())
        if failure is None:
            self._metrics.registration(plugin.resource, m.OK)
            plugin.announce(failed_attempts=streak.succeeded())
            return
        self._metrics.registration(plugin.resource, m.REGISTRATION_FAILED)
        if await self._registration_overtaken(plugin, kubelet):
            # A kubelet that restarts cleans its directory, our socket with it, and its
            # call back to us fails: the restart's own records say what happens next.
            # Still a failed attempt, as the registration metric counts it.
            streak.failed_quietly()
            log.debug(
                "Device plugin registration overtaken by a kubelet restart or a removed socket",
                resourceName=plugin.resource, err=failure, failedAttempts=streak.failures,
            )  # fmt: skip
            return
        # A kubelet that is not there fails every scan: say it once per reason.
        emit = log.error if streak.failed(str(failure)) else log.debug
        emit(
            "Device plugin registration failed; retrying next scan",
            resourceName=plugin.resource, err=failure, failedAttempts=streak.failures,
        )  # fmt: skip

    async def _registration_overtaken(
        self, plugin: ResourcePlugin, kubelet: FileIdentity | None
    ) -> bool:
        """True when the kubelet the attempt talked to went away or restarted under it,
        or the plugin's socket is gone: each is said on its own and starts it again."""
        if await self._superseded(plugin) or self._kubelet_down:
            return True
        if kubelet is not None and self.kubelet_socket_watch.identity != kubelet:
            return True
        return not await plugin.socket_intact()

    async def _superseded(self, plugin: ResourcePlugin) -> bool:
        """Looks at kubelet.sock first: True when a kubelet restart is pending or under
        way, or ``plugin`` is no longer the resource's plugin (either starts it again)."""
        await self.kubelet_socket_watch.check()
        return self._restart_pending or self.plugins.get(plugin.resource) is not plugin

    def _stream_lost(self, plugin: ResourcePlugin) -> None:
        """The kubelet's stream of ``plugin`` ended: a restart, or a stream lost alone."""
        self._spawn(self._after_stream_loss(plugin), f"stream lost {plugin.resource}")

    async def _after_stream_loss(self, plugin: ResourcePlugin) -> None:
        await asyncio.sleep(STREAM_LOSS_GRACE_S)
        if await self._superseded(plugin):
            return  # a kubelet restart: every plugin starts again, nothing was lost
        plugin.registration_lost()
        if not await self._kubelet_serving():
            if not self._kubelet_down:  # once per outage, whatever the number of streams
                self._kubelet_down = True
                log.info(
                    "Kubelet is not serving; waiting for it to start again",
                    kubeletSocket=str(self.kubelet_socket_watch.socket_path),
                )
            return
        # The kubelet never reopens a stream on its own: register again.
        log.warning("ListAndWatch stream ended; registering again", resourceName=plugin.resource)
        self._wake.set()

    async def _kubelet_serving(self) -> bool:
        path = self.kubelet_socket_watch.socket_path
        serving = await self._hostio.call(str(path), partial(kubelet_serving, path))
        return serving is not False  # a stalled probe: assume serving, registration says

    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_all(self) -> None:
        # Every stop begins before the first await, and each runs to its end even if this
        # is cancelled (see ResourcePlugin.stop); a plugin leaves self.plugins only once
        # it has stopped, so a later call (run's finally) still waits for it.
        stopping = {
            resource: (plugin, plugin.begin_stop()) for resource, plugin in self.plugins.items()
        }
        outcomes = await asyncio.gather(
            *(asyncio.shield(task) for _, task in stopping.values()), return_exceptions=True
        )
        for (resource, (plugin, _)), outcome in zip(stopping.items(), outcomes, strict=True):
            if self.plugins.get(resource) is plugin:
                del self.plugins[resource]
            if isinstance(outcome, Exception):
                log.error("Cannot stop device plugin cleanly", resourceName=resource, err=outcome)

    # ----------------------------------------------------------------- kubelet
    def _kubelet_restarted(self) -> None:
        """A new kubelet.sock: the scan loop restarts the plugins, in one task."""
        self._restart_pending = True
        self._metrics.kubelet_restart()
        self._wake.set()

    async def _restart_if_kubelet_restarted(self) -> None:
        await self.kubelet_socket_watch.check()  # a cheap stat per scan backs up the watch
        if self._restart_pending:
            self._restart_pending = False
            self._kubelet_down = False
            await self._hooks.kubelet_restart()
            await self._stop_all()
            await self._clean_cdi()

    async def _clean_cdi(self) -> None:
        await self._hostio.call(
            str(self._config.cdi_root), partial(cdi.remove_transient_specs, self._config.cdi_root)
        )


def _device_count(wanted: Mapping[str, Sequence[Device]]) -> int:
    return sum(len(devices) for devices in wanted.values())
