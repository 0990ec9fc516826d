"""A simulated node: built from a layout, reopened from disk, changed while a daemon runs.

Each change updates the three views together: sysfs and /dev (through ``tree``), the
rbln-smi state (under its lock) and the saved layout, so a later CLI call or
``SimNode.open`` sees the same node the daemon sees.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from rbln_device_plugin_sim.layout import Layout, LayoutError, SimDevice, make_vfs
from rbln_device_plugin_sim.state import (
    RSD_MINOR_BASE,
    Fault,
    SmiState,
    StateStore,
    make_dev_node,
)
from rbln_device_plugin_sim.tree import (
    LAYOUT_FILE,
    LONGEST_SOCKET,
    MAX_SOCKET_PATH,
    TOOLKIT_CDI_SPEC_NAME,
    NodePaths,
    SimError,
    remove_device,
    short_tempdir,
    write_device,
    write_smi_script,
)

__all__ = [
    "LAYOUT_FILE",
    "TOOLKIT_CDI_ENV",
    "TOOLKIT_CDI_SPEC",
    "TOOLKIT_CDI_SPEC_NAME",
    "SimError",
    "SimNode",
    "materialize",
    "remove_node",
    "short_tempdir",
]

MAX_VFS: Final = 7  # functions .1 .. .7 of the PF's slot


@dataclass(slots=True)
class SimNode(NodePaths):
    """A materialised node: its paths, its current layout and its rbln-smi state."""

    layout: Layout
    store: StateStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = StateStore(self.state_path)

    def save_layout(self) -> None:
        self.layout.save(self.layout_path)

    @classmethod
    def open(cls, root: Path) -> SimNode:
        """Reopen a node that ``materialize`` built earlier (for the CLI)."""
        root = Path(root).absolute()
        try:
            layout = Layout.load(root / LAYOUT_FILE)
        except OSError as exc:
            raise SimError(f"{root} holds no simulated node ({exc.strerror})") from exc
        return cls(root, layout)

    @property
    def char_major(self) -> int | None:
        """The major of the node's character devices; None: its /dev holds files."""
        return self.store.read().char_major

    def groups(self) -> dict[str, list[str]]:
        """RSD group id -> device names, as ``rbln-smi -g -j`` would report them."""
        return self.store.read().groups()

    # ------------------------------------------------------------ the toolkit's CDI spec
    def write_cdi_spec(self, text: str | None = None) -> None:
        """The container toolkit's ``rbln.yaml`` (``text``: any contents, for tests)."""
        temporary = self.cdi_spec_path.with_name(f".{TOOLKIT_CDI_SPEC_NAME}.tmp")
        temporary.write_text(TOOLKIT_CDI_SPEC if text is None else text, encoding="utf-8")
        temporary.replace(self.cdi_spec_path)  # as a toolkit writes it: never half a file

    def remove_cdi_spec(self) -> None:
        self.cdi_spec_path.unlink(missing_ok=True)

    # ------------------------------------------------------------ runtime changes
    def set_status(self, name: str, value: int | str | None) -> None:
        """A lifecycle code, raw file contents (e.g. "garbage"), or None to delete the file."""
        dev = self._device(name)
        text = value if value is None or isinstance(value, str) else f"{value}\n"
        path = self.status_path(name)
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Replace rather than rewrite in place: a concurrent reader sees old or new, never "".
            tmp = path.with_name("status.tmp")
            tmp.write_text(text)
            tmp.replace(path)
        self._replace(dataclasses.replace(dev, status=text))
        with self.store.transaction() as state:
            for rec in state.devices:
                if rec["device"] == name:
                    rec["status"] = (text or "").strip() or "unknown"

    def add_device(self, dev: SimDevice) -> None:
        try:
            layout = self.layout.with_devices((*self.layout.devices, dev))
        except LayoutError as exc:
            raise SimError(f"cannot add {dev.name}: {exc}") from exc
        write_device(self, dev, self.char_major)
        if dev.listed:
            with self.store.transaction() as state:
                state.devices.append(dev.smi_record())
        self.layout = layout
        self.save_layout()

    def remove_device(self, name: str) -> list[str]:
        """Remove a device (a PF takes its VFs with it); returns the names removed."""
        dev = self._device(name)
        gone = [*self.layout.vfs_of(dev), dev]
        self._drop(gone)
        return [d.name for d in gone]

    def repartition(self, pf_name: str, count: int, *, listed: bool = True) -> list[str]:
        """Write ``count`` to the PF's sriov_numvfs, replacing its VFs; returns the new VFs."""
        pf = self._device(pf_name)
        if pf.is_vf:
            raise SimError(f"{pf_name} is a VF; only PFs can be partitioned")
        if not 0 <= count <= MAX_VFS:
            raise SimError(f"VF count must be 0..{MAX_VFS}, got {count}")
        self._drop(self.layout.vfs_of(pf))
        pf = dataclasses.replace(pf, sriov_numvfs=count)
        self._replace(pf)
        write_device(self, pf, self.char_major)  # rewrites sriov_numvfs
        vfs = make_vfs(pf, count, self.layout.next_npu(), listed=listed)
        for vf in vfs:
            self.add_device(vf)
        return [vf.name for vf in vfs]

    def renumber(self, names: Mapping[str, str]) -> dict[str, str]:
        """A driver reload that probed the PFs in another order: ``names`` maps a PF's
        current name to its new one and must only permute names (``{"rbln0": "rbln1",
        "rbln1": "rbln0"}``). A renamed PF's VFs follow it (``rbln0-2`` -> ``rbln1-2``),
        the driver's index (rbln-smi's ``npu``) stays with the name, and, as after any
        reload, every device is back in the default RSD group. Returns old -> new names.
        """
        pfs = {name: self._device(name) for name in names}
        if sorted(names) != sorted(names.values()):
            raise SimError(f"a reload only reorders names: {dict(names)} is not a permutation")
        if vf := next((d for d in pfs.values() if d.is_vf), None):
            raise SimError(f"{vf.name} is a VF; renumber its PF")
        renamed: dict[str, str] = {}
        for old, new in names.items():
            renamed[old] = new
            for vf in self.layout.vfs_of(pfs[old]):
                renamed[vf.name] = new + vf.name[len(old) :]
        npu_of = {d.name: d.npu for d in self.layout.devices}
        moved = [d for d in self.layout.devices if d.name in renamed]
        if any(new not in npu_of for new in renamed.values()):
            raise SimError(f"{dict(names)}: the PFs do not have the same VFs")
        for dev in moved:
            remove_device(self, dev)
        after = {
            d.name: dataclasses.replace(d, name=renamed[d.name], npu=npu_of[renamed[d.name]])
            for d in moved
        }
        for dev in sorted(after.values(), key=lambda d: d.is_vf):  # PFs first: VFs link to them
            write_device(self, dev, self.char_major)
        self.layout = self.layout.with_devices(after.get(d.name, d) for d in self.layout.devices)
        self.save_layout()
        listed = {d.name for d in self.layout.devices if d.listed}
        with self.store.transaction() as state:
            state.devices = sorted(
                (d.smi_record() for d in self.layout.devices if d.name in listed),
                key=lambda record: int(record["npu"]),
            )
        for node in self.dev_root.glob("rsd*"):
            if node.name != "rsd0":
                node.unlink(missing_ok=True)
        return renamed

    def inject_fault(self, fault: Fault) -> None:
        with self.store.transaction() as state:
            state.faults.append(fault)

    def clear_faults(self) -> None:
        with self.store.transaction() as state:
            state.faults.clear()

    def held(self) -> list[tuple[int, str]]:
        """rbln-smi invocations waiting in a HOLD fault, as (pid, command), by pid.

        An invocation killed while held (its caller timed out or died) is not listed.
        """
        held = []
        for marker in _entries(self.store.held_dir):
            try:
                command = marker.read_text(encoding="utf-8")
            except FileNotFoundError:  # released meanwhile
                continue
            if command and _alive(int(marker.name)):
                held.append((int(marker.name), command))
        return sorted(held)

    def release_held(self) -> None:
        """Let every held invocation go on (each then runs its command as usual)."""
        for marker in _entries(self.store.held_dir):
            marker.unlink(missing_ok=True)

    def _device(self, name: str) -> SimDevice:
        try:
            return self.layout.device(name)
        except LayoutError as exc:
            raise SimError(str(exc)) from exc

    def _replace(self, dev: SimDevice) -> None:
        self.layout = self.layout.with_devices(
            dev if d.name == dev.name else d for d in self.layout.devices
        )
        self.save_layout()

    def _drop(self, devices: tuple[SimDevice, ...] | list[SimDevice]) -> None:
        names = {d.name for d in devices}
        if not names:
            return
        for dev in devices:
            remove_device(self, dev)
        with self.store.transaction() as state:
            state.devices = [r for r in state.devices if r["device"] not in names]
        self.layout = self.layout.with_devices(
            d for d in self.layout.devices if d.name not in names
        )
        self.save_layout()


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# What the RBLN container toolkit's spec amounts to on the simulated node: the kind and
# device name the plugin's answers reference, and an edit a container can show. The one
# stand-in for every test: the daemon's (sim nodes) and the container runtimes' (the real
# node's /etc/cdi). TOOLKIT_CDI_ENV: (name, value) of the env edit, what a container whose
# runtime applied the spec finds in its environment.
TOOLKIT_CDI_ENV: Final = ("RBLN_CDI_SPEC", "simulated")
TOOLKIT_CDI_SPEC: Final = f"""\
cdiVersion: 0.6.0
kind: rebellions.ai/npu
devices:
  - name: runtime
    containerEdits:
      env:
        - {TOOLKIT_CDI_ENV[0]}={TOOLKIT_CDI_ENV[1]}
"""

