"""Exactness on full-size nodes (64 and 128 devices), where the old search gave up.

- brute force is still cheap at sizes 1, 2, 62 and 63, so those are compared on the
  benchmark nodes and on feature-rich random 64-device nodes;
- on the half-unreadable node (every second device without a PCI link, the layout that
  used to fall back to the kubelet for most sizes from 33 to 50) every size must return a
  full-size answer equal to an independent exact reference (tests/card_oracle.py).
"""

from __future__ import annotations

import random

import pytest

from bench.layouts import candidates, node_64, node_64_half_unreadable, node_128
from rbln_device_plugin.topology import Candidate, Topology
from tests.card_oracle import card_oracle
from tests.topology_oracle import Oracle

ROOTS = ["pci0000:00", "pci0000:40", "pci0001:00", "pci0002:80"]
SIDS = [None, None, *(f"sid:{i:016x}" for i in range(12))]


def rich_node(seed: int) -> dict[str, Candidate]:
    """64 devices mixing every feature: cards and VFs, unreadable, solo and nested paths."""
    rng = random.Random(seed)
    out: dict[str, Candidate] = {}
    readable: list[tuple[str, ...]] = []
    for i in range(64):
        name = f"rbln{i}"
        bdf = f"00{i // 16:02x}:{0x10 + i:02x}:00.{rng.randint(0, 7)}"
        shape = rng.choice(["card"] * 6 + ["deep", "nested", "solo", "unreadable"])
        path: tuple[str, ...] | None
        if shape == "card":
            root = rng.choice(ROOTS)
            card = rng.randint(0, 5)
            path = (
                root,
                f"{root[3:7]}:{root[8:]}:{card + 1:02x}.0",
                f"0000:{0x80 + card:02x}:00.0",
                bdf,
            )
        elif shape == "deep":
            path = (rng.choice(ROOTS), "0000:00:1f.0", "0000:7f:00.0", "0000:7e:00.0", bdf)
        elif shape == "nested" and readable:
            path = (*rng.choice(readable), bdf)
        elif shape == "solo":
            path = (f"pci0003:{i:02x}", bdf)
        else:
            path = None
        if path is not None:
            readable.append(path)
        group = rng.choice(SIDS) if rng.random() < 0.8 else f"pf:0000:{rng.randint(1, 4):02x}:00.0"
        numa = rng.choice([None, 0, 0, 1, 1, 2, 3])
        out[name] = Candidate(name, numa, group, path)
    return out


NODES = {
    "64 readable": lambda: candidates(node_64()),
    "64 half unreadable": lambda: candidates(node_64_half_unreadable()),
    "rich 1": lambda: rich_node(1),
    "rich 2": lambda: rich_node(2),
}


@pytest.mark.slow  # brute force on 64 devices
@pytest.mark.parametrize("name", list(NODES))
def test_brute_force_sizes_on_64_devices(name: str) -> None:
    cands = NODES[name]()
    allocator = Topology(cands)
    reference = Oracle(cands)
    ids = list(cands)
    rng = random.Random(name)
    for size in (1, 2, 62, 63):
        for _ in range(3):
            # Small sizes on a partly busy node; large ones need (nearly) all of it.
            available = rng.sample(ids, rng.randint(40, 64) if size <= 2 else 64)
            must = rng.sample(available, rng.randint(0, min(size, 3)))
            got = allocator.preferred(available, must, size)
            want = reference.best(available, must, size)
            assert got.device_ids == want, (size, must)
            assert got.score.levels() == reference.levels(want)
            assert got.capped is None


@pytest.mark.slow  # every size of a 64-device node
def test_half_unreadable_node_every_size_is_full_and_exact() -> None:
    cands = candidates(node_64_half_unreadable())
    allocator = Topology(cands)
    ids = list(cands)
    rng = random.Random(14)
    for size in range(1, 65):
        requests = [(ids, [])]
        available = rng.sample(ids, rng.randint(size, 64))
        requests.append((available, rng.sample(available, rng.randint(0, min(size, 3)))))
        for available, must in requests:
            got = allocator.preferred(available, must, size)
            want, levels = card_oracle(cands, available, must, size)
            assert len(got.device_ids) == size and got.capped is None
            assert got.device_ids == want, (size, must)
            assert got.score.levels() == levels


def test_every_size_of_the_128_device_node_is_answered_in_full() -> None:
    cands = candidates(node_128())
    allocator = Topology(cands)
    ids = list(cands)
    for size in range(1, 129):
        got = allocator.preferred(ids, [], size)
        assert len(set(got.device_ids)) == size and got.capped is None
        # One NUMA node (32 devices) as long as it can hold the request, fewest cards.
        assert got.score.numa_nodes == -(-size // 32)
        assert got.score.share_groups == -(-size // 4)
