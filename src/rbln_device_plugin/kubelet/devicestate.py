"""One resource's device state: its table, health history, observe lock, the final
check before Allocate, and the records of what changed.

It owns the devices; the servicer only serves them. Updates flow one way: a scan's
devices come in through ``update`` and leave, when something the kubelet sees changed,
as a new published view that ``wait_for_view`` hands to ListAndWatch streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

from rbln_device_plugin.host import sysfs
from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.kubelet.allocate import AllocationError, Snapshot, validate_request
from rbln_device_plugin.model.devicetable import Change, DeviceTable, Entry, KubeletDevice
from rbln_device_plugin.model.health import Health, HealthHistory, StatusReading
from rbln_device_plugin.model.inventory import Device, natural_key
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()


class DeviceState:
    def __init__(
        self,
        resource: str,
        sysfs_root: Path,
        hostio: HostIO,
        history: HealthHistory | None = None,
        metrics: m.Metrics = m.NOOP,
    ) -> None:
        self.resource = resource
        self._sysfs_root = sysfs_root
        self._hostio = hostio
        self._metrics = metrics
        self.table = DeviceTable(history)
        # Held around each batch of status reads and the history update that applies it,
        # so scan and Allocate observations reach the history in the order they were read.
        self._observe_lock = asyncio.Lock()
        self._published: tuple[KubeletDevice, ...] = ()
        self._version = 0
        self._changed = asyncio.Condition()
        self._closed = False
        self.announced = False

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self.table.entries

    def devices(self) -> dict[str, Device]:
        return {device_id: entry.device for device_id, entry in self.table.entries.items()}

    # ----------------------------------------------------------------- updates
    async def update(self, devices: Sequence[Device]) -> list[Change]:
        """Apply one scan's devices; log what changed; wake ListAndWatch if needed."""
        async with self._observe_lock:
            readings = await self._read_statuses(devices)
            changes = self.table.apply_scan(devices, readings)
        self._metrics.devices(self.resource, self.table.entries)
        if self.announced:
            self._log_changes(changes)
        view = self.table.kubelet_view()
        if view != self._published:
            self._published = view
            self._version += 1
            async with self._changed:
                self._changed.notify_all()
        return changes

    async def close(self) -> None:
        """The plugin stops: its devices leave the metrics, its streams end."""
        self._closed = True
        self._metrics.devices(self.resource, None)
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_view(self, sent: int) -> tuple[int, tuple[KubeletDevice, ...]] | None:
        """The published view once its version is not ``sent``; None once closed."""
        async with self._changed:
            await self._changed.wait_for(partial(self._has_news, sent))
        if self._closed:
            return None
        return self._version, self._published

    @property
    def closed(self) -> bool:
        return self._closed

    def _has_news(self, sent: int) -> bool:
        return self._version != sent or self._closed

    # ----------------------------------------------------------------- Allocate
    async def allocation_snapshot(
        self,
        requested: Sequence[Sequence[str]],
        beside: Callable[[list[str], Snapshot], Sequence[Call[object]]] | None = None,
    ) -> tuple[Snapshot, list[object]]:
        """Validate a request against the devices and take the final status check.

        Raises AllocationError for a bad request or an unhealthy device; otherwise
        returns the requested devices as this check saw them (immutable), and the
        results of ``beside``'s calls. ``beside`` gets the distinct requested IDs and
        their devices once the request is valid; its calls (the containers' first host
        checks) run in the status reads' off-loop batch, after them: one thread hop.
        """
        entries = self.table.entries
        distinct = validate_request(self.resource, requested, entries)
        async with self._observe_lock:
            snapshot = {device_id: entries[device_id].device for device_id in distinct}
            extra = list(beside(distinct, snapshot)) if beside is not None else []
            names = [device.name for device in snapshot.values()]
            reads = cast("list[Call[object]]", sysfs.status_calls(self._sysfs_root, names))
            results = await self._hostio.map([*reads, *extra])
            readings = sysfs.statuses(
                names, cast("list[StatusReading | Stalled]", results[: len(names)])
            )
            self._log_unreadable(readings)
            verdicts = self.table.final_check(readings)
        unhealthy = [
            f"{device_id} is {verdict.describe()}"
            for device_id, verdict in verdicts.items()
            if verdict.health is Health.UNHEALTHY
        ]
        if unhealthy:
            raise AllocationError(
                f"{self.resource}: unhealthy devices requested: {'; '.join(unhealthy)}",
                result=m.ALLOCATE_UNHEALTHY,
            )
        return snapshot, results[len(names) :]

    async def _read_statuses(self, devices: Iterable[Device]) -> dict[str, StatusReading]:
        """One off-loop batch of status reads; a read that hangs counts as unreadable."""
        names = (d.name for d in devices)
        readings = await sysfs.read_statuses(self._hostio, self._sysfs_root, names)
        self._log_unreadable(readings)
        return readings

    def _log_unreadable(self, readings: Mapping[str, StatusReading]) -> None:
        root = self._sysfs_root
        for name, reading in readings.items():
            if not reading.readable:
                log.debug(
                    "Cannot read device status",
                    resourceName=self.resource, device=name,
                    path=sysfs.status_path(root, name), err=reading.reason,
                )  # fmt: skip

    # ----------------------------------------------------------------- records
    def _log_changes(self, changes: Sequence[Change]) -> None:
        # Keys in the logging catalogue's order: what, which device, its state (and what it
        # was), then the resource's resulting counts. Keyword order is record key order.
        counts = self.table.counts().fields()
        for change in changes:
            entry = change.entry
            identity: dict[str, Any] = {
                "resourceName": self.resource,
                "device": entry.device.name,
            }
            state: dict[str, Any] = {
                "health": entry.verdict.health.value,
                "status": entry.verdict.describe(),
            }
            if change.kind == "appeared":
                emit = log.info if entry.healthy else log.warning
                emit(
                    "Device appeared in inventory",
                    **identity, pciBusID=entry.device.bus_id, **state, **counts,
                )  # fmt: skip
            elif change.kind == "disappeared":
                log.warning("Device disappeared from inventory", **identity, **state, **counts)
            elif change.previous is not None:
                emit = log.info if entry.healthy else log.warning
                emit(
                    "Device state changed",
                    **identity,
                    **state,
                    previousHealth=change.previous.health.value,
                    previousStatus=change.previous.describe(),
                    **counts,
                )

    def announce(self, socket_path: Path, failed_attempts: int = 0) -> None:
        """The narrative of a (re)registration: the plugin, then each device it exposes.

        ``failed_attempts``: registrations that failed before this one (said only if any).
        From here on, every change is logged as it happens.
        """
        counts = self.table.counts()
        after_failures = {"failedAttempts": failed_attempts} if failed_attempts else {}
        log.info(
            "Registered device plugin with kubelet",
            resourceName=self.resource, **counts.fields(), socketPath=str(socket_path),
            **after_failures,
        )  # fmt: skip
        for entry in sorted(self.table.entries.values(), key=lambda e: natural_key(e.device.name)):
            _log_exposed(self.resource, entry)
        self.announced = True


def _log_exposed(resource: str, entry: Entry) -> None:
    device = entry.device
    emit = log.info if entry.healthy else log.warning
    emit(
        "Device exposed",
        resourceName=resource,
        device=device.name,
        product=device.product,
        pciDeviceID=device.pci_device_id,
        pciBusID=device.bus_id,
        numa=device.numa if device.numa is not None else "unknown",
        health=entry.verdict.health.value,
        status=entry.verdict.describe(),
    )
