"""Runtime changes to a materialised node: status, devices, partitions, faults.

Each change updates the three views together: sysfs and /dev, the rbln-smi state (under
its lock) and the saved layout, so a later CLI call or ``SimNode.open`` sees the same
node the daemon sees.
"""

from __future__ import annotations

import dataclasses

from rbln_device_plugin.sim.layout import LayoutError, SimDevice, make_vfs
from rbln_device_plugin.sim.materialize import SimError, SimNode, remove_device, write_device
from rbln_device_plugin.sim.state import Fault

MAX_VFS = 7  # functions .1 .. .7 of the PF's slot


def _status_text(value: int | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return f"{value}\n"


def set_status(node: SimNode, name: str, value: int | str | None) -> None:
    """A lifecycle code, raw file contents (e.g. "garbage"), or None to delete the file."""
    dev = _device(node, name)
    text = _status_text(value)
    path = node.status_path(name)
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Replace rather than rewrite in place: a concurrent reader sees old or new, never "".
        tmp = path.with_name("status.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    _replace(node, dataclasses.replace(dev, status=text))
    with node.store.transaction() as state:
        for rec in state.devices:
            if rec["device"] == name:
                rec["status"] = (text or "").strip() or "unknown"


def add_device(node: SimNode, dev: SimDevice) -> None:
    try:
        layout = node.layout.with_devices((*node.layout.devices, dev))
    except LayoutError as exc:
        raise SimError(f"cannot add {dev.name}: {exc}") from exc
    write_device(node, dev)
    if dev.listed:
        with node.store.transaction() as state:
            state.devices.append(dev.smi_record())
    node.layout = layout
    node.save_layout()


def remove(node: SimNode, name: str) -> list[str]:
    """Remove a device (a PF takes its VFs with it); returns the names removed."""
    dev = _device(node, name)
    gone = [*node.layout.vfs_of(dev), dev]
    _drop(node, gone)
    return [d.name for d in gone]


def repartition(node: SimNode, pf_name: str, count: int, *, listed: bool = True) -> list[str]:
    """Write ``count`` to the PF's sriov_numvfs, replacing its VFs; returns the new VFs."""
    pf = _device(node, pf_name)
    if pf.is_vf:
        raise SimError(f"{pf_name} is a VF; only PFs can be partitioned")
    if not 0 <= count <= MAX_VFS:
        raise SimError(f"VF count must be 0..{MAX_VFS}, got {count}")
    _drop(node, node.layout.vfs_of(pf))
    pf = dataclasses.replace(pf, sriov_numvfs=count)
    _replace(node, pf)
    write_device(node, pf)  # rewrites sriov_numvfs
    vfs = make_vfs(pf, count, node.layout.next_npu(), listed=listed)
    for vf in vfs:
        add_device(node, vf)
    return [vf.name for vf in vfs]


def inject_fault(node: SimNode, fault: Fault) -> None:
    with node.store.transaction() as state:
        state.faults.append(fault)


def clear_faults(node: SimNode) -> None:
    with node.store.transaction() as state:
        state.faults.clear()


def groups(node: SimNode) -> dict[str, list[str]]:
    return node.store.read().groups()


def _device(node: SimNode, name: str) -> SimDevice:
    try:
        return node.layout.device(name)
    except LayoutError as exc:
        raise SimError(str(exc)) from exc


def _replace(node: SimNode, dev: SimDevice) -> None:
    node.layout = node.layout.with_devices(
        dev if d.name == dev.name else d for d in node.layout.devices
    )
    node.save_layout()


def _drop(node: SimNode, devices: tuple[SimDevice, ...] | list[SimDevice]) -> None:
    names = {d.name for d in devices}
    if not names:
        return
    for dev in devices:
        remove_device(node, dev)
    with node.store.transaction() as state:
        state.devices = [r for r in state.devices if r["device"] not in names]
    node.layout = node.layout.with_devices(d for d in node.layout.devices if d.name not in names)
    node.save_layout()
