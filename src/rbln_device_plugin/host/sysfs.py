"""sysfs readers: device status, PCI hierarchy, SR-IOV role.

Everything is resolved under a configurable sysfs root (``/sys`` on a node, a tmp tree
in tests). Readers never raise for a bad device: the problem is returned as data and
affects only that device.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.model.health import MAX_STATUS_CHARS, StatusReading, parse_status
from rbln_device_plugin.model.inventory import (
    DeviceFacts,
    SriovFacts,
    is_valid_bus_id,
    is_valid_name,
)

# Count files hold a few digits; anything longer is malformed, not worth reading.
_SMALL_FILE_BYTES: Final = 64
# A status file is read up to one sysfs page: no genuine attribute is longer, so any
# integer the driver can write is classified as such, and a runaway file costs one page.
_STATUS_FILE_BYTES: Final = MAX_STATUS_CHARS
_PCI_ROOT_RE: Final = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}", re.ASCII)
# The PCI vendor ID of every Rebellions function, as sysfs prints it.
REBELLIONS_PCI_VENDOR: Final = "0x1eff"


# Paths are built as strings: pathlib's joins cost more than the reads themselves here,
# and a scan does a handful per device every few seconds.
def status_path(root: Path | str, name: str) -> str:
    # Formatted, not joined: this runs for every device on every scan, and names are
    # validated device names (never absolute, never "..").
    return f"{os.fspath(root).rstrip('/')}/class/rebellions/{name}/status"


def pci_device_dir(root: Path | str, bus_id: str) -> str:
    return os.path.join(root, "bus", "pci", "devices", bus_id.lower())


class _Malformed(Exception):
    pass


def _read_small(path: str, limit: int = _SMALL_FILE_BYTES) -> str:
    """Read a tiny sysfs attribute; OSError passes through, oversize/binary is _Malformed."""
    # A raw descriptor: a file object's buffering costs more than the read of a sysfs
    # attribute, and a scan reads one per device.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _Malformed(f"more than {limit} bytes")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise _Malformed("not ASCII text") from None


def read_status(root: Path | str, name: str) -> StatusReading:
    """The driver lifecycle status of device ``name``; never raises."""
    if not is_valid_name(name):
        return StatusReading(None, f"invalid device name {name!r}")
    return _read_status_at(status_path(root, name))


def _read_status_at(path: str) -> StatusReading:
    try:
        return _parsed_status(_read_small(path, _STATUS_FILE_BYTES))
    except FileNotFoundError:
        return StatusReading(None, f"{path} does not exist")
    except OSError as exc:
        return StatusReading(None, f"cannot read {path}: {exc.strerror or exc}")
    except _Malformed as exc:
        return StatusReading(None, f"malformed status in {path}: {exc}")


# A node's status files hold a handful of distinct texts; each scan reads every one of
# them, so each text is parsed once (readings are immutable and shared).
_parsed_status = functools.lru_cache(maxsize=64)(parse_status)


def status_calls(root: Path | str, names: Sequence[str]) -> list[Call[StatusReading]]:
    """One off-loop call per device's status read, for a ``HostIO`` batch (the names are
    checked and the paths formed here, once, not in each read)."""
    calls: list[Call[StatusReading]] = []
    for name in names:
        path = status_path(root, name)
        if is_valid_name(name):
            calls.append(Call(path, partial(_read_status_at, path)))
        else:
            calls.append(Call(path, partial(read_status, root, name)))
    return calls


def statuses(
    names: Sequence[str], results: Sequence[StatusReading | Stalled]
) -> dict[str, StatusReading]:
    """The readings of ``status_calls``' batch by device; a stalled read is unreadable."""
    if Stalled not in map(type, results):  # the usual case, checked without a Python loop
        return dict(zip(names, results, strict=True))  # type: ignore[arg-type]
    return {
        name: StatusReading(None, str(result)) if isinstance(result, Stalled) else result
        for name, result in zip(names, results, strict=True)
    }


async def read_statuses(
    io: HostIO, root: Path | str, names: Iterable[str]
) -> dict[str, StatusReading]:
    """Status of each device, read off the event loop in one batch (see ``hostio``).

    A read that does not finish in time is unreadable, with the reason.
    """
    names = list(names)
    results = await io.map(status_calls(root, names))
    return statuses(names, results)


_O_PATH: Final = getattr(os, "O_PATH", 0)


def _resolve_dir(path: str) -> str | None:
    """realpath of an existing directory, or None.

    The kernel resolves the whole chain in one open; /proc/self/fd names the result.
    That is several times cheaper than os.path.realpath's lstat per component, which
    dominated the scan cost. Without O_PATH or /proc, fall back to realpath.
    """
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None  # missing, dangling, a loop, or not a directory
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
        finally:
            os.close(fd)
    try:
        resolved = os.path.realpath(path)
        return resolved if os.path.isdir(resolved) else None
    except (OSError, ValueError):
        return None


def read_pci_path(root: Path | str, bus_id: str) -> tuple[str, ...] | None:
    """The device's PCI hierarchy from its pciDDDD:BB root down to itself, or None.

    None means the link is missing or does not resolve to a plausible PCI device
    directory; only this device's topology is then unknown.
    """
    return explain_pci_path(root, bus_id)[0]


