"""Which NPUs the node's pods hold through the other kubelet API, and which devices a mode
therefore keeps back (pure: ``kubelet.podresources`` reads, ``runtime.otherholds`` drives).

A node switched between the device-plugin mode and DRA can have pods running that got
their NPUs the other way. The kubelet's PodResources API lists, per running pod and
container, the device-plugin devices (resource name and device IDs, as this plugin
advertised them) and the DRA claims' devices (driver, pool, device name). A mode must not
offer a device the other mode's pods still hold, or one device would be given twice.

``Holds`` is the decision across reads: before the first successful read every candidate
device is kept back (any of them might be held); after it, exactly the devices the last
successful read found held. A failed read keeps the last successful read's answer: while
this instance holds the node's instance lock the other mode does not run, so nothing new
can be handed out the other way and the holdings only shrink. Once a read finds nothing
held the question is settled for the life of the process (no more reads).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    """A container that holds a device."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """One DRA claim of a container: its devices as (driver, pool, device name)."""

    namespace: str
    name: str
    devices: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerUse:
    """One container's devices: device-plugin ones as (resource name, device IDs)."""

    name: str
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    claims: tuple[ClaimUse, ...] = ()


@dataclass(frozen=True, slots=True)
class PodUse:
    namespace: str
    name: str
    containers: tuple[ContainerUse, ...] = ()


# Device ID -> the containers holding it.
Held = Mapping[str, frozenset[Holder]]


def _collect(pairs: Iterable[tuple[str, Holder]]) -> dict[str, frozenset[Holder]]:
    found: dict[str, set[Holder]] = {}
    for device, holder in pairs:
        found.setdefault(device, set()).add(holder)
    return {device: frozenset(holders) for device, holders in found.items()}


def held_through_device_plugin(pods: Iterable[PodUse], resources: Collection[str]) -> Held:
    """The devices of ``resources`` (this plugin's resource names) the pods hold."""
    return _collect(
        (device, Holder(pod.namespace, pod.name, container.name))
        for pod in pods
        for container in pod.containers
        for resource, ids in container.devices
        if resource in resources
        for device in ids
    )


def held_through_dra(pods: Iterable[PodUse], driver: str) -> Held:
    """The devices of DRA driver ``driver`` the pods' claims hold. The pool is not
    compared: the kubelet lists only claims prepared on its own node, and this driver
    has one pool per node."""
    return _collect(
        (device, Holder(pod.namespace, pod.name, container.name))
        for pod in pods
        for container in pod.containers
        for claim in container.claims
        for claim_driver, _pool, device in claim.devices
        if claim_driver == driver
    )


class Holds:
    """The devices to keep back, across successive reads (see the module's doc).

    ``candidates``: the devices that might be held before anything was read (None: any
    device). ``settled``: a read found nothing held; nothing is kept back from then on.
    """

    def __init__(self, candidates: Collection[str] | None = None) -> None:
        self._candidates = None if candidates is None else frozenset(candidates)
        self._held: Held | None = None  # the last successful read's answer
        self.settled = self._candidates is not None and not self._candidates

    @property
    def known(self) -> bool:
        """A read succeeded (or nothing could be held from the start)."""
        return self._held is not None or self.settled

    def read(self, held: Held) -> None:
        """A successful read's answer."""
        if self.settled:
            return
        self._held = dict(held)
        self.settled = not held

    def holders(self, device: str) -> frozenset[Holder]:
        """Who holds ``device`` by the last successful read (empty: unknown or nobody)."""
        return frozenset() if self._held is None else self._held.get(device, frozenset())

    def withheld(self, offered: Iterable[str]) -> frozenset[str]:
        """Of the ``offered`` device IDs, those to keep back now."""
        if self.settled:
            return frozenset()
        if self._held is not None:
            return frozenset(d for d in offered if d in self._held)
        if self._candidates is None:
            return frozenset(offered)
        return frozenset(d for d in offered if d in self._candidates)
