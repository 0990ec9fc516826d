"""An allocation request checked against a resource's devices, before any host access.

Pure: ``validate_request`` takes the requested IDs per container and the devices known
now, and either names what is wrong (``AllocationError``) or returns the request with
its distinct IDs in request order. Both front ends refuse with the same messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m

SHOWN_IDS: Final = 8
SHOWN_ID_CHARS: Final = 64
# Container requests one GetPreferredAllocation may carry. The kubelet sends one per call
# (its device manager asks container by container); each runs a search of its own, so
# without a cap one call could keep a worker busy for seconds (2,000 took 9 s).
MAX_PREFERRED_CONTAINERS: Final = 8

# The requested devices as the final status check saw them, by device ID.
Snapshot = Mapping[str, Device]


class AllocationError(Exception):
    """Fails the whole allocation with this message (the device plugin's Allocate: with
    INVALID_ARGUMENT)."""

    def __init__(
        self,
        message: str,
        *,
        logged: bool = False,
        result: str = m.ALLOCATE_INVALID_REQUEST,
        rescan_wanted: bool = False,
    ) -> None:
        super().__init__(message)
        self.logged = logged  # the per-container failure record was already written
        self.result = result  # the metrics' result class
        self.rescan_wanted = rescan_wanted  # the node's devices changed since the last scan


@dataclass(frozen=True, slots=True)
class ValidRequest:
    """A request that passed validation against ``entries`` (the devices of that moment:
    the final check takes its snapshot from them, whatever a scan publishes meanwhile)."""

    containers: Sequence[Sequence[str]]
    distinct: Sequence[str]  # every requested ID once, in request order
    entries: Mapping[str, Entry]


def shown_id(device_id: str) -> str:
    """One requested ID cut at ``SHOWN_ID_CHARS``: a hostile request's IDs can be
    anything, and messages and trace attributes must stay bounded."""
    if len(device_id) <= SHOWN_ID_CHARS:
        return device_id
    return device_id[:SHOWN_ID_CHARS] + "..."


def shown_ids(ids: Sequence[str]) -> str:
    """At most ``SHOWN_IDS`` IDs, each cut (``shown_id``): messages end up in pod events."""
    shown = [shown_id(i) for i in ids]
    text = ", ".join(repr(i) for i in shown[:SHOWN_IDS])
    return text + (f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")


def preferred_request_problem(resource: str, containers: int) -> str | None:
    """Why a GetPreferredAllocation with ``containers`` container requests is refused
    before any search, or None."""
    if containers <= MAX_PREFERRED_CONTAINERS:
        return None
    return (
        f"{resource}: GetPreferredAllocation carries {containers} container requests; "
        f"at most {MAX_PREFERRED_CONTAINERS} per call (the kubelet sends one)"
    )


def validate_request(
    resource: str, requested: Sequence[Sequence[str]], entries: Mapping[str, Entry]
) -> ValidRequest:
    """Reject bad requests before any host access."""
    if not requested:
        raise AllocationError(f"{resource}: the request names no containers")
    owner: dict[str, int] = {}
    for index, ids in enumerate(requested):
        if not ids:
            raise AllocationError(f"{resource}: container {index} requests no devices")
        unknown = [i for i in dict.fromkeys(ids) if i not in entries]
        if unknown:
            raise AllocationError(
                f"{resource}: unknown device IDs {shown_ids(unknown)} "
                "(not managed by this plugin now)"
            )
        repeated = [i for i, n in Counter(ids).items() if n > 1]
        if repeated:
            raise AllocationError(
                f"{resource}: container {index} lists {shown_ids(repeated)} more than once"
            )
        # Two containers cannot share a device: each gets a group of its own, and the
        # second group would take the device out of the first.
        shared = [i for i in ids if owner.setdefault(i, index) != index]
        if shared:
            raise AllocationError(
                f"{resource}: {shown_ids(shared)} requested by more than one container "
                f"(containers {owner[shared[0]]} and {index})"
            )
    return ValidRequest(requested, list(owner), entries)
