"""Interchangeable-device classes: the compact model the allocation search works on.

Devices that no score level can tell apart form a class: same NUMA node, same share-group
role, same readability, and twins in the PCI forest (equal depth under a common bridge,
each alone in its own branch there). A selection is then just a count per class, and a
class's members can be swapped freely without changing levels 1-4.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rbln_device_plugin.topology import Candidate

Value = tuple[int, int, int, int, int, int, int]


@dataclass(slots=True)
class Model:
    """Interchangeable-device classes and what the score needs to know about them."""

    n: int = 0
    cap: list[int] = field(default_factory=list)
    fixed_count: list[int] = field(default_factory=list)  # must-include classes: lo == cap
    numa: list[int] = field(default_factory=list)  # -1 = unknown
    grp: list[int] = field(default_factory=list)  # -1 = every member is its own group
    root: list[int] = field(default_factory=list)  # >= 0 root index, -1 unreadable, -2 alone
    attach: list[tuple[str, ...]] = field(default_factory=list)  # common bridge of members
    height: list[int] = field(default_factory=list)  # depth of each member's endpoint
    intra: list[int] = field(default_factory=list)  # distance between two members, -1 none
    dist: list[list[int]] = field(default_factory=list)  # between members of two classes
    n_roots: int = 0
    unknown_numa: list[int] = field(default_factory=list)
    known_numa: list[int] = field(default_factory=list)
    unreadable: list[int] = field(default_factory=list)
    readable: list[int] = field(default_factory=list)
    tree: list[int] = field(default_factory=list)  # readable with a shared root
    solo: list[int] = field(default_factory=list)  # readable, every member alone in a root
    order: list[int] = field(default_factory=list)  # branching order of free classes
    pool_order: list[tuple[str, int]] = field(default_factory=list)  # pool by ID, with class
    t_parent: list[int] = field(default_factory=list)  # forest of attach points (DP)
    t_depth: list[int] = field(default_factory=list)
    t_classes: list[list[int]] = field(default_factory=list)
    t_order: list[int] = field(default_factory=list)  # deepest first
    root_nodes: list[list[int]] = field(default_factory=list)  # per root, deepest first
    root_classes: list[list[int]] = field(default_factory=list)
    # Symmetry breaking: class -> [(earlier sibling's classes, its own sibling's other classes)]
    sym: dict[int, list[tuple[list[int], list[int]]]] = field(default_factory=dict)


def build_model(pool: Sequence[Candidate], fixed: Sequence[Candidate]) -> Model:
    universe = [*fixed, *pool]
    sizes = Counter(c.group for c in universe if c.group is not None)
    # A group with a single member shares nothing: it behaves like no group at all.
    group_index = {g: i for i, g in enumerate(sorted(g for g, n in sizes.items() if n > 1))}
    below: Counter[tuple[str, ...]] = Counter()
    for cand in universe:
        if cand.pci_path is not None:
            for j in range(1, len(cand.pci_path) + 1):
                below[cand.pci_path[:j]] += 1
    roots = {r: i for i, r in enumerate(sorted({p[0] for p in below}))}
    md = Model(n_roots=len(roots))
    index: dict[tuple[object, ...], int] = {}
    for i, cand in enumerate(universe):
        numa = cand.numa if cand.numa is not None and cand.numa >= 0 else -1
        grp = group_index.get(cand.group, -1) if cand.group is not None else -1
        path = cand.pci_path
        attach: tuple[str, ...] = ()
        height, intra, root = 0, -1, -1
        key: tuple[object, ...]
        if path is None:
            key = ("unreadable", numa, grp)
        elif below[path] != 1:
            key, attach, height, root = ("alone", cand.id), path, len(path) - 1, roots[path[0]]
        else:
            # Climb while the branch holds only this device: its twins hang off the same
            # bridge, each in a branch of its own, at the same depth.
            j = len(path)
            while j > 1 and below[path[: j - 1]] == 1:
                j -= 1
            if j == 1:
                key, root = ("solo", numa, grp), -2
            else:
                attach, height, root = path[: j - 1], len(path) - 1, roots[path[0]]
                intra = 2 * (height - len(attach) + 1)
                key = ("twin", numa, grp, attach, height)
        if i < len(fixed):
            key = ("fixed", i)
        c = index.get(key)
        if c is None:
            c = index[key] = md.n
            md.n += 1
            md.cap.append(0)
            md.fixed_count.append(0)
            md.numa.append(numa)
            md.grp.append(grp)
            md.root.append(root)
            md.attach.append(attach)
            md.height.append(height)
            md.intra.append(intra)
        md.cap[c] += 1
        if i < len(fixed):
            md.fixed_count[c] = 1
        else:
            md.pool_order.append((cand.id, c))
    md.pool_order.sort()
    _classify(md)
    _build_forest(md)
    return md


def _classify(md: Model) -> None:
    for c in range(md.n):
        (md.unknown_numa if md.numa[c] < 0 else md.known_numa).append(c)
        (md.unreadable if md.root[c] == -1 else md.readable).append(c)
        if md.root[c] >= 0:
            md.tree.append(c)
        elif md.root[c] == -2:
            md.solo.append(c)
    md.dist = [[-1] * md.n for _ in range(md.n)]
    for a in md.tree:
        for b in md.tree:
            if a < b and md.root[a] == md.root[b]:
                pa, pb = md.attach[a], md.attach[b]
                common = 0
                for x, y in zip(pa, pb, strict=False):
                    if x != y:
                        break
                    common += 1
                d = md.height[a] + md.height[b] - 2 * (common - 1)
                md.dist[a][b] = md.dist[b][a] = d
    # Branch on neighbouring classes one after another (forest preorder) so partial
    # choices stay local and sibling subtrees are decided one after the other.
    roots = {c: md.attach[c][0] if md.attach[c] else "" for c in range(md.n)}
    free = [c for c in range(md.n) if not md.fixed_count[c]]
    md.order = sorted(
        free,
        key=lambda c: (
            -md.root[c] if md.root[c] < 0 else 0,
            roots[c],
            md.attach[c],
            md.height[c],
            c,
        ),
    )


def _build_forest(md: Model) -> None:
    nodes: dict[tuple[str, ...], int] = {}

    def node(path: tuple[str, ...]) -> int:
        v = nodes.get(path)
        if v is None:
            parent = node(path[:-1]) if len(path) > 1 else -1
            v = nodes[path] = len(md.t_depth)
            md.t_parent.append(parent)
            md.t_depth.append(len(path) - 1)
            md.t_classes.append([])
        return v

    for c in md.tree:
        md.t_classes[node(md.attach[c])].append(c)
    md.t_order = sorted(range(len(md.t_depth)), key=lambda v: -md.t_depth[v])
    root_index = {md.attach[c][0]: md.root[c] for c in md.tree}
    md.root_nodes = [[] for _ in range(md.n_roots)]
    md.root_classes = [[] for _ in range(md.n_roots)]
    for path, v in sorted(nodes.items(), key=lambda item: -len(item[0])):
        md.root_nodes[root_index[path[0]]].append(v)
    for c in md.tree:
        md.root_classes[md.root[c]].append(c)
    _symmetries(md)


def _symmetries(md: Model) -> None:
    """Record interchangeable sibling subtrees (and classes) for symmetry breaking.

    Two siblings are interchangeable when their subtrees look alike level by level: the
    same NUMA nodes, group roles, depths and capacities. Any selection can then swap
    them, so the value search only considers selections where the earlier sibling (in
    branching order) holds at least as many devices as the next one.
    """
    members: dict[int, list[int]] = {}
    for c in range(md.n):
        members.setdefault(md.grp[c], []).append(c)
    position = {c: i for i, c in enumerate(md.order)}
    interned: dict[tuple[object, ...], int] = {}
    sig = [0] * len(md.t_depth)
    inside: list[list[int]] = [[] for _ in md.t_depth]  # classes below each node
    kids: list[list[int]] = [[] for _ in md.t_depth]
    for v in md.t_order:
        depth = md.t_depth[v]
        units: list[tuple[object, list[int]]] = []
        for c in md.t_classes[v]:
            g = md.grp[c]
            role: object = "none" if g < 0 else "own" if members[g] == [c] else g
            desc = (md.numa[c], role, md.height[c] - depth, md.cap[c], md.intra[c])
            units.append((("class", *desc, md.fixed_count[c]), [c]))
            inside[v].append(c)
        for child in kids[v]:
            units.append((("node", sig[child]), inside[child]))
            inside[v].extend(inside[child])
        sig[v] = interned.setdefault(tuple(sorted(str(u[0]) for u in units)), len(interned))
        _chain(md, units, position)
        parent = md.t_parent[v]
        if parent >= 0:
            kids[parent].append(v)
    roots = [v for v in range(len(md.t_depth)) if md.t_parent[v] < 0]
    _chain(md, [(("node", sig[v]), inside[v]) for v in roots], position)


def _chain(md: Model, units: list[tuple[object, list[int]]], position: dict[int, int]) -> None:
    """Order equal siblings by branching position and link each to its predecessor."""
    alike: dict[str, list[list[int]]] = {}
    for key, classes in units:
        free = [c for c in classes if c in position]
        if free and len(free) == len(classes):
            alike.setdefault(str(key), []).append(sorted(free, key=position.__getitem__))
    for group in alike.values():
        group.sort(key=lambda cs: position[cs[0]])
        for before, after in itertools.pairwise(group):
            for c in after:
                md.sym.setdefault(c, []).append((before, [x for x in after if x != c]))


def value(md: Model, m: list[int]) -> Value:
    """Exact levels 1-4 of the selection that takes m[c] devices from each class c."""
    unknown = sum(m[c] for c in md.unknown_numa)
    nodes = {md.numa[c] for c in md.known_numa if m[c]}
    groups = {md.grp[c] for c in range(md.n) if m[c] and md.grp[c] >= 0}
    loners = sum(m[c] for c in range(md.n) if md.grp[c] < 0)
    unreadable = sum(m[c] for c in md.unreadable)
    cross, worst, total = pairs(md, m)
    return (unknown, len(nodes), len(groups) + loners, unreadable, cross, worst, total)


def pairs(md: Model, m: list[int]) -> tuple[int, int, int]:
    """Cross-root pair count, worst and summed distance of connected pairs for counts m."""
    readable = [c for c in md.readable if m[c]]
    per_root = [0] * md.n_roots
    count = squares = worst = total = 0
    for i, c in enumerate(readable):
        n = m[c]
        count += n
        if md.root[c] < 0:
            squares += n  # each member is alone under its own root
            continue
        per_root[md.root[c]] += n
        if n >= 2 and md.intra[c] >= 0:
            worst = max(worst, md.intra[c])
            total += n * (n - 1) // 2 * md.intra[c]
        row = md.dist[c]
        for c2 in readable[i + 1 :]:
            d = row[c2]
            if d >= 0:
                worst = max(worst, d)
                total += n * m[c2] * d
    squares += sum(v * v for v in per_root)
    return (count * count - squares) // 2, worst, total
