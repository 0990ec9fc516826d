"""The merge plan: in which order the search combines classes, and what each step costs.

The search is a dynamic program over a tree (the plan) of PCI bridges where branches
meet, PCI roots and one virtual node on top, so every level of the score becomes a sum of
per-step amounts that can be packed into one integer (:class:`Packing`). A class joins at
its attach bridge; an unreadable or solo class joins where its card's readable devices
meet (else at the top), so a card is finished, and its group counted, as early as
possible. What cannot be summed yet is carried as state: share groups and NUMA nodes that
still have members outside the merged part (one bit each, counted at the step that merges
their last member, precomputed here) and the PCI counts a root needs to turn into
distances. Everything here depends on the inventory only, so it is built once per device
set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from rbln_device_plugin.topology.classes import TREE, DeviceClass, build_classes
from rbln_device_plugin.topology.model import Candidate, Path


@dataclass(slots=True)
class Node:
    depth: int  # PCI depth of the bridge; -1 for the virtual top
    up: int  # PCI edges between this bridge and its parent in the plan
    root: bool  # a PCI root: cross-root pairs and distances are settled here
    readable: int = 0  # TREE devices below (constant offset that keeps packed fields >= 0)
    children: list[int] = field(default_factory=list)  # >= 0: node, < 0: ~class index
    # Bits whose last member arrives with children[i]: (NUMA bits, group bits).
    closes: list[tuple[int, int]] = field(default_factory=list)
    parent: int = -1


@dataclass(frozen=True, slots=True)
class Packing:
    """Bit offsets of the levels inside a packed value.

    Most significant first: unknown NUMA, NUMA nodes, share groups, unreadable paths, a
    per-root term for cross-root pairs, the distance sum, then a tie-break field that is
    smaller for smaller sorted ID lists. Every field is wide enough for its largest sum,
    so adding two packed values adds every level at once and ``<`` compares them
    lexicographically.
    """

    ids: int  # width of the ID tie-break field (offset 0)
    distance: int  # offset of the distance-sum field
    squares: int  # cross-root term
    unreadable: int
    groups: int
    numa: int
    unknown: int

    @staticmethod
    def for_node(devices: int, depth: int) -> Packing:
        width = devices.bit_length() + 1
        ids = devices + width + 1  # holds up to devices * 2**devices
        distance = ids
        squares = distance + (3 * devices * devices * (depth + 1)).bit_length() + 1
        unreadable = squares + (devices * devices + devices).bit_length() + 1
        return Packing(
            ids, distance, squares, unreadable, unreadable + width, unreadable + 2 * width,
            unreadable + 3 * width,
        )  # fmt: skip


@dataclass(slots=True)
class Plan:
    ids: tuple[str, ...]  # device IDs in plain string order; a device is its index here
    index: dict[str, int]
    candidates: tuple[Candidate, ...]
    classes: list[DeviceClass]
    class_of: list[int]
    home: list[int]  # class -> plan node it joins
    numa_bit: list[int]  # class -> bit mask (0: counted at once or unknown)
    group_bit: list[int]
    numa_local: list[bool]  # class alone on its known NUMA node: counted when taken
    group_local: list[bool]  # class alone in its share group
    nodes: list[Node]  # 0 is the virtual top
    postorder: list[int]
    packing: Packing

    @staticmethod
    def build(candidates: Sequence[Candidate]) -> Plan:
        cands = tuple(sorted(candidates, key=lambda c: c.id))
        classes = build_classes(cands)
        class_of = [0] * len(cands)
        for c, cls in enumerate(classes):
            for member in cls.members:
                class_of[member] = c
        nodes, home = _tree(classes)
        numa_bit, numa_local = _bits(classes, [cls.numa for cls in classes], 0)
        group_bit, group_local = _bits(classes, [cls.group for cls in classes], len(classes))
        plan = Plan(
            ids=tuple(c.id for c in cands),
            index={c.id: i for i, c in enumerate(cands)},
            candidates=cands,
            classes=classes,
            class_of=class_of,
            home=home,
            numa_bit=numa_bit,
            group_bit=group_bit,
            numa_local=numa_local,
            group_local=group_local,
            nodes=nodes,
            postorder=_postorder(nodes),
            packing=Packing.for_node(len(cands), max((c.depth for c in classes), default=0)),
        )
        _schedule_closing(plan)
        return plan


def _tree(classes: Sequence[DeviceClass]) -> tuple[list[Node], list[int]]:
    """Plan nodes: PCI roots, attach bridges and branch points, under a virtual top."""
    attach = [cls.attach for cls in classes if cls.kind == TREE]
    # A bridge becomes a node when it is a root, an attach point, or where paths split.
    kids: dict[Path, set[Path]] = {}
    for path in attach:
        for j in range(1, len(path)):
            kids.setdefault(path[:j], set()).add(path[: j + 1])
    keep = sorted(
        {p for p in kids if len(p) == 1 or len(kids[p]) > 1} | set(attach) | {a[:1] for a in attach}
    )
    nodes = [Node(depth=-1, up=0, root=False)]
    index: dict[Path, int] = {}
    for path in keep:  # sorted: every ancestor comes before its descendants
        parent = next(
            (index[path[:j]] for j in range(len(path) - 1, 0, -1) if path[:j] in index), 0
        )
        up = 0 if parent == 0 else len(path) - 1 - nodes[parent].depth
        index[path] = len(nodes)
        nodes.append(Node(depth=len(path) - 1, up=up, root=len(path) == 1, parent=parent))
        nodes[parent].children.append(index[path])
    home = [index[cls.attach] if cls.kind == TREE else 0 for cls in classes]
    # Unreadable and solo members join where their card's PCI members meet.
    meets: dict[str, int] = {}
    for c, cls in enumerate(classes):
        if cls.kind == TREE and cls.group is not None:
            meets[cls.group] = _lca(nodes, meets.get(cls.group, home[c]), home[c])
    for c, cls in enumerate(classes):
        if cls.kind != TREE and cls.group is not None:
            home[c] = meets.get(cls.group, 0)
        nodes[home[c]].children.append(~c)
        size = len(cls.members) if cls.kind == TREE else 0
        v = home[c]
        while v > 0:
            nodes[v].readable += size
            v = nodes[v].parent
    top = nodes[0]
    # Keep each NUMA node's roots together, so its bit closes before the next one opens.
    top.children.sort(key=lambda child: _first_numa(nodes, classes, child))
    return nodes, home


def _first_numa(nodes: list[Node], classes: Sequence[DeviceClass], child: int) -> tuple[int, int]:
    found: list[int] = []
    stack = [child]
    while stack:
        x = stack.pop()
        if x < 0:
            numa = classes[~x].numa
            found.append(1 << 30 if numa is None else numa)
        else:
            stack.extend(nodes[x].children)
    return min(found, default=1 << 30), child if child >= 0 else 1 << 30


def _lca(nodes: list[Node], a: int, b: int) -> int:
    seen = set()
    while a > 0:
        seen.add(a)
        a = nodes[a].parent
    while b > 0 and b not in seen:
        b = nodes[b].parent
    return max(b, 0)


def _bits(
    classes: Sequence[DeviceClass], keys: Sequence[object], offset: int
) -> tuple[list[int], list[bool]]:
    """A bit per key held by several classes; ``local``: the class holds the key alone."""
    counts = Counter(k for k in keys if k is not None)
    bits: dict[object, int] = {}
    mask, local = [], []
    for key in keys:
        if key is None or counts[key] == 1:
            mask.append(0)
            local.append(key is not None)
        else:
            mask.append(1 << (offset + bits.setdefault(key, len(bits))))
            local.append(False)
    return mask, local


def _postorder(nodes: list[Node]) -> list[int]:
    out: list[int] = []
    stack = [(0, False)]
    while stack:
        v, done = stack.pop()
        if done:
            out.append(v)
            continue
        stack.append((v, True))
        stack.extend((c, False) for c in reversed(nodes[v].children) if c >= 0)
    return out


def _schedule_closing(plan: Plan) -> None:
    """Find, for every bit, the merge step after which no member is left outside."""
    nodes = plan.nodes
    holders: dict[tuple[int, int], list[int]] = {}  # (kind, bit) -> classes
    for c in range(len(plan.classes)):
        for kind, bit in ((0, plan.numa_bit[c]), (1, plan.group_bit[c])):
            if bit:
                holders.setdefault((kind, bit), []).append(c)
    for node in nodes:
        node.closes = [(0, 0)] * len(node.children)
    for (kind, bit), members in holders.items():
        meet = plan.home[members[0]]
        for c in members[1:]:
            meet = _lca(nodes, meet, plan.home[c])
        last = 0
        for c in members:
            # The child of the meeting node that contains this class.
            child, v = ~c, plan.home[c]
            while v != meet:
                child, v = v, nodes[v].parent
            last = max(last, nodes[meet].children.index(child))
        numa, group = nodes[meet].closes[last]
        nodes[meet].closes[last] = (numa | bit, group) if kind == 0 else (numa, group | bit)
