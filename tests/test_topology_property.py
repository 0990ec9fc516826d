"""The exact search must agree with brute force on every allocation size.

The oracle below shares no code with the allocator: it builds explicit ancestor sets for
the PCI forest, scores every combination, and takes the smallest (levels, sorted IDs).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbln_device_plugin.inventory import Device
from rbln_device_plugin.topology import (
    Candidate,
    Fallback,
    candidate_from_device,
    preferred_allocation,
)

SIDS = ["", " N/A ", "unknown", "0000000000000000", "0x000", "0000000022502229", "00000000ab12cd34"]
PARENTS = ["0000:17:00.0", "0000:18:00.0"]
ROOTS = ["pci0000:00", "pci0000:3a", "pci0001:80"]
BRIDGES = ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]


def oracle_levels(chosen: Sequence[Candidate]) -> tuple[int, ...]:
    def numa_known(c: Candidate) -> bool:
        return c.numa is not None and c.numa >= 0

    shared = {c.group for c in chosen if c.group is not None}
    alone = len([c for c in chosen if c.group is None])
    with_path = [c for c in chosen if c.pci_path is not None]
    cross, distances = 0, []
    for a, b in itertools.combinations(with_path, 2):
        pa, pb = a.pci_path, b.pci_path
        assert pa is not None and pb is not None
        if pa[0] != pb[0]:
            cross += 1
            continue
        ancestors_of_a = {pa[:j] for j in range(1, len(pa) + 1)}
        node = pb
        while node not in ancestors_of_a:
            node = node[:-1]
        lca_depth = len(node) - 1
        distances.append((len(pa) - 1) + (len(pb) - 1) - 2 * lca_depth)
    return (
        len([c for c in chosen if not numa_known(c)]),
        len({c.numa for c in chosen if numa_known(c)}),
        len(shared) + alone,
        len(chosen) - len(with_path),
        cross,
        max(distances, default=0),
        sum(distances),
    )


def oracle(
    cands: dict[str, Candidate], available: list[str], must: list[str], size: int
) -> list[str]:
    rest = sorted(set(available) - set(must))
    best: tuple[tuple[int, ...], list[str]] | None = None
    for extra in itertools.combinations(rest, size - len(must)):
        ids = sorted([*must, *extra])
        key = (oracle_levels([cands[i] for i in ids]), ids)
        if best is None or key < best:
            best = key
    assert best is not None
    chosen = set(best[1]) - set(must)
    return [*must, *sorted(chosen)]


@st.composite
def devices(draw: st.DrawFn) -> list[Device]:
    count = draw(st.integers(min_value=1, max_value=12))
    out = []
    for i in range(count):
        depth = draw(st.integers(min_value=0, max_value=3))
        path: tuple[str, ...] | None = (
            draw(st.sampled_from(ROOTS)),
            *draw(st.lists(st.sampled_from(BRIDGES), min_size=depth, max_size=depth)),
            f"0000:{i + 16:02x}:00.{draw(st.integers(0, 1))}",
        )
        kind = draw(st.sampled_from(["ok", "ok", "ok", "ok", "missing", "garbage"]))
        if kind == "missing":
            path = None
        elif kind == "garbage" and path is not None:
            path = (*path[:-1], "virtual", path[-1])
        bus_id = path[-1] if path is not None else f"0000:{i + 16:02x}:00.0"
        vf = draw(st.integers(0, 4)) == 0
        out.append(
            Device(
                name=f"rbln{i}",
                product="RBLN-CA25",
                pci_device_id="1251" if vf else "1250",
                bus_id=bus_id,
                numa=draw(st.sampled_from([None, 0, 0, 1, 1, 2])),
                sid=draw(st.sampled_from(SIDS)),
                parent_bus_id=draw(st.sampled_from(PARENTS)) if vf else None,
                pci_path=path,
            )
        )
    return out


@settings(
    max_examples=600,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(devs=devices(), data=st.data())
def test_search_equals_brute_force_for_every_size(devs: list[Device], data: st.DataObject) -> None:
    cands = {d.name: candidate_from_device(d) for d in devs}
    names = list(cands)
    available = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=3, unique=True))
    for size in range(len(must), len(available) + 1):
        got = preferred_allocation(cands, available, must, size).device_ids
        want = oracle(cands, available, must, size)
        assert got == want, f"size={size}"


@settings(max_examples=60, derandomize=True, deadline=None)
@given(devs=devices(), data=st.data())
def test_invalid_sizes_fall_back(devs: list[Device], data: st.DataObject) -> None:
    cands = {d.name: candidate_from_device(d) for d in devs}
    available = list(cands)
    must = data.draw(st.lists(st.sampled_from(available), min_size=1, unique=True))
    for size in (-1, len(must) - 1, len(available) + 1):
        try:
            preferred_allocation(cands, available, must, size)
        except Fallback as exc:
            assert exc.reason
        else:
            raise AssertionError(f"size {size} should fall back")


@st.composite
def card_layouts(draw: st.DrawFn) -> dict[str, Candidate]:
    """Realistic shapes with many interchangeable devices: cards of chips behind switches."""
    out: dict[str, Candidate] = {}
    # Device numbering need not follow bus order (it rarely does across cards).
    names = draw(st.permutations([f"rbln{i}" for i in range(12)]))
    roots = draw(st.integers(1, 3))
    card = 0
    for root in range(roots):
        root_numa = draw(st.sampled_from([None, 0, 1]))
        for port in range(draw(st.integers(1, 3))):
            chips = draw(st.integers(1, 4))
            numa = root_numa if draw(st.integers(0, 4)) else draw(st.sampled_from([None, 0, 1]))
            behind_switch = draw(st.booleans())
            for chip in range(chips):
                if len(out) == 12:
                    return out
                name = names[len(out)]
                bus = 0x10 * root + 4 * port
                path: tuple[str, ...] | None = (
                    f"pci0000:{0x40 * root:02x}",
                    f"0000:{0x40 * root:02x}:{port + 1:02x}.0",
                    *(
                        [f"0000:{bus + 1:02x}:00.0", f"0000:{bus + 2:02x}:{chip:02x}.0"]
                        if behind_switch
                        else []
                    ),
                    f"0000:{bus + 3:02x}:00.{chip}",
                )
                if draw(st.integers(0, 14)) == 0:
                    path = None
                group = None if draw(st.integers(0, 7)) == 0 else f"sid:card{card}"
                out[name] = Candidate(name, numa, group, path)
            card += 1
    return out


@settings(max_examples=300, derandomize=True, deadline=None)
@given(cands=card_layouts(), data=st.data())
def test_search_equals_brute_force_on_card_layouts(
    cands: dict[str, Candidate], data: st.DataObject
) -> None:
    names = list(cands)
    available = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
    for size in range(len(must), len(available) + 1):
        got = preferred_allocation(cands, available, must, size).device_ids
        assert got == oracle(cands, available, must, size), f"size={size}"


def test_identical_cards_numbered_against_bus_order() -> None:
    """Swapping identical cards must never cost the smaller IDs their place."""

    def card(names: list[str], port: int, sid: str) -> dict[str, Candidate]:
        return {
            name: Candidate(
                name,
                0,
                sid,
                (
                    "pci0000:00",
                    f"0000:00:0{port}.0",
                    f"0000:0{port}:00.0",
                    f"0000:1{port}:0{chip}.0",
                    f"0000:2{port}:00.{chip}",
                ),
            )
            for chip, name in enumerate(names)
        }

    cands = {**card(["rbln5", "rbln6"], 1, "sid:a"), **card(["rbln1", "rbln2"], 2, "sid:b")}
    for size in range(5):
        want = oracle(cands, list(cands), [], size)
        assert preferred_allocation(cands, list(cands), [], size).device_ids == want
