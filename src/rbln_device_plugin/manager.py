"""The scan loop: inventory snapshots -> one ResourcePlugin per resource name.

It scans at start and then on a fixed schedule (no drift, no overlap), starts, updates
and stops plugins to match each snapshot, registers them with the kubelet, re-registers
after a dropped stream, and restarts everything when the kubelet recreates its socket.
Kubelet restarts are noticed by polling the identity (inode and change time) of
``kubelet.sock`` every 200 ms: one ``stat`` call, which works on every hostPath mount and
needs no inotify watch limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from opentelemetry import trace

from rbln_device_plugin import cdi
from rbln_device_plugin.config import Config
from rbln_device_plugin.inventory import Device
from rbln_device_plugin.logs import get_logger
from rbln_device_plugin.plugin import RegistrationError, ResourcePlugin, file_identity
from rbln_device_plugin.scan import DiscoveryError, Scanner

KUBELET_POLL_S: Final = 0.2
# A kubelet restart also ends every stream; give the socket watcher time to see the new
# kubelet.sock first, so a restart causes one registration, not two.
STREAM_LOSS_GRACE_S: Final = 3 * KUBELET_POLL_S

log = get_logger()


class Manager:
    def __init__(
        self,
        config: Config,
        tracer: trace.Tracer,
        on_first_scan: Callable[[], Awaitable[None]],
        scanner: Scanner | None = None,
    ) -> None:
        self._config = config
        self._tracer = tracer
        self._on_first_scan = on_first_scan
        self._scanner = scanner or Scanner(sysfs_root=config.sysfs_root, smi_path=config.rbln_smi)
        self._kubelet_socket = config.kubelet_dir / "kubelet.sock"
        self.plugins: dict[str, ResourcePlugin] = {}
        self._wake = asyncio.Event()
        # One queue for RSD group changes across all resource plugins of this daemon.
        self._rsd_queue = asyncio.Lock()
        self._kubelet_identity: tuple[int, int] | None = None
        self._restart_pending = False
        self.scans = 0

    async def run(self, stop: asyncio.Event) -> None:
        cdi.remove_transient_specs(self._config.cdi_root)
        self._kubelet_identity = file_identity(self._kubelet_socket)
        watcher = asyncio.create_task(self._watch_kubelet(stop), name="kubelet-watch")
        loop = asyncio.get_running_loop()
        interval = self._config.scan_interval
        next_scan = loop.time()
        try:
            while not stop.is_set():
                await self._restart_if_kubelet_restarted()
                await self._reconcile()
                if self.scans == 1:
                    await self._on_first_scan()
                now = loop.time()
                if next_scan <= now:
                    next_scan += interval
                    if next_scan <= now:  # a scan outlasted the interval: skip, don't pile up
                        next_scan = now + interval
                # Woken early (kubelet restart, lost stream): reconcile now, keep the schedule.
                await _sleep_until(loop, next_scan, stop, self._wake)
                self._wake.clear()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await self._stop_all()

    # ----------------------------------------------------------------- scanning
    async def _reconcile(self) -> None:
        started = time.monotonic()
        self.scans += 1
        try:
            result = await self._scanner.scan()
            wanted: Mapping[str, Sequence[Device]] = {
                name: devices for name, devices in result.resources.items() if devices
            }
        except DiscoveryError as exc:
            log.error("Device discovery failed; reporting zero devices until it recovers", err=exc)
            wanted = {}
        except Exception as exc:  # a bug on odd input must not end the scan loop
            log.error(
                "Device discovery failed; reporting zero devices until it recovers",
                err=f"internal error: {exc!r}", exc_info=True,
            )  # fmt: skip
            wanted = {}
        # The kubelet may have restarted while rbln-smi ran: restart first, register once.
        await self._restart_if_kubelet_restarted()
        for resource in sorted(set(self.plugins) - set(wanted)):
            plugin = self.plugins.pop(resource)
            await plugin.stop()
            log.info("Stopped device plugin for absent resource", resourceName=resource)
        for resource in sorted(wanted):
            try:
                await self._sync_plugin(resource, wanted[resource])
            except Exception as exc:  # one resource's trouble must not cost the others
                log.error(
                    "Cannot update device plugin; retrying next scan",
                    resourceName=resource, err=exc, exc_info=True,
                )  # fmt: skip
        log.debug(
            "Reconciled device inventory",
            resourceCount=len(self.plugins),
            deviceCount=sum(len(devices) for devices in wanted.values()),
            durationMs=round((time.monotonic() - started) * 1000, 2),
            tasks=len(asyncio.all_tasks()),
            streams=sum(plugin.open_streams for plugin in self.plugins.values()),
        )

    async def _sync_plugin(self, resource: str, devices: Sequence[Device]) -> None:
        plugin = self.plugins.get(resource)
        if plugin is not None and not plugin.socket_intact():
            log.warning(
                "Device plugin socket was removed; restarting the plugin",
                resourceName=resource, socketPath=str(plugin.socket_path),
            )  # fmt: skip
            await plugin.stop()
            del self.plugins[resource]
            plugin = None
        if plugin is None:
            plugin = ResourcePlugin(
                resource, self._config, self._tracer, self._stream_lost, self._rsd_queue
            )
            try:
                await plugin.start()
            except (OSError, RuntimeError) as exc:
                log.error(
                    "Cannot start device plugin server; retrying next scan",
                    resourceName=resource, socketPath=str(plugin.socket_path), err=exc,
                )  # fmt: skip
                await plugin.stop()
                return
            self.plugins[resource] = plugin
        await plugin.update(devices)
        if not plugin.registered:
            await self._register(plugin)

    def _stream_lost(self) -> None:
        asyncio.get_running_loop().call_later(STREAM_LOSS_GRACE_S, self._wake.set)

    async def _register(self, plugin: ResourcePlugin) -> None:
        try:
            await plugin.register()
        except RegistrationError as exc:
            log.error(
                "Device plugin registration failed; retrying next scan",
                resourceName=plugin.resource, err=exc,
            )  # fmt: skip
            return
        plugin.announce()

    async def _stop_all(self) -> None:
        plugins, self.plugins = self.plugins, {}
        await asyncio.gather(*(plugin.stop() for plugin in plugins.values()))

    # ----------------------------------------------------------------- kubelet
    async def _watch_kubelet(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(KUBELET_POLL_S)
            if self._check_kubelet_socket():
                self._wake.set()

    async def _restart_if_kubelet_restarted(self) -> None:
        self._check_kubelet_socket()
        if self._restart_pending:
            self._restart_pending = False
            await self._stop_all()
            cdi.remove_transient_specs(self._config.cdi_root)

    def _check_kubelet_socket(self) -> bool:
        """Note a new kubelet.sock; the scan loop does the restart, in one task."""
        identity = file_identity(self._kubelet_socket)
        if identity == self._kubelet_identity:
            return False
        previous, self._kubelet_identity = self._kubelet_identity, identity
        if identity is None:
            return False  # kubelet is down; its new socket is what we wait for
        log.info(
            "Detected kubelet socket recreation; restarting device plugins",
            kubeletSocket=str(self._kubelet_socket), hadSocket=previous is not None,
        )  # fmt: skip
        self._restart_pending = True
        return True


async def _sleep_until(
    loop: asyncio.AbstractEventLoop, deadline: float, stop: asyncio.Event, wake: asyncio.Event
) -> None:
    timeout = max(0.0, deadline - loop.time())
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)
