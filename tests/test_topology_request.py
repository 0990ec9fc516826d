"""Request validation, shortcuts, answer order and the safety cap of preferred_allocation."""

from __future__ import annotations

import random
import time

import pytest

from bench.layouts import atom_16_cards, atom_cards, atom_max_8, candidates
from bench.layouts import node_64_half_unreadable as half_unreadable
from rbln_device_plugin.topology import (
    MAX_DEVICES,
    Candidate,
    Fallback,
    Topology,
    preferred_allocation,
    score,
)
from tests.topology_oracle import Oracle


def flat(count: int) -> dict[str, Candidate]:
    """Devices with no topology information at all: only ID order can decide."""
    return {f"rbln{i}": Candidate(f"rbln{i}", None, None, None) for i in range(count)}


@pytest.mark.parametrize(
    ("available", "must", "size", "reason"),
    [
        (["rbln0", "rbln1"], [], -1, "negative"),
        (["rbln0", "gpu7"], [], 1, "'gpu7' is not managed"),
        (["rbln0", "rbln0", "rbln1"], [], 3, "exceeds the 2 available"),
        (["rbln0", "rbln1"], ["rbln2"], 2, "'rbln2' is not available"),
        (["rbln0", "rbln1", "rbln2"], ["rbln0", "rbln1"], 1, "2 must-include devices exceed"),
    ],
)
def test_invalid_requests_fall_back_with_a_reason(
    available: list[str], must: list[str], size: int, reason: str
) -> None:
    with pytest.raises(Fallback) as caught:
        preferred_allocation(flat(3), available, must, size)
    assert reason in caught.value.reason


def test_duplicates_are_ignored() -> None:
    got = preferred_allocation(flat(4), ["rbln3", "rbln3", "rbln1", "rbln2"], ["rbln2", "rbln2"], 2)
    assert got.device_ids == ["rbln2", "rbln1"]


def test_size_equal_to_must_include_returns_them_in_request_order() -> None:
    got = preferred_allocation(flat(4), ["rbln0", "rbln1", "rbln3"], ["rbln3", "rbln1"], 2)
    assert got.device_ids == ["rbln3", "rbln1"]
    assert got.shortcut == "must-include"
    assert got.score == score(["rbln1", "rbln3"], flat(4))  # shortcuts are scored too


def test_size_zero_without_must_include_is_empty() -> None:
    got = preferred_allocation(flat(2), ["rbln0", "rbln1"], [], 0)
    assert got.device_ids == [] and got.shortcut == "must-include"
    assert got.score.levels() == (0, 0, 0, 0, 0, 0, 0)


def test_size_equal_to_available_returns_all_with_must_include_first() -> None:
    cands = flat(12)
    got = preferred_allocation(cands, ["rbln2", "rbln10", "rbln11", "rbln1"], ["rbln11"], 4)
    assert got.device_ids == ["rbln11", "rbln1", "rbln10", "rbln2"]  # plain string order
    assert got.shortcut == "all-available"
    assert got.score.unreadable_paths == 4


def test_ids_compare_as_plain_strings() -> None:
    got = preferred_allocation(flat(12), ["rbln2", "rbln10", "rbln3"], [], 2)
    assert got.device_ids == ["rbln10", "rbln2"]


def test_one_device_prefers_known_numa_then_a_readable_path_then_the_id() -> None:
    path = ("pci0000:00", "0000:00:01.0")
    cands = {
        "rbln0": Candidate("rbln0", None, None, path),  # unknown NUMA: level 1 loses
        "rbln1": Candidate("rbln1", 1, None, None),  # unreadable: level 3 loses
        "rbln2": Candidate("rbln2", 0, "sid:a", path),
        "rbln3": Candidate("rbln3", 1, None, path),
    }
    got = preferred_allocation(cands, ["rbln0", "rbln1", "rbln3", "rbln2"], [], 1)
    assert got.device_ids == ["rbln2"] and got.shortcut == "one-device"
    assert preferred_allocation(cands, ["rbln0", "rbln1"], [], 1).device_ids == ["rbln1"]
    assert preferred_allocation(cands, ["rbln0"], [], 1).device_ids == ["rbln0"]


