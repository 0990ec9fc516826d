"""Request validation, shortcuts and answer order of preferred_allocation."""

from __future__ import annotations

import time

import pytest

from bench.layouts import atom_16_cards, atom_max_8
from rbln_device_plugin.topology import Candidate, Fallback, preferred_allocation


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
    assert got.shortcut == "must-include" and got.score is None


def test_size_zero_without_must_include_is_empty() -> None:
    got = preferred_allocation(flat(2), ["rbln0", "rbln1"], [], 0)
    assert got.device_ids == [] and got.shortcut == "must-include"


def test_size_equal_to_available_returns_all_with_must_include_first() -> None:
    cands = flat(12)
    got = preferred_allocation(cands, ["rbln2", "rbln10", "rbln11", "rbln1"], ["rbln11"], 4)
    assert got.device_ids == ["rbln11", "rbln1", "rbln10", "rbln2"]  # plain string order
    assert got.shortcut == "all-available"


def test_ids_compare_as_plain_strings() -> None:
    got = preferred_allocation(flat(12), ["rbln2", "rbln10", "rbln3"], [], 2)
    assert got.device_ids == ["rbln10", "rbln2"]


def test_answer_lists_must_include_first_then_the_chosen_by_id() -> None:
    cands = atom_max_8()
    got = preferred_allocation(cands, list(cands), ["rbln7", "rbln6"], 4)
    # rbln6/rbln7 sit on card 1 (rbln4..rbln7): completing that card is best.
    assert got.device_ids == ["rbln7", "rbln6", "rbln4", "rbln5"]
    assert got.score is not None and got.score.share_groups == 1 and got.shortcut is None


def test_a_full_node_request_keeps_one_numa_node_and_the_fewest_cards() -> None:
    cands = atom_16_cards()
    got = preferred_allocation(cands, list(cands), [], 12)
    assert got.score is not None
    assert (got.score.numa_nodes, got.score.share_groups) == (1, 3)
    assert got.device_ids == sorted(got.device_ids)


def test_exhausted_search_budget_falls_back() -> None:
    cands = atom_16_cards()
    with pytest.raises(Fallback) as caught:
        preferred_allocation(cands, list(cands), [], 13, node_budget=3)
    assert "gave up" in caught.value.reason


def test_absurd_inputs_are_rejected_quickly() -> None:
    many = 1_000_000
    started = time.perf_counter()
    with pytest.raises(Fallback):
        preferred_allocation(flat(1), ["rbln0"] * many + ["other"], [], 1)
    with pytest.raises(Fallback):
        preferred_allocation(flat(2), ["rbln0", "rbln1"] * many, [], 3)
    huge = flat(20_000)
    with pytest.raises(Fallback) as caught:
        preferred_allocation(huge, list(huge), [], 3)
    assert "search limit" in caught.value.reason
    print(f"absurd inputs rejected in {time.perf_counter() - started:.2f}s")