# What a node (and the tools around it) put under its root; --force removes only these.
NODE_ENTRIES: Final = (
    "sys", "dev", "bin", "lib", "kubelet", "cdi", "etc-cdi", "run", LAYOUT_FILE,
    "smi-state.json",
    "smi-state.json.lock", "smi-state.json.listings", "smi-state.json.held", "layout.json.tmp",
    "daemon.log",
    "sim-control.sock",
)  # fmt: skip


def remove_node(root: Path | str) -> None:
    """Delete the simulated node under ``root``: its own entries, nothing else there."""
    root = Path(root).absolute()
    if not (root / LAYOUT_FILE).exists():
        raise SimError(f"{root} holds no simulated node")
    for name in NODE_ENTRIES:
        entry = root / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)


def materialize(
    layout: Layout,
    root: Path | str,
    *,
    char_major: int | None = None,
    smi_interpreter: str | None = None,
) -> SimNode:
    """Build the node under ``root`` (created if missing; must not hold a node yet).

    ``char_major``: make /dev entries real character devices of that major (root only),
    so the node can stand behind a real kubelet and container runtime; ``smi_interpreter``:
    see ``write_smi_script``.
    """
    node = SimNode(Path(root).absolute(), layout)
    socket_path = node.kubelet_dir / LONGEST_SOCKET
    if len(str(socket_path)) >= MAX_SOCKET_PATH:
        raise SimError(
            f"root {node.root} is too long: {socket_path} would exceed {MAX_SOCKET_PATH} bytes"
        )
    if node.layout_path.exists():
        raise SimError(
            f"{node.root} already holds a simulated node ({_layout_name(node.layout_path)})"
        )
    for directory in (
        node.sysfs_root / "class" / "rebellions",
        node.sysfs_root / "bus" / "pci" / "devices",
        node.sysfs_root / "devices",
        node.dev_root,
        node.smi_path.parent,
        node.kubelet_dir,
        node.cdi_root,
        node.cdi_static_dir,
        node.rsd_lock_path.parent,
    ):
        directory.mkdir(parents=True, exist_ok=True)
    node.write_cdi_spec()
    for dev in layout.devices:
        write_device(node, dev, char_major)
    # Group 0 (every device at boot) has its node like any other group.
    make_dev_node(node.dev_root / "rsd0", char_major, RSD_MINOR_BASE)
    node.store.create(
        SmiState(
            kmd_version=layout.kmd_version,
            dev_root=str(node.dev_root),
            devices=[d.smi_record() for d in layout.devices if d.listed],
            char_major=char_major,
        )
    )
    write_smi_script(node, smi_interpreter)
    node.save_layout()
    return node


def _layout_name(path: Path) -> str:
    try:
        return Layout.load(path).name
    except (OSError, LayoutError):
        return "unreadable layout"
