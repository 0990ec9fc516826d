"""One sweep of the dynamic program over the merge plan: which partial selections to keep.

Each plan node gets a table from partial selections under it to their packed value,
keyed by what the rest of the sweep still depends on: how many devices (``k``), the PCI
counts its root will need (readable devices ``n``, their summed depth ``D``, the deepest
``h``), the share groups and NUMA nodes still open (``sig``) and the widest PCI distance so
far (``w``). Keeping only the best value per key is exact, because every later step adds
the same amount to states with equal keys, and the packed value carries the ID tie-break
too (a smaller sorted ID list stays smaller when the same devices are added to both).
Dominance rules (:meth:`Sweep._prune`) drop further states that cannot win. A root
turns its counts into levels: cross-root pairs shrink as the per-root sum of squares
grows, and its distance sum is ``n * D - Q``, ``Q`` summing the squared count below each
PCI edge (an edge with ``m`` of the root's ``n`` devices below it lies on ``m * (n - m)``
paths). A narrowed sweep keeps only the best few states per device count: fast and
complete, not necessarily optimal.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from rbln_device_plugin.topology.classes import SOLO, UNREADABLE
from rbln_device_plugin.topology.plan import Packing, Plan

# (devices, readable under the root, their summed depth, deepest, open bits, widest pair)
Key = tuple[int, int, int, int, int, int]
Table = dict[Key, int]
_EMPTY: Final[Key] = (0, 0, 0, -1, 0, 0)


class TooMuchWork(Exception):
    """A sweep went past its step limit."""


class Demand:
    """One request mapped onto the plan: per class the members on offer, mandatory first."""

    def __init__(
        self, plan: Plan, available: Collection[int], must: Collection[int], size: int
    ) -> None:
        self.plan = plan
        self.size = size
        count = len(plan.classes)
        self.members: list[list[int]] = [[] for _ in range(count)]
        self.lo = [0] * count
        must_set = set(must)
        # Taking j of a class takes its mandatory members, then the smallest other IDs.
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

    def decode(self, value: int) -> list[int]:
        """The devices of a complete selection, from its packed tie-break field."""
        devices = len(self.plan.ids)
        taken = self.size * (1 << devices) - (value & ((1 << self.plan.packing.ids) - 1))
        return sorted(devices - 1 - bit for bit in range(devices) if taken >> bit & 1)


class Sweep:
    """One bottom-up pass. ``limit``: steps before TooMuchWork (or narrowing, if ``width``
    is set); ``narrow``: keep only ``width`` states per device count from the start."""

    def __init__(
        self,
        demand: Demand,
        *,
        limit: int,
        width: int = 0,
        narrow: bool = False,
        bound: int | None = None,
    ) -> None:
        self.d = demand
        self.p: Packing = demand.plan.packing
        self.limit = limit
        self.width = width
        self.narrowed = narrow
        self.bound = bound  # levels 1-3a (packed, >> unreadable) of a known selection
        self.steps = 0
        numa_bits = 0
        for bit in demand.plan.numa_bit:
            numa_bits |= bit
        self.numa_bits = numa_bits

    def best(self) -> tuple[int, int, int] | None:
        """Rank (levels 1-3, widest pair, packed value) of the best complete selection."""
        tables: dict[int, Table] = {}
        for v in self.d.plan.postorder:
            tables[v] = self._node(v, tables)
        p, size = self.p, self.d.size
        ranked = [(v >> p.squares, key[5], v) for key, v in tables[0].items() if key[0] == size]
        return min(ranked, default=None)

    def _count(self, work: int) -> None:
        self.steps += work
        if self.steps > self.limit and not self.narrowed:
            if not self.width:
                raise TooMuchWork
            self.narrowed = True

    def _node(self, v: int, tables: dict[int, Table]) -> Table:
        d, p = self.d, self.p
        node = d.plan.nodes[v]
        acc: Table = {_EMPTY: 0}
        if not d.avail[v]:
            return acc
        rest_avail, rest_must = d.avail[v], d.needed[v]
        out_avail = d.avail[0] - rest_avail
        out_must = d.needed[0] - rest_must
        twice = 2 * node.depth if node.depth > 0 else 0
        for child, (numa, group) in zip(node.children, node.closes, strict=True):
            if child >= 0:
                has, needs = d.avail[child], d.needed[child]
                table = tables.pop(child) if has else None
            else:
                has, needs = len(d.members[~child]), d.lo[~child]
                table = self._leaf(~child) if has else None
            rest_avail -= has
            rest_must -= needs
            if table is not None:
                low = d.size - rest_avail - out_avail
                high = d.size - rest_must - out_must
                acc = self._merge(acc, table, twice, low, high)
            if numa or group:
                acc = _close(acc, numa, group, p)
            acc = self._prune(acc)
        if node.root:
            acc = _settle_root(acc, node.readable * node.readable, p)
        elif node.up:
            acc = _edge(acc, node.up, node.readable * node.readable, p)
        return acc

    def _leaf(self, c: int) -> Table:
        plan, p, d = self.d.plan, self.p, self.d
        cls = plan.classes[c]
        members, lo = d.members[c], d.lo[c]
        devices = len(plan.ids)
        cap = len(cls.members)
        bits = plan.numa_bit[c] | plan.group_bit[c]
        table: Table = {}
        ids = sum((1 << devices) - (1 << (devices - 1 - m)) for m in members[:lo])
        for j in range(lo, len(members) + 1):
            if j > lo:
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
        if self.narrowed:
            acc, table = self._narrow(acc), self._narrow(table)
        self._count(len(acc) * len(table))
        if self.narrowed:  # the limit was passed just now
            acc, table = self._narrow(acc), self._narrow(table)
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
        """Drop states that cannot win.

        A state loses to another with the same ``k`` and open bits whose NUMA, group and
        readability levels are lower (those only grow by the same amounts from here), to
        one with the same ``k``, ``n`` and open bits that matches it in value, summed and
        deepest depth and widest pair, and, given a known complete selection
        (``bound``), when its levels so far, open bits included, already exceed it.
        """
        self._count(len(acc))
        if self.narrowed:
            return self._narrow(acc)
        if len(acc) < 2:
            return acc
        p = self.p
        if self.bound is not None:
            acc = self._bounded(acc)
        # Same device count and open bits, but worse NUMA/group/readability levels.
        best: dict[tuple[int, int], int] = {}
        for key, v in acc.items():
            head = v >> p.unreadable
            slot = (key[0], key[4])
            if head < best.get(slot, head + 1):
                best[slot] = head
        # Same device count, readable count and open bits: lower levels 1-3 win outright;
        # otherwise a state wins if it is no worse in the value it would have were its root
        # settled now, in summed depth, deepest device and widest pair (a larger summed
        # depth only costs more as the root gathers more devices).
        groups: dict[tuple[int, int, int], list[tuple[int, int, int, int, Key]]] = {}
        for key, v in acc.items():
            if v >> p.unreadable == best[(key[0], key[4])]:
                now = v + ((key[1] * key[2]) << p.distance)
                groups.setdefault((key[0], key[1], key[4]), []).append(
                    (now, key[2], key[3], key[5], key)
                )
        out: Table = {}
        for members in groups.values():
            if len(members) > 1:
                members.sort()
            head = members[0][0] >> p.squares
            kept: list[tuple[int, int, int]] = []
            for now, depth, deepest, widest, key in members:
                if now >> p.squares > head:
                    break
                if any(a <= depth and b <= deepest and c <= widest for a, b, c in kept):
                    continue
                kept.append((depth, deepest, widest))
                out[key] = acc[key]
        return out

    def _bounded(self, acc: Table) -> Table:
        """Drop states whose levels so far, open bits counted, exceed the known selection's."""
        p, bound, numa_bits = self.p, self.bound, self.numa_bits
        assert bound is not None
        out: Table = {}
        for key, v in acc.items():
            sig = key[4]
            if sig:
                numa = (sig & numa_bits).bit_count()
                least = v + (numa << p.numa) + ((sig.bit_count() - numa) << p.groups)
            else:
                least = v
            if least >> p.unreadable <= bound:
                out[key] = v
        return out

    def _narrow(self, table: Table) -> Table:
        """Keep the best ``width`` states per device count (by value, then width)."""
        p = self.p
        ranked: dict[int, list[tuple[int, int, int, Key]]] = {}
        for key, v in table.items():
            ranked.setdefault(key[0], []).append((v >> p.squares, key[5], v, key))
        out: Table = {}
        for states in ranked.values():
            states.sort()
            for *_, v, key in states[: max(1, self.width)]:
                out[key] = v
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
    return {k: v + ((length * (squared - k[1] * k[1])) << p.distance) for k, v in acc.items()}
