"""One container's request: validation, the answers that need no search, the entry points.

This module decides what the kubelet gets back. Invalid requests raise :class:`Fallback`
(the caller answers an empty list and warns); every valid one gets a full-size answer.
Two facts about the score narrow the search before it starts, both exact: unknown-NUMA
devices are only worth taking when the known ones run out (level 1 counts them first),
and when one card can hold the whole request on one known NUMA node, no selection can
beat (no unknown NUMA, one NUMA node, one card), so only such cards are searched. A single
device needs no search at all: the best is the smallest ID with a known NUMA node and a
readable path. :class:`Topology` keeps the merge plan of one device set, so a plugin
builds it once per inventory change and reuses it for every request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from rbln_device_plugin.topology.model import Candidate, Score, known_numa, score
from rbln_device_plugin.topology.plan import Plan
from rbln_device_plugin.topology.search import DEFAULT_CAP, search

# No real node comes close; above this a request is refused instead of searched.
MAX_DEVICES: Final = 4096


class Fallback(Exception):
    """The request is invalid; the caller answers an empty list and warns."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Preferred:
    device_ids: list[str]  # must-include IDs first (request order), then the rest by ID
    score: Score  # of the whole answer, shortcuts included
    shortcut: str | None  # how the answer was found without the general search, if it was
    capped: int | None = None  # the search cap that was exceeded (answer may not be optimal)


class Topology:
    """The allocator for one device set: validates requests and answers them."""

    def __init__(self, candidates: Mapping[str, Candidate]) -> None:
        self.candidates = {k: _normalized(k, c) for k, c in candidates.items()}
        self._plan: Plan | None = None

    @property
    def plan(self) -> Plan:
        if self._plan is None:  # built on the first request that needs a search
            self._plan = Plan.build(list(self.candidates.values()))
        return self._plan

    def preferred(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        *,
        cap: int = DEFAULT_CAP,
    ) -> Preferred:
        """Answer one container's preferred-allocation request, or raise :class:`Fallback`."""
        cands = self.candidates
        if size < 0:
            raise Fallback(f"allocation size {size} is negative")
        avail = list(dict.fromkeys(available))
        for device_id in avail:
            if device_id not in cands:
                raise Fallback(f"available device {device_id!r} is not managed by this plugin")
        if size > len(avail):
            raise Fallback(f"allocation size {size} exceeds the {len(avail)} available devices")
        must = list(dict.fromkeys(must_include))
        avail_set = set(avail)
        for device_id in must:
            if device_id not in avail_set:
                raise Fallback(f"must-include device {device_id!r} is not available")
        if len(must) > size:
            raise Fallback(f"{len(must)} must-include devices exceed allocation size {size}")
        if size == len(must):
            return self._answer(must, [], "must-include")
        must_set = set(must)
        rest = [i for i in avail if i not in must_set]
        if size == len(avail):
            return self._answer(must, rest, "all-available")
        if size == 1:
            best = min(rest, key=lambda i: _alone(cands[i]))
            return self._answer([], [best], "one-device")
        if len(cands) > MAX_DEVICES:
            raise Fallback(f"{len(cands)} devices exceed the search limit of {MAX_DEVICES}")
        pool, forced = _level_one(cands, rest, size - len(must))
        must = must + forced
        pool, shortcut = _one_card(cands, pool, must, size)
        index = self.plan.index
        pool_idx = [index[i] for i in pool]
        must_idx = [index[i] for i in must]
        outcome = search(self.plan, pool_idx + must_idx, must_idx, size, cap)
        chosen = {self.plan.ids[i] for i in outcome.chosen} - set(must)
        return self._answer(
            must, chosen, shortcut, cap if outcome.capped else None, first=len(must) - len(forced)
        )

    def _answer(
        self,
        must: list[str],
        chosen: Sequence[str] | set[str],
        shortcut: str | None,
        capped: int | None = None,
        first: int | None = None,
    ) -> Preferred:
        # Mandatory devices keep the kubelet's order; devices forced in by level 1 are
        # ordinary choices and sort with the rest.
        keep = len(must) if first is None else first
        ids = must[:keep] + sorted([*must[keep:], *chosen])
        return Preferred(ids, score(ids, self.candidates), shortcut, capped)


def preferred_allocation(
    candidates: Mapping[str, Candidate],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    cap: int = DEFAULT_CAP,
) -> Preferred:
    """One request against a device set (builds the plan; plugins keep a Topology)."""
    return Topology(candidates).preferred(available, must_include, size, cap=cap)


def _normalized(key: str, cand: Candidate) -> Candidate:
    """The candidate as the score reads it, whoever built it: the mapping's key is the ID,
    a negative NUMA node is unknown, a path without a root and a device is unreadable."""
    numa = known_numa(cand)
    path = cand.pci_path if cand.pci_path is not None and len(cand.pci_path) > 1 else None
    if (cand.id, cand.numa, cand.pci_path) == (key, numa, path):
        return cand
    return replace(cand, id=key, numa=numa, pci_path=path)


def _alone(cand: Candidate) -> tuple[bool, bool, str]:
    """Score of a one-device selection, in the order the levels compare."""
    return cand.numa is None, cand.pci_path is None, cand.id


def _level_one(
    cands: Mapping[str, Candidate], rest: list[str], extra: int
) -> tuple[list[str], list[str]]:
    """(pool, devices every optimum takes) after settling the unknown-NUMA count."""
    known = [i for i in rest if cands[i].numa is not None]
    if extra <= len(known):
        return known, []  # enough known devices: no unknown one is ever worth taking
    return [i for i in rest if cands[i].numa is None], known  # every known one is taken


def _one_card(
    cands: Mapping[str, Candidate], pool: list[str], must: list[str], size: int
) -> tuple[list[str], str | None]:
    """Restrict the pool to cards that hold the whole request on one known NUMA node."""
    holders: dict[tuple[str, int], list[str]] = {}
    for device_id in [*must, *pool]:
        cand = cands[device_id]
        if cand.group is None or cand.numa is None:
            if device_id in must:
                return pool, None  # a mandatory device already rules out one card
            continue
        holders.setdefault((cand.group, cand.numa), []).append(device_id)
    wanted = set(must)
    fitting = [ids for ids in holders.values() if len(ids) >= size and wanted.issubset(ids)]
    if not fitting:
        return pool, None
    keep = {device_id for ids in fitting for device_id in ids}
    return [i for i in pool if i in keep], "one-card"
