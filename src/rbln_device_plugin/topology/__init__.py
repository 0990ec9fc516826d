"""Topology-aware preferred allocation (pure and synchronous; no gRPC, no I/O).

Modules import one way: :mod:`.model` (candidates and the score) -> :mod:`.classes`
(interchangeable devices) -> :mod:`.plan` (the merge tree built once per device set) ->
:mod:`.tables` (one sweep of the dynamic program) -> :mod:`.search` (exact sweeps, the
bound and the safety cap) -> :mod:`.request` (validation, shortcuts and the entry
points). The gRPC adapter lives outside, in ``rbln_device_plugin.kubelet.preferred``.
"""

from rbln_device_plugin.topology.model import (
    Candidate,
    PciForest,
    Score,
    candidate_from_device,
    known_numa,
    normalize_pci_path,
    pci_distance,
    score,
)
from rbln_device_plugin.topology.request import (
    MAX_DEVICES,
    Fallback,
    Preferred,
    Topology,
    preferred_allocation,
)
from rbln_device_plugin.topology.search import DEFAULT_CAP

__all__ = [
    "DEFAULT_CAP",
    "MAX_DEVICES",
    "Candidate",
    "Fallback",
    "PciForest",
    "Preferred",
    "Score",
    "Topology",
    "candidate_from_device",
    "known_numa",
    "normalize_pci_path",
    "pci_distance",
    "preferred_allocation",
    "score",
]
