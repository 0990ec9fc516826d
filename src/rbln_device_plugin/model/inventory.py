"""Inventory policy (pure): rbln-smi records + sysfs facts -> devices per resource name.

Two steps, so the host layer only reads sysfs for records worth classifying:
``select_records`` drops entries whose identity is unusable (bad name or bus ID,
unsupported product, duplicates); ``classify`` applies the SR-IOV rules. Every exclusion
that an operator should hear about becomes a ``Problem`` with a stable key, so a caller can
log each one once while it persists instead of once per scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from rbln_device_plugin.model import resources

# Names kept for the callers of this module; the definitions live in ``resources``.
RESOURCE_NPU: Final = resources.NPU.name
RESOURCE_NPU_VF1: Final = resources.NPU_VF1.name
RESOURCE_NPU_VF4: Final = resources.NPU_VF4.name
VF_RESOURCES: Final = resources.VF_RESOURCES
SUPPORTED_PRODUCT_PREFIXES: Final = ("RBLN-CA", "RBLN-CR")

# Names and bus IDs end up in /dev and sysfs paths, so only these exact shapes pass.
_NAME_RE: Final = re.compile(r"rbln[0-9]{1,6}(?:-[0-9]{1,6})?", re.ASCII)
_BDF_RE: Final = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", re.ASCII)
_UNKNOWN_SIDS: Final = frozenset({"", "n/a", "unknown"})


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
    # rbln-smi's "uuid" as printed; "" = not reported (published only when known).
    uuid: str = ""

    @property
    def is_vf(self) -> bool:
        return self.parent_bus_id is not None


@dataclass(frozen=True, slots=True)
class SmiRecord:
    """One device entry of ``rbln-smi -j`` with the fields the plugin uses."""

    name: str  # "device": "rbln0" / "rbln0-0"
    product: str  # "name": "RBLN-CA25"
    bus_id: str  # "pci.bus_id", as printed (normalised by select_records)
    pci_device_id: str = ""  # "pci.dev"
    numa_node: str = ""  # "pci.numa_node", raw
    sid: str = ""
    npu: int | None = None
    group_id: str | None = None  # only with -g
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class SriovFacts:
    """What sysfs says about one device's SR-IOV role."""

    # Set iff the device is a VF (it has a physfn link): the hosting PF's BDF.
    parent_bus_id: str | None = None
    # VF: the parent's sriov_numvfs. PF: its own (None = no file = not partitioned).
    vf_count: int | None = None
    # Non-empty when the state could not be determined; the device is then not advertised.
    error: str = ""
    # The device's PCI directory does not exist (a sysfs root that is not the host's, or
    # not mounted): nothing says whether it is a VF or hosts VFs (see ``resource_for``).
    unseen: bool = False


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    sriov: SriovFacts = SriovFacts()
    pci_path: tuple[str, ...] | None = None
    # Why pci_path is None (missing link, odd target); empty when it was read.
    pci_path_error: str = ""


@dataclass(frozen=True, slots=True)
class Problem:
    """A device-level issue worth one error record while it persists."""

    key: str  # stable identity of the condition (not of the scan)
    message: str  # log message
    fields: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def kind(self) -> str:
        """The condition without its subject: "unsupported-vf-count", "duplicate", ..."""
        return self.key.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class Inventory:
    # Only resources with at least one device appear.
    resources: Mapping[str, tuple[Device, ...]]
    problems: tuple[Problem, ...]


def natural_key(name: str) -> tuple[tuple[bool, int | str], ...]:
    """Sort key for device names: rbln2 before rbln10, rbln0 before rbln0-0 (for people;
    the kubelet sees plain string order)."""
    parts = (int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name) if p)
    return tuple((isinstance(p, str), p) for p in parts)


def is_valid_name(name: str) -> bool:
    return _NAME_RE.fullmatch(name) is not None


def is_valid_bus_id(bus_id: str) -> bool:
    return _BDF_RE.fullmatch(bus_id) is not None


def is_supported_product(product: str) -> bool:
    return product.upper().startswith(SUPPORTED_PRODUCT_PREFIXES)


def parse_numa(raw: str) -> int | None:
    """Known iff the value is an integer >= 0."""
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        return None
    return int(text)


def sid_is_known(sid: str) -> bool:
    """Unknown SIDs (empty, N/A, unknown, all zeros) never group devices into a card."""
    text = sid.strip().lower()
    if text in _UNKNOWN_SIDS:
        return False
    digits = text.removeprefix("0x")
    return digits.strip("0") != ""


def _fields(record: SmiRecord, **extra: Any) -> dict[str, Any]:
    return {"device": record.name, "product": record.product, "busID": record.bus_id, **extra}


@dataclass(frozen=True, slots=True)
class Screening:
    """Every record of a listing in order, kept (None) or with the Problem that drops it."""

    outcomes: tuple[tuple[SmiRecord, Problem | None], ...]

    @property
    def kept(self) -> list[SmiRecord]:
        return [record for record, problem in self.outcomes if problem is None]

    @property
    def problems(self) -> list[Problem]:
        return [problem for _, problem in self.outcomes if problem is not None]


