"""The simulated node behind the real kubelet.

One node carries all three resources, so one cluster serves every scenario: an ATOM
card with four chips (``rebellions.ai/npu``: 4) and two REBEL cards split into SR-IOV
virtual functions, one into four (``rebellions.ai/npu-vf4``: 4) and one into one
(``rebellions.ai/npu-vf1``: 1).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from rbln_device_plugin_sim.layout import Layout, generate, make_vfs, rebel_pf

EXPECTED: Final = {
    "rebellions.ai/npu": 4,
    "rebellions.ai/npu-vf4": 4,
    "rebellions.ai/npu-vf1": 1,
}


def mixed() -> Layout:
    atom = generate(1, 4, 1, product="RBLN-CA25", name="realnode")
    vf4_pf = rebel_pf(4, 0x41, "1", sid_base=21303000, sriov_numvfs=4)
    vf1_pf = rebel_pf(5, 0x61, "1", sid_base=21303000, sriov_numvfs=1)
    vf4 = make_vfs(vf4_pf, 4, 6)
    vf1 = make_vfs(vf1_pf, 1, 10)
    return dataclasses.replace(
        atom,
        devices=(*atom.devices, vf4_pf, *vf4, vf1_pf, *vf1),
        description="1 x RBLN-CA25 (4 chips), RBLN-CR13 in vf-4 and in vf-1",
    )
