"""GetPreferredAllocation adapter: kubelet request -> topology search -> device IDs.

A failed GetPreferredAllocation fails the pod's admission, so nothing here raises: any
problem answers an empty list (the kubelet then picks on its own) with a warn record.
"""

from __future__ import annotations

import asyncio

from rbln_device_plugin import topology
from rbln_device_plugin.api.v1beta1 import api_pb2
from rbln_device_plugin.devicetable import DeviceTable
from rbln_device_plugin.logs import get_logger

log = get_logger()
_MAX_LOGGED_IDS = 16
_MAX_REASON = 300


async def choose(
    resource: str, table: DeviceTable, request: api_pb2.ContainerPreferredAllocationRequest
) -> list[str]:
    size = request.allocation_size
    try:
        candidates = {
            name: topology.candidate_from_device(entry.device)
            for name, entry in table.entries.items()
        }
        # A search on a large node can take tens of milliseconds: keep the loop free for
        # other resources' ListAndWatch and Allocate meanwhile.
        result = await asyncio.to_thread(
            topology.preferred_allocation,
            candidates,
            list(request.available_deviceIDs),
            list(request.must_include_deviceIDs),
            size,
        )
    except topology.Fallback as exc:
        _fallback(resource, size, exc.reason, request)
        return []
    except Exception as exc:  # never let a search bug fail pod admission
        _fallback(resource, size, "internal error in topology search", request, err=exc)
        return []
    log.debug(
        "Selected preferred allocation",
        resourceName=resource,
        allocationSize=size,
        deviceIDs=result.device_ids,
        mustInclude=list(request.must_include_deviceIDs)[:_MAX_LOGGED_IDS],
        shortcut=result.shortcut,
        score=_levels(result.score),
    )
    return list(result.device_ids)


def _levels(score: topology.Score | None) -> dict[str, int] | None:
    """The numeric score levels, named, so an operator can see why a set won."""
    if score is None:
        return None
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
