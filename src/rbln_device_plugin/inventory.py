"""Inventory policy (pure): rbln-smi records + sysfs facts -> devices per resource name.

CONTRACT STUB written before the host-layer work; the classification is filled in by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

RESOURCE_NPU: Final = "rebellions.ai/npu"
RESOURCE_NPU_VF1: Final = "rebellions.ai/npu-vf1"
RESOURCE_NPU_VF4: Final = "rebellions.ai/npu-vf4"


@dataclass(frozen=True, slots=True)
class Device:
    """One advertisable NPU (a PF or an SR-IOV VF) as later stages need it."""

    name: str  # device ID towards the kubelet: "rbln0", VF "rbln0-1"
    product: str  # "RBLN-CA25"
    pci_device_id: str  # "1250"
    bus_id: str  # lowercase BDF "0000:05:00.0"
    numa: int | None  # None = unknown (missing, invalid or negative)
    sid: str  # raw SID as rbln-smi reports it
    parent_bus_id: str | None  # VFs: the hosting PF's BDF; PFs: None
    # Resolved PCI hierarchy: ("pci0000:00", "0000:00:01.0", ..., bus_id); None = unreadable.
    pci_path: tuple[str, ...] | None

    @property
    def is_vf(self) -> bool:
        return self.parent_bus_id is not None
