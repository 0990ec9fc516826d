"""The share-group budget that bounds cross-root pairs must never cut off the optimum.

The search limits how many devices a PCI root can still gather by the number of new
share groups a completion may open. These layouts stress the cases where that limit is
subtle: groups spread over several roots, ungrouped devices, devices alone under a root,
unreadable members of a group, must-include devices, and partial availability.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rbln_device_plugin.topology import Candidate, preferred_allocation
from tests.test_topology_property import oracle


@st.composite
def busy_layouts(draw: st.DrawFn) -> dict[str, Candidate]:
    count = draw(st.integers(4, 13))
    names = draw(st.permutations([f"rbln{i}" for i in range(count)]))
    out: dict[str, Candidate] = {}
    card = 0
    while len(out) < count:
        root = draw(st.integers(0, 2))
        port = draw(st.integers(1, 3))
        numa = draw(st.sampled_from([0, 0, 1, None]))
        # Most cards own a group; some share one with another card (maybe on another
        # root), some devices have none.
        group = draw(st.sampled_from([f"sid:card{card}"] * 3 + ["sid:shared", None]))
        for chip in range(draw(st.integers(1, 4))):
            if len(out) == count:
                break
            name = names[len(out)]
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
            out[name] = Candidate(name, numa, group, path)
        card += 1
    return out


@settings(max_examples=250, derandomize=True, deadline=None)
@given(cands=busy_layouts(), data=st.data())
def test_partial_requests_match_brute_force(
    cands: dict[str, Candidate], data: st.DataObject
) -> None:
    names = sorted(cands)
    available = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=3, unique=True))
    size = data.draw(st.integers(len(must), len(available)))
    got = preferred_allocation(cands, available, must, size).device_ids
    assert got == oracle(cands, available, must, size)


def test_group_and_readability_bounds_that_cannot_both_hold() -> None:
    """One VF group wins at level 2 even though it costs an unreadable path at level 3."""
    cands = {
        "rbln0": Candidate("rbln0", None, "pf:0000:17:00.0", None),
        "rbln1": Candidate("rbln1", None, None, ("pci0000:00", "0000:11:00.0")),
        "rbln2": Candidate("rbln2", None, "pf:0000:17:00.0", ("pci0000:00", "0000:12:00.0")),
    }
    for size in range(4):
        want = oracle(cands, list(cands), [], size)
        assert preferred_allocation(cands, list(cands), [], size).device_ids == want
    assert preferred_allocation(cands, list(cands), [], 2).device_ids == ["rbln0", "rbln2"]
