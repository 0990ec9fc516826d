"""The kubelet session's plugins: one ``ResourcePlugin`` per offered resource.

Only the session's task calls in here (see ``session``). A plugin is recorded before it
starts and forgotten only once it has stopped, so a stop of the session at any moment
still finds it and its server and socket never outlive the daemon. Each new instance
gets a serial: events from an instance replaced since are told apart by it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from rbln_device_plugin import aiotasks
from rbln_device_plugin.core.devicestate import DeviceState
from rbln_device_plugin.host.kubeletdir import KubeletDirectory
from rbln_device_plugin.kubelet.events import Events, PluginRef
from rbln_device_plugin.kubelet.plugin import ResourcePlugin
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.model.streaks import FailureStreak
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()


class DeviceStates(Protocol):
    """Where a new plugin's device state comes from (``core.devices.NodeDevices``)."""

    def open_state(self, resource: str) -> DeviceState: ...


class PluginSet:
    def __init__(
        self,
        services: SharedServices,
        states: DeviceStates,
        events: Events,
        kubelet_dir: KubeletDirectory,
    ) -> None:
        self._services = services
        self._states = states
        self._events = events
        self._kubelet_dir = kubelet_dir
        self.by_resource: dict[str, ResourcePlugin] = {}
        self._serials = 0
        self._start_failures: dict[str, FailureStreak] = {}

    def get(self, resource: str) -> ResourcePlugin | None:
        return self.by_resource.get(resource)

    def current(self, ref: PluginRef) -> ResourcePlugin | None:
        """The plugin instance ``ref`` names, while it is still the resource's plugin."""
        plugin = self.by_resource.get(ref.resource)
        return plugin if plugin is not None and plugin.ref == ref else None

    def __iter__(self) -> Iterator[ResourcePlugin]:
        return iter(list(self.by_resource.values()))

    @property
    def open_streams(self) -> int:
        return sum(plugin.open_streams for plugin in self.by_resource.values())

    async def stop_absent(self, offered: Mapping[str, Sequence[Device]]) -> list[str]:
        """Stop the plugins of resources no longer offered; their names."""
        stopped = sorted(set(self.by_resource) - set(offered))
        for resource in stopped:
            plugin = self.by_resource[resource]
            await plugin.update(())  # every device disappears, and is logged as such
            await plugin.stop()
            del self.by_resource[resource]
            self._start_failures.pop(resource, None)
            log.info("Stopped device plugin for absent resource", resourceName=resource)
        return stopped

    async def stop(self, resource: str) -> None:
        plugin = self.by_resource[resource]
        await plugin.stop()
        del self.by_resource[resource]

    async def start(self, resource: str) -> ResourcePlugin | None:
        self._serials += 1
        ref = PluginRef(resource, self._serials)
        state = self._states.open_state(resource)
        plugin = ResourcePlugin(ref, self._services, state, self._events)
        # Recorded before it starts (see the module docstring).
        self.by_resource[resource] = plugin
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
            del self.by_resource[resource]
            return None
        failed_starts = streak.succeeded()
        if failed_starts:
            log.info(
                "Device plugin server started",
                resourceName=resource, socketPath=str(plugin.socket_path),
                failedAttempts=failed_starts,
            )  # fmt: skip
        return plugin

    async def stop_all(self) -> None:
        """Stop every plugin, all at once. Each stop begins before the first await and
        runs to its end even if this is cancelled (see ResourcePlugin.stop); a plugin
        leaves ``plugins`` only once it has stopped, so a later call still waits for it."""
        stopping = list(self.by_resource.items())
        outcomes = await aiotasks.settle_all(plugin.begin_stop() for _, plugin in stopping)
        for (resource, plugin), outcome in zip(stopping, outcomes, strict=True):
            if self.by_resource.get(resource) is plugin:
                del self.by_resource[resource]
            if isinstance(outcome, Exception):
                log.error("Cannot stop device plugin cleanly", resourceName=resource, err=outcome)
