"""The search must agree with brute force on every node feature and every size.

Nodes of up to 14 devices mix everything the README ranks by: any number of NUMA nodes
(unknown and negative values too), shared, unknown, all-zero and N/A SIDs, VFs grouped by
parent PF, unreadable and malformed PCI paths next to readable ones, several host bridges,
devices nested below other devices, random availability and must-include devices. For
each drawn request every size from the must-include count to the available count is
compared against the exhaustive reference (tests/topology_oracle.py), IDs and levels.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.topology import (
    Candidate,
    Fallback,
    candidate_from_device,
    preferred_allocation,
    score,
)
from rbln_device_plugin.topology.plan import Plan
from rbln_device_plugin.topology.search import WIDTH, search
from rbln_device_plugin.topology.tables import Demand, Sweep
from tests.topology_oracle import Oracle, draw_subset

SIDS = [
    "",
    " N/A ",
    "unknown",
    "0000000000000000",
    "0x000",
    "0000000022502229",
    "0000000022502229",
    "00000000ab12cd34",
    "00000000ab12cd35",
]
PARENTS = ["0000:17:00.0", "0000:18:00.0", "0000:19:00.0"]
ROOTS = ["pci0000:00", "pci0000:3a", "pci0001:80", "pci0002:00"]
BRIDGES = ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"]

# Node sizes, weighted towards the large ones where the search has most to get wrong.
SIZES = [*range(1, 15), *range(8, 15), *range(11, 15), 14, 14]
# Property-test settings (issue #14): fixed seed so CI runs are reproducible.
EXAMPLES = 500
# Merge steps for the bounded-sweep test: small enough that the first sweep often gives up.
CAP = 100


@st.composite
def nodes(draw: st.DrawFn) -> list[Device]:
    count = draw(st.sampled_from(SIZES))
    numa_nodes = draw(st.integers(min_value=0, max_value=5))
    numa_values = [None, -1, *range(numa_nodes)]
    out: list[Device] = []
    for i in range(count):
        bdf = f"0000:{i + 16:02x}:00.{draw(st.integers(0, 1))}"
        readable = [d.pci_path for d in out if d.pci_path is not None]
        shape = draw(st.sampled_from(["tree"] * 6 + ["nested", "missing", "garbage", "wrong"]))
        path: tuple[str, ...] | None
        if shape == "nested" and readable:
            path = (*draw(st.sampled_from(readable)), bdf)  # below another device
        else:
            depth = draw(st.integers(min_value=0, max_value=3))
            bridges = draw(st.lists(st.sampled_from(BRIDGES), min_size=depth, max_size=depth))
            path = (draw(st.sampled_from(ROOTS)), *bridges, bdf)
        if shape == "missing":
            path = None
        elif shape == "garbage" and path is not None:
            path = (*path[:-1], "virtual", path[-1])
        elif shape == "wrong" and path is not None:
            path = (*path[:-1], "0000:ff:00.0")  # does not end at the device
        vf = draw(st.integers(0, 4)) == 0
        out.append(
            Device(
                name=f"rbln{i}",
                product="RBLN-CA25",
                pci_device_id="1251" if vf else "1250",
                bus_id=bdf,
                numa=draw(st.sampled_from(numa_values)),
                sid=draw(st.sampled_from(SIDS)),
                parent_bus_id=draw(st.sampled_from(PARENTS)) if vf else None,
                pci_path=path,
            )
        )
    return out


@pytest.mark.slow  # brute force over every size of many generated nodes
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(devs=nodes(), data=st.data())
def test_search_equals_brute_force_for_every_size(devs: list[Device], data: st.DataObject) -> None:
    cands = {d.name: candidate_from_device(d) for d in devs}
    reference = Oracle(cands)
    event(f"devices: {len(devs) // 5 * 5}-{len(devs) // 5 * 5 + 4}")
    names = list(cands)
    available = draw_subset(data, names, 1)
    must = draw_subset(data, available, 0, 3)
    event(f"available: {len(available) // 5 * 5}-{len(available) // 5 * 5 + 4}")
    for size in range(len(must), len(available) + 1):
        got = preferred_allocation(cands, available, must, size)
        want = reference.best(available, must, size)
        assert got.device_ids == want, f"size={size}"
        assert got.score.levels() == reference.levels(want), f"size={size}"
        assert got.capped is None


@settings(max_examples=60, derandomize=True, deadline=None)
@given(devs=nodes(), data=st.data())
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


def _random_node(rng: random.Random, count: int) -> dict[str, Candidate]:
    """Like ``nodes()``, from a plain seeded generator (for loops outside hypothesis)."""
    out: dict[str, Candidate] = {}
    numa_values = [None, *range(rng.randint(1, 4))]
    for i in range(count):
        bdf = f"0000:{i + 16:02x}:00.0"
        path: tuple[str, ...] | None = (
            rng.choice(ROOTS),
            *rng.sample(BRIDGES, rng.randint(0, 3)),
            bdf,
        )
        readable = [c.pci_path for c in out.values() if c.pci_path is not None]
        if readable and rng.random() < 0.1:
            path = (*rng.choice(readable), bdf)
        elif rng.random() < 0.15:
            path = None
        sid = rng.choice(SIDS)
        group = f"pf:{rng.choice(PARENTS)}" if rng.random() < 0.2 else None
        if group is None and sid.strip().lower() not in ("", "n/a", "unknown") and sid.strip("0x"):
            group = f"sid:{sid}"
        out[f"rbln{i}"] = Candidate(f"rbln{i}", rng.choice(numa_values), group, path)
    return out


def test_the_bounded_sweep_is_exact_whenever_it_finishes() -> None:
    """A tiny cap makes the first sweep give up, so the bounded second sweep runs: it must
    agree with brute force whenever it finishes, and a capped answer must be complete."""
    rng = random.Random(14)
    seen = {"first": 0, "bounded": 0, "capped": 0, "better": 0}
    for trial in range(150):
        cands = _random_node(random.Random(trial), 12)
        reference = Oracle(cands)
        plan = Plan.build(list(cands.values()))
        available = rng.sample(list(cands), rng.randint(8, 12))
        must = rng.sample(available, rng.randint(0, 2))
        for size in range(len(must) + 2, len(available)):
            index = plan.index
            outcome = search(
                plan, [index[i] for i in available], [index[i] for i in must], size, CAP
            )
            chosen = [plan.ids[i] for i in outcome.chosen]
            assert len(chosen) == size and set(must) <= set(chosen) <= set(available)
            if outcome.capped:
                seen["capped"] += 1
                # Never worse than the quick narrowed sweep's complete selection.
                demand = Demand(plan, [index[i] for i in available], [index[i] for i in must], size)
                quick = Sweep(demand, limit=0, width=WIDTH, narrow=True).best()
                assert quick is not None
                fallback = [plan.ids[i] for i in demand.decode(quick[2])]
                assert score(chosen, cands) <= score(fallback, cands)
                seen["better"] += score(chosen, cands) < score(fallback, cands)
            else:
                seen["bounded" if outcome.bounded else "first"] += 1
                want = reference.best(available, must, size)
                assert chosen == sorted(want), (trial, size)
    assert seen["bounded"] > 100 and seen["capped"] > 10 and seen["better"] > 0, seen
