"""Admissible lower bounds on levels 1-4 for a partial class-count assignment.

A state gives each class an interval [lo, hi] of devices still allowed; a completion picks
a count inside every interval so that the total is the requested size. The bound is
computed level by level, and each level only considers completions that meet the earlier
levels' bounds exactly (the others already lose there), which lets it restrict classes:
no other NUMA node, no other group, one PCI root, and so on.

Levels 3b and 4 share a knapsack over PCI roots (:mod:`topology_cross`) that respects the
share-group budget left by level 2. Level 4 feeds it per-root tables from a dynamic
program over each root's forest that charges every pair of new devices at least the
shortest hops down to its branch point.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Final, NamedTuple

from rbln_device_plugin.topology_cross import SQUARES, SUMMED, WORST, Cost, RootKnapsack, unpack
from rbln_device_plugin.topology_model import Model, Value, pairs

INF: Final = 1 << 60


class BudgetExceeded(Exception):
    """The search needed more bound evaluations than allowed (pathological input)."""


class _Tables(NamedTuple):
    """Lower bounds inside one root, indexed by the number of new picks there."""

    worst: list[int]
    summed: list[int]


class Bounds:
    def __init__(self, model: Model, total: int, budget: int) -> None:
        self.md = model
        self.total = total
        self.budget = budget
        self.evaluations = 0
        self.tables: dict[tuple[object, ...], _Tables] = {}
        self.knapsack = RootKnapsack(model, total)
        # Per-root accessors for cache keys (a root's (lo, hi) decides its tables).
        self.getters = [operator.itemgetter(*cs) if cs else _nothing for cs in model.root_classes]

    def lower(self, lo_in: list[int], hi_in: list[int], ref: Value | None) -> tuple[int, ...]:
        """Lower bounds on levels 1-4 of every completion, level by level.

        Each level's bound only covers completions that meet the earlier levels' bounds
        exactly (the others already lose there), which lets it restrict the classes. The
        vector stops after the first level that differs from ``ref``.
        """
        self.evaluations += 1
        if self.evaluations > self.budget:
            raise BudgetExceeded(f"topology search gave up after {self.budget} bound evaluations")
        md = self.md
        lo, hi = list(lo_in), list(hi_in)
        need = self.total - sum(lo)
        if need < 0 or need > sum(hi) - sum(lo):
            return (INF,)
        vec: list[int] = []

        def settle(bound: int) -> bool:
            vec.append(bound)
            return ref is not None and bound != ref[len(vec) - 1]

        # Level 1a: unknown NUMA devices are only taken when known ones run out.
        lo_unk = sum(lo[c] for c in md.unknown_numa)
        slack_unk = sum(hi[c] - lo[c] for c in md.unknown_numa)
        slack_known = sum(hi) - sum(lo) - slack_unk
        bound = lo_unk + max(0, need - slack_known)
        if settle(bound):
            return tuple(vec)
        _freeze(md.unknown_numa if bound == lo_unk else md.known_numa, lo, hi, bound == lo_unk)
        need = self.total - sum(lo)

        # Level 1b: fewest NUMA nodes covering the known picks.
        fixed_nodes = {md.numa[c] for c in md.known_numa if lo[c]}
        per_node: dict[int, int] = {}
        for c in md.known_numa:
            if hi[c] > lo[c]:
                per_node[md.numa[c]] = per_node.get(md.numa[c], 0) + hi[c] - lo[c]
        known_need = max(0, need - sum(hi[c] - lo[c] for c in md.unknown_numa))
        inside = sum(s for node, s in per_node.items() if node in fixed_nodes)
        outside = [s for node, s in per_node.items() if node not in fixed_nodes]
        added = _cover(known_need - inside, outside)
        if settle(len(fixed_nodes) + added):
            return tuple(vec)
        if added == 0:
            _freeze([c for c in md.known_numa if md.numa[c] not in fixed_nodes], lo, hi, True)

        # Level 2: fewest share groups; devices without a shared group count one each.
        fixed_groups = {md.grp[c] for c in range(md.n) if lo[c] and md.grp[c] >= 0}
        loners = sum(lo[c] for c in range(md.n) if md.grp[c] < 0)
        per_group: dict[int, int] = {}
        inside = 0
        for c in range(md.n):
            slack = hi[c] - lo[c]
            g = md.grp[c]
            if not slack or g < 0:
                continue
            if g in fixed_groups:
                inside += slack
            else:
                per_group[g] = per_group.get(g, 0) + slack
        added = _cover(need - inside, list(per_group.values()))  # then one group per loner
        if settle(len(fixed_groups) + loners + added):
            return tuple(vec)
        if added == 0:
            outsiders = [c for c in range(md.n) if md.grp[c] not in fixed_groups]
            _freeze(outsiders, lo, hi, True)
        new_groups = added

        # Level 3a: unreadable PCI paths only when readable devices run out.
        lo_unr = sum(lo[c] for c in md.unreadable)
        slack_unr = sum(hi[c] - lo[c] for c in md.unreadable)
        slack_rd = sum(hi) - sum(lo) - slack_unr
        bound = lo_unr + max(0, need - slack_rd)
        if settle(bound):
            return tuple(vec)
        _freeze(md.unreadable if bound == lo_unr else md.readable, lo, hi, bound == lo_unr)

        # Level 3b: pairs under separate roots, within the share-group budget.
        readable = self.total - bound
        shapes = self.knapsack.shapes(lo, hi, fixed_groups)
        budget = new_groups or INF
        best = self.knapsack.best(SQUARES, shapes, (), readable, budget)
        if best is None:
            # No completion meets the earlier levels' bounds together: all are worse.
            return (*vec, INF)
        if settle((readable * readable - best) // 2):
            return tuple(vec)

        # Level 4: worst, then summed, distance over connected pairs.
        costs: list[Cost | None] = [self._root_tables(r, lo, hi, -1) for r in range(md.n_roots)]
        costs.append(None)  # devices alone under their root pair with nobody
        packed = self.knapsack.best(WORST, shapes, costs, readable, budget)
        squares, worst = unpack(packed) if packed is not None else (-1, INF)
        if squares != best:
            return (*vec, INF)
        if settle(worst):
            return tuple(vec)
        costs = [self._root_tables(r, lo, hi, worst) for r in range(md.n_roots)]
        costs.append(None)
        packed = self.knapsack.best(SUMMED, shapes, costs, readable, budget)
        squares, summed = unpack(packed) if packed is not None else (-1, INF)
        settle(summed if squares == best else INF)
        return tuple(vec)

    def _root_tables(self, r: int, lo: list[int], hi: list[int], limit: int) -> Cost:
        """Lower bounds on the worst and summed distance inside root r, by new picks.

        ``limit`` >= 0 drops classes that would create a pair farther apart than it.
        A merge at a forest node charges each pair split across two branches at least
        the two shortest hops down to a candidate leaf; pairs with fixed devices are exact.
        """
        md = self.md
        classes = md.root_classes[r]
        get = self.getters[r]
        key = (r, limit, get(lo), get(hi))
        cached = self.tables.get(key)
        if cached is not None:
            return key, cached, limit
        fixed = [c for c in classes if lo[c]]
        _, worst, summed = pairs(md, [lo[c] if md.root[c] == r else 0 for c in range(md.n)])
        pending: dict[int, list[tuple[list[int], list[int], int]]] = {}
        top_w: list[int] = [worst]
        top_s: list[int] = [summed]
        for v in md.root_nodes[r]:
            depth = md.t_depth[v]
            items = pending.pop(v, [])
            for c in md.t_classes[v]:
                slack = hi[c] - lo[c]
                if not slack:
                    continue
                row = md.dist[c]
                ecc = max((row[f] for f in fixed if f != c), default=0)
                star = sum(lo[f] * row[f] for f in fixed if f != c)
                intra = max(md.intra[c], 0)
                if lo[c]:
                    ecc = max(ecc, intra)
                    star += lo[c] * intra
                if limit >= 0:
                    if ecc > limit:
                        continue
                    if intra > limit:
                        slack = min(slack, 1)
                w = [0] + [max(ecc, intra if j > 1 else 0) for j in range(1, slack + 1)]
                s = [j * star + j * (j - 1) // 2 * intra for j in range(slack + 1)]
                items.append((w, s, md.height[c]))
            if not items:
                continue
            mw, ms, low = [0], [0], INF
            for w, s, h in items:
                a = h - depth
                size = len(mw) + len(w) - 1
                nw, ns = [INF] * size, [INF] * size
                for big, (wb, sb) in enumerate(zip(mw, ms, strict=True)):
                    hop = low + a if big else 0
                    for j, (wj, sj) in enumerate(zip(w, s, strict=True)):
                        cw = max(wb, wj, hop if j else 0)
                        cs = sb + sj + big * j * hop
                        if cw < nw[big + j]:
                            nw[big + j] = cw
                        if cs < ns[big + j]:
                            ns[big + j] = cs
                mw, ms, low = nw, ns, min(low, a)
            parent = md.t_parent[v]
            if parent < 0:
                top_w = [max(worst, x) for x in mw]
                top_s = [summed + x for x in ms]
            else:
                pending.setdefault(parent, []).append((mw, ms, low + depth))
        tables = _Tables(top_w, top_s)
        self.tables[key] = tables
        return key, tables, limit


def _nothing(_: list[int]) -> tuple[int, ...]:
    return ()


def _freeze(classes: Sequence[int], lo: list[int], hi: list[int], drop: bool) -> None:
    """Restrict classes to their current minimum (drop) or maximum (take every slot)."""
    for c in classes:
        if drop:
            hi[c] = lo[c]
        else:
            lo[c] = hi[c]


def _cover(need: int, capacities: list[int]) -> int:
    """Fewest new buckets holding ``need`` items: largest first, then one-item buckets."""
    added = 0
    for cap in sorted(capacities, reverse=True):
        if need <= 0:
            break
        added += 1
        need -= cap
    return added + max(0, need)
