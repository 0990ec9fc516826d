"""The node's ResourceSlices from the core's device state (pure: no I/O, no lightkube).

``build_pool`` turns what the scan offers (resource name -> device ID -> ``Entry``) into
the ``resource.k8s.io/v1`` ResourceSlices of one pool: driver ``npu.rebellions.ai``, the
pool named after the node, ``spec.nodeName`` the node. The result is plain JSON-able data
(dicts, tuples) rather than lightkube's models: this module stays importable without the
client library (the device-plugin mode never loads it), two builds compare with ``==``
(the publisher's "nothing changed, write nothing" is one equality test), and the same
data is the body the API server gets.

Attribute names and types follow Rebellions' own DRA driver (``RBLN-SW/rbln-k8s-dra-driver``,
``cmd/npu-kubelet-plugin/state.go``) where it publishes the same fact, so CEL selectors and
``matchAttribute`` constraints written for it work here; what the scan knows beyond it
(``deviceType``, ``parentPciBusID``, ``healthy``, ``status``) is added under names of
ours. An unknown fact is an absent attribute, never a made-up value.

An Unhealthy device (the core's verdict, as ListAndWatch reports it) carries one taint,
``npu.rebellions.ai/unhealthy=<status name>`` with the configured effect (NoSchedule, or
NoExecute when the operator chose eviction): the scheduler then allocates it to no claim
that does not tolerate it. It goes when the history's rules make the device Healthy.

The API server's limits (``k8s.io/api@v0.37.2`` ``resource/v1/types.go`` and its
validation) are kept here, so a write is never refused for its shape: at most
``MAX_DEVICES_PER_SLICE`` devices per slice (more make more slices of the pool), at most
``MAX_ATTRIBUTES_PER_DEVICE`` attributes per device, string values of at most
``MAX_STRING_BYTES`` bytes (a longer value is left out: a cut bus ID or UUID would name
another device), device names that are DNS labels, attribute names that are qualified
names. Whatever is left out is an ``Omission`` for the publisher to log once.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rbln_device_plugin.dra import taints
from rbln_device_plugin.dra.names import DRIVER_NAME
from rbln_device_plugin.model import resources
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.health import Health
from rbln_device_plugin.model.inventory import natural_key, sid_is_known

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceSlice"

# k8s.io/api@v0.37.2 resource/v1: ResourceSliceMaxDevicesWithAdvancedFeatures (a slice
# with a tainted device holds at most 64; any device may fault at any scan, so every slice
# keeps to 64 and a fault never moves devices between slices),
# ResourceSliceMaxAttributesAndCapacitiesPerDevice, DeviceAttributeMaxValueLength (Go's
# len: bytes), DeviceMaxDomainLength, DeviceMaxIDLength.
MAX_DEVICES_PER_SLICE: Final = 64
MAX_ATTRIBUTES_PER_DEVICE: Final = 32
MAX_STRING_BYTES: Final = 64
MAX_DOMAIN_CHARS: Final = 63
MAX_ID_CHARS: Final = 32
MAX_LABEL_CHARS: Final = 63  # a device name: a DNS label
MAX_OBJECT_NAME_CHARS: Final = 253  # a slice's name: a DNS subdomain

# Rebellions' driver's names (state.go): the Kubernetes-standard ones carry the
# resource.kubernetes.io/ domain, as there.
ATTR_TYPE: Final = "type"
ATTR_PRODUCT: Final = "productName"
ATTR_SID: Final = "sid"
ATTR_UUID: Final = "uuid"
ATTR_PCI_DEVICE_ID: Final = "pciDeviceID"
ATTR_PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
ATTR_NUMA: Final = "resource.kubernetes.io/numaNode"
# Ours: what the scan knows that Rebellions' driver does not publish.
ATTR_DEVICE_TYPE: Final = "deviceType"
ATTR_PARENT_BUS_ID: Final = "parentPciBusID"
ATTR_HEALTHY: Final = "healthy"
ATTR_STATUS: Final = "status"

# Rebellions' driver calls every device it publishes an "npu"; so do we (a VF is one too,
# ``deviceType`` tells them apart).
TYPE_NPU: Final = "npu"
# deviceType per resource: the DeviceClasses select on exactly these values.
DEVICE_TYPES: Final[Mapping[str, str]] = {
    resources.NPU.name: "npu",
    resources.NPU_VF1.name: "npu-vf1",
    resources.NPU_VF4.name: "npu-vf4",
}

_LABEL_RE: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?", re.ASCII)
_SUBDOMAIN_RE: Final = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
_C_IDENTIFIER_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

Attribute = tuple[str, str | int | bool]  # (qualified name, value)
DeviceJSON = Mapping[str, Any]  # {"name": ..., "attributes": {...}, "taints": [...]}


@dataclass(frozen=True, slots=True)
class Omission:
    """A device, or one attribute of one, left out of the slices, and why."""

    key: str  # stable while the cause lasts: the publisher logs each key once
    device: str
    reason: str
    attribute: str = ""  # empty: the whole device is left out


@dataclass(frozen=True, slots=True)
class DesiredSlice:
    name: str
    devices: tuple[DeviceJSON, ...]


@dataclass(frozen=True, slots=True)
class Pool:
    """The node's pool as it should be published, without its generation (the publisher
    numbers writes). Two pools with equal ``slices`` need no write."""

    node: str
    slices: tuple[DesiredSlice, ...]
    omissions: tuple[Omission, ...] = ()

    @property
    def device_count(self) -> int:
        return sum(len(s.devices) for s in self.slices)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slices)

    def taints(self) -> dict[str, taints.Taint]:
        """Device -> its taint, for the tainted devices."""
        return {
            d["name"]: found
            for s in self.slices
            for d in s.devices
            if (found := taints.device_taint(d)) is not None
        }

    def objects(
        self, generation: int, owner: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """The ResourceSlice bodies at ``generation``, each owned by ``owner`` (the Node's
        ownerReference) when given."""
        count = len(self.slices)
        return [slice_object(self.node, s, generation, count, owner) for s in self.slices]


def slice_object(
    node: str,
    desired: DesiredSlice,
    generation: int,
    count: int,
    owner: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": desired.name}
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": [_device_object(d) for d in desired.devices],
        },
    }


def _device_object(device: DeviceJSON) -> dict[str, Any]:
    out: dict[str, Any] = {"name": device["name"], "attributes": dict(device["attributes"])}
    if device.get("taints"):
        out["taints"] = [dict(t) for t in device["taints"]]
    return out


def tainted(entries: Mapping[str, Mapping[str, Entry]]) -> set[str]:
    """The devices of the slices that carry a taint: the Unhealthy ones."""
    return {
        item[1]
        for item in offered(entries)
        if not isinstance(item, Omission) and not item[2].healthy
    }


def node_owner(node: str, uid: str) -> dict[str, Any]:
    """The ownerReference that makes the slices go with their Node."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}


