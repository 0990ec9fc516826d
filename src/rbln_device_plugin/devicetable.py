"""The device set of one resource plugin and what changed between scans (pure).

A ``DeviceTable`` lives exactly as long as its resource plugin instance, and so does its
``HealthHistory``: a device that leaves and returns keeps its history, a new instance
starts empty. Status reads are passed in as a function so the policy is tested without
files; the read and the history update happen together under the history lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rbln_device_plugin.health import Health, HealthHistory, StatusReading, Verdict
from rbln_device_plugin.inventory import Device

StatusReader = Callable[[Device], StatusReading]


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
    def __init__(self) -> None:
        self.history = HealthHistory()
        self._entries: dict[str, Entry] = {}

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self._entries

    def get(self, device_id: str) -> Entry | None:
        return self._entries.get(device_id)

    def apply_scan(self, devices: Sequence[Device], read: StatusReader) -> list[Change]:
        """Read each device's status, feed the history, replace the set; return changes."""
        with self.history.lock:
            fresh = {
                device.name: Entry(device, self.history.observe(device.name, read(device)))
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
        return changes

    def final_check(self, device_ids: Iterable[str], read: StatusReader) -> dict[str, Verdict]:
        """Allocate's status check: one read per distinct device, recorded in the history.

        The published set is left as it is; the next scan publishes the outcome.
        """
        verdicts: dict[str, Verdict] = {}
        with self.history.lock:
            for device_id in device_ids:
                if device_id in verdicts:
                    continue
                entry = self._entries[device_id]
                verdicts[device_id] = self.history.observe(device_id, read(entry.device))
        return verdicts

    def counts(self) -> Counts:
        healthy = sum(1 for entry in self._entries.values() if entry.healthy)
        return Counts(len(self._entries), healthy, len(self._entries) - healthy)

    def kubelet_view(self) -> tuple[KubeletDevice, ...]:
        return tuple(
            (name, entry.verdict.health.value, entry.device.numa)
            for name, entry in sorted(self._entries.items())
        )
