"""The simulated node behind the real kubelet.

One node carries all three resources, so one cluster serves every scenario: an ATOM
card with four chips (``rebellions.ai/npu``: 4) and two REBEL cards split into SR-IOV
virtual functions, one into four (``rebellions.ai/npu-vf4``: 4) and one into one
(``rebellions.ai/npu-vf1``: 1).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from rbln_device_plugin_sim.layout import Layout, SimDevice, generate, make_vfs

EXPECTED: Final = {
    "rebellions.ai/npu": 4,
    "rebellions.ai/npu-vf4": 4,
    "rebellions.ai/npu-vf1": 1,
}


def _rebel_pf(index: int, bus: int, vfs: int) -> SimDevice:
    bdf = f"0000:{bus:02x}:00.0"
    return SimDevice(
        name=f"rbln{index}",
        npu=index,
        product="RBLN-CR13",
        bus_id=bdf,
        sid=f"{21303000 + index:016d}",
        numa="1",
        pci_path=(f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0", bdf),
        sriov_numvfs=vfs,
    )


def mixed() -> Layout:
    atom = generate(1, 4, 1, product="RBLN-CA25", name="realnode")
    vf4_pf = _rebel_pf(4, 0x41, 4)
    vf1_pf = _rebel_pf(5, 0x61, 1)
    vf4 = make_vfs(vf4_pf, 4, 6)
    vf1 = make_vfs(vf1_pf, 1, 10)
    return dataclasses.replace(
        atom,
        devices=(*atom.devices, vf4_pf, *vf4, vf1_pf, *vf1),
        description="1 x RBLN-CA25 (4 chips), RBLN-CR13 in vf-4 and in vf-1",
    )
