"""An exact reference for two-root card nodes, written from the node's shape alone.

Brute force cannot check a 64-device node at size 32, but a node made of cards has few
distinct situations: on ``node_64_half_unreadable`` every card holds two readable twins
and two unreadable ones, every card hangs off its root at the same depth, and each root is
one NUMA node. The score of a selection then only depends on, per root, how many devices,
readable devices, cards and same-card readable pairs it takes, so this reference sweeps
every (readable, unreadable) count on every card, keeps the smallest sorted ID list per
such summary, and compares the two roots' summaries with the README's levels written out
for this shape. It shares no code with the allocator; the pair distances it relies on are
measured with the brute-force reference's own LCA routine.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rbln_device_plugin.topology import Candidate
from tests.topology_oracle import Levels, pair_distance

# (devices, readable, cards with a readable device (capped at 2), any same-card pair)
Summary = tuple[int, int, int, bool]


@dataclass
class Card:
    readable: list[str]
    unreadable: list[str]


def _shape(cands: Mapping[str, Candidate]) -> tuple[list[list[Card]], list[int], int, int]:
    """Cards per root, each root's NUMA node, and the same-card / cross-card distances."""
    roots: dict[str, dict[str, Card]] = {}
    numa: dict[str, int] = {}
    for cand in cands.values():
        assert cand.group is not None and cand.numa is not None
        readable = [c for c in cands.values() if c.group == cand.group and c.pci_path]
        root = readable[0].pci_path[0] if readable[0].pci_path else ""
        assert numa.setdefault(root, cand.numa) == cand.numa  # one NUMA node per root
        card = roots.setdefault(root, {}).setdefault(cand.group, Card([], []))
        (card.readable if cand.pci_path else card.unreadable).append(cand.id)
    same, across = set(), set()
    for a, b in itertools.combinations([c for c in cands.values() if c.pci_path], 2):
        d = pair_distance(a, b)
        if d is not None:
            (same if a.group == b.group else across).add(d)
    assert len(same) == 1 and len(across) == 1, "cards must be uniform"
    assert len(roots) == 2 and len(set(numa.values())) == 2
    ordered = sorted(roots)
    return [list(roots[r].values()) for r in ordered], [numa[r] for r in ordered], *same, *across


def _options(card: Card, available: set[str], must: set[str]) -> list[tuple[int, int, list[str]]]:
    """(readable, unreadable, IDs) for every count the card can give; smallest IDs first."""
    out = []
    parts = []
    for ids in (card.readable, card.unreadable):
        free = sorted(i for i in ids if i in available and i not in must)
        forced = sorted(i for i in ids if i in must)
        parts.append([forced + free[:j] for j in range(len(free) + 1)])
    for picked_r, picked_u in itertools.product(*parts):
        out.append((len(picked_r), len(picked_u), picked_r + picked_u))
    return out


def _root_table(
    cards: Sequence[Card], available: set[str], must: set[str]
) -> dict[Summary, tuple[int, int, tuple[str, ...]]]:
    """Summary -> (cards used, -(same-card readable pairs), sorted IDs), the best of each."""
    table: dict[Summary, tuple[int, int, tuple[str, ...]]] = {(0, 0, 0, False): (0, 0, ())}
    for card in cards:
        nxt: dict[Summary, tuple[int, int, tuple[str, ...]]] = {}
        for (k, n, rc, paired), (g, neg_pairs, ids) in table.items():
            for r, u, picked in _options(card, available, must):
                key = (k + r + u, n + r, min(2, rc + (r > 0)), paired or r > 1)
                value = (
                    g + (r + u > 0),
                    neg_pairs - r * (r - 1) // 2,
                    tuple(sorted(ids + tuple(picked))),
                )
                if key not in nxt or value < nxt[key]:
                    nxt[key] = value
        table = nxt
    return table


def card_oracle(
    cands: Mapping[str, Candidate], available: Sequence[str], must: Sequence[str], size: int
) -> tuple[list[str], Levels]:
    """The answer (mandatory first, then by ID) and its levels."""
    (cards_a, cards_b), _, same, across = _shape(cands)
    avail, forced = set(available), set(must)
    table_a = _root_table(cards_a, avail, forced)
    table_b = _root_table(cards_b, avail, forced)
    best: tuple[Levels, tuple[str, ...]] | None = None
    for (ka, na, rca, pa), (ga, qa, ids_a) in table_a.items():
        for (kb, nb, rcb, pb), (gb, qb, ids_b) in table_b.items():
            if ka + kb != size:
                continue

            def widest(n: int, rc: int, paired: bool) -> int:
                return across if rc > 1 else same if paired else 0

            pairs_a, pairs_b = -qa, -qb
            levels = (
                0,
                (ka > 0) + (kb > 0),
                ga + gb,
                (ka - na) + (kb - nb),
                na * nb,
                max(widest(na, rca, pa), widest(nb, rcb, pb)),
                across * (na * (na - 1) // 2 + nb * (nb - 1) // 2)
                - (across - same) * (pairs_a + pairs_b),
            )
            key = (levels, tuple(sorted(ids_a + ids_b)))
            if best is None or key < best:
                best = key
    assert best is not None
    chosen = sorted(set(best[1]) - forced)
    return [*must, *chosen], best[0]
