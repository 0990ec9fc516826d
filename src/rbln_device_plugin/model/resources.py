"""The resources this plugin advertises: one definition each; everything else derives it.

A resource has its kubelet name, the slug of its plugin socket, and the SR-IOV
partition mode (the PF's ``sriov_numvfs``) whose VFs it carries (None: whole devices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

SOCKET_PREFIX: Final = "rbln-device-plugin-"


def socket_slug(name: str) -> str:
    """The resource name as it appears in a socket file name."""
    slug = name.lower()
    for char in "/._":
        slug = slug.replace(char, "-")
    return slug


# An instance that takes over from a running one (``--installation``, see
# runtime.handover) serves on sockets of its own: the kubelet keeps one endpoint per
# socket path, so a successor's sockets stand beside its predecessor's instead of
# replacing them. The token is this many hex digits, after a dot, which no slug contains.
INSTANCE_TOKEN_LEN: Final = 4


def socket_name(name: str, token: str = "") -> str:
    """The plugin socket's file name (in the kubelet's directory) for resource ``name``;
    with ``token`` (an instance's, see ``INSTANCE_TOKEN_LEN``) one unique to the instance."""
    suffix = f".{token}" if token else ""
    return f"{SOCKET_PREFIX}{socket_slug(name)}{suffix}.sock"


def instance_token_of(socket_file: str) -> str | None:
    """The instance token a plugin socket name carries: "" for a fixed name, None for a
    name that is not a plugin socket of ours."""
    if not socket_file.startswith(SOCKET_PREFIX) or not socket_file.endswith(".sock"):
        return None
    stem = socket_file[len(SOCKET_PREFIX) : -len(".sock")]
    slug, dot, token = stem.rpartition(".")
    if not dot:
        return "" if any(socket_slug(r.name) == stem for r in RESOURCES) else None
    if not slug or len(token) != INSTANCE_TOKEN_LEN:
        return None
    if any(c not in "0123456789abcdef" for c in token):
        return None
    return token if any(socket_slug(r.name) == slug for r in RESOURCES) else None


@dataclass(frozen=True, slots=True)
class Resource:
    name: str  # "rebellions.ai/npu-vf4"
    vf_mode: int | None  # VFs of a PF partitioned this many ways; None = physical devices

    @property
    def socket_name(self) -> str:
        return socket_name(self.name)


NPU: Final = Resource("rebellions.ai/npu", None)
NPU_VF1: Final = Resource("rebellions.ai/npu-vf1", 1)
NPU_VF4: Final = Resource("rebellions.ai/npu-vf4", 4)
# Every advertised resource, in the order reports list them.
RESOURCES: Final = (NPU, NPU_VF1, NPU_VF4)
RESOURCE_NAMES: Final = tuple(r.name for r in RESOURCES)
# Partition mode -> the resource its VFs are advertised under.
VF_RESOURCES: Final[Mapping[int, str]] = {
    r.vf_mode: r.name for r in RESOURCES if r.vf_mode is not None
}
# The longest plugin socket name: the one that must fit a unix socket address.
LONGEST_SOCKET_NAME: Final = max((r.socket_name for r in RESOURCES), key=lambda n: (len(n), n))