def explain_pci_path(root: Path | str, bus_id: str) -> tuple[tuple[str, ...] | None, str]:
    """``read_pci_path`` plus why the path is unreadable ("" when it was read)."""
    bus_id = bus_id.lower()
    if not is_valid_bus_id(bus_id):
        return None, f"bus ID {bus_id[:64]!r} is not a PCI address"
    link = pci_device_dir(root, bus_id)
    resolved = _resolve_dir(link)
    if resolved is None:
        return None, _unresolvable(link)
    parts = resolved.lower().split(os.sep)
    if not parts or parts[-1] != bus_id:
        return None, f"{link} resolves to {resolved}, not to a directory named {bus_id}"
    # The pciDDDD:BB segment is the host bridge: everything below it must be BDFs.
    start = next((i for i, part in enumerate(parts) if _PCI_ROOT_RE.fullmatch(part)), None)
    if start is None:
        return None, f"{link} resolves to {resolved}, which has no pciDDDD:BB host bridge"
    chain = parts[start:]
    odd = next((part for part in chain[1:] if not is_valid_bus_id(part)), None)
    if len(chain) < 2 or odd is not None:
        return None, f"{link} resolves to {resolved}: {odd!r} below the host bridge is not a BDF"
    return tuple(chain), ""


def _unresolvable(link: str) -> str:
    """Why ``link`` did not resolve to a directory (only computed on that failure)."""
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return f"{link} does not exist"
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return f"{link} is neither a directory nor a link to one"
        return f"cannot read {link}: {exc.strerror or exc}"
    return f"{link} -> {target} does not resolve to a directory"


def _read_count(path: str) -> int:
    """A non-negative decimal count. FileNotFoundError passes through; else ValueError."""
    try:
        text = _read_small(path).strip()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except _Malformed as exc:
        raise ValueError(f"malformed {path}: {exc}") from None
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        raise ValueError(f"malformed {path}: {text[:32]!r}")
    return int(text)


def read_sriov(root: Path | str, bus_id: str) -> SriovFacts:
    """VF or PF, and the VF count that decides the resource; never raises."""
    device_dir = pci_device_dir(root, bus_id)
    if not os.path.isdir(device_dir):
        return SriovFacts(unseen=True)
    physfn = os.path.join(device_dir, "physfn")
    try:
        target = os.readlink(physfn)
    except FileNotFoundError:
        target = None
    except OSError as exc:
        if os.path.lexists(physfn):
            return SriovFacts(error=f"cannot read {physfn}: {exc.strerror or exc}")
        target = None
    if target is not None:
        parent = os.path.basename(target.rstrip("/")).lower()
        if not is_valid_bus_id(parent):
            return SriovFacts(error=f"{physfn} points to {target!r}, not a PCI device")
        count_path = os.path.join(pci_device_dir(root, parent), "sriov_numvfs")
        try:
            return SriovFacts(parent_bus_id=parent, vf_count=_read_count(count_path))
        except FileNotFoundError:
            return SriovFacts(parent_bus_id=parent, error=f"{count_path} does not exist")
        except ValueError as exc:
            return SriovFacts(parent_bus_id=parent, error=str(exc))
    try:
        return SriovFacts(vf_count=_read_count(os.path.join(device_dir, "sriov_numvfs")))
    except FileNotFoundError:
        return SriovFacts()  # no SR-IOV capability: a plain PF
    except ValueError as exc:
        return SriovFacts(error=str(exc))


PCI_DEVICES: Final = ("bus", "pci", "devices")
DRIVER_CLASS: Final = ("class", "rebellions")


def missing_roots(root: Path | str) -> tuple[str, ...]:
    """The sysfs directories the daemon reads that do not exist, when the PCI one is
    among them (a sysfs root that cannot be the host's); () otherwise."""
    pci = os.path.join(root, *PCI_DEVICES)
    if os.path.isdir(pci):
        return ()
    driver = os.path.join(root, *DRIVER_CLASS)
    return (pci,) if os.path.isdir(driver) else (pci, driver)


def read_device_facts(root: Path | str, bus_id: str) -> DeviceFacts:
    pci_path, pci_path_error = explain_pci_path(root, bus_id)
    return DeviceFacts(
        sriov=read_sriov(root, bus_id), pci_path=pci_path, pci_path_error=pci_path_error
    )


@dataclass(frozen=True, slots=True)
class SysfsDevice:
    """An NPU function the host shows in sysfs, whatever rbln-smi lists."""

    name: str | None  # its class/rebellions/<name> entry; None: only the PCI function exists
    bus_id: str | None  # lowercase BDF; None: the class entry has no usable device link


def list_sysfs_devices(root: Path | str) -> list[SysfsDevice]:
    """Devices of the rebellions driver class, then Rebellions PCI functions without one.

    Only names and bus IDs that pass the inventory's shape checks are returned, so
    nothing here can turn into an unexpected path. Never raises: an unreadable
    directory shows nothing.
    """
    found: list[SysfsDevice] = []
    seen: set[str] = set()
    class_dir = os.path.join(root, "class", "rebellions")
    for name in sorted(_list_dir(class_dir)):
        if not is_valid_name(name):
            continue
        bus_id = _link_target_bdf(os.path.join(class_dir, name, "device"))
        found.append(SysfsDevice(name, bus_id))
        if bus_id is not None:
            seen.add(bus_id)
    devices_dir = os.path.join(root, "bus", "pci", "devices")
    for entry in sorted(_list_dir(devices_dir)):
        bus_id = entry.lower()
        if bus_id in seen or not is_valid_bus_id(bus_id):
            continue
        try:
            vendor = _read_small(os.path.join(devices_dir, entry, "vendor")).strip().lower()
        except (OSError, _Malformed):
            continue
        if vendor == REBELLIONS_PCI_VENDOR:
            found.append(SysfsDevice(None, bus_id))
    return found


def _list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _link_target_bdf(link: str) -> str | None:
    try:
        target = os.readlink(link)
    except OSError:
        return None
    bus_id = os.path.basename(target.rstrip("/")).lower()
    return bus_id if is_valid_bus_id(bus_id) else None