def screen(records: Iterable[SmiRecord]) -> Screening:
    """The first step of a scan: records with a usable identity (see ``screen_records``)."""
    return Screening(tuple(screen_records(records)))


def inventory_from(
    screening: Screening, facts: Mapping[str, DeviceFacts], *, sysfs_missing: bool = False
) -> Inventory:
    """The second step: the kept records classified, with the problems of both steps.

    The scan and ``inspect`` both end here; ``facts`` need only cover the kept records.
    ``sysfs_missing``: sysfs shows no PCI device at all (see ``resource_for``).
    """
    inventory = classify(screening.kept, facts, sysfs_missing=sysfs_missing)
    return Inventory(inventory.resources, (*screening.problems, *inventory.problems))


def select_records(records: Iterable[SmiRecord]) -> tuple[list[SmiRecord], list[Problem]]:
    """Keep records with a usable identity; bus IDs come back lowercase.

    Duplicates keep the first record in rbln-smi's order, so the outcome is stable.
    """
    screening = screen(records)
    return screening.kept, screening.problems


def screen_records(records: Iterable[SmiRecord]) -> Iterator[tuple[SmiRecord, Problem | None]]:
    """``select_records`` one record at a time: (kept record, None) or (record, its Problem).

    A kept record comes back with a lowercase bus ID.
    """
    names: set[str] = set()
    bus_ids: set[str] = set()
    for record in records:
        if not is_valid_name(record.name):
            yield (
                record,
                Problem(
                    f"invalid-name:{record.name!r}:{record.bus_id!r}",
                    "Skipping device with an invalid name",
                    _fields(record, reason="name must look like rbln<N> or rbln<N>-<K>"),
                ),
            )
            continue
        if not is_valid_bus_id(record.bus_id):
            yield (
                record,
                Problem(
                    f"invalid-bus-id:{record.name}:{record.bus_id!r}",
                    "Skipping device with an invalid PCI bus ID",
                    _fields(record, reason="bus ID must look like 0000:05:00.0"),
                ),
            )
            continue
        if not is_supported_product(record.product):
            yield (
                record,
                Problem(
                    f"unsupported-product:{record.name}:{record.bus_id}:{record.product!r}",
                    "Skipping unsupported device",
                    _fields(record, reason="product is not RBLN-CA* or RBLN-CR*"),
                ),
            )
            continue
        bus_id = record.bus_id.lower()
        duplicate = "name" if record.name in names else "bus ID" if bus_id in bus_ids else None
        if duplicate is not None:
            yield (
                record,
                Problem(
                    f"duplicate:{record.name}:{bus_id}",
                    "Skipping duplicate device",
                    _fields(record, reason=f"{duplicate} already listed by an earlier entry"),
                ),
            )
            continue
        names.add(record.name)
        bus_ids.add(bus_id)
        yield (record if bus_id == record.bus_id else replace(record, bus_id=bus_id)), None


UNSEEN_KIND: Final = "sysfs-unseen"
UNSEEN_MSG: Final = "Skipping device that sysfs does not show"
# A VF's PCI device ID is its PF's + 1 (CR03 2030 -> 2031, CR13 2130 -> 2131); ATOM
# cards have no SR-IOV, their +1 ids are listed only so a VF is never taken for a PF.
_VF_DEVICE_IDS: Final = frozenset({"2031", "2131", "1121", "1221", "1251"})
_WHOLE_ONLY_PRODUCT_PREFIX: Final = "RBLN-CA"  # ATOM: never partitioned


def looks_like_vf(record: SmiRecord) -> bool:
    """A VF by what rbln-smi says alone: its name (``rbln<N>-<K>``) or its PCI device ID."""
    return "-" in record.name or record.pci_device_id.lower().removeprefix("0x") in _VF_DEVICE_IDS


def vf_hosts(records: Iterable[SmiRecord]) -> frozenset[str]:
    """The PF names rbln-smi itself shows hosting VFs: ``rbln<N>`` for a listed ``rbln<N>-<K>``."""
    return frozenset(r.name.split("-", 1)[0] for r in records if "-" in r.name)


def _unseen(
    record: SmiRecord, hosts_vfs: bool, sysfs_missing: bool
) -> tuple[str | None, Problem | None]:
    """A device whose PCI directory does not exist: nothing in sysfs says whether it is a VF
    or hosts VFs. One such device is a PF with an unknown placement (the README: unknown
    PCI information only affects that device) unless rbln-smi shows it is a VF or lists VFs
    of it. Without any PCI device in sysfs no REBEL PF is guessed whole: a sysfs that is
    not the host's hides every partitioned PF at once."""
    if looks_like_vf(record):
        reason = "a VF by its rbln-smi name or PCI device ID; its partition mode cannot be read"
    elif hosts_vfs:
        reason = "rbln-smi lists VFs of it: a PF hosting VFs is not advertised"
    elif sysfs_missing and not record.product.startswith(_WHOLE_ONLY_PRODUCT_PREFIX):
        reason = "a REBEL PF whose partitioning cannot be read: it may host VFs"
    else:
        return RESOURCE_NPU, None
    return None, Problem(f"{UNSEEN_KIND}:{record.name}:{record.bus_id}", UNSEEN_MSG,
                         _fields(record, reason=reason))  # fmt: skip


