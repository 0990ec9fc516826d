"""Brute-force agreement on the shapes real nodes have, where the search's shortcuts bite.

Random devices rarely look alike, so the all-feature property test seldom exercises what
makes the search fast: interchangeable chips on a card, identical cards, groups whose
unreadable members join the card's PCI branch, PCI trees deep enough for the widest
distance and the distance sum to disagree. These generators build such nodes (up to 14
devices, IDs numbered against bus order) and compare every size with brute force.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbln_device_plugin.topology import Candidate, preferred_allocation
from tests.topology_oracle import Oracle, draw_subset

EXAMPLES = 300


@st.composite
def card_layouts(draw: st.DrawFn) -> dict[str, Candidate]:
    """Cards of chips behind on-card switches, on one to three host bridges."""
    out: dict[str, Candidate] = {}
    count = draw(st.sampled_from([*range(2, 15), *range(10, 15)]))
    names = draw(st.permutations([f"rbln{i}" for i in range(count)]))
    card = 0
    for root in range(draw(st.integers(1, 3))):
        root_numa = draw(st.sampled_from([None, 0, 1]))
        for port in range(draw(st.integers(1, 3))):
            numa = root_numa if draw(st.integers(0, 4)) else draw(st.sampled_from([None, 0, 1]))
            behind_switch = draw(st.booleans())
            for chip in range(draw(st.integers(1, 4))):
                if len(out) == count:
                    return out
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
                if draw(st.integers(0, 6)) == 0:
                    path = None  # the card's unreadable members join its branch
                group = None if draw(st.integers(0, 7)) == 0 else f"sid:card{card}"
                out[names[len(out)]] = Candidate(names[len(out)], numa, group, path)
            card += 1
    return out


@st.composite
def busy_layouts(draw: st.DrawFn) -> dict[str, Candidate]:
    """Cards that share a group across roots, devices alone under a bridge, no groups."""
    count = draw(st.sampled_from([*range(4, 15), *range(10, 15)]))
    names = draw(st.permutations([f"rbln{i}" for i in range(count)]))
    out: dict[str, Candidate] = {}
    card = 0
    while len(out) < count:
        root = draw(st.integers(0, 2))
        port = draw(st.integers(1, 3))
        numa = draw(st.sampled_from([0, 0, 1, None]))
        group = draw(st.sampled_from([f"sid:card{card}"] * 3 + ["sid:shared", None]))
        for chip in range(draw(st.integers(1, 4))):
            if len(out) == count:
                break
            path: tuple[str, ...] | None = (
                f"pci0000:{0x40 * root:02x}",
                f"0000:{0x40 * root:02x}:{port:02x}.0",
                f"0000:{0x10 * card + 1:02x}:00.0",
                f"0000:{0x10 * card + 2:02x}:{chip:02x}.0",
                f"0000:{0x10 * card + 3 + chip:02x}:00.0",
            )
            shape = draw(st.integers(0, 11))
            if shape == 0:
                path = None
            elif shape == 1:  # alone under a host bridge of its own
                path = (f"pci0001:{len(out):02x}", f"0001:{len(out):02x}:00.0")
            out[names[len(out)]] = Candidate(names[len(out)], numa, group, path)
        card += 1
    return out


@st.composite
def deep_trees(draw: st.DrawFn) -> dict[str, Candidate]:
    """One NUMA node, few groups, uneven PCI depths: levels 3b and 4 decide."""
    count = draw(st.sampled_from([*range(3, 15), *range(10, 15)]))
    names = draw(st.permutations([f"rbln{i}" for i in range(count)]))
    bridges = [f"0000:{b:02x}:00.0" for b in range(1, 7)]
    out: dict[str, Candidate] = {}
    paths: list[tuple[str, ...]] = []
    for i in range(count):
        end = f"0000:{0x20 + i:02x}:00.0"
        if paths and draw(st.integers(0, 5)) == 0:
            path = (*draw(st.sampled_from(paths)), end)  # below another device
        else:
            depth = draw(st.integers(0, 4))
            below = draw(st.lists(st.sampled_from(bridges), min_size=depth, max_size=depth))
            path = (draw(st.sampled_from(["pci0000:00", "pci0000:00", "pci0000:80"])), *below, end)
        paths.append(path)
        group = draw(st.sampled_from([None, None, "sid:a", "sid:b"]))
        out[names[i]] = Candidate(names[i], 0, group, path)
    return out


def _every_size(cands: dict[str, Candidate], data: st.DataObject, max_must: int) -> None:
    reference = Oracle(cands)
    names = sorted(cands)
    available = draw_subset(data, names, 1)
    must = draw_subset(data, available, 0, max_must)
    for size in range(len(must), len(available) + 1):
        got = preferred_allocation(cands, available, must, size)
        want = reference.best(available, must, size)
        assert got.device_ids == want, f"size={size}"
        assert got.score.levels() == reference.levels(want)


@pytest.mark.slow  # brute force over every size
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(cands=card_layouts(), data=st.data())
def test_card_layouts_match_brute_force(cands: dict[str, Candidate], data: st.DataObject) -> None:
    _every_size(cands, data, 2)


@pytest.mark.slow  # brute force over every size
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(cands=busy_layouts(), data=st.data())
def test_busy_layouts_match_brute_force(cands: dict[str, Candidate], data: st.DataObject) -> None:
    _every_size(cands, data, 3)


@pytest.mark.slow  # brute force over every size
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(cands=deep_trees(), data=st.data())
def test_deep_trees_match_brute_force(cands: dict[str, Candidate], data: st.DataObject) -> None:
    _every_size(cands, data, 2)


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
    reference = Oracle(cands)
    for size in range(5):
        want = reference.best(list(cands), [], size)
        assert preferred_allocation(cands, list(cands), [], size).device_ids == want


def test_a_vf_group_wins_at_level_2_despite_an_unreadable_member() -> None:
    cands = {
        "rbln0": Candidate("rbln0", None, "pf:0000:17:00.0", None),
        "rbln1": Candidate("rbln1", None, None, ("pci0000:00", "0000:11:00.0")),
        "rbln2": Candidate("rbln2", None, "pf:0000:17:00.0", ("pci0000:00", "0000:12:00.0")),
    }
    assert preferred_allocation(cands, list(cands), [], 2).device_ids == ["rbln0", "rbln2"]


def test_the_widest_distance_is_settled_before_the_distance_sum() -> None:
    """Regression: a partial selection with a smaller sum but a wider pair was kept
    in place of one with a narrower pair; rbln1 sits below rbln0 (a nested device)."""
    bridges = ("pci0000:00", "0000:00:01.0", "0000:00:01.0", "0000:00:01.0")
    vf = "pf:0000:17:00.0"
    cands = {
        "rbln0": Candidate("rbln0", None, vf, (*bridges, "0000:10:00.0")),
        "rbln1": Candidate("rbln1", None, None, (*bridges, "0000:10:00.0", "0000:11:00.0")),
        "rbln2": Candidate("rbln2", None, vf, ("pci0000:00", "0000:12:00.0")),
        "rbln3": Candidate("rbln3", None, vf, ("pci0000:3a", "0000:13:00.0")),
        "rbln4": Candidate("rbln4", None, vf, ("pci0000:3a", "0000:14:00.0")),
        "rbln5": Candidate("rbln5", None, "pf:0000:18:00.0", ("pci0000:00", "0000:15:00.0")),
        "rbln6": Candidate("rbln6", None, None, ("pci0000:00", "0000:16:00.0")),
        "rbln7": Candidate("rbln7", None, None, ("pci0000:00", "0000:17:00.0")),
        "rbln8": Candidate("rbln8", None, vf, (*bridges, "0000:18:00.0")),
    }
    got = preferred_allocation(cands, list(cands), [], 6)
    assert got.device_ids == ["rbln0", "rbln2", "rbln3", "rbln4", "rbln5", "rbln8"]
    assert got.score.levels() == (6, 0, 2, 0, 8, 5, 26)  # a sum of 24 would cost width 6


def test_a_deeper_device_is_remembered_for_the_pairs_still_to_come() -> None:
    """Two pairs under bridge P with equal summed depth and width: x/y reach depth 4,
    u/t only 3, so with z next to P the x/y set gets the wider pair (5 against 4)."""
    root, bridge = "pci0000:00", "0000:00:01.0"
    cands = {
        "rbln0": Candidate(
            "rbln0", 0, "sid:a", (root, bridge, "0000:01:00.0", "0000:02:00.0", "0000:03:00.0")
        ),
        "rbln1": Candidate("rbln1", 0, "sid:a", (root, bridge, "0000:01:01.0")),
        "rbln2": Candidate("rbln2", 0, "sid:b", (root, bridge, "0000:01:02.0", "0000:04:00.0")),
        "rbln3": Candidate("rbln3", 0, "sid:b", (root, bridge, "0000:01:03.0", "0000:05:00.0")),
        "rbln4": Candidate("rbln4", 0, None, (root, "0000:00:02.0")),
    }
    got = preferred_allocation(cands, list(cands), ["rbln4"], 3)
    assert got.device_ids == ["rbln4", "rbln2", "rbln3"]
    assert got.device_ids == Oracle(cands).best(list(cands), ["rbln4"], 3)
    assert got.score.levels() == (0, 1, 2, 0, 0, 4, 12)
