"""GetPreferredAllocation adapter: kubelet request -> topology search -> device IDs.

A failed GetPreferredAllocation fails the pod's admission, so nothing here raises: an
invalid request answers an empty list (the kubelet then picks on its own) with a warn
record. The prepared topology of a device set is built once and reused until the plugin's
devices change; health changes do not touch it (the kubelet only offers healthy devices).
Small requests are answered on the event loop: the hand-off to a worker thread would
cost more than the search.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final

from rbln_device_plugin import topology
from rbln_device_plugin.api.v1beta1 import api_pb2
from rbln_device_plugin.model.devicetable import DeviceTable, Entry
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import in_thread

log = get_logger()
_MAX_LOGGED_IDS = 16
_MAX_REASON = 300
# Requests whose search is at most this big (available devices times the smaller of the
# size and what is left over) take well under a millisecond: not worth a thread.
INLINE_WORK: Final = 4 * 64


@dataclass(slots=True)
class _CachedTopology:
    entries: Mapping[str, Entry]  # the table's entries the topology was last checked against
    devices: tuple[Device, ...]
    prepared: topology.Topology


_prepared: weakref.WeakKeyDictionary[DeviceTable, _CachedTopology] = weakref.WeakKeyDictionary()


def topology_for(table: DeviceTable) -> topology.Topology:
    """The table's prepared topology; rebuilt only when the devices themselves changed."""
    entries = table.entries
    known = _prepared.get(table)
    if known is not None and known.entries is entries:
        return known.prepared
    devices = tuple(entry.device for entry in entries.values())
    if known is not None and known.devices == devices:
        known.entries = entries  # a new scan with the same devices
        return known.prepared
    candidates = {d.name: topology.candidate_from_device(d) for d in devices}
    _prepared[table] = _CachedTopology(entries, devices, topology.Topology(candidates))
    return _prepared[table].prepared


async def choose(
    resource: str,
    table: DeviceTable,
    request: api_pb2.ContainerPreferredAllocationRequest,
    metrics: m.Metrics = m.NOOP,
    *,
    cap: int = topology.DEFAULT_CAP,
) -> list[str]:
    """The preferred devices for one container; ``cap``: merge steps before the search
    narrows (``topology.Topology.preferred``)."""
    started = time.monotonic()
    size = request.allocation_size
    available = list(request.available_deviceIDs)
    must = list(request.must_include_deviceIDs)
    try:
        prepared = topology_for(table)
        search = partial(prepared.preferred, available, must, size, cap=cap)
        if _small(len(available), size):
            result = search()
        else:
            # Keep the loop free for other resources' ListAndWatch and Allocate meanwhile.
            result = await in_thread(search, f"preferred {resource}")
    except topology.Fallback as exc:
        _fallback(resource, size, exc.reason, request)
        metrics.preferred_allocation(resource, m.PREFERRED_FALLBACK, time.monotonic() - started)
        return []
    except Exception as exc:  # never let a search bug fail pod admission
        _fallback(resource, size, "internal error in topology search", request, err=exc)
        metrics.preferred_allocation(resource, m.PREFERRED_INTERNAL, time.monotonic() - started)
        return []
    if result.capped is not None:
        log.warning(
            "Preferred allocation search reached its cap",
            resourceName=resource,
            allocationSize=size,
            cap=result.capped,
            deviceIDs=result.device_ids[:_MAX_LOGGED_IDS],
            score=_levels(result.score),
        )
    log.debug(
        "Selected preferred allocation",
        resourceName=resource,
        allocationSize=size,
        deviceIDs=result.device_ids,
        mustInclude=must[:_MAX_LOGGED_IDS],
        shortcut=result.shortcut,
        score=_levels(result.score),
    )
    metrics.preferred_allocation(
        resource, m.OK, time.monotonic() - started, capped=result.capped is not None
    )
    return list(result.device_ids)


def _small(available: int, size: int) -> bool:
    return available * max(0, min(size, available - size)) <= INLINE_WORK


def _levels(score: topology.Score) -> dict[str, int]:
    """The numeric score levels, named, so an operator can see why a set won."""
    return {name: value for name, value in score._asdict().items() if name != "device_ids"}


def _fallback(
    resource: str,
    size: int,
    reason: str,
    request: api_pb2.ContainerPreferredAllocationRequest,
    err: BaseException | None = None,
) -> None:
    fields = {
        "resourceName": resource,
        "allocationSize": size,
        "reason": reason if len(reason) <= _MAX_REASON else reason[:_MAX_REASON] + "...",
        "availableCount": len(request.available_deviceIDs),
        "mustIncludeCount": len(request.must_include_deviceIDs),
    }
    if err is not None:
        fields["err"] = err
    log.warning("Preferred allocation fallback to kubelet", **fields)
