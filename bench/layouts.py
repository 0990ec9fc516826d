"""Synthetic node layouts for benchmarks: ATOM-style cards behind on-card PCIe switches.

Every card sits on its own root port of a host bridge (``pciDDDD:BB``); the card's switch
upstream port fans out to one downstream port per chip, and each chip's endpoint sits
below its downstream port. The chips of a card share a SID. Host bridges are split evenly
over the NUMA nodes, and every bus number on the node is distinct.
"""

from __future__ import annotations

import dataclasses

from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.topology import Candidate, candidate_from_device
from rbln_device_plugin_sim.layout import Layout, generate


def atom_cards(
    cards: int = 8,
    chips_per_card: int = 4,
    numa_nodes: int = 2,
    cards_per_root: int = 2,
) -> dict[str, Candidate]:
    """``cards`` cards of ``chips_per_card`` devices, named rbln0.. in card order."""
    if cards % (numa_nodes * cards_per_root):
        raise ValueError("cards must split evenly over NUMA nodes and host bridges")
    roots = cards // cards_per_root
    roots_per_numa = roots // numa_nodes
    bus_span = 0x100 // roots  # each host bridge owns a contiguous bus range
    out: dict[str, Candidate] = {}
    for card in range(cards):
        root, slot = divmod(card, cards_per_root)
        root_bus = root * bus_span
        root_name = f"pci0000:{root_bus:02x}"
        root_port = f"0000:{root_bus:02x}:{0x01 + 2 * slot:02x}.0"
        base = root_bus + 1 + slot * (chips_per_card + 2)
        upstream = f"0000:{base:02x}:00.0"
        for chip in range(chips_per_card):
            downstream = f"0000:{base + 1:02x}:{chip:02x}.0"
            endpoint = f"0000:{base + 2 + chip:02x}:00.0"
            index = card * chips_per_card + chip
            name = f"rbln{index}"
            out[name] = Candidate(
                id=name,
                numa=root // roots_per_numa,
                group=f"sid:00000000225022{card:02x}",
                pci_path=(root_name, root_port, upstream, downstream, endpoint),
            )
    return out


def atom_max_8() -> dict[str, Candidate]:
    """8 x RBLN-CA25 (32 devices): 4 cards per NUMA node, 2 cards per host bridge."""
    return atom_cards(cards=8)


def atom_16_cards() -> dict[str, Candidate]:
    """16 cards x 4 devices (64 devices) over 2 NUMA nodes."""
    return atom_cards(cards=16)


# ---------------------------------------------------------------- simulated nodes
# The nodes the preferred-allocation targets are measured on (issue #14). They are sim
# layouts, so the benchmark can run the real daemon on them; ``candidates`` gives the
# same devices as the allocator sees them, for in-process figures and tests.


def node_64() -> Layout:
    """16 cards x 4 (64 x CA25), 2 NUMA nodes, 2 host bridges (8 cards behind each)."""
    return generate(16, 4, 2, cards_per_root=8, name="64 readable")


def node_64_half_unreadable() -> Layout:
    """``node_64`` where every second device has no readable PCI link."""
    base = node_64()
    devices = tuple(
        dataclasses.replace(d, pci_path=None) if i % 2 else d for i, d in enumerate(base.devices)
    )
    return Layout("64 half unreadable", devices)


def node_128() -> Layout:
    """32 cards x 4 (128 devices), 4 NUMA nodes, one host bridge of 8 cards per node."""
    return generate(32, 4, 4, cards_per_root=8, name="128 devices")


def candidates(layout: Layout) -> dict[str, Candidate]:
    """The layout's devices as the daemon's allocator sees them."""
    out = {}
    for d in layout.devices:
        numa = int(d.numa) if d.numa.lstrip("-").isdigit() else None
        device = Device(
            name=d.name,
            product=d.product,
            pci_device_id=d.pci_dev,
            bus_id=d.bus_id,
            numa=numa if numa is not None and numa >= 0 else None,
            sid=d.sid,
            parent_bus_id=d.physfn,
            pci_path=d.pci_path,
        )
        out[d.name] = candidate_from_device(device)
    return out
