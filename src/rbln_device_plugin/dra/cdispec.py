"""The CDI spec of one prepared claim (pure): one CDI device per allocated NPU, each
giving the container the claim's RSD group as ``/dev/rsd0`` and the NPU's own node.

The container toolkit's edits (its libraries and hooks) stay in the toolkit's spec: each
prepared device's CDI IDs name the toolkit's ``runtime`` device beside the claim's own,
and the runtime applies both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from rbln_device_plugin.dra import names

# Device nodes with a hostPath need CDI 0.5.0 (specs-go/version.go).
SPEC_VERSION: Final = "0.5.0"


def claim_spec(uid: str, devices: Sequence[str], dev_root: Path, host_rsd_path: Path) -> bytes:
    """The spec file's bytes (JSON, which the CDI library reads as YAML)."""
    spec = {
        "cdiVersion": SPEC_VERSION,
        "kind": names.CDI_KIND,
        "devices": [
            {
                "name": names.cdi_device_name(uid, device),
                "containerEdits": {
                    "deviceNodes": [
                        {"path": names.CONTAINER_RSD_PATH, "hostPath": str(host_rsd_path)},
                        {"path": f"/dev/{device}", "hostPath": str(dev_root / device)},
                    ]
                },
            }
            for device in devices
        ],
    }
    return (json.dumps(spec, indent=2) + "\n").encode()


def cdi_device_ids(uid: str, device: str, first_of_request: bool) -> list[str]:
    """What the kubelet hands to the runtime for one prepared device: its own CDI device,
    and for the first device of each request the toolkit's (once is enough: the runtime
    applies a container's devices together)."""
    own = names.cdi_device_id(uid, device)
    return [own, names.TOOLKIT_DEVICE] if first_of_request else [own]
