"""Exact search: a dynamic program over the merge plan, with a safety cap.

Each plan node gets a table from partial selections under it to their packed value
(:mod:`plan`). A table is keyed by what its future still depends on: how many devices it
holds (``k``), the PCI counts its root will need (readable devices ``n``, their summed
depth ``D``, the deepest one ``h``), the share groups and NUMA nodes still open (``sig``)
and the widest PCI distance so far (``w``). Only the best value per key survives, which is
exact because every later step adds the same amount to states with equal keys; the
packed value carries the ID tie-break too, and a smaller sorted ID list stays smaller
when the same devices are added to both sides.

Two dominance rules keep tables small without losing the optimum: a state whose NUMA,
group and readability levels are already worse than another's with the same ``k`` and
open bits can never catch up (those levels only grow by the same amounts), and of two
states with the same key, one that is no worse in value and in widest distance wins.

A PCI root turns its counts into levels: cross-root pairs only depend on how many devices
each root holds (a larger sum of squares means fewer such pairs), and the distance sum is
``n * D - Q`` with ``Q`` the summed squares of the devices below each PCI edge (each edge
with ``m`` of the root's ``n`` devices below it lies on ``m * (n - m)`` paths). The widest
distance is not a sum, so it stays in the key until the end.

The number of merge steps is bounded by ``cap``. Past it, every table keeps only its best
state per device count: the search still ends with a complete selection of the requested
size, the best that the narrowed search finds, and reports that it was capped.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.topology.classes import SOLO, UNREADABLE
from rbln_device_plugin.topology.plan import Packing, Plan

# Merge steps (one pair of partial selections combined) before the search narrows. A
# 128-device node needs about 10,000; one step costs about half a microsecond.
DEFAULT_CAP: Final = 2_000_000

# (devices, readable under the root, their summed depth, deepest, open bits, widest pair)
Key = tuple[int, int, int, int, int, int]
Table = dict[Key, int]
_EMPTY: Final[Key] = (0, 0, 0, -1, 0, 0)


@dataclass(frozen=True, slots=True)
class Outcome:
    chosen: list[int]  # device indices (positions in the plan's ID order)
    capped: bool  # the cap was hit: the answer is the narrowed search's best
    steps: int


def search(
    plan: Plan, available: Collection[int], must: Collection[int], size: int, cap: int
) -> Outcome:
    """Best ``size`` devices of ``available`` that include ``must`` (indices into the plan)."""
    run = _Run(plan, available, must, size, cap)
    top = run.solve()
    packing = plan.packing
    best = min(
        ((v >> packing.squares, key[5], v) for key, v in top.items() if key[0] == size),
        default=None,
    )
    if best is None:
        raise ValueError(f"no selection of {size} devices exists")
    devices = len(plan.ids)
    taken = size * (1 << devices) - (best[2] & ((1 << packing.ids) - 1))
    chosen = [devices - 1 - bit for bit in range(devices) if taken >> bit & 1]
    return Outcome(sorted(chosen), run.capped, run.steps)


class _Run:
    def __init__(
        self, plan: Plan, available: Collection[int], must: Collection[int], size: int, cap: int
    ) -> None:
        self.plan = plan
        self.size = size
        self.cap = cap
        self.steps = 0
        self.capped = False
        self.p: Packing = plan.packing
        count = len(plan.classes)
        self.members: list[list[int]] = [[] for _ in range(count)]
        self.lo = [0] * count
        must_set = set(must)
        # Mandatory members first, then the rest in ID order: taking j of a class takes
        # its mandatory members and the smallest other IDs.
        for d in sorted(available, key=lambda d: (d not in must_set, d)):
            c = plan.class_of[d]
            self.members[c].append(d)
            self.lo[c] += d in must_set
        self.avail = [0] * len(plan.nodes)
        self.needed = [0] * len(plan.nodes)
        for c, members in enumerate(self.members):
            v = plan.home[c]
            while v >= 0:
                self.avail[v] += len(members)
                self.needed[v] += self.lo[c]
                v = plan.nodes[v].parent
        self.total_avail = self.avail[0]
        self.total_must = self.needed[0]

    def solve(self) -> Table:
        tables: dict[int, Table] = {}
        for v in self.plan.postorder:
            tables[v] = self._node(v, tables)
        return tables[0]

    def _node(self, v: int, tables: dict[int, Table]) -> Table:
        node = self.plan.nodes[v]
        acc: Table = {_EMPTY: 0}
        if not self.avail[v]:
            return acc
        rest_avail = self.avail[v]
        rest_must = self.needed[v]
        out_avail = self.total_avail - rest_avail
        out_must = self.total_must - rest_must
        twice = 2 * node.depth if node.depth > 0 else 0
        p = self.p
        for child, (numa, group) in zip(node.children, node.closes, strict=True):
            if child >= 0:
                has, needs = self.avail[child], self.needed[child]
                table = tables.pop(child) if has else None
            else:
                has, needs = len(self.members[~child]), self.lo[~child]
                table = self._leaf(~child) if has else None
            rest_avail -= has
            rest_must -= needs
            if table is not None:
                low = self.size - rest_avail - out_avail
                high = self.size - rest_must - out_must
                acc = self._merge(acc, table, twice, low, high)
            if numa or group:
                acc = _close(acc, numa, group, p)
            acc = self._prune(acc)
        if node.root:
            squared = node.readable * node.readable
            acc = _settle_root(acc, squared, p)
        elif node.up:
            acc = _edge(acc, node.up, node.readable * node.readable, p)
        return acc

    def _leaf(self, c: int) -> Table:
        plan, p = self.plan, self.p
        cls = plan.classes[c]
        members = self.members[c]
        devices = len(plan.ids)
        cap = len(cls.members)
        bits = plan.numa_bit[c] | plan.group_bit[c]
        table: Table = {}
        ids = sum((1 << devices) - (1 << (devices - 1 - d)) for d in members[: self.lo[c]])
        for j in range(self.lo[c], len(members) + 1):
            if j > self.lo[c]:
                ids += (1 << devices) - (1 << (devices - 1 - members[j - 1]))
            v = ids
            if cls.numa is None:
                v += j << p.unknown
            elif j and plan.numa_local[c]:
                v += 1 << p.numa
            if cls.group is None:
                v += j << p.groups
            elif j and plan.group_local[c]:
                v += 1 << p.groups
            sig = bits if j else 0
            if cls.kind == UNREADABLE:
                table[(j, 0, 0, -1, sig, 0)] = v + (j << p.unreadable)
            elif cls.kind == SOLO:
                table[(j, 0, 0, -1, sig, 0)] = v + ((cap - j) << p.squares)
            else:
                key = (j, j, j * cls.depth, cls.depth if j else -1, sig, 2 * cls.branch * (j > 1))
                table[key] = v + (((cap - j) * cls.branch) << p.distance)
        return table

    def _merge(self, acc: Table, table: Table, twice: int, low: int, high: int) -> Table:
        if len(acc) == 1 and _EMPTY in acc:  # nothing merged yet: the table as it is
            return {key: v for key, v in table.items() if low <= key[0] <= high}
        self.steps += len(acc) * len(table)
        if self.steps > self.cap:
            self.capped = True
            acc, table = _narrow(acc, self.p), _narrow(table, self.p)
        out: Table = {}
        right = list(table.items())
        for (ka, na, da, ha, sa, wa), va in acc.items():
            for (kc, nc, dc, hc, sc, wc), vc in right:
                k = ka + kc
                if k < low or k > high:
                    continue
                w = wa if wa >= wc else wc
                if na and nc and ha + hc - twice > w:
                    w = ha + hc - twice
                key = (k, na + nc, da + dc, ha if ha >= hc else hc, sa | sc, w)
                value = va + vc
                old = out.get(key)
                if old is None or value < old:
                    out[key] = value
        return out

    def _prune(self, acc: Table) -> Table:
        if self.capped:
            return _narrow(acc, self.p)
        if len(acc) < 2:
            return acc
        p = self.p
        # Rule 1: same device count and open bits, worse NUMA/group/readability levels.
        best: dict[tuple[int, int], int] = {}
        for key, v in acc.items():
            head = v >> p.unreadable
            slot = (key[0], key[4])
            if head < best.get(slot, head + 1):
                best[slot] = head
        # Rule 2: same key but the widest distance: keep the Pareto front.
        fronts: dict[tuple[int, int, int, int, int], list[tuple[int, int]]] = {}
        for key, v in acc.items():
            if v >> p.unreadable == best[(key[0], key[4])]:
                fronts.setdefault(key[:5], []).append((v, key[5]))
        out: Table = {}
        for base, front in fronts.items():
            if len(front) > 1:
                front.sort()
            head = front[0][0] >> p.squares
            widest = 1 << 62
            for v, w in front:
                if v >> p.squares > head:
                    break
                if w < widest:
                    widest = w
                    out[(*base, w)] = v
        return out


def _close(acc: Table, numa: int, group: int, p: Packing) -> Table:
    """Count the NUMA nodes and groups whose last member has just been merged."""
    out: Table = {}
    both = numa | group
    for (k, n, d, h, sig, w), v in acc.items():
        if sig & both:
            v += ((sig & numa).bit_count() << p.numa) + ((sig & group).bit_count() << p.groups)
            sig &= ~both
        key = (k, n, d, h, sig, w)
        old = out.get(key)
        if old is None or v < old:
            out[key] = v
    return out


def _settle_root(acc: Table, squared: int, p: Packing) -> Table:
    """Turn a root's counts into its cross-root term and distance sum; drop the counts."""
    out: Table = {}
    for (k, n, d, _, sig, w), v in acc.items():
        v += ((squared - n * n) << p.squares) + ((n * d) << p.distance)
        key = (k, 0, 0, -1, sig, w)
        old = out.get(key)
        if old is None or v < old:
            out[key] = v
    return out


def _edge(acc: Table, length: int, squared: int, p: Packing) -> Table:
    """The PCI edges above a bridge: each carries the bridge's count on its paths."""
    return {
        key: v + ((length * (squared - key[1] * key[1])) << p.distance) for key, v in acc.items()
    }


def _narrow(table: Table, p: Packing) -> Table:
    """Past the cap: keep one state per device count, the best by value then width."""
    best: dict[int, tuple[int, int, int, Key]] = {}
    for key, v in table.items():
        rank = (v >> p.squares, key[5], v, key)
        if key[0] not in best or rank < best[key[0]]:
            best[key[0]] = rank
    return {rank[3]: rank[2] for rank in best.values()}