def is_dns_label(name: str) -> bool:
    return len(name) <= MAX_LABEL_CHARS and _LABEL_RE.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= MAX_OBJECT_NAME_CHARS and _SUBDOMAIN_RE.fullmatch(name) is not None


@functools.lru_cache(maxsize=256)  # the names are a handful of constants, checked per device
def qualified_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a device attribute, or None: a C identifier of at most 32
    characters, optionally after a DNS subdomain of at most 63 and a slash."""
    domain, slash, ident = name.rpartition("/")
    if slash and not (len(domain) <= MAX_DOMAIN_CHARS and _SUBDOMAIN_RE.fullmatch(domain)):
        return f"domain {domain[:80]!r} is not a DNS subdomain of at most {MAX_DOMAIN_CHARS}"
    if not (len(ident) <= MAX_ID_CHARS and _C_IDENTIFIER_RE.fullmatch(ident)):
        return f"{ident[:80]!r} is not a C identifier of at most {MAX_ID_CHARS} characters"
    return None


def slice_name(node: str, index: int) -> str:
    """``<node>-npu.rebellions.ai-<index>``; a node name too long for that keeps its start
    and gains a digest of the whole name, so two long node names never share slices."""
    suffix = f"-{DRIVER_NAME}-{index}"
    name = f"{node}{suffix}"
    if len(name) <= MAX_OBJECT_NAME_CHARS:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    room = MAX_OBJECT_NAME_CHARS - len(suffix) - len(digest) - 1
    # A cut may end on "-" or "."; a DNS subdomain's labels end on a letter or digit.
    return f"{node[:room].rstrip('-.')}-{digest}{suffix}"


def _value(value: str | int | bool) -> dict[str, Any]:
    # bool before int: a bool is an int in Python.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def fit_attributes(
    device: str, attributes: Sequence[Attribute]
) -> tuple[dict[str, dict[str, Any]], list[Omission]]:
    """The attributes the API accepts, as its JSON (sorted by name), and the ones left
    out: a bad name, a string longer than 64 bytes, or any beyond the first 32 (the
    order of ``attributes`` is their priority)."""
    kept: dict[str, dict[str, Any]] = {}
    left_out: list[Omission] = []

    def omit(name: str, key: str, reason: str) -> None:
        left_out.append(Omission(f"{key}:{device}:{name}", device, reason, name))

    for name, value in attributes:
        problem = qualified_name_problem(name)
        if problem is not None:
            omit(name, "attribute-name", f"attribute name {problem}")
            continue
        if name in kept:
            omit(name, "attribute-duplicate", "attribute named twice; the first is kept")
            continue
        if isinstance(value, str) and len(value.encode()) > MAX_STRING_BYTES:
            omit(
                name,
                "attribute-too-long",
                f"value is {len(value.encode())} bytes, the API allows {MAX_STRING_BYTES}: "
                f"left out rather than cut (starts {value[:32]!r})",
            )
            continue
        if len(kept) == MAX_ATTRIBUTES_PER_DEVICE:
            omit(
                name,
                "attribute-count",
                f"the API allows {MAX_ATTRIBUTES_PER_DEVICE} attributes per device",
            )
            continue
        kept[name] = _value(value)
    return dict(sorted(kept.items())), left_out


def device_attributes(resource: str, entry: Entry) -> list[Attribute]:
    """What is published about one device, Rebellions' driver's names first."""
    device, verdict = entry.device, entry.verdict
    found: list[Attribute] = [(ATTR_TYPE, TYPE_NPU), (ATTR_PRODUCT, device.product)]
    if sid_is_known(device.sid):
        found.append((ATTR_SID, device.sid))
    if device.uuid:
        found.append((ATTR_UUID, device.uuid))
    if device.pci_device_id:
        found.append((ATTR_PCI_DEVICE_ID, device.pci_device_id))
    found.append((ATTR_PCI_BUS_ID, device.bus_id))
    # The first element of the resolved PCI path is the root complex, "pci0000:00", the
    # form Kubernetes' deviceattribute package and Rebellions' driver publish.
    if device.pci_path and device.pci_path[0].startswith("pci"):
        found.append((ATTR_PCIE_ROOT, device.pci_path[0]))
    if device.numa is not None:
        found.append((ATTR_NUMA, device.numa))
    found.append((ATTR_DEVICE_TYPE, DEVICE_TYPES[resource]))
    if device.parent_bus_id is not None:
        found.append((ATTR_PARENT_BUS_ID, device.parent_bus_id))
    found.append((ATTR_HEALTHY, verdict.health is Health.HEALTHY))
    found.append((ATTR_STATUS, verdict.status))
    return found


def offered(
    entries: Mapping[str, Mapping[str, Entry]],
) -> Iterator[tuple[str, str, Entry] | Omission]:
    """Each offered device as (resource, ID, entry), or the Omission that refuses it: the
    devices of the slices, which the health stream reports under the same names."""
    vf_parents = {
        entry.device.parent_bus_id
        for devices in entries.values()
        for entry in devices.values()
        if entry.device.parent_bus_id is not None
    }
    seen: set[str] = set()
    for resource in sorted(entries):
        for device_id in sorted(entries[resource], key=natural_key):
            entry = entries[resource][device_id]
            shown = device_id[:80]
            if resource not in DEVICE_TYPES:
                yield Omission(f"resource:{resource}:{shown}", shown,
                               f"resource {resource[:80]!r} has no deviceType")  # fmt: skip
            elif not is_dns_label(device_id):
                yield Omission(
                    f"device-name:{shown!r}", shown,
                    f"device ID is not a DNS label of at most {MAX_LABEL_CHARS} characters",
                )  # fmt: skip
            elif device_id in seen:
                yield Omission(f"device-duplicate:{shown}", shown,
                               "device ID offered under two resources; first one kept")  # fmt: skip
            elif not entry.device.is_vf and entry.device.bus_id in vf_parents:
                # The core never offers a PF that hosts VFs; its VFs carry its capacity.
                yield Omission(f"device-hosts-vfs:{shown}", shown,
                               "a PF hosting VFs is not a device; its VFs are")  # fmt: skip
            else:
                seen.add(device_id)
                yield resource, device_id, entry


def build_pool(
    node: str,
    entries: Mapping[str, Mapping[str, Entry]],
    effect: str = taints.NO_SCHEDULE,
    taint_times: Mapping[str, str] | None = None,
) -> Pool:
    """The node's pool for the devices offered now. ``node`` must be a DNS subdomain (a
    node name); ValueError otherwise. Each Unhealthy device carries its taint
    (``dra.taints``) with ``effect``, added at ``taint_times[device]`` (RFC 3339, whole seconds; the
    publisher keeps it while the device stays tainted, so rebuilding never changes it)."""
    times = taint_times or {}
    if not is_dns_subdomain(node):
        raise ValueError(f"node name {node[:80]!r} is not a DNS subdomain")
    devices: list[tuple[tuple[Any, ...], DeviceJSON]] = []
    omissions: list[Omission] = []
    for item in offered(entries):
        if isinstance(item, Omission):
            omissions.append(item)
            continue
        resource, device_id, entry = item
        attributes, left_out = fit_attributes(device_id, device_attributes(resource, entry))
        omissions.extend(left_out)
        device: dict[str, Any] = {"name": device_id, "attributes": attributes}
        if not entry.healthy:
            added = times.get(device_id)
            device["taints"] = (taints.taint_json(entry.verdict.status, effect, added),)
        devices.append((natural_key(device_id), device))
    devices.sort(key=lambda pair: pair[0])
    ordered = [device for _, device in devices]
    chunks = [
        tuple(ordered[start : start + MAX_DEVICES_PER_SLICE])
        for start in range(0, len(ordered), MAX_DEVICES_PER_SLICE)
    ] or [()]  # no devices: one empty slice keeps the pool (and its generation) visible
    slices = tuple(DesiredSlice(slice_name(node, i), chunk) for i, chunk in enumerate(chunks))
    return Pool(node, slices, tuple(omissions))
