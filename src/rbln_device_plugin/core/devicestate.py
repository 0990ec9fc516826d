"""One resource's device state: its table, health history, observe lock, request
validation, the final check before an allocation, and the records of what changed.

It owns the devices; a front end only serves them. Updates flow one way: a scan's
devices come in through ``update`` and leave, when something the kubelet sees changed,
as a new published view that ``wait_for_view`` hands to whoever streams it (the device
plugin's ListAndWatch). An allocation flows one way too: ``validate``, then
``final_check`` (the status reads, with the front end's own first host calls in the same
off-loop batch), then an immutable snapshot the front end prepares containers from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rbln_device_plugin.core.requests import (
    AllocationError,
    Snapshot,
    ValidRequest,
    validate_request,
)
from rbln_device_plugin.host import sysfs
from rbln_device_plugin.host.hostio import Call, HostBatch, HostIO
from rbln_device_plugin.model.devicetable import Change, DeviceTable, Entry, KubeletDevice
from rbln_device_plugin.model.health import Health, HealthHistory, StatusReading
from rbln_device_plugin.model.inventory import Device
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
        self._status_calls: tuple[tuple[str, ...], list[Call[StatusReading]]] = ((), [])
        self._status_devices: Sequence[Device] | None = None
        # Held by pods of the other kubelet API (``runtime.otherholds``): kept in the table and
        # its health history, left out of the kubelet's view and refused by ``validate``.
        self._withheld: frozenset[str] = frozenset()

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self.table.entries

    def devices(self) -> dict[str, Device]:
        return {device_id: entry.device for device_id, entry in self.table.entries.items()}

    # ----------------------------------------------------------------- updates
    async def withhold(self, devices: frozenset[str]) -> None:
        """Keep ``devices`` out of the view from now on (call it before ``update``, so a
        held device is never in a view sent); the view is published again when it changed."""
        if devices == self._withheld:
            return
        self._withheld = devices
        if self.table.entries:
            await self._publish(())

    async def update(self, devices: Sequence[Device]) -> list[Change]:
        """Apply one scan's devices; log what changed; wake the view's waiters (the device
        plugin's ListAndWatch streams) when what the kubelet sees changed."""
        async with self._observe_lock:
            readings = await self._read_statuses(devices)
            before = self.table.entries
            changes = self.table.apply_scan(devices, readings)
        if changes or self.table.entries is not before:
            await self._publish(changes)
        return changes

    async def _publish(self, changes: Sequence[Change]) -> None:
        """Log and count what changed; wake the view's waiters when the view changed."""
        if self._closed:  # its devices left the metrics; nobody waits for its view
            return
        self._metrics.devices(self.resource, self.table.entries)
        if self.announced:
            self._log_changes(changes)
        view = self.table.kubelet_view()
        if self._withheld:
            view = tuple(device for device in view if device[0] not in self._withheld)
        if view != self._published:
            self._published = view
            self._version += 1
            async with self._changed:
                self._changed.notify_all()

    async def close(self) -> None:
        """Its front end stops serving it: its devices leave the metrics, the view's
        waiters end."""
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

    # ----------------------------------------------------------------- allocation
    def validate(self, requested: Sequence[Sequence[str]]) -> ValidRequest:
        """Check a request against the devices published now (raises AllocationError)."""
        entries = self.table.entries
        if self._withheld:  # unknown to the kubelet's view, so unknown here
            entries = {i: e for i, e in entries.items() if i not in self._withheld}
        return validate_request(self.resource, requested, entries)

    async def final_check(self, request: ValidRequest, ahead: HostBatch) -> Snapshot:
        """The final status check of a valid request's devices: the snapshot to prepare
        containers from (immutable), or AllocationError naming the unhealthy devices.

        ``ahead`` (the front end's first host calls for this request, which only look
        and open) runs in the status reads' off-loop batch, after them: one thread hop.
        A verdict that differs from the published one is published at once.
        """
        async with self._observe_lock:
            snapshot = {i: request.entries[i].device for i in request.distinct}
            names = [device.name for device in snapshot.values()]
            reads = HostBatch()
            slots = [reads.add(call) for call in sysfs.status_calls(self._sysfs_root, names)]
            await reads.run(self._hostio, ahead)
            readings = sysfs.statuses(names, [slot.result() for slot in slots])
            self._log_unreadable(readings)
            verdicts, changes = self.table.final_check(readings)
        if changes:  # a fault (or a recovery) found here is published now
            await self._publish(changes)
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
        return snapshot

    async def _read_statuses(self, devices: Sequence[Device]) -> dict[str, StatusReading]:
        """One off-loop batch of status reads; a read that hangs counts as unreadable."""
        if devices is not self._status_devices:  # an idle scan hands over the same list
            names = tuple(d.name for d in devices)
            if names != self._status_calls[0]:  # the calls are kept while the devices stay
                self._status_calls = (names, sysfs.status_calls(self._sysfs_root, names))
            self._status_devices = devices
        names, calls = self._status_calls
        results = await self._hostio.map(calls)
        readings = sysfs.statuses(names, results)
        self._log_unreadable(readings)
        return readings

    def _log_unreadable(self, readings: Mapping[str, StatusReading]) -> None:
        if not log.is_enabled_for(logging.DEBUG):
            return  # 64 property reads a scan on a large node, for records nobody sees
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

    def report_changes(self) -> None:
        """From now on every change is logged as it happens (a front end calls this once
        it has told its consumer about the devices: before that, changes are the start)."""
        self.announced = True
