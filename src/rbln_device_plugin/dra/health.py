"""What the DRA health stream tells the kubelet about each device (pure: no I/O, no gRPC).

The kubelet (``k8s.io/kubernetes@v1.37.2`` ``pkg/kubelet/cm/dra/healthinfo.go`` and
``manager.go``) keeps the last report of each pool/device of the driver and writes it into
``status.containerStatuses[].allocatedResourcesStatus`` of the pods holding the device:
Healthy, Unhealthy or Unknown, with the report's message. Each report is the driver's
complete list; a device left out, or reported last longer ago than its
``health_check_timeout_seconds`` (30 s when unset), reads as Unknown.

``report`` lists every device of the ResourceSlices, under the same names
(``slices.offered``), with the health the device plugin's ListAndWatch gives it: the
core's verdict from the one health history (FAULT and every other non-READY code
Unhealthy and sticky; an unreadable status Healthy unless a fault is unresolved), and its
status text as the message. A device a prepared claim holds that the scan does not offer
now (gone from the inventory, a discovery failure) is reported Unknown at once, rather
than after the kubelet's timeout: its health is not known, and its pods should say so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.dra import slices
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.inventory import natural_key

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
UNKNOWN: Final = "Unknown"
# k8s.io/api@v0.37.2 core/v1 ResourceHealthMessageMaxLength, Go's len (bytes): the
# kubelet cuts a longer message to 1021 bytes and "...", which is done here instead so
# the cut never splits a character.
MAX_MESSAGE_BYTES: Final = 1024
NOT_OFFERED: Final = "not in the node's inventory"
# The kubelet's own default (healthinfo.go DefaultHealthTimeout).
MIN_TIMEOUT_S: Final = 30


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    health: str  # HEALTHY, UNHEALTHY or UNKNOWN
    message: str


def fit_message(text: str) -> str:
    """``text`` within the API's 1024 bytes: a longer one cut on a character boundary
    and ended with "...", as the kubelet would."""
    data = text.encode()
    if len(data) <= MAX_MESSAGE_BYTES:
        return text
    return data[: MAX_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."


def timeout_seconds(scan_interval: float) -> int:
    """The ``health_check_timeout_seconds`` sent with each device: three scan intervals,
    at least the kubelet's 30 s. A report goes out every scan, so a device only goes
    Unknown when the scan loop has stalled for that long (or the daemon is gone)."""
    return max(MIN_TIMEOUT_S, math.ceil(3 * scan_interval))


def report(
    pool: str, entries: Mapping[str, Mapping[str, Entry]], held: Iterable[str] = ()
) -> tuple[DeviceHealth, ...]:
    """The complete list: the slices' devices with their verdicts, then the devices of
    prepared claims (``held``) not offered now, Unknown."""
    found: list[DeviceHealth] = []
    seen: set[str] = set()
    for item in slices.offered(entries):
        if isinstance(item, slices.Omission):
            continue  # not in the slices: no pod can hold it through this driver
        _, device_id, entry = item
        seen.add(device_id)
        health = HEALTHY if entry.healthy else UNHEALTHY
        found.append(DeviceHealth(pool, device_id, health, fit_message(entry.verdict.describe())))
    for device_id in sorted(set(held) - seen, key=natural_key):
        if slices.is_dns_label(device_id):
            found.append(DeviceHealth(pool, device_id, UNKNOWN, NOT_OFFERED))
    return tuple(found)
