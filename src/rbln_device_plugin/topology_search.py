"""Exact branch-and-bound search for the best preferred allocation.

The search works on interchangeable-device classes (:mod:`topology_model`) and only
decides how many devices each class contributes:

1. Find the optimal value of levels 1-4 by depth-first search over class counts, pruning
   every branch whose admissible lower bound (:mod:`topology_bounds`) reaches the
   incumbent. Counts are tried most promising first, and identical sibling subtrees
   are only explored in non-increasing order of their totals.
2. Build the lexicographically smallest ID list with that value: walk the devices in ID
   order and keep each one whenever some optimal selection still contains everything
   kept so far; each check is the same search, aimed at the known optimum.

No step is greedy: the answer equals an exhaustive comparison, tie-break included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from rbln_device_plugin.topology_bounds import INF, Bounds, BudgetExceeded
from rbln_device_plugin.topology_model import Model, Value, build_model, value

if TYPE_CHECKING:
    from rbln_device_plugin.topology import Candidate

# Bound evaluations before the search gives up and the kubelet picks instead. Real
# requests on 64 devices need at most about 1,100; one evaluation costs ~50 us, so this
# caps a pathological layout near one second of admission delay, deterministically.
DEFAULT_NODE_BUDGET: Final = 20_000
# Far above any real node; beyond these the model itself (pairwise class distances,
# recursion per class) would cost more than a kubelet round trip is worth.
MAX_DEVICES: Final = 4096
MAX_CLASSES: Final = 512

__all__ = ["DEFAULT_NODE_BUDGET", "BudgetExceeded", "search"]


def search(
    pool: Sequence[Candidate],
    fixed: Sequence[Candidate],
    extra: int,
    *,
    node_budget: int = DEFAULT_NODE_BUDGET,
) -> list[str]:
    """IDs of the ``extra`` pool devices that best complete ``fixed`` (exact optimum)."""
    if extra <= 0:
        return []
    if extra > len(pool):
        raise ValueError(f"cannot choose {extra} of {len(pool)} devices")
    if len(pool) + len(fixed) > MAX_DEVICES:
        raise BudgetExceeded(f"{len(pool) + len(fixed)} devices exceed the search limit")
    model = build_model(pool, fixed)
    if model.n > MAX_CLASSES:
        raise BudgetExceeded(f"{model.n} distinct device positions exceed the search limit")
    return _Search(model, len(fixed) + extra, node_budget).run()


class _Search:
    def __init__(self, model: Model, total: int, budget: int) -> None:
        self.md = model
        self.total = total
        self.bounds = Bounds(model, total, budget)
        self.best: Value | None = None
        self.witness: list[int] | None = None
        self.target: Value | None = None
        self.found: list[int] | None = None
        self.sym: dict[int, list[tuple[list[int], list[int]]]] = {}

    # ---- driver -------------------------------------------------------------------
    def run(self) -> list[str]:
        md = self.md
        lo = list(md.fixed_count)
        hi = list(md.cap)
        self.sym = md.sym
        if self.bounds.lower(lo, hi, None)[0] >= INF:
            raise ValueError("no selection of the requested size exists")
        self._descend(lo, hi, 0)
        assert self.best is not None and self.witness is not None
        self.target = self.best
        witness = self.witness
        chosen: list[str] = []
        closed: set[int] = set()
        extra = self.total - sum(md.fixed_count)
        for device_id, c in md.pool_order:
            if len(chosen) == extra:
                break
            if c in closed:
                continue  # a twin with a smaller ID was rejected, so this one is too
            lo[c] += 1
            if witness[c] < lo[c]:
                self.found = None
                self.sym = self._symmetries(lo, hi)
                if not self._prunable(self.bounds.lower(lo, hi, self.target)):
                    self._descend(list(lo), list(hi), 0)
                if self.found is None:
                    lo[c] -= 1
                    hi[c] = lo[c]
                    closed.add(c)
                    continue
                witness = self.found
            chosen.append(device_id)
        return chosen

    def _symmetries(
        self, lo: list[int], hi: list[int]
    ) -> dict[int, list[tuple[list[int], list[int]]]]:
        """The sibling symmetries that the kept and rejected devices leave intact."""
        md = self.md

        def untouched(classes: Sequence[int]) -> bool:
            return all(lo[x] == md.fixed_count[x] and hi[x] == md.cap[x] for x in classes)

        active: dict[int, list[tuple[list[int], list[int]]]] = {}
        for c, links in md.sym.items():
            for before, others in links:
                alike = (
                    len(before) == 1
                    and not others
                    and (lo[before[0]], hi[before[0]]) == (lo[c], hi[c])
                )
                if alike or (untouched(before) and untouched([c, *others])):
                    active.setdefault(c, []).append((before, others))
        return active

    def _descend(self, lo: list[int], hi: list[int], pos: int) -> None:
        need = self.total - sum(lo)
        if need == 0:
            score = value(self.md, lo)
            if self.target is not None:
                if score == self.target:
                    self.found = list(lo)
            elif self.best is None or score < self.best:
                self.best, self.witness = score, list(lo)
            return
        order = self.md.order
        while pos < len(order) and lo[order[pos]] == hi[order[pos]]:
            pos += 1
        if pos == len(order):
            return
        c = order[pos]
        low, high = lo[c], hi[c]
        top = min(high, low + need)
        for before, others in self.sym.get(c, ()):
            top = min(top, sum(lo[x] for x in before) - sum(lo[x] for x in others))
        # Visit the most promising counts first: good incumbents early prune the rest.
        children: list[tuple[tuple[int, ...], int]] = []
        for count in range(top, low - 1, -1):
            lo[c] = hi[c] = count
            bound = self.bounds.lower(lo, hi, self._ref())
            if not self._prunable(bound):
                children.append((bound, count))
        children.sort(key=lambda child: child[0])
        for bound, count in children:
            lo[c] = hi[c] = count
            if self._prunable(bound, lo, hi):
                continue
            self._descend(lo, hi, pos + 1)
            if self.found is not None:
                break
        lo[c], hi[c] = low, high

    def _ref(self) -> Value | None:
        return self.target if self.target is not None else self.best

    def _prunable(
        self, bound: tuple[int, ...], lo: list[int] | None = None, hi: list[int] | None = None
    ) -> bool:
        """Whether no completion can beat the incumbent (or reach the target)."""
        ref = self._ref()
        if bound[0] >= INF:
            return True
        if ref is None:
            return False
        head = ref[: len(bound)]
        if bound != head:
            return bound > head
        if len(bound) < len(ref):
            # Computed against an older incumbent: recompute against the current one.
            if lo is None or hi is None:
                return False
            return self._prunable(self.bounds.lower(lo, hi, ref))
        return self.target is None  # a tie never beats the incumbent
