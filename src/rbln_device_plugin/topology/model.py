"""What a device is to the allocator, and how a complete selection is ranked.

This module decides the policy's vocabulary: a :class:`Candidate` keeps only the three
facts the README ranks by (known NUMA node, share group, readable PCI path), normalised
once so no later stage re-interprets raw SIDs or sysfs strings; :func:`score` ranks a
complete selection as a lexicographic :class:`Score` (lower wins). It is the single
definition of the score: the search only has to agree with it, and every answer is
scored with it before it leaves the package.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from rbln_device_plugin.model.inventory import Device, sid_is_known

_ROOT_RE: Final = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF_RE: Final = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

Path = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the allocator knows about one device."""

    id: str
    numa: int | None  # None = unknown
    group: str | None  # share key: a known SID, or "pf:<parent BDF>" for a VF; None = alone
    pci_path: Path | None  # ("pci0000:00", bridges..., own BDF); None = unreadable


def normalize_pci_path(path: Sequence[str] | None, bus_id: str | None = None) -> Path | None:
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
    return Candidate(
        id=device.name,
        numa=_numa(device.numa),
        group=group,
        pci_path=normalize_pci_path(device.pci_path, device.bus_id),
    )


def known_numa(candidate: Candidate) -> int | None:
    """The candidate's NUMA node, or None when unknown (missing or negative)."""
    return _numa(candidate.numa)


def _numa(numa: int | None) -> int | None:
    return numa if numa is not None and numa >= 0 else None


def pci_distance(a: Path, b: Path) -> int | None:
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


def score(selection: Iterable[str], candidates: Mapping[str, Candidate]) -> Score:
    """Score of a complete selection (mandatory devices included); duplicates count once.

    Distances come from counts per PCI node rather than from every pair, so scoring a
    64-device answer stays cheap: an edge with ``n`` of a root's ``T`` chosen devices
    below it lies on ``n * (T - n)`` connected paths.
    """
    chosen = [candidates[i] for i in sorted(set(selection))]
    numas = [c.numa for c in chosen if c.numa is not None and c.numa >= 0]
    paths = [c.pci_path for c in chosen if c.pci_path is not None]
    below: Counter[Path] = Counter()
    for path in paths:
        for j in range(1, len(path) + 1):
            below[path[:j]] += 1
    total = len(paths)
    squares = sum(n * n for node, n in below.items() if len(node) == 1)
    summed = sum(n * (below[node[:1]] - n) for node, n in below.items() if len(node) > 1)
    return Score(
        unknown_numa=len(chosen) - len(numas),
        numa_nodes=len(set(numas)),
        share_groups=len({c.group for c in chosen if c.group is not None})
        + sum(1 for c in chosen if c.group is None),
        unreadable_paths=len(chosen) - total,
        cross_root_pairs=(total * total - squares) // 2,
        max_distance=_widest(paths),
        distance_sum=summed,
        device_ids=tuple(c.id for c in chosen),
    )


def _widest(paths: Sequence[Path]) -> int:
    """Largest distance between two endpoints under one root (0 with fewer than two).

    The farthest pair meeting at a node takes the deepest endpoint from two different
    branches of it (an endpoint sitting on the node itself is a branch of its own).
    """
    deepest: dict[Path, int] = {}  # node -> depth of its deepest endpoint
    for path in paths:
        for j in range(1, len(path) + 1):
            node = path[:j]
            if deepest.get(node, -1) < len(path) - 1:
                deepest[node] = len(path) - 1
    branches: dict[Path, list[int]] = {}
    for node, depth in deepest.items():
        if len(node) > 1:
            branches.setdefault(node[:-1], []).append(depth)
    for path in paths:  # endpoints that are themselves a node with endpoints below
        if len(path) > 1 and path in branches:
            branches[path].append(len(path) - 1)
    widest = 0
    for node, depths in branches.items():
        if len(depths) > 1:
            depths.sort(reverse=True)
            widest = max(widest, depths[0] + depths[1] - 2 * (len(node) - 1))
    return widest
