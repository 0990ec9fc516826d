"""The DRA driver's fixed names (pure), as Rebellions' own DRA driver
(``RBLN-SW/rbln-k8s-dra-driver``, ``cmd/npu-kubelet-plugin``) spells them, so claims,
DeviceClasses and CDI device IDs written for it mean the same here.

Claim UIDs end up in file and CDI device names: ``claim_uid_problem`` refuses any UID
that is not a plain token before it reaches a path.
"""

from __future__ import annotations

import re
from typing import Final

DRIVER_NAME: Final = "npu.rebellions.ai"
# The CDI kind of the per-claim specs: vendor "k8s.<driver>", class "npu".
CDI_VENDOR: Final = f"k8s.{DRIVER_NAME}"
CDI_CLASS: Final = "npu"
CDI_KIND: Final = f"{CDI_VENDOR}/{CDI_CLASS}"
# The container toolkit's own spec and device (its libraries, hooks): named in every
# prepared device's CDI IDs, as the device plugin names it in its answers.
TOOLKIT_DEVICE: Final = "rebellions.ai/npu=runtime"
# Inside the kubelet's root: the plugin watcher's directory gets the registration socket,
# the driver's own directory under plugins/ the service socket and the checkpoint.
REGISTRATION_SOCKET: Final = f"{DRIVER_NAME}-reg.sock"
SERVICE_SOCKET: Final = "dra.sock"
CHECKPOINT_FILE: Final = "checkpoint.json"
CONTAINER_RSD_PATH: Final = "/dev/rsd0"

# A Kubernetes UID is a UUID; anything that is not a short token of these characters is
# refused before it names a file or a CDI device.
_UID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}", re.ASCII)


def claim_uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot name a claim's files, or None."""
    if _UID_RE.fullmatch(uid):
        return None
    shown = uid[:64] + ("..." if len(uid) > 64 else "")
    return f"claim UID {shown!r} is not a Kubernetes UID"


def spec_file_name(uid: str) -> str:
    """The claim's CDI spec file: the CDI library's transient spec name, as JSON."""
    return f"{CDI_VENDOR}-{CDI_CLASS}_{uid}.json"


def cdi_device_name(uid: str, device: str) -> str:
    return f"{uid}-{device}"


def cdi_device_id(uid: str, device: str) -> str:
    """The fully qualified CDI device ID the kubelet hands to the runtime."""
    return f"{CDI_KIND}={cdi_device_name(uid, device)}"
