"""Levels 3b and 4 bounds: a knapsack over PCI roots that knows the share-group budget.

Once the share-group level is settled, a completion that meets its bound opens exactly
that many new groups (an ungrouped device counts as one). A card lives under one PCI
root, so the budget limits how many devices each root can still gather: the ``a``
largest unopened groups there, plus whatever already opened groups may still add.

Cross-root pairs are ``(total^2 - sum of squared per-root counts) / 2``: level 3b is the
largest sum of squares reachable within the budget. Level 4 only covers completions that
reach it, so the same knapsack then ranks per-root counts by (squares, then least worst
or summed distance) with each root's distance tables (:mod:`topology_bounds`).

The knapsack is memoised per suffix of roots in branching order: while the search
branches inside one root, the later roots keep their shape and their table is reused,
and the branching root itself is resolved with a handful of lookups.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from typing import Final

from rbln_device_plugin.topology_model import Model

# Values pack (squares, distance) into one int: squares * SCALE - distance. Larger is
# better, distances stay below SCALE, and sums of values add both parts.
SCALE: Final = 1 << 32

SQUARES, WORST, SUMMED = 0, 1, 2

# A root's shape: (devices alone?, fixed devices, capacity with 0, 1, 2, ... new groups).
Shape = tuple[bool, int, tuple[int, ...]]
# (devices, new groups, packed value): one way a root can end up.
Option = tuple[int, int, int]
# A root's distance tables by new picks (worst, summed), their cache key, and a limit on
# the worst distance (-1 for none).
Cost = tuple[Hashable, tuple[list[int], list[int]], int]
# Devices over the roots -> Pareto front of (new groups, best packed value), both rising.
_Table = dict[int, list[tuple[int, int]]]


class RootKnapsack:
    """Best per-root device counts under a budget of new share groups."""

    def __init__(self, model: Model, total: int) -> None:
        self.md = model
        self.total = total  # no query asks for more devices than this
        home: dict[int, int | None] = {}
        for c in model.readable:
            g = model.grp[c]
            if g >= 0:
                r = model.root[c]
                home[g] = r if home.get(g, r) == r else None
        # Groups spanning several roots are left free: charging them in every root
        # would overcount, and a relaxation only has to stay optimistic.
        self.spans = {g for g, r in home.items() if r is None}
        # Roots in branching order, then the devices that are alone under their root.
        self.members: list[Sequence[int]] = [*model.root_classes, model.solo]
        self.getters = [operator.itemgetter(*cs) if cs else _nothing for cs in self.members]
        # A root's shape follows from its own counts, except for the groups that also
        # have members elsewhere: whether those are opened is part of the cache key.
        self.outside: list[list[int]] = []
        for classes in self.members:
            inside = set(classes)
            mine = {model.grp[c] for c in classes if model.grp[c] >= 0} - self.spans
            elsewhere = {model.grp[c] for c in range(model.n) if c not in inside}
            self.outside.append(sorted(mine & elsewhere))
        self.known: dict[Hashable, Shape] = {}
        self.options: dict[Hashable, list[Option]] = {}
        self.suffixes: dict[tuple[object, ...], _Table] = {}

    def shapes(self, lo: list[int], hi: list[int], opened: set[int]) -> list[Shape]:
        """Every root's shape; ``opened`` groups already hold a device and grow freely."""
        out: list[Shape] = []
        for k, get in enumerate(self.getters):
            key = (k, get(lo), get(hi), *(g in opened for g in self.outside[k]))
            shape = self.known.get(key)
            if shape is None:
                shape = self.known[key] = self._shape(k, lo, hi, opened)
            out.append(shape)
        return out

    def _shape(self, k: int, lo: list[int], hi: list[int], opened: set[int]) -> Shape:
        md = self.md
        classes = self.members[k]
        base = free = loose = 0
        groups: dict[int, int] = {}
        for c in classes:
            base += lo[c]
            slack = hi[c] - lo[c]
            if slack:
                g = md.grp[c]
                if g < 0:
                    loose += slack
                elif g in opened or g in self.spans:
                    free += slack
                else:
                    groups[g] = groups.get(g, 0) + slack
        caps = [base + free]
        for size in sorted(groups.values(), reverse=True):
            caps.append(caps[-1] + size)
        caps.extend(range(caps[-1] + 1, caps[-1] + loose + 1))
        return (k == md.n_roots, base, tuple(caps))

    def best(
        self,
        mode: int,
        shapes: list[Shape],
        costs: Sequence[Cost | None],
        total: int,
        budget: int,
    ) -> int | None:
        """Best packed value over ``total`` readable devices; None when nothing fits.

        ``costs[k]`` holds root k's distance tables (indexed by new picks there); in
        SUMMED mode, picks whose worst distance exceeds the cost's limit are ruled out.
        """
        layers: list[tuple[Hashable, list[Option]]] = []
        const = 0
        for k, shape in enumerate(shapes):
            cost = costs[k] if mode != SQUARES else None
            key = (mode, shape, cost[0] if cost is not None else None)
            options = self.options.get(key)
            if options is None:
                options = self.options[key] = _options(mode, shape, cost)
            if not options:
                return None
            if len(options) == 1:
                const = _join(mode, const, options[0][2])
                total -= options[0][0]
                budget -= options[0][1]
            else:
                layers.append((key, options))
        if total < 0 or budget < 0:
            return None
        if not layers:
            return const if total == 0 else None
        table = self._table(mode, tuple(layers[1:]))
        result: int | None = None
        for x, a, v in layers[0][1]:
            if a > budget or x > total:
                break
            for a2, w in reversed(table.get(total - x, ())):
                if a + a2 <= budget:
                    joined = _join(mode, v, w)
                    if result is None or joined > result:
                        result = joined
                    break
        return None if result is None else _join(mode, const, result)

    def _table(self, mode: int, layers: tuple[tuple[Hashable, list[Option]], ...]) -> _Table:
        key = (mode, *(layer[0] for layer in layers))
        cached = self.suffixes.get(key)
        if cached is not None:
            return cached
        if not layers:
            return {0: [(0, 0)]}
        later = self._table(mode, layers[1:])
        merged: dict[int, list[tuple[int, int]]] = {}
        for x, a, v in layers[0][1]:
            own = -v % SCALE
            for t, front in later.items():
                if x + t > self.total:
                    continue
                out = merged.setdefault(x + t, [])
                if mode == WORST:
                    # Squares add, the worst distance is the larger one.
                    out.extend((a + a2, v + w + min(own, -w % SCALE)) for a2, w in front)
                else:
                    out.extend((a + a2, v + w) for a2, w in front)
        table: _Table = {}
        for t, found in merged.items():
            found.sort()
            front = table[t] = [found[0]]
            for pair in found:
                if pair[1] > front[-1][1]:
                    if pair[0] == front[-1][0]:
                        front[-1] = pair  # same groups, better value
                    else:
                        front.append(pair)
        self.suffixes[key] = table
        return table


def unpack(value: int) -> tuple[int, int]:
    """(squares, distance) of a packed value."""
    return -(-value // SCALE), -value % SCALE


def _join(mode: int, a: int, b: int) -> int:
    if mode != WORST:
        return a + b
    # Squares add, the worst distance is the larger one.
    return a + b + min(-a % SCALE, -b % SCALE)


def _options(mode: int, shape: Shape, cost: Cost | None) -> list[Option]:
    """Every count a root can reach, with the fewest new groups it needs and its value."""
    alone, base, caps = shape
    out: list[Option] = []
    a = 0
    for x in range(base, caps[-1] + 1):
        while caps[a] < x:
            a += 1
        gain = x if alone else x * x
        if cost is None:
            out.append((x, a, gain if mode == SQUARES else gain * SCALE))
            continue
        _, (worst, summed), limit = cost
        j = x - base
        if j >= len(worst) or worst[j] >= SCALE or (limit >= 0 and worst[j] > limit):
            continue
        distance = worst[j] if mode == WORST else summed[j]
        if distance >= SCALE:
            continue
        out.append((x, a, gain * SCALE - distance))
    return out


def _nothing(_: list[int]) -> tuple[int, ...]:
    return ()
