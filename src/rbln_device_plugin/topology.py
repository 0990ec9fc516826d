"""Topology-aware preferred allocation: candidates, PCI forest, selection score, requests.

Pure and synchronous. The plugin turns a kubelet ``GetPreferredAllocation`` container
request into a call of :func:`preferred_allocation` and logs the outcome; the exact search
itself lives in :mod:`rbln_device_plugin.topology_search`.

A selection is ranked by a lexicographic :class:`Score` (lower wins): NUMA spread, share
groups (cards), PCI readability and root spread, PCI distances, then the sorted ID list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from rbln_device_plugin import topology_search
from rbln_device_plugin.inventory import Device, sid_is_known

_ROOT_RE: Final = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF_RE: Final = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the allocator knows about one device."""

    id: str
    numa: int | None  # None = unknown
    group: str | None  # share key: a known SID, or "pf:<parent BDF>" for a VF; None = alone
    pci_path: tuple[str, ...] | None  # ("pci0000:00", bridges..., own BDF); None = unreadable


def normalize_pci_path(
    path: Sequence[str] | None, bus_id: str | None = None
) -> tuple[str, ...] | None:
    """Lower-cased path if it has the sysfs shape (root, then BDFs); otherwise None."""
    if not path or len(path) < 2:
        return None
    parts = tuple(segment.strip().lower() for segment in path)
    if not _ROOT_RE.match(parts[0]) or not all(_BDF_RE.match(p) for p in parts[1:]):
        return None
    if bus_id is not None and parts[-1] != bus_id.strip().lower():
        return None
    return parts


def candidate_from_device(device: Device) -> Candidate:
    if device.parent_bus_id is not None:
        # VFs of one PF share the card regardless of what SID rbln-smi reports for them.
        group: str | None = "pf:" + device.parent_bus_id.strip().lower()
    elif sid_is_known(device.sid):
        group = "sid:" + device.sid.strip().lower()
    else:
        group = None
    numa = device.numa if device.numa is not None and device.numa >= 0 else None
    return Candidate(
        id=device.name,
        numa=numa,
        group=group,
        pci_path=normalize_pci_path(device.pci_path, device.bus_id),
    )


def pci_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int | None:
    """Hops between two endpoints through their lowest common ancestor; None across roots.

    Nodes are identified by their whole path prefix, so equally named bridges under
    different parents stay distinct.
    """
    if a[0] != b[0]:
        return None
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return len(a) + len(b) - 2 * common


class PciForest:
    """The candidates' PCI hierarchy: roots, shared bridges and endpoint leaves."""

    def __init__(self, candidates: Iterable[Candidate]) -> None:
        self._paths = {c.id: c.pci_path for c in candidates if c.pci_path is not None}

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._paths

    def depth(self, device_id: str) -> int:
        return len(self._paths[device_id]) - 1

    def root(self, device_id: str) -> str:
        return self._paths[device_id][0]

    def distance(self, a: str, b: str) -> int | None:
        """None when either device is outside the forest or they sit under separate roots."""
        pa, pb = self._paths.get(a), self._paths.get(b)
        if pa is None or pb is None:
            return None
        return pci_distance(pa, pb)


class Score(NamedTuple):
    """Lexicographic rank of a complete selection; every level is better when lower."""

    unknown_numa: int
    numa_nodes: int
    share_groups: int
    unreadable_paths: int
    cross_root_pairs: int
    max_distance: int
    distance_sum: int
    device_ids: tuple[str, ...]

    def levels(self) -> tuple[int, int, int, int, int, int, int]:
        """The numeric levels 1-4 (everything but the ID tie-break)."""
        return (
            self.unknown_numa,
            self.numa_nodes,
            self.share_groups,
            self.unreadable_paths,
            self.cross_root_pairs,
            self.max_distance,
            self.distance_sum,
        )


def known_numa(candidate: Candidate) -> int | None:
    return candidate.numa if candidate.numa is not None and candidate.numa >= 0 else None


def score(selection: Iterable[str], candidates: Mapping[str, Candidate]) -> Score:
    """Score of a complete selection (mandatory devices included); duplicates count once."""
    chosen = [candidates[i] for i in sorted(set(selection))]
    numas = [known_numa(c) for c in chosen]
    groups = {c.group for c in chosen if c.group is not None}
    paths = [c.pci_path for c in chosen if c.pci_path is not None]
    cross = worst = total = 0
    for i, a in enumerate(paths):
        for b in paths[i + 1 :]:
            d = pci_distance(a, b)
            if d is None:
                cross += 1
            else:
                worst = max(worst, d)
                total += d
    return Score(
        unknown_numa=numas.count(None),
        numa_nodes=len({n for n in numas if n is not None}),
        share_groups=len(groups) + sum(1 for c in chosen if c.group is None),
        unreadable_paths=len(chosen) - len(paths),
        cross_root_pairs=cross,
        max_distance=worst,
        distance_sum=total,
        device_ids=tuple(c.id for c in chosen),
    )


class Fallback(Exception):
    """The request cannot be optimised; the caller answers an empty list and warns."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Preferred:
    device_ids: list[str]  # must-include IDs first (request order), then the rest by ID
    score: Score | None  # None when a shortcut answered without searching
    shortcut: str | None  # "must-include" or "all-available" when no search ran


def preferred_allocation(
    candidates: Mapping[str, Candidate],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    node_budget: int = topology_search.DEFAULT_NODE_BUDGET,
) -> Preferred:
    """Answer one container's preferred-allocation request, or raise :class:`Fallback`."""
    if size < 0:
        raise Fallback(f"allocation size {size} is negative")
    avail = list(dict.fromkeys(available))
    for device_id in avail:
        if device_id not in candidates:
            raise Fallback(f"available device {device_id!r} is not managed by this plugin")
    if size > len(avail):
        raise Fallback(f"allocation size {size} exceeds the {len(avail)} available devices")
    must = list(dict.fromkeys(must_include))
    avail_set = set(avail)
    for device_id in must:
        if device_id not in avail_set:
            raise Fallback(f"must-include device {device_id!r} is not available")
    if len(must) > size:
        raise Fallback(f"{len(must)} must-include devices exceed allocation size {size}")
    must_set = set(must)
    if size == len(must):
        return Preferred(device_ids=must, score=None, shortcut="must-include")
    rest = sorted(i for i in avail if i not in must_set)
    if size == len(avail):
        return Preferred(device_ids=must + rest, score=None, shortcut="all-available")
    try:
        chosen = topology_search.search(
            [candidates[i] for i in rest],
            [candidates[i] for i in must],
            size - len(must),
            node_budget=node_budget,
        )
    except topology_search.BudgetExceeded as exc:
        raise Fallback(str(exc)) from exc
    ids = must + sorted(chosen)
    return Preferred(device_ids=ids, score=score(ids, candidates), shortcut=None)
