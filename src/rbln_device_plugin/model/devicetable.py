"""The device set of one resource plugin and what changed between scans (pure).

A ``DeviceTable`` lives as long as its resource plugin instance; its ``HealthHistory``
is passed in by the owner, who decides how long it lasts (the scan loop keeps one per
resource across kubelet restarts). A device that leaves and returns keeps its history.
Status readings are passed in, so the policy is tested without files; the plugin holds
one lock around each batch of reads and the update that applies them, so observations
reach the history in the order they were read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rbln_device_plugin.model.health import Health, HealthHistory, StatusReading, Verdict
from rbln_device_plugin.model.inventory import Device

Readings = Mapping[str, StatusReading]


@dataclass(frozen=True, slots=True)
class Entry:
    device: Device
    verdict: Verdict

    @property
    def healthy(self) -> bool:
        return self.verdict.health is Health.HEALTHY


@dataclass(frozen=True, slots=True)
class Change:
    kind: Literal["appeared", "disappeared", "changed"]
    entry: Entry  # the device as it is now (as it was last, for "disappeared")
    previous: Verdict | None = None


@dataclass(frozen=True, slots=True)
class Counts:
    devices: int
    healthy: int
    unhealthy: int

    def fields(self) -> dict[str, int]:
        return {
            "deviceCount": self.devices,
            "healthyCount": self.healthy,
            "unhealthyCount": self.unhealthy,
        }


# What the kubelet sees of one device: ID, health, NUMA node (None = not reported).
KubeletDevice = tuple[str, str, int | None]


class DeviceTable:
    def __init__(self, history: HealthHistory | None = None) -> None:
        self.history = history if history is not None else HealthHistory()
        self._entries: dict[str, Entry] = {}
        # The last scan's devices and readings, while nothing else observed since: the
        # same scan again changes nothing (the history's verdict for a repeated reading
        # is the one it gave), so an idle node's scan skips rebuilding the table.
        self._last_scan: tuple[Sequence[Device], Readings] | None = None

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self._entries

    def apply_scan(self, devices: Sequence[Device], readings: Readings) -> list[Change]:
        """Feed each device's status reading to the history, replace the set; return changes."""
        last = self._last_scan
        if last is not None and readings == last[1] and (devices is last[0] or devices == last[0]):
            return []
        fresh = {
            device.name: Entry(device, self.history.observe(device.name, readings[device.name]))
            for device in devices
        }
        changes: list[Change] = []
        for name, entry in fresh.items():
            old = self._entries.get(name)
            if old is None:
                changes.append(Change("appeared", entry))
            elif (old.verdict.health, old.verdict.status) != (
                entry.verdict.health,
                entry.verdict.status,
            ):
                changes.append(Change("changed", entry, old.verdict))
        changes.extend(
            Change("disappeared", old) for name, old in self._entries.items() if name not in fresh
        )
        self._entries = fresh
        self._last_scan = (devices, readings)
        return changes

    def final_check(self, readings: Readings) -> tuple[dict[str, Verdict], list[Change]]:
        """Allocate's status check: one reading per distinct device, recorded in the history.

        A verdict that differs from the published one replaces it at once (a fault found
        here reaches the kubelet now, not at the next scan): returns the verdicts and
        those changes. A device the table no longer holds only feeds the history.
        """
        verdicts: dict[str, Verdict] = {}
        changes: list[Change] = []
        self._last_scan = None  # the history may now answer the same reading otherwise
        for device_id, reading in readings.items():
            verdict = verdicts[device_id] = self.history.observe(device_id, reading)
            old = self._entries.get(device_id)
            if old is None or (old.verdict.health, old.verdict.status) == (
                verdict.health,
                verdict.status,
            ):
                continue
            entry = self._entries[device_id] = Entry(old.device, verdict)
            changes.append(Change("changed", entry, old.verdict))
        return verdicts, changes

    def counts(self) -> Counts:
        healthy = sum(1 for entry in self._entries.values() if entry.healthy)
        return Counts(len(self._entries), healthy, len(self._entries) - healthy)

    def kubelet_view(self) -> tuple[KubeletDevice, ...]:
        return tuple(
            (name, entry.verdict.health.value, entry.device.numa)
            for name, entry in sorted(self._entries.items())
        )
