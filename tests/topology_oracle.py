"""Exhaustive reference for preferred allocation, sharing no code with the allocator.

It builds explicit ancestor sets for the PCI forest, scores every combination that holds
the mandatory devices, and keeps the smallest (levels, sorted IDs). Pairwise distances
are computed once per node, so a 64-device comparison at sizes 1, 2, 62 and 63 stays
within seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from rbln_device_plugin.topology import Candidate

Levels = tuple[int, int, int, int, int, int, int]


def _known(c: Candidate) -> bool:
    return c.numa is not None and c.numa >= 0


def pair_distance(a: Candidate, b: Candidate) -> int | None:
    """LCA distance, or None when either path is unreadable or the roots differ."""
    pa, pb = a.pci_path, b.pci_path
    if pa is None or pb is None or pa[0] != pb[0]:
        return None
    ancestors_of_a = {pa[:j] for j in range(1, len(pa) + 1)}
    node = pb
    while node not in ancestors_of_a:
        node = node[:-1]
    return (len(pa) - 1) + (len(pb) - 1) - 2 * (len(node) - 1)


class Oracle:
    def __init__(self, cands: Mapping[str, Candidate]) -> None:
        self.cands = cands
        names = sorted(cands)
        self.dist: dict[tuple[str, str], int | None] = {}
        for a, b in itertools.combinations(names, 2):
            self.dist[(a, b)] = pair_distance(cands[a], cands[b])

    def levels(self, ids: Sequence[str]) -> Levels:
        chosen = [self.cands[i] for i in ids]
        ordered = sorted(ids)
        shared = {c.group for c in chosen if c.group is not None}
        alone = len([c for c in chosen if c.group is None])
        readable = [i for i in ordered if self.cands[i].pci_path is not None]
        cross, worst, total = 0, 0, 0
        for a, b in itertools.combinations(readable, 2):
            d = self.dist[(a, b)]
            if d is None:
                cross += 1
            else:
                worst = max(worst, d)
                total += d
        return (
            len([c for c in chosen if not _known(c)]),
            len({c.numa for c in chosen if _known(c)}),
            len(shared) + alone,
            len(chosen) - len(readable),
            cross,
            worst,
            total,
        )

    def best(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """The kubelet-facing answer: mandatory IDs first, then the rest by ID."""
        rest = sorted(set(available) - set(must))
        found: tuple[Levels, list[str]] | None = None
        for extra in itertools.combinations(rest, size - len(must)):
            ids = sorted([*must, *extra])
            key = (self.levels(ids), ids)
            if found is None or key < found:
                found = key
        assert found is not None
        chosen = set(found[1]) - set(must)
        return [*must, *sorted(chosen)]


def oracle(
    cands: Mapping[str, Candidate], available: Sequence[str], must: Sequence[str], size: int
) -> list[str]:
    return Oracle(cands).best(available, must, size)


def oracle_levels(cands: Mapping[str, Candidate], ids: Sequence[str]) -> Levels:
    return Oracle({i: cands[i] for i in ids}).levels(ids)


def draw_subset(
    data: st.DataObject, names: Sequence[str], least: int, most: int | None = None
) -> list[str]:
    """A random subset; without ``most`` usually a large one (most nodes are mostly free)."""
    order = data.draw(st.permutations(list(names)))
    if most is not None:
        return order[: data.draw(st.integers(0, min(most, len(order))))]
    dropped = data.draw(st.sampled_from([0, 0, 1, 1, 2, 3, len(order) // 2, len(order)]))
    return order[: max(min(least, len(order)), len(order) - dropped)]
