"""Admissible lower bounds on levels 1-4 for a partial class-count assignment.

A state gives each class an interval [lo, hi] of devices still allowed; a completion picks
a count inside every interval so that the total is the requested size. The bound is
computed level by level, and each level only considers completions that meet the earlier
levels' bounds exactly (the others already lose there), which lets it restrict classes:
no other NUMA node, no other group, one PCI root, and so on.

Level 4 runs a dynamic program over each root's forest that charges every pair of new
devices at least the shortest hops down to its branch point, and combines roots under the
per-root device counts that the cross-root level forces, without enumerating subsets.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from typing import Final, NamedTuple

from rbln_device_plugin.topology_model import Model, Value, pairs

INF: Final = 1 << 60


class BudgetExceeded(Exception):
    """The search needed more bound evaluations than allowed (pathological input)."""


class _Tables(NamedTuple):
    """Lower bounds inside one root, indexed by the number of new picks there."""

    worst: list[int]
    summed: list[int]


# A per-root spread of device counts: pinned totals by root, then the multiset of totals
# that the remaining roots share out among themselves.
_Spread = tuple[dict[int, int], Counter[int]]


class Bounds:
    def __init__(self, model: Model, total: int, budget: int) -> None:
        self.md = model
        self.total = total
        self.budget = budget
        self.evaluations = 0
        self.tables: dict[tuple[object, ...], _Tables] = {}
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

        # Level 3a: unreadable PCI paths only when readable devices run out.
        lo_unr = sum(lo[c] for c in md.unreadable)
        slack_unr = sum(hi[c] - lo[c] for c in md.unreadable)
        slack_rd = sum(hi) - sum(lo) - slack_unr
        bound = lo_unr + max(0, need - slack_rd)
        if settle(bound):
            return tuple(vec)
        _freeze(md.unreadable if bound == lo_unr else md.readable, lo, hi, bound == lo_unr)

        # Level 3b: pairs under separate roots.
        bound, spreads = self._bound_roots(lo, hi, self.total - bound)
        if bound >= INF or settle(bound):
            return tuple(vec) if bound < INF else (INF,)

        # Level 4: worst, then summed, distance over connected pairs.
        need = self.total - sum(lo)
        picks = max(0, need - sum(hi[c] - lo[c] for c in md.unreadable))
        solo_slack = sum(hi[c] - lo[c] for c in md.solo)
        roots = [r for r in range(md.n_roots) if md.root_classes[r]]
        tables = {r: self._root_tables(r, lo, hi, -1) for r in roots}
        root_lo = [sum(lo[c] for c in cs) for cs in md.root_classes]
        worst = _combine(md, tables, root_lo, spreads, picks, solo_slack, False, None)
        if worst >= INF:
            return (INF,)
        if settle(worst):
            return tuple(vec)
        tables = {r: self._root_tables(r, lo, hi, worst) for r in roots}
        summed = _combine(md, tables, root_lo, spreads, picks, solo_slack, True, worst)
        if summed >= INF:
            return (INF,)
        settle(summed)
        return tuple(vec)

    def _bound_roots(
        self, lo: list[int], hi: list[int], total: int
    ) -> tuple[int, list[_Spread] | None]:
        """Least number of pairs under separate roots.

        Also returns every per-root spread of device counts that reaches that bound, or
        None when they cannot be pinned down cheaply.
        """
        md = self.md
        root_lo = [0] * md.n_roots
        root_hi = [0] * md.n_roots
        solo_lo = solo_hi = 0
        for c in md.readable:
            r = md.root[c]
            if r < 0:
                solo_lo += lo[c]
                solo_hi += hi[c]
            else:
                root_lo[r] += lo[c]
                root_hi[r] += hi[c]
        fixed_total = sum(root_lo) + solo_lo
        fixed_cross = (fixed_total * fixed_total - sum(x * x for x in root_lo) - solo_lo) // 2
        # Cross pairs = (total^2 - sum of squared per-root counts) / 2, so the bound needs
        # the largest reachable sum of squares. Roots without fixed devices are filled
        # largest first (that fill majorizes all others); the few partly fixed roots are
        # enumerated.
        pinned_sq = solo_lo
        free_caps = [1] * (solo_hi - solo_lo)
        mixed: list[int] = []
        for r in range(md.n_roots):
            if root_lo[r] == root_hi[r]:
                pinned_sq += root_lo[r] * root_lo[r]
            elif root_lo[r] == 0:
                free_caps.append(root_hi[r])
            else:
                mixed.append(r)
        extra = total - fixed_total
        exact = len(mixed) <= 2
        if not exact:
            # Relax the partly fixed roots to free ones: still an upper bound.
            free_caps += [root_hi[r] for r in mixed]
            extra += sum(root_lo[r] for r in mixed)
            mixed = []
        fill = _Fill(free_caps)
        best_sq, options = -1, []
        for xs in itertools.product(*(range(root_hi[r] - root_lo[r] + 1) for r in mixed)):
            rest = extra - sum(xs)
            q = fill.squares(rest)
            if q < 0:
                continue
            sq = pinned_sq + q + sum((root_lo[r] + x) ** 2 for r, x in zip(mixed, xs, strict=True))
            if sq > best_sq:
                best_sq, options = sq, [(xs, rest)]
            elif sq == best_sq:
                options.append((xs, rest))
        if best_sq < 0:
            return INF, None
        concentrated = (total * total - best_sq) // 2
        bound = max(concentrated, fixed_cross)
        if not exact or concentrated != bound or solo_hi:
            return bound, None
        spreads: list[_Spread] = []
        for xs, rest in options:
            pinned = {r: root_lo[r] for r in range(md.n_roots) if root_lo[r] == root_hi[r]}
            pinned.update({r: root_lo[r] + x for r, x in zip(mixed, xs, strict=True)})
            # Sum of squares is strictly Schur-convex: a tie needs exactly this free fill.
            spreads.append((pinned, Counter(fill.spread(rest))))
        return bound, spreads

    def _root_tables(self, r: int, lo: list[int], hi: list[int], limit: int) -> _Tables:
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
            return cached
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
        return tables


def _combine(
    md: Model,
    tables: dict[int, _Tables],
    root_lo: list[int],
    spreads: list[_Spread] | None,
    picks: int,
    solo_slack: int,
    summed: bool,
    limit: int | None,
) -> int:
    """Least combined cost over ways to spread ``picks`` new devices across roots.

    Worst distances join by max, summed ones by addition: pairs across roots have no
    distance. With ``spreads`` known, every root takes its total from one of them;
    otherwise any split is allowed. ``limit`` skips entries whose worst distance exceeds it.
    """
    roots = sorted(tables)
    if spreads is None:
        best = [0] * (min(picks, solo_slack) + 1)
        for r in roots:
            table = tables[r].summed if summed else tables[r].worst
            allowed = tables[r].worst
            if len(table) == 1:  # nothing left to choose in this root
                fixed = table[0]
                best = [x + fixed if summed else max(x, fixed) for x in best]
                continue
            out = [INF] * min(len(best) + len(table) - 1, picks + 1)
            for i, x in enumerate(best):
                if x >= INF:
                    continue
                for j, y in enumerate(table[: picks + 1 - i]):
                    if limit is not None and allowed[j] > limit:
                        continue
                    cost = x + y if summed else max(x, y)
                    if cost < out[i + j]:
                        out[i + j] = cost
            best = out
        return best[picks] if picks < len(best) else INF
    result = INF
    for pinned, free in spreads:
        cost = 0
        for r, total in pinned.items():
            entry = _entry(tables, r, total - root_lo[r], summed, limit)
            cost = cost + entry if summed else max(cost, entry)
        if cost >= INF:
            continue
        # The other roots hold no fixed devices and share out the free totals.
        values = sorted(free)
        states = {tuple(free[v] for v in values): cost}
        for r in range(md.n_roots):
            if r in pinned:
                continue
            nxt: dict[tuple[int, ...], int] = {}
            for state, acc in states.items():
                for k, v in enumerate(values):
                    entry = _entry(tables, r, v, summed, limit) if state[k] else INF
                    if entry >= INF:
                        continue
                    key = (*state[:k], state[k] - 1, *state[k + 1 :])
                    new_cost = acc + entry if summed else max(acc, entry)
                    if new_cost < nxt.get(key, INF):
                        nxt[key] = new_cost
            states = nxt
        result = min([result, *states.values()])
    return result


def _entry(tables: dict[int, _Tables], r: int, j: int, summed: bool, limit: int | None) -> int:
    """Root r's table entry for j new picks; INF when impossible or over ``limit``."""
    if r not in tables:
        return 0 if j == 0 else INF
    table = tables[r].summed if summed else tables[r].worst
    if j < 0 or j >= len(table) or (limit is not None and tables[r].worst[j] > limit):
        return INF
    return table[j]


def _nothing(_: list[int]) -> tuple[int, ...]:
    return ()


class _Fill:
    """Largest-first filling of buckets with the given capacities."""

    def __init__(self, caps: list[int]) -> None:
        self.caps = sorted((c for c in caps if c > 0), reverse=True)
        self.prefix = list(itertools.accumulate(self.caps, initial=0))
        self.square_prefix = list(itertools.accumulate((c * c for c in self.caps), initial=0))

    def squares(self, amount: int) -> int:
        """Sum of squared fill levels, or -1 when ``amount`` does not fit."""
        if amount < 0 or amount > self.prefix[-1]:
            return -1
        full = bisect.bisect_right(self.prefix, amount) - 1
        return self.square_prefix[full] + (amount - self.prefix[full]) ** 2

    def spread(self, amount: int) -> list[int]:
        out = []
        for cap in self.caps:
            take = min(cap, amount)
            out.append(take)
            amount -= take
        return out


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
