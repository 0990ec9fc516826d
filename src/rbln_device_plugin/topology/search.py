"""How hard the search tries: one exact sweep, then a bounded one, then a safety cap.

Nodes built from cards (chips of a card behind one switch, a card on one host bridge, a
NUMA node per host bridge or several) are solved by a single exact sweep
(:mod:`tables`) in a few thousand steps. Nodes whose share groups or NUMA nodes are
scattered over many host bridges keep many groups open at once and can need far more. So
the first sweep stops at ``EASY`` steps; then a narrowed sweep finds a good complete
selection quickly, and a second exact sweep starts with that selection as a bound, which
drops every partial selection already worse on levels 1-3a. Only if that sweep passes
``cap`` steps does it narrow as well; the answer is then the better of the two narrowed
selections, a complete selection of the requested size, reported as capped.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.topology.plan import Plan
from rbln_device_plugin.topology.tables import Demand, Sweep, TooMuchWork

# Steps for the first exact sweep: a 128-device node of cards needs about 7,000.
EASY: Final = 50_000
# Steps for the bounded exact sweep before it narrows; a step costs about a microsecond.
DEFAULT_CAP: Final = 250_000
# States kept per device count by a narrowed sweep.
WIDTH: Final = 2


@dataclass(frozen=True, slots=True)
class Outcome:
    chosen: list[int]  # device indices (positions in the plan's ID order)
    capped: bool  # the cap was reached: the best narrowed selection, maybe not optimal
    steps: int
    bounded: bool = False  # found by the second, bounded exact sweep


def search(
    plan: Plan, available: Collection[int], must: Collection[int], size: int, cap: int
) -> Outcome:
    """Best ``size`` devices of ``available`` that include ``must`` (indices into the plan)."""
    demand = Demand(plan, available, must, size)
    first = Sweep(demand, limit=min(EASY, cap))
    try:
        found = first.best()
    except TooMuchWork:
        found = None
    else:
        return _outcome(demand, found, False, first.steps)
    quick = Sweep(demand, limit=0, width=WIDTH, narrow=True)
    known = quick.best()
    if known is None:
        raise ValueError(f"no selection of {size} devices exists")
    bounded = Sweep(demand, limit=cap, width=WIDTH, bound=known[2] >> plan.packing.unreadable)
    found = bounded.best()
    steps = first.steps + quick.steps + bounded.steps
    if bounded.narrowed:
        # Both answers are complete selections; keep the better one.
        return _outcome(demand, min(known, found or known), True, steps)
    return _outcome(demand, found, False, steps, bounded=True)


def _outcome(
    demand: Demand,
    found: tuple[int, int, int] | None,
    capped: bool,
    steps: int,
    *,
    bounded: bool = False,
) -> Outcome:
    if found is None:
        raise ValueError(f"no selection of {demand.size} devices exists")
    return Outcome(demand.decode(found[2]), capped, steps, bounded)
