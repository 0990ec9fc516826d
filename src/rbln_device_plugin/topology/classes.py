"""Interchangeable-device classes: the units the search counts instead of devices.

Devices that no score level can tell apart form a class: same known NUMA node (or both
unknown), same share group, and the same place in the PCI forest, meaning twins that hang
from one bridge at the same depth with a branch of their own each. Only how many of a
class a selection takes matters for levels 1-4; which ones is settled by the ID
tie-break alone (the smallest IDs). On a real node every card's chips form one class, so
the search weighs 16 counts instead of 64 devices. Classes depend only on the inventory
and are built once per device set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.topology.model import Candidate, Path

# Where a class sits: in a PCI tree shared with other devices, alone under a PCI root of
# its own (each member is its own root), or outside the forest (unreadable path).
TREE: Final = 0
SOLO: Final = 1
UNREADABLE: Final = 2


@dataclass(frozen=True, slots=True)
class DeviceClass:
    members: tuple[int, ...]  # device indices; index = position in plain ID order
    kind: int  # TREE, SOLO or UNREADABLE
    numa: int | None
    group: str | None  # None: every member counts as a card of its own
    attach: Path  # TREE: the bridge each member hangs from in a branch of its own
    depth: int  # TREE: depth of every member (a root is depth 0)

    @property
    def branch(self) -> int:
        """Edges between the attach bridge and each member (0: a member is the bridge)."""
        return self.depth - (len(self.attach) - 1)


def build_classes(candidates: Sequence[Candidate]) -> list[DeviceClass]:
    """Classes of ``candidates`` (which must be in ID order), in order of first member."""
    below: Counter[Path] = Counter()
    for cand in candidates:
        if cand.pci_path is not None:
            for j in range(1, len(cand.pci_path) + 1):
                below[cand.pci_path[:j]] += 1
    groups = Counter(c.group for c in candidates if c.group is not None)
    keys: dict[tuple[object, ...], list[int]] = {}
    shapes: dict[tuple[object, ...], tuple[int, Path, int]] = {}
    for index, cand in enumerate(candidates):
        # A group with one member shares nothing: it counts like no group at all.
        group = cand.group if cand.group is not None and groups[cand.group] > 1 else None
        kind, attach, depth = _place(cand.pci_path, below)
        if kind == TREE and cand.pci_path is not None and attach == cand.pci_path:
            key: tuple[object, ...] = ("nested", index)  # has devices below it: no twins
        else:
            key = (kind, cand.numa, group, attach, depth)
        keys.setdefault(key, []).append(index)
        shapes[key] = (kind, attach, depth)
    out = []
    for key, members in keys.items():
        kind, attach, depth = shapes[key]
        first = candidates[members[0]]
        group = first.group if first.group is not None and groups[first.group] > 1 else None
        out.append(DeviceClass(tuple(members), kind, first.numa, group, attach, depth))
    return out


def _place(path: Path | None, below: Counter[Path]) -> tuple[int, Path, int]:
    """(kind, attach bridge, depth) of one device."""
    if path is None:
        return UNREADABLE, (), 0
    depth = len(path) - 1
    if below[path] > 1:
        return TREE, path, depth  # other devices sit below this one
    # Climb while the branch holds only this device: twins branch off the same bridge.
    j = len(path)
    while j > 1 and below[path[: j - 1]] == 1:
        j -= 1
    if j == 1:
        return SOLO, (), 0
    return TREE, path[: j - 1], depth
