"""The DRA front end's part of the scan loop, as ``kubelet.session`` is the device plugin's.

Each scan's devices reach the core's device states (``DraDevices``: the same health
history and final checks as the device plugin's), then the kubelet's device-health
streams (``dra.healthstream``, every scan) and the ResourceSlice publisher, which writes
only what changed. The kubelet plugin (``dra.server``) serves from start to
stop: the kubelet's plugin watcher finds its registration socket by itself, after a
kubelet restart too, so there is no restart to act on here.

The API server is reached through one client, shared by the claim reads and the slice
writes, made at start from ``--kubeconfig`` or the pod's service account.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rbln_device_plugin import aiotasks
from rbln_device_plugin.config import Config
from rbln_device_plugin.core.devices import NodeDevices
from rbln_device_plugin.dra import health, names, taints
from rbln_device_plugin.dra.apiclaims import ApiClaims, ClaimSource
from rbln_device_plugin.dra.healthstream import HealthFeed
from rbln_device_plugin.dra.prepare import DraDevices, Preparer
from rbln_device_plugin.dra.server import DraPlugin
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()


class SliceSink(Protocol):
    """Where each scan's devices are published (``dra.publisher``; a test's list)."""

    async def publish(self, entries: Mapping[str, Mapping[str, Entry]]) -> None: ...

    def forget(self) -> None: ...

    async def watch(self, stop: asyncio.Event, changed: Callable[[], None]) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DraParts:
    """What the session serves through: the claim source and the slice sink. Tests pass
    their own; the daemon's come from one API client (``api_parts``)."""

    claims: ClaimSource
    slices: SliceSink


class ApiSetupError(Exception):
    """The API server's client cannot be made (no kubeconfig, no service account)."""


def api_parts(config: Config, metrics: m.Metrics = m.NOOP) -> DraParts:
    """The API server's claim reads and slice writes, sharing one client. Nothing is
    sent yet: a wrong address shows at the first publish, and is retried."""
    from rbln_device_plugin.dra.publisher import SlicePublisher

    try:
        claims = ApiClaims.from_kubeconfig(config.kubeconfig)
    except Exception as exc:  # lightkube's ConfigError, an unreadable or broken file
        source = str(config.kubeconfig) if config.kubeconfig else "the pod's service account"
        raise ApiSetupError(f"{source}: {exc}") from None
    effect = taints.NO_EXECUTE if config.dra_taint_no_execute else taints.NO_SCHEDULE
    publisher = SlicePublisher(claims.client, config.node_name, metrics, taint_effect=effect)
    return DraParts(claims, publisher)


async def close_parts(parts: DraParts) -> None:
    """Close the slice sink, then the claim source (the client's owner)."""
    for part in (parts.slices, parts.claims):
        close = getattr(part, "close", None)
        if close is None:
            continue
        try:
            await close()
        except Exception as exc:  # closing a client must not stop the shutdown
            log.warning("Closing the API client failed", err=repr(exc))


class DraSession:
    def __init__(
        self,
        config: Config,
        hostio: HostIO,
        metrics: m.Metrics,
        rsd_queue: asyncio.Lock,
        devices: NodeDevices,
        wake_scan: asyncio.Event,
        parts: DraParts,
    ) -> None:
        self._parts = parts
        self.devices = DraDevices(devices.open_state)
        self.plugin_dir = config.kubelet_plugins_path / names.DRIVER_NAME
        self.preparer = Preparer(
            config, self.devices, parts.claims, node_name=config.node_name,
            plugin_dir=self.plugin_dir, hostio=hostio, metrics=metrics,
            rsd_queue=rsd_queue, wake=wake_scan,
        )  # fmt: skip
        self.feed = HealthFeed(health.timeout_seconds(config.scan_interval))
        self.plugin = DraPlugin(
            self.preparer, config.kubelet_plugins_registry_path, self.plugin_dir, hostio,
            feed=self.feed, metrics=metrics,
        )  # fmt: skip
        # Set once the kubelet accepted the registration (the `registered` health service).
        self.registered = asyncio.Event()
        self._serving = False
        self._wake_scan = wake_scan

    # ----------------------------------------------------------------- the scan loop's
    async def begin(self) -> None:
        """Before the first scan: the checkpoint is read and the plugin serves."""
        await self.plugin.start()
        self._serving = True

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the kubelet's registrations and the slices on the API server."""
        watch = aiotasks.start(
            self._parts.slices.watch(stop, self._slices_changed), "resourceslice-watch"
        )
        try:
            await self._follow_registrations(stop)
        finally:
            await aiotasks.cancel_and_wait(watch, title="DRA session")

    async def _follow_registrations(self, stop: asyncio.Event) -> None:
        """``registered`` turns on at the kubelet's first positive verdict. A later one is
        a kubelet that started again, and a starting kubelet deletes its node's slices:
        they are published again at once."""
        registration = self.plugin.registration
        first = True
        while not stop.is_set():
            await registration.notified.wait()
            registration.notified.clear()
            if not registration.registered:
                continue
            self.registered.set()
            if not first:
                self._slices_changed()
            first = False

    def _slices_changed(self) -> None:
        self._parts.slices.forget()
        self._wake_scan.set()

    async def restart_due(self, *, look: bool = True) -> bool:
        return False  # the plugin watcher registers the plugin again by itself

    async def restart(self) -> None:
        pass

    async def reconcile(
        self, offered: Mapping[str, Sequence[Device]], withheld: frozenset[str] = frozenset()
    ) -> None:
        """The scan's devices into the core's states, then to the kubelet's health streams
        (every scan: a list not re-sent goes stale there), then into the ResourceSlices
        (only what changed; an API server that hangs cannot hold the health back), but for
        those ``withheld`` (held by the device-plugin mode's pods: ``runtime.otherholds``)."""
        self.devices.withheld = withheld
        await self.devices.update(offered)
        entries = {resource: state.entries for resource, state in self.devices.states.items()}
        if withheld:
            entries = {
                resource: {i: e for i, e in table.items() if i not in withheld}
                for resource, table in entries.items()
            }
        held = (
            d.device
            for claim in self.preparer.checkpoint.claims.values()
            for d in claim.devices
            if d.pool == self.preparer.pool
        )
        await self.feed.publish(health.report(self.preparer.pool, entries, held))
        await self._parts.slices.publish(entries)

    async def stop_plugins(self) -> None:
        if self._serving:
            self._serving = False
            await self.plugin.stop()
        for state in list(self.devices.states.values()):
            await state.close()
        self.devices.states.clear()

    @property
    def plugins(self) -> Mapping[str, Any]:
        return self.devices.states

    @property
    def open_streams(self) -> int:
        return self.feed.streams
