"""A ResourceClaim's allocation as this driver's devices (pure).

``allocated_devices`` takes the claim as the API server returned it (its JSON, as a
mapping) and the claim the kubelet named, and returns this driver's devices of this
node's pool in the allocation's order, or ``ClaimProblem`` saying what is wrong: the
claim was replaced (another UID), is not allocated, or names a device of another pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class ClaimProblem(Exception):
    """The claim cannot be prepared; the message is the per-claim error the kubelet shows."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources/NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str  # the request's name; a subrequest's ("req/sub") reduced to "req"
    pool: str
    device: str


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ClaimProblem(f"{what} is not an object")
    return value


def allocated_devices(
    claim: Mapping[str, Any], ref: ClaimRef, driver: str, pool: str
) -> list[AllocatedDevice]:
    metadata = _mapping(claim.get("metadata") or {}, "the claim's metadata")
    if metadata.get("uid") != ref.uid:
        raise ClaimProblem(
            f"ResourceClaim {ref} got replaced: the API server has UID "
            f"{metadata.get('uid')!r}, the kubelet asked for {ref.uid!r}"
        )
    status = _mapping(claim.get("status") or {}, "the claim's status")
    allocation = status.get("allocation")
    if not allocation:
        raise ClaimProblem(f"ResourceClaim {ref} is not allocated")
    devices = _mapping(_mapping(allocation, "the allocation").get("devices") or {}, "devices")
    results = devices.get("results") or []
    if not isinstance(results, Sequence) or isinstance(results, str):
        raise ClaimProblem(f"ResourceClaim {ref}: the allocation's results are not a list")
    found: list[AllocatedDevice] = []
    seen: set[str] = set()
    for result in results:
        entry = _mapping(result, "an allocation result")
        if entry.get("driver") != driver:
            continue  # another driver's part of the claim
        request, device, its_pool = entry.get("request"), entry.get("device"), entry.get("pool")
        if not all(isinstance(v, str) and v for v in (request, device, its_pool)):
            raise ClaimProblem(f"ResourceClaim {ref}: an allocation result lacks a name")
        assert isinstance(request, str) and isinstance(device, str) and isinstance(its_pool, str)
        if its_pool != pool:
            raise ClaimProblem(
                f"ResourceClaim {ref}: device {device} is allocated from pool {its_pool!r}, "
                f"not this node's pool {pool!r}"
            )
        if device in seen:
            raise ClaimProblem(f"ResourceClaim {ref}: device {device} is allocated twice")
        seen.add(device)
        found.append(AllocatedDevice(request.split("/", 1)[0], its_pool, device))
    return found
