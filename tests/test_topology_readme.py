"""The README's preferred-allocation policy, row by row, on the README's example tree."""

from __future__ import annotations

import dataclasses

import pytest

from rbln_device_plugin.model.inventory import Device, sid_is_known
from rbln_device_plugin.topology import (
    Candidate,
    PciForest,
    candidate_from_device,
    normalize_pci_path,
    preferred_allocation,
    score,
)

ROOT_A, ROOT_B = "pci0000:00", "pci0000:80"
PORT0, SWITCH, BRIDGE_A, BRIDGE_B = "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"
PORT1 = "0000:00:02.0"
README_PATHS: dict[str, tuple[str, ...] | None] = {
    "rbln0": (ROOT_A, PORT0, SWITCH, BRIDGE_A, "0000:03:00.0"),
    "rbln2": (ROOT_A, PORT0, SWITCH, BRIDGE_A, "0000:03:01.0"),
    "rbln1": (ROOT_A, PORT0, SWITCH, BRIDGE_B, "0000:04:00.0"),
    "rbln3": (ROOT_A, PORT0, SWITCH, BRIDGE_B, "0000:04:01.0"),
    "rbln4": (ROOT_A, PORT1, "0000:05:00.0"),
    "rbln5": (ROOT_B, "0000:80:01.0", "0000:81:00.0"),
    "rbln6": None,
}


def readme_tree(**changes: dict[str, object]) -> dict[str, Candidate]:
    """The README tree: distinct SIDs, NUMA 0; ``changes`` override fields per device."""
    out = {}
    for i, (name, path) in enumerate(sorted(README_PATHS.items())):
        cand = Candidate(id=name, numa=0, group=f"sid:00000000000000{i:02d}", pci_path=path)
        out[name] = dataclasses.replace(cand, **changes.get(name, {}))  # type: ignore[arg-type]
    return out


def answer(
    cands: dict[str, Candidate], available: list[str], must: list[str], size: int
) -> list[str]:
    return preferred_allocation(cands, available, must, size).device_ids


def test_readme_distances() -> None:
    forest = PciForest(readme_tree().values())
    assert forest.distance("rbln0", "rbln2") == 2
    assert forest.distance("rbln0", "rbln1") == 4
    assert forest.distance("rbln0", "rbln4") == 6
    assert forest.distance("rbln0", "rbln5") is None  # separate roots: no invented hop count
    assert forest.distance("rbln0", "rbln6") is None
    assert "rbln6" not in forest


def test_row_choose_two_takes_the_closest_pair_in_id_order() -> None:
    cands = readme_tree()
    assert answer(cands, list(cands), [], 2) == ["rbln0", "rbln2"]


def test_row_shared_sid_beats_a_shorter_visible_path() -> None:
    shared = {"group": "sid:0000000022502229"}
    cands = readme_tree(rbln0=shared, rbln4=shared)
    assert answer(cands, ["rbln0", "rbln2", "rbln4"], [], 2) == ["rbln0", "rbln4"]


def test_row_same_numa_beats_the_shorter_path() -> None:
    cands = readme_tree(rbln2={"numa": 1})
    assert answer(cands, ["rbln0", "rbln1", "rbln2"], ["rbln0"], 2) == ["rbln0", "rbln1"]


def test_row_subsets_within_one_sid_are_compared() -> None:
    shared = {"group": "sid:0000000022502229"}
    cands = readme_tree(rbln0=shared, rbln1=shared, rbln2=shared)
    assert answer(cands, ["rbln1", "rbln0", "rbln2"], [], 2) == ["rbln0", "rbln2"]


def test_row_required_device_without_pci_data_keeps_the_best_known_pair() -> None:
    cands = readme_tree()
    assert answer(cands, list(cands), ["rbln6"], 3) == ["rbln6", "rbln0", "rbln2"]


def test_row_one_root_beats_an_unmeasured_inter_root_path() -> None:
    cands = readme_tree()
    assert answer(cands, ["rbln0", "rbln4", "rbln5"], ["rbln0"], 2) == ["rbln0", "rbln4"]


def test_row_all_metadata_missing_falls_back_to_id_order() -> None:
    blank = {"numa": None, "group": None, "pci_path": None}
    cands = readme_tree(**{name: blank for name in README_PATHS})
    result = preferred_allocation(cands, list(reversed(list(cands))), [], 2)
    assert result.device_ids == ["rbln0", "rbln1"]
    assert result.score is not None and result.score.unreadable_paths == 2


