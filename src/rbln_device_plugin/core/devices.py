"""The node's devices as the core knows them: each scan's discovery, and per resource a
health history that outlives any one front end's serving of it.

A scan asks the scanner (``host.scan``: ``rbln-smi`` and sysfs) and answers with the
devices each resource should offer now. A failed discovery offers nothing and is said
once per reason, and once more when it recovers. The histories live for as long as the
resource is offered: a front end that starts serving again (the kubelet restarted)
opens a fresh ``DeviceState`` on the same history, so a faulted device whose status
turns unreadable stays Unhealthy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rbln_device_plugin.config import Config
from rbln_device_plugin.core.devicestate import DeviceState
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import DiscoveryError, ScanResult
from rbln_device_plugin.model.health import HealthHistory
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.model.streaks import FailureStreak
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

# Resource name -> the devices it offers now; resources without devices are absent.
Offered = Mapping[str, Sequence[Device]]


class DeviceSource(Protocol):
    """What discovers the node's devices (``host.scan.Scanner``)."""

    async def scan(self) -> ScanResult: ...


@dataclass(frozen=True, slots=True)
class Discovery:
    """One scan's answer: what each resource offers, and the scan's metrics outcome."""

    offered: Offered
    outcome: str  # metrics.OK or metrics.SCAN_DISCOVERY_FAILED

    @property
    def device_count(self) -> int:
        return sum(len(devices) for devices in self.offered.values())


class NodeDevices:
    def __init__(
        self, config: Config, source: DeviceSource, hostio: HostIO, metrics: m.Metrics
    ) -> None:
        self._config = config
        self._source = source
        self._hostio = hostio
        self._metrics = metrics
        self._histories: dict[str, HealthHistory] = {}
        # Said once, again on a new reason, and once more when it ends (see streaks).
        self._failures = FailureStreak()

    async def discover(self) -> Discovery:
        """The devices each resource should offer now; a resource no longer offered
        forgets its history."""
        discovery = await self._scan()
        for resource in set(self._histories) - set(discovery.offered):
            del self._histories[resource]
        return discovery

    def open_state(self, resource: str) -> DeviceState:
        """A fresh device state for a front end that starts serving ``resource``."""
        history = self._histories.setdefault(resource, HealthHistory())
        return DeviceState(resource, self._config.sysfs_root, self._hostio, history, self._metrics)

    async def _scan(self) -> Discovery:
        try:
            result = await self._source.scan()
            offered = {name: devices for name, devices in result.resources.items() if devices}
        except DiscoveryError as exc:
            log.error("Device discovery failed; reporting zero devices until it recovers", err=exc)
            self._failures.failed(str(exc))
            return Discovery({}, m.SCAN_DISCOVERY_FAILED)
        except Exception as exc:  # a bug on odd input must not end the scan loop
            log.error(
                "Device discovery failed; reporting zero devices until it recovers",
                err=f"internal error: {exc!r}", exc_info=True,
            )  # fmt: skip
            self._failures.failed(repr(exc))
            return Discovery({}, m.SCAN_DISCOVERY_FAILED)
        discovery = Discovery(offered, m.OK)
        failed_scans = self._failures.succeeded()
        if failed_scans:
            log.info(
                "Device discovery recovered",
                failedScans=failed_scans,
                deviceCount=discovery.device_count,
            )
        return discovery