SYSFS_MISSING_KIND: Final = "sysfs-missing"
SYSFS_MISSING_MSG: Final = (
    "sysfs does not show the host's PCI devices; VFs and REBEL PFs are not advertised"
)
SYSFS_MISSING_HINT: Final = (
    "the daemon needs the host's sysfs at --sysfs-root / SYSFS_ROOT: the chart's privileged "
    "container sees it at /sys; a deployment that is not privileged must mount the host's "
    "/sys (hostPath /sys) and point --sysfs-root at it"
)


def with_sysfs_missing(
    sysfs_root: str, missing: Sequence[str], problems: Sequence[Problem]
) -> list[Problem]:
    """One problem for a sysfs root that shows no PCI devices, in place of one per device
    skipped for it (the cause is the same for all of them)."""
    skipped = [str(p.fields.get("device")) for p in problems if p.kind == UNSEEN_KIND]
    summary = Problem(
        f"{SYSFS_MISSING_KIND}:{missing[0]}",
        SYSFS_MISSING_MSG,
        {"path": missing[0], "missing": list(missing), "sysfsRoot": sysfs_root,
         "skippedDevices": skipped, "hint": SYSFS_MISSING_HINT},
    )  # fmt: skip
    return [summary, *(p for p in problems if p.kind != UNSEEN_KIND)]


def resource_for(
    record: SmiRecord, sriov: SriovFacts, *, hosts_vfs: bool = False, sysfs_missing: bool = False
) -> tuple[str | None, Problem | None]:
    """The resource a device is advertised under, or None (with a Problem if noteworthy).

    ``hosts_vfs``: rbln-smi lists VFs of this device (see ``vf_hosts``); ``sysfs_missing``:
    sysfs shows no PCI device at all (see ``with_sysfs_missing``). Both matter only for a
    device whose PCI directory does not exist.
    """
    if sriov.unseen:
        return _unseen(record, hosts_vfs, sysfs_missing)
    if sriov.error:
        return None, Problem(
            f"sriov-indeterminate:{record.name}:{record.bus_id}",
            "Skipping device with indeterminate SR-IOV state",
            _fields(record, reason=sriov.error),
        )
    if sriov.parent_bus_id is not None:
        if sriov.vf_count is None:
            return None, Problem(
                f"sriov-indeterminate:{record.name}:{record.bus_id}",
                "Skipping device with indeterminate SR-IOV state",
                _fields(
                    record, reason="parent PF has no sriov_numvfs", parentBusID=sriov.parent_bus_id
                ),
            )
        resource = VF_RESOURCES.get(sriov.vf_count)
        if resource is None:
            return None, Problem(
                f"unsupported-vf-count:{record.name}:{record.bus_id}:{sriov.vf_count}",
                "Skipping VF of a PF with an unsupported VF count",
                _fields(record, parentBusID=sriov.parent_bus_id, vfCount=sriov.vf_count),
            )
        return resource, None
    if not sriov.vf_count:
        return RESOURCE_NPU, None
    # A PF hosting VFs is not advertised: its VFs carry its compute capacity.
    if sriov.vf_count in VF_RESOURCES:
        return None, None
    return None, Problem(
        f"unsupported-vf-count:{record.name}:{record.bus_id}:{sriov.vf_count}",
        "Skipping PF with an unsupported VF count",
        _fields(record, vfCount=sriov.vf_count, reason="supported partition modes are 1 and 4"),
    )


def classify(
    records: Sequence[SmiRecord], facts: Mapping[str, DeviceFacts], *, sysfs_missing: bool = False
) -> Inventory:
    """Apply the SR-IOV rules to selected records (see ``select_records``).

    ``facts`` is keyed by lowercase bus ID; a device without an entry is treated as a
    non-partitioned PF with an unreadable PCI path.
    """
    grouped: dict[str, list[Device]] = {}
    problems: list[Problem] = []
    missing = DeviceFacts()
    hosts = vf_hosts(records)
    for record in records:
        device_facts = facts.get(record.bus_id, missing)
        resource, problem = resource_for(
            record, device_facts.sriov, hosts_vfs=record.name in hosts, sysfs_missing=sysfs_missing
        )
        if problem is not None:
            problems.append(problem)
        if resource is None:
            continue
        grouped.setdefault(resource, []).append(
            Device(
                name=record.name,
                product=record.product,
                pci_device_id=record.pci_device_id,
                bus_id=record.bus_id,
                numa=parse_numa(record.numa_node),
                sid=record.sid,
                parent_bus_id=device_facts.sriov.parent_bus_id,
                pci_path=device_facts.pci_path,
                uuid=record.uuid,
            )
        )
    return Inventory({name: tuple(devices) for name, devices in grouped.items()}, tuple(problems))