def test_all_metadata_missing_keeps_mandatory_devices_first() -> None:
    blank = {"numa": None, "group": None, "pci_path": None}
    cands = readme_tree(**{name: blank for name in README_PATHS})
    assert answer(cands, list(cands), ["rbln5"], 3) == ["rbln5", "rbln0", "rbln1"]


def _card(card: int, chips: int, numa: int) -> dict[str, Candidate]:
    out = {}
    for chip in range(chips):
        name = f"rbln{card * 4 + chip}"
        path = (
            f"pci0000:{card * 0x10:02x}",
            f"0000:{card * 0x10:02x}:01.0",
            f"0000:{card * 0x10 + 1:02x}:00.0",
            f"0000:{card * 0x10 + 2:02x}:{chip:02x}.0",
            f"0000:{card * 0x10 + 3 + chip:02x}:00.0",
        )
        out[name] = Candidate(name, numa, f"sid:00000000000000{card:02x}", path)
    return out


def test_four_devices_on_three_local_cards_beat_two_cards_across_numa_nodes() -> None:
    # NUMA 0 offers 2 + 1 + 1 free devices on three cards; card 3 on NUMA 1 offers 2.
    cands = {**_card(0, 2, 0), **_card(1, 1, 0), **_card(2, 1, 0), **_card(3, 2, 1)}
    result = preferred_allocation(cands, list(cands), [], 4)
    assert result.device_ids == ["rbln0", "rbln1", "rbln4", "rbln8"]
    assert result.score is not None
    assert (result.score.numa_nodes, result.score.share_groups) == (1, 3)


def test_vfs_group_by_parent_pf_not_by_sid() -> None:
    def vf(name: str, parent: str, fn: int) -> Device:
        bdf = parent[:-1] + str(fn)
        return Device(name, "RBLN-CA25", "1251", bdf, 0, "0000000022502229", parent, None)

    devices = [vf("rbln0-0", "0000:17:00.0", 1), vf("rbln1-0", "0000:18:00.0", 1)]
    devices.append(vf("rbln1-1", "0000:18:00.0", 2))
    cands = {d.name: candidate_from_device(d) for d in devices}
    assert cands["rbln1-1"].group == "pf:0000:18:00.0"
    # By SID all three would share one card and ID order would pick rbln0-0 first.
    assert answer(cands, list(cands), [], 2) == ["rbln1-0", "rbln1-1"]


@pytest.mark.parametrize(
    "sid", ["", "  ", " N/A ", "n/a", "unknown", "UNKNOWN", "0" * 16, "0x0000", "0x"]
)
def test_unknown_sids_never_group(sid: str) -> None:
    assert not sid_is_known(sid)
    device = Device("rbln0", "RBLN-CA25", "1250", "0000:05:00.0", 0, sid, None, None)
    assert candidate_from_device(device).group is None


@pytest.mark.parametrize("sid", ["0000000022502229", "0x1f", " 00000000ab12cd34 "])
def test_real_sids_group(sid: str) -> None:
    assert sid_is_known(sid)


def test_unknown_sids_count_as_separate_cards() -> None:
    cands = readme_tree(**{n: {"group": None} for n in README_PATHS})
    assert score(["rbln0", "rbln2", "rbln4"], cands).share_groups == 3


def test_candidate_from_device_normalizes_numa_and_path() -> None:
    path = ("PCI0000:00", "0000:00:01.0", "0000:05:00.0")
    device = Device("rbln0", "RBLN-CA25", "1250", "0000:05:00.0", -1, "x", None, path)
    cand = candidate_from_device(device)
    assert cand.numa is None
    assert cand.pci_path == ("pci0000:00", "0000:00:01.0", "0000:05:00.0")


@pytest.mark.parametrize(
    "path",
    [
        ("pci0000:00", "virtual", "0000:05:00.0"),  # a non-PCI segment inside the chain
        ("0000:00:01.0", "0000:05:00.0"),  # no host bridge first
        ("pci0000:00", "0000:00:01.0", "0000:06:00.0"),  # does not end at the device
        ("pci0000:00",),
        (),
    ],
)
def test_malformed_paths_are_unreadable(path: tuple[str, ...]) -> None:
    assert normalize_pci_path(path, "0000:05:00.0") is None


def test_score_names_every_level() -> None:
    got = score(["rbln2", "rbln0", "rbln5", "rbln6"], readme_tree())
    assert got.levels() == (0, 1, 4, 1, 2, 2, 2)
    assert got.device_ids == ("rbln0", "rbln2", "rbln5", "rbln6")
