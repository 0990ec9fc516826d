"""The scan loop: scan -> core -> the kubelet session's reconcile, on a fixed schedule.

It scans at start and then on a fixed schedule (no drift, no overlap); each scan asks
the core (``core.devices``) for the devices each resource offers now, and hands that to
the kubelet session (``kubelet.session``), which starts, updates, stops and registers
the plugins and owns everything the kubelet does (restarts, lost streams, registration).
The session wakes the loop early through ``wake`` (a kubelet restart, a lost stream, an
Allocate that found the node renumbered); the schedule is kept.

The health service turns SERVING after the first scan whatever the kubelet does: the
session never waits for the kubelet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rbln_device_plugin import aiotasks
from rbln_device_plugin.core.devices import DeviceSource, Discovery, NodeDevices
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.kubelet.session import KubeletSession
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.runtime.cdicheck import CdiSpecCheck
from rbln_device_plugin.runtime.otherholds import OtherModeHolds
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import StopScope

log = get_logger()


async def _nothing() -> None:
    pass


async def _relay(stop: asyncio.Event, wake: asyncio.Event) -> None:
    await stop.wait()
    wake.set()


class FrontEnd(Protocol):
    """What serves the scans' devices to the kubelet: the device plugin's session
    (``kubelet.session``) or the DRA kubelet plugin's (``dra.session``)."""

    registered: asyncio.Event

    async def begin(self) -> None: ...
    async def run(self, stop: asyncio.Event) -> None: ...
    async def restart_due(self, *, look: bool = True) -> bool: ...
    async def restart(self) -> None: ...
    async def reconcile(
        self, offered: Mapping[str, Sequence[Device]], withheld: frozenset[str] = ...
    ) -> None: ...
    async def stop_plugins(self) -> None: ...
    @property
    def plugins(self) -> Mapping[str, Any]: ...
    @property
    def open_streams(self) -> int: ...


# Makes the front end from the node's devices and the scan loop's wake event.
FrontEndFactory = Callable[[NodeDevices, asyncio.Event], FrontEnd]


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
        scanner: DeviceSource | None = None,
        front_end: FrontEndFactory | None = None,
        holds: OtherModeHolds | None = None,
    ) -> None:
        config = services.config
        self._config = config
        self._metrics = services.metrics
        self._hooks = hooks
        source = scanner or Scanner(
            sysfs_root=config.sysfs_root,
            smi_path=config.rbln_smi,
            hostio=services.hostio,
            metrics=services.metrics,
        )
        self.devices = NodeDevices(config, source, services.hostio, services.metrics)
        # Set to scan now and keep the schedule (by the session: see the module docstring).
        self._wake = asyncio.Event()
        self.session: FrontEnd = (
            front_end(self.devices, self._wake)
            if front_end is not None
            else KubeletSession(services, self.devices, self._wake)
        )
        # What pods of the other kubelet API hold: kept out of this mode's offer.
        self.holds = holds or OtherModeHolds(config, services.hostio, services.metrics)
        self.cdi_check = CdiSpecCheck(config, services.hostio, services.metrics)
        self._cdi_check_failed = False
        self.scans = 0
        # Device IDs per resource after the previous scan (None before the first one), for
        # the appeared/disappeared counters: what the kubelet was offered, whatever
        # plugin instance offered it.
        self._offered: dict[str, frozenset[str]] | None = None

    @property
    def plugins(self) -> Mapping[str, Any]:
        return self.session.plugins

    async def run(self, stop: asyncio.Event) -> None:
        await self.session.begin()
        await self._check_cdi_spec()  # once before the first scan: its record comes first
        session = aiotasks.start(self.session.run(stop), "kubelet-session")
        cdi_watch = aiotasks.start(self.cdi_check.watch(stop), "cdi-spec-watch")
        # The stop wakes the wait between scans, which then waits on one event alone.
        stopping = aiotasks.start(_relay(stop, self._wake), "scan-loop-stop")
        try:
            async with StopScope(stop) as scans:  # a stop cancels the scan under way
                await self._scan_loop(stop, scans)
        finally:
            await aiotasks.cancel_and_wait(session, cdi_watch, stopping, title="scan loop")
            await self.session.stop_plugins()

    async def _scan_loop(self, stop: asyncio.Event, scans: StopScope) -> None:
        loop = asyncio.get_running_loop()
        interval = self._config.scan_interval
        next_scan = loop.time()
        while not stop.is_set():
            if not await scans.run(self._scan_once()):
                break
            if self.scans == 1:
                await self._hooks.first_scan()
            now = loop.time()
            if next_scan <= now:
                next_scan += interval
                if next_scan <= now:  # a scan outlasted the interval: skip, don't pile up
                    next_scan = now + interval
            # Woken early (kubelet restart, lost stream): reconcile now, keep the schedule.
            # The timer sets the same event: an idle turn raises and catches no timeout.
            timer = loop.call_at(next_scan, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
            self._wake.clear()

    async def _scan_once(self) -> None:
        await self._hooks.scan_start()
        try:
            await self._settle_kubelet_restart()
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

    async def _reconcile(self) -> None:
        started = time.monotonic()
        self.scans += 1
        discovery = await self.devices.discover()
        # The kubelet may have restarted while rbln-smi ran: restart first, register once.
        # The scan's first question looked at kubelet.sock; the watch saw it since.
        await self._settle_kubelet_restart(look=False)
        withheld = await self.holds.withheld(discovery.offered)
        await self.session.reconcile(discovery.offered, withheld)
        self._record(discovery, started)

    async def _settle_kubelet_restart(self, *, look: bool = True) -> None:
        """A kubelet restart seen since: the runtime's part first (the hook: the instance
        lock's check, as kubelets before 1.33 delete its legacy file), then the session
        stops every plugin before anything registers again."""
        if await self.session.restart_due(look=look):
            await self._hooks.kubelet_restart()
            await self.session.restart()

    def _record(self, discovery: Discovery, started: float) -> None:
        """The scan's metrics and its debug record."""
        if self._metrics.enabled:
            self._count_changes(discovery)
        self._metrics.scan(discovery.outcome, time.monotonic() - started)
        if not log.is_enabled_for(logging.DEBUG):
            return  # counting the tasks is most of the record's cost
        log.debug(
            "Reconciled device inventory",
            resourceCount=len(self.session.plugins),
            deviceCount=discovery.device_count,
            durationMs=round((time.monotonic() - started) * 1000, 2),
            tasks=len(asyncio.all_tasks()),
            streams=self.session.open_streams,
        )

    def _count_changes(self, discovery: Discovery) -> None:
        offered = {
            name: frozenset(d.name for d in devices) for name, devices in discovery.offered.items()
        }
        before, self._offered = self._offered, offered
        if before is None:
            return  # the first scan sets the baseline: a start is not a change
        for resource in sorted(set(before) | set(offered)):
            old, new = before.get(resource, frozenset()), offered.get(resource, frozenset())
            self._metrics.inventory_changes(resource, len(new - old), len(old - new))