def test_one_card_requests_search_only_the_cards_that_hold_them() -> None:
    cands = atom_cards(cards=4, numa_nodes=2)  # 16 devices: brute force stays cheap
    reference = Oracle(cands)
    rng = random.Random(4)
    ids = list(cands)
    for size in (2, 3, 4):
        for _ in range(5):
            available = rng.sample(ids, rng.randint(8, 16))
            must = rng.sample(available, rng.randint(0, 1))
            got = preferred_allocation(cands, available, must, size)
            assert got.device_ids == reference.best(available, must, size)
    got = preferred_allocation(cands, ids, [], 4)
    assert got.shortcut == "one-card" and got.score.share_groups == 1


def test_answer_lists_must_include_first_then_the_chosen_by_id() -> None:
    cands = atom_max_8()
    got = preferred_allocation(cands, list(cands), ["rbln7", "rbln6"], 4)
    # rbln6/rbln7 sit on card 1 (rbln4..rbln7): completing that card is best.
    assert got.device_ids == ["rbln7", "rbln6", "rbln4", "rbln5"]
    assert got.score.share_groups == 1


def test_devices_forced_in_by_the_numa_level_sort_with_the_chosen_ones() -> None:
    # Only two devices have a known NUMA node and three are asked for: both are taken,
    # but only the kubelet's mandatory device is listed first.
    cands = {
        f"rbln{i}": Candidate(f"rbln{i}", 0 if i in (3, 4) else None, None, None) for i in range(6)
    }
    got = preferred_allocation(cands, list(cands), ["rbln5"], 3)
    assert got.device_ids == ["rbln5", "rbln3", "rbln4"]
    assert got.score.unknown_numa == 1


def test_a_full_node_request_keeps_one_numa_node_and_the_fewest_cards() -> None:
    cands = atom_16_cards()
    got = preferred_allocation(cands, list(cands), [], 12)
    assert (got.score.numa_nodes, got.score.share_groups) == (1, 3)
    assert got.device_ids == sorted(got.device_ids)


@pytest.mark.parametrize("cap", [0, 1, 50])
def test_past_the_cap_the_answer_is_still_a_full_valid_selection(cap: int) -> None:
    cands = candidates(half_unreadable())
    allocator = Topology(cands)
    ids = list(cands)
    rng = random.Random(cap)
    capped = 0
    for size in range(2, 64):
        available = rng.sample(ids, rng.randint(size + 1, 64))
        must = rng.sample(available, rng.randint(0, min(3, size)))
        got = allocator.preferred(available, must, size, cap=cap)
        assert len(got.device_ids) == len(set(got.device_ids)) == size
        assert got.device_ids[: len(must)] == must
        assert set(got.device_ids) <= set(available)
        assert got.score == score(got.device_ids, cands)
        if got.capped is not None:
            assert got.capped == cap
            capped += 1
    assert capped > 0  # the narrowed path really ran


def test_a_generous_cap_is_never_reached_on_real_nodes() -> None:
    cands = candidates(half_unreadable())
    allocator = Topology(cands)
    for size in range(1, 65):
        assert allocator.preferred(list(cands), [], size).capped is None


def test_absurd_inputs_are_rejected_quickly() -> None:
    many = 1_000_000
    started = time.perf_counter()
    with pytest.raises(Fallback):
        preferred_allocation(flat(1), ["rbln0"] * many + ["other"], [], 1)
    with pytest.raises(Fallback):
        preferred_allocation(flat(2), ["rbln0", "rbln1"] * many, [], 3)
    huge = flat(MAX_DEVICES + 1)
    with pytest.raises(Fallback) as caught:
        preferred_allocation(huge, list(huge), [], 3)
    assert "search limit" in caught.value.reason
    print(f"absurd inputs rejected in {time.perf_counter() - started:.2f}s")


def test_hand_built_candidates_are_read_like_the_score_reads_them() -> None:
    # A negative NUMA node is unknown, a one-segment path is unreadable, and the mapping's
    # key is the device ID even if the candidate says otherwise.
    cands = {
        "rbln0": Candidate("rbln0", -1, None, ("pci0000:00", "0000:00:01.0")),
        "rbln1": Candidate("other", 0, None, ("pci0000:00",)),
        "rbln2": Candidate("rbln2", 0, None, ("pci0000:00", "0000:00:02.0")),
        "rbln3": Candidate("rbln3", 0, None, ("pci0000:00", "0000:00:03.0")),
    }
    reference = Oracle(Topology(cands).candidates)
    for size in range(1, 5):
        got = preferred_allocation(cands, list(cands), [], size)
        assert got.device_ids == reference.best(list(cands), [], size)
    assert preferred_allocation(cands, list(cands), [], 2).device_ids == ["rbln2", "rbln3"]
