"""Node layouts as data: devices, their PCI paths, SR-IOV state, and the presets.

A layout says everything the simulated node shows: what ``rbln-smi`` lists, what sysfs
holds, and which ``/dev`` nodes exist. It round-trips through JSON so a node on disk can
be reopened by the CLI, and so operators can write their own.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# PCI device ids of the PFs; a VF's id is its PF's plus one.
PRODUCT_PCI_IDS: Final[Mapping[str, str]] = {
    "RBLN-CA12": "1120",
    "RBLN-CA22": "1220",
    "RBLN-CA25": "1250",
    "RBLN-CR03": "2030",
    "RBLN-CR13": "2130",
}
DEFAULT_KMD_VERSION: Final = "1.3.73"
DEFAULT_FW_VERSION: Final = "2.1.4"
READY: Final = "0\n"

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


class LayoutError(ValueError):
    """A layout that no real node could have (or JSON that is not a layout)."""


@dataclass(frozen=True, slots=True)
class SimDevice:
    """One NPU function (a PF or an SR-IOV VF) as the host shows it."""

    name: str  # "rbln0", VF "rbln0-1"
    npu: int  # rbln-smi's index, used by `group -a`
    product: str  # "RBLN-CA25"
    bus_id: str  # lowercase BDF
    sid: str = ""
    numa: str = "0"  # as rbln-smi prints it: "-1" means unknown
    # ("pci0000:00", root port, ..., bus_id); None: no bus/pci/devices link at all.
    pci_path: tuple[str, ...] | None = None
    # Contents of sys/class/rebellions/<name>/status; None: the file does not exist.
    status: str | None = READY
    listed: bool = True  # whether rbln-smi reports it
    sriov_numvfs: int | None = None  # PFs: the file's value; None: no file
    physfn: str | None = None  # VFs: the hosting PF's BDF
    uuid: str = ""
    fw_ver: str = DEFAULT_FW_VERSION
    memory_total: str = "17179869184"

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    @property
    def pci_dev(self) -> str:
        base = PRODUCT_PCI_IDS.get(self.product, "0000")
        return f"{int(base, 16) + 1:04x}" if self.is_vf else base

    def smi_record(self, group_id: str = "0") -> dict[str, Any]:
        """The device as ``rbln-smi -g -j`` prints it (numbers as strings except npu)."""
        return {
            "npu": self.npu,
            "name": self.product,
            "sid": self.sid,
            "uuid": self.uuid or str(uuid.uuid5(uuid.NAMESPACE_OID, f"rbln:{self.bus_id}")),
            "device": self.name,
            "status": (self.status or "").strip() or "unknown",
            "fw_ver": self.fw_ver,
            "group_id": group_id,
            "pci": {
                "dev": self.pci_dev,
                "bus_id": self.bus_id,
                "numa_node": self.numa,
                "link_speed": "16.0GT/s",
                "link_width": "16",
            },
            "memory": {"used": "0", "total": self.memory_total},
        }


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    devices: tuple[SimDevice, ...]
    kmd_version: str = DEFAULT_KMD_VERSION
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    def device(self, name: str) -> SimDevice:
        for dev in self.devices:
            if dev.name == name:
                return dev
        raise LayoutError(f"no device {name!r} in layout {self.name!r}")

    def by_bus_id(self, bus_id: str) -> SimDevice | None:
        return next((d for d in self.devices if d.bus_id == bus_id), None)

    def vfs_of(self, pf: SimDevice) -> tuple[SimDevice, ...]:
        return tuple(d for d in self.devices if d.physfn == pf.bus_id)

    def with_devices(self, devices: Iterable[SimDevice]) -> Layout:
        return dataclasses.replace(self, devices=tuple(devices))

    def next_npu(self) -> int:
        return max((d.npu for d in self.devices), default=-1) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "kmd_version": self.kmd_version,
            "devices": [_device_to_dict(d) for d in self.devices],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Layout:
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise LayoutError("a layout is an object with a 'devices' list")
        try:
            devices = tuple(_device_from_dict(d) for d in data["devices"])
            return cls(
                name=str(data.get("name", "custom")),
                devices=devices,
                kmd_version=str(data.get("kmd_version", DEFAULT_KMD_VERSION)),
                description=str(data.get("description", "")),
            )
        except (TypeError, KeyError, AttributeError) as exc:
            raise LayoutError(f"malformed layout device: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> Layout:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise LayoutError(f"layout is not JSON: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> Layout:
        return cls.from_json(path.read_text(encoding="utf-8"))

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)


def _device_to_dict(dev: SimDevice) -> dict[str, Any]:
    out = dataclasses.asdict(dev)
    out["pci_path"] = list(dev.pci_path) if dev.pci_path is not None else None
    return out


def _device_from_dict(data: Any) -> SimDevice:
    if not isinstance(data, dict):
        raise TypeError(f"device entry is {type(data).__name__}, not an object")
    known = {f.name for f in dataclasses.fields(SimDevice)}
    unknown = set(data) - known
    if unknown:
        raise KeyError(f"unknown device keys {sorted(unknown)}")
    values = dict(data)
    if values.get("pci_path") is not None:
        values["pci_path"] = tuple(str(s) for s in values["pci_path"])
    return SimDevice(**values)


def _validate(layout: Layout) -> None:
    seen: dict[str, set[Any]] = {"name": set(), "bus_id": set(), "npu": set()}
    for dev in layout.devices:
        for key in seen:
            value = getattr(dev, key)
            if value in seen[key]:
                raise LayoutError(f"duplicate {key} {value!r} in layout {layout.name!r}")
            seen[key].add(value)
        if not dev.name or "/" in dev.name:
            raise LayoutError(f"bad device name {dev.name!r}")
        if not _BDF.match(dev.bus_id):
            raise LayoutError(f"{dev.name}: bus_id {dev.bus_id!r} is not a lowercase BDF")
        path = dev.pci_path
        if path is not None:
            if len(path) < 2 or not _ROOT.match(path[0]) or path[-1] != dev.bus_id:
                raise LayoutError(f"{dev.name}: pci_path must run from pciDDDD:BB to its BDF")
            # Segments may be anything else (tests build malformed paths on purpose), but
            # never something that escapes the sysfs tree.
            if any(not s or "/" in s or s in (".", "..") for s in path):
                raise LayoutError(f"{dev.name}: pci_path segment unusable as a directory")
    for dev in layout.devices:
        if dev.physfn is not None and dev.physfn not in seen["bus_id"]:
            raise LayoutError(f"{dev.name}: physfn {dev.physfn} is not a device of the layout")


# ---------------------------------------------------------------------------- builders


def make_vfs(pf: SimDevice, count: int, first_npu: int, *, listed: bool = True) -> list[SimDevice]:
    """The VFs a PF gets when ``count`` is written to its sriov_numvfs.

    Names are ``<pf>-<k>``; BDFs are the PF's functions .1, .2, ...; they sit next to the
    PF in the PCI tree.
    """
    base = pf.bus_id[:-1]
    vfs = []
    for k in range(count):
        bdf = f"{base}{k + 1}"
        path = (*pf.pci_path[:-1], bdf) if pf.pci_path is not None else None
        vfs.append(
            dataclasses.replace(
                pf,
                name=f"{pf.name}-{k}",
                npu=first_npu + k,
                bus_id=bdf,
                pci_path=path,
                listed=listed,
                sriov_numvfs=None,
                physfn=pf.bus_id,
                uuid="",
                memory_total=str(int(pf.memory_total) // max(count, 1)),
            )
        )
    return vfs


# ---------------------------------------------------------------------------- presets


def generate(
    cards: int,
    devices_per_card: int,
    numa_nodes: int = 2,
    *,
    product: str = "RBLN-CA25",
    cards_per_root: int = 2,
    name: str = "",
    sid_base: int = 22502229,
) -> Layout:
    """A uniform node: cards spread evenly over NUMA nodes, two per PCI root complex.

    A card with several chips has an on-card switch: root port -> switch upstream port ->
    one downstream port per chip -> chip. A single-chip card hangs off its root port.
    """
    if cards < 1 or devices_per_card < 1 or numa_nodes < 1 or cards_per_root < 1:
        raise LayoutError("cards, devices_per_card, numa_nodes, cards_per_root must be >= 1")
    if devices_per_card > 32:
        raise LayoutError("at most 32 devices per card (one switch bus)")
    # Buses one card uses: switch upstream, its internal bus, one per chip.
    card_span = devices_per_card + 2 if devices_per_card > 1 else 1
    slot_span = -(-card_span // 16) * 16
    root_span = -(-(cards_per_root * slot_span + 1) // 32) * 32
    roots_per_domain = max(256 // root_span, 1)
    if root_span > 256:
        raise LayoutError("too many devices behind one PCI root; lower cards_per_root")
    devices: list[SimDevice] = []
    for card in range(cards):
        root_index, slot = divmod(card, cards_per_root)
        domain, root_slot = divmod(root_index, roots_per_domain)
        root_bus = root_slot * root_span
        root = f"pci{domain:04x}:{root_bus:02x}"
        root_port = f"{domain:04x}:{root_bus:02x}:{2 * slot + 1:02x}.1"
        base = root_bus + 1 + slot * slot_span
        numa = str(card * numa_nodes // cards)
        sid = f"{sid_base + card:016d}"
        for chip in range(devices_per_card):
            if devices_per_card == 1:
                bdf = f"{domain:04x}:{base:02x}:00.0"
                path: tuple[str, ...] = (root, root_port, bdf)
            else:
                upstream = f"{domain:04x}:{base:02x}:00.0"
                downstream = f"{domain:04x}:{base + 1:02x}:{chip:02x}.0"
                bdf = f"{domain:04x}:{base + 2 + chip:02x}:00.0"
                path = (root, root_port, upstream, downstream, bdf)
            index = len(devices)
            devices.append(
                SimDevice(
                    name=f"rbln{index}",
                    npu=index,
                    product=product,
                    bus_id=bdf,
                    sid=sid,
                    numa=numa,
                    pci_path=path,
                )
            )
    label = name or f"generated-{cards}x{devices_per_card}"
    return Layout(label, tuple(devices), description=f"{cards} x {product}, {numa_nodes} NUMA")


def atom_max_8() -> Layout:
    layout = generate(8, 4, 2, product="RBLN-CA25", name="atom-max-8")
    return dataclasses.replace(layout, description="8 x RBLN-CA25 (32 chips) on 2 NUMA nodes")


def rebel_4() -> Layout:
    layout = generate(4, 1, 2, product="RBLN-CR13", name="rebel-4", sid_base=21301000)
    return dataclasses.replace(layout, description="4 x RBLN-CR13, one device per card")


def rebel_pf(
    index: int, bus: int, numa: str, *, sid_base: int = 21302000, **changes: Any
) -> SimDevice:
    """A REBEL (CR13) physical function ``rbln<index>`` at bus ``bus`` behind its own root
    port; ``changes``: other ``SimDevice`` fields (``sriov_numvfs``, ``listed``...)."""
    bdf = f"0000:{bus:02x}:00.0"
    return SimDevice(
        name=f"rbln{index}",
        npu=index,
        product="RBLN-CR13",
        bus_id=bdf,
        sid=f"{sid_base + index:016d}",
        numa=numa,
        pci_path=(f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0", bdf),
        **changes,
    )


def rebel_sriov() -> Layout:
    """vf-4 (PF unlisted by rbln-smi), vf-1 (PF listed, VF without status), plain PFs."""
    pf0 = rebel_pf(0, 0x17, "0", sriov_numvfs=4, listed=False)
    pf1 = rebel_pf(1, 0x2A, "0", sriov_numvfs=1)
    pf2 = rebel_pf(2, 0x3D, "1", sriov_numvfs=0)
    pf3 = rebel_pf(3, 0x51, "1")  # no sriov_numvfs file: not SR-IOV capable
    vfs0 = make_vfs(pf0, 4, 4)
    vfs1 = [dataclasses.replace(v, status=None) for v in make_vfs(pf1, 1, 8)]
    return Layout(
        "rebel-sriov",
        (pf0, *vfs0, pf1, *vfs1, pf2, pf3),
        description="REBEL PFs in vf-4 and vf-1 next to unpartitioned PFs",
    )


def rebel_sriov_bad() -> Layout:
    """A PF with an unsupported VF count (2) next to a vf-4 PF and a plain PF."""
    pf0 = rebel_pf(0, 0x17, "0", sriov_numvfs=2, listed=False)
    pf1 = rebel_pf(1, 0x2A, "0", sriov_numvfs=4, listed=False)
    pf2 = rebel_pf(2, 0x3D, "1")
    return Layout(
        "rebel-sriov-bad",
        (pf0, *make_vfs(pf0, 2, 3), pf1, *make_vfs(pf1, 4, 5), pf2),
        description="one PF with 2 VFs (unsupported), one vf-4 PF, one plain PF",
    )


def readme_example() -> Layout:
    """The upstream README's tree: d(0,2)=2, d(0,1)=4, d(0,4)=6, rbln5 on another root."""
    root_a, root_b = "pci0000:00", "pci0000:80"
    port0, port1 = "0000:00:01.0", "0000:00:02.0"
    switch = "0000:01:00.0"
    bridge_a, bridge_b = "0000:02:00.0", "0000:02:01.0"
    port_b = "0000:80:01.0"
    paths: dict[str, tuple[str, ...] | None] = {
        "rbln0": (root_a, port0, switch, bridge_a, "0000:03:00.0"),
        "rbln1": (root_a, port0, switch, bridge_b, "0000:04:00.0"),
        "rbln2": (root_a, port0, switch, bridge_a, "0000:03:01.0"),
        "rbln3": (root_a, port0, switch, bridge_b, "0000:04:01.0"),
        "rbln4": (root_a, port1, "0000:05:00.0"),
        "rbln5": (root_b, port_b, "0000:81:00.0"),
        "rbln6": None,
    }
    devices = []
    for index, (dev_name, path) in enumerate(paths.items()):
        bdf = path[-1] if path is not None else "0000:90:00.0"
        devices.append(
            SimDevice(
                name=dev_name,
                npu=index,
                product="RBLN-CA25",
                bus_id=bdf,
                sid=f"{22509000 + index:016d}",
                numa="0",
                pci_path=path,
            )
        )
    return Layout("readme-example", tuple(devices), description="the README's PCI tree")


PRESETS: Final[Mapping[str, Callable[[], Layout]]] = {
    "atom-max-8": atom_max_8,
    "rebel-4": rebel_4,
    "rebel-sriov": rebel_sriov,
    "rebel-sriov-bad": rebel_sriov_bad,
    "readme-example": readme_example,
}


def preset(name: str) -> Layout:
    try:
        return PRESETS[name]()
    except KeyError:
        raise LayoutError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None
