"""The simulated node on disk: where everything lives, and one device written or removed.

``NodePaths`` names every path of a node (and the daemon flags that point there);
``write_device`` and ``remove_device`` are the only primitives that change the tree.
Building a node and changing it at run time (``node``) go through them.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import rbln_device_plugin_sim
from rbln_device_plugin.model import resources
from rbln_device_plugin_sim.layout import SimDevice
from rbln_device_plugin_sim.state import make_dev_node

LAYOUT_FILE: Final = "layout.json"
STATE_FILE: Final = "smi-state.json"
# The file the RBLN container toolkit writes its CDI spec to, in /etc/cdi.
TOOLKIT_CDI_SPEC_NAME: Final = "rbln.yaml"
# The longest socket file name the daemon creates in the kubelet directory.
LONGEST_SOCKET: Final = resources.LONGEST_SOCKET_NAME
MAX_SOCKET_PATH: Final = 100
PCI_VENDOR: Final = "0x1eff"


class SimError(Exception):
    """The simulated node cannot be built or changed as asked."""


def short_tempdir(prefix: str = "rbln-sim-") -> Path:
    """A fresh directory whose path leaves room for unix socket names."""
    base = tempfile.gettempdir()
    if len(base) > 20:
        # TMPDIR can be deep (CI, pytest); unix socket paths cannot.
        base = "/tmp"  # noqa: S108
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


@dataclass(slots=True)
class NodePaths:
    """Every path of a node under its root."""

    root: Path

    @property
    def sysfs_root(self) -> Path:
        return self.root / "sys"

    @property
    def dev_root(self) -> Path:
        return self.root / "dev"

    @property
    def smi_path(self) -> Path:
        return self.root / "bin" / "rbln-smi"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def cdi_static_dir(self) -> Path:
        """The node's /etc/cdi, where its container toolkit wrote ``rbln.yaml``."""
        return self.root / "etc-cdi"

    @property
    def cdi_spec_path(self) -> Path:
        return self.cdi_static_dir / TOOLKIT_CDI_SPEC_NAME

    @property
    def rsd_lock_path(self) -> Path:
        return self.root / "run" / "rbln-rsd-group.lock"

    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    @property
    def layout_path(self) -> Path:
        return self.root / LAYOUT_FILE

    def daemon_args(self, scan_interval: str = "1s") -> list[str]:
        return [
            "--sysfs-root", str(self.sysfs_root),
            "--dev-root", str(self.dev_root),
            "--rbln-smi", str(self.smi_path),
            "--kubelet-device-plugin-path", str(self.kubelet_dir),
            "--cdi-root", str(self.cdi_root),
            "--cdi-static-dir", str(self.cdi_static_dir),
            "--rsd-lock-path", str(self.rsd_lock_path),
            "--healthcheck-port", "-1",
            "--device-scan-interval", scan_interval,
            # The simulated /dev holds regular files: no character devices without root.
            "--test-file-device-nodes",
        ]  # fmt: skip

    def status_path(self, name: str) -> Path:
        return self.sysfs_root / "class" / "rebellions" / name / "status"

    def pci_link(self, bus_id: str) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices" / bus_id


def write_smi_script(node: NodePaths, interpreter: str | None = None) -> None:
    """The fake ``rbln-smi``: a script that runs the simulator's tool on this node's state.

    ``interpreter``: a Python 3.11+ to name in the script instead of this one, with a copy
    of the simulator package under the node's root; the script then runs wherever the
    root is visible at the same path (inside a container, for the real-node tests).
    """
    src_dir = Path(rbln_device_plugin_sim.__file__).resolve().parent.parent
    if interpreter is not None:
        copy = node.root / "lib" / "rbln_device_plugin_sim"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(
            src_dir / "rbln_device_plugin_sim", copy, ignore=shutil.ignore_patterns("__pycache__")
        )
        src_dir = copy.parent
    # -S skips site-packages: the fake tool needs only the stdlib and the simulator
    # package, and it starts on every scan (smi_exe says why it imports so little).
    script = (
        f"#!{interpreter or sys.executable} -S\n"
        "import sys\n"
        f"sys.path.insert(0, {str(src_dir)!r})\n"
        "from rbln_device_plugin_sim.smi_exe import main\n"
        f"sys.exit(main(sys.argv[1:], {str(node.state_path)!r}))\n"
    )
    node.smi_path.write_text(script, encoding="utf-8")
    mode = node.smi_path.stat().st_mode
    node.smi_path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _pci_dir(node: NodePaths, dev: SimDevice) -> Path | None:
    if dev.pci_path is None:
        return None
    return node.sysfs_root.joinpath("devices", *dev.pci_path)


def write_device(node: NodePaths, dev: SimDevice, char_major: int | None = None) -> None:
    """Create the device's sysfs entries and /dev node (not its rbln-smi record): a
    character device (``char_major``, the device's ``npu``) or, without a major, a file."""
    pci_dir = _pci_dir(node, dev)
    if pci_dir is not None and dev.pci_path is not None:
        pci_dir.mkdir(parents=True, exist_ok=True)
        (pci_dir / "vendor").write_text(f"{PCI_VENDOR}\n")
        (pci_dir / "device").write_text(f"0x{dev.pci_dev}\n")
        (pci_dir / "numa_node").write_text(f"{dev.numa}\n")
        if dev.sriov_numvfs is not None:
            (pci_dir / "sriov_totalvfs").write_text("4\n")
            (pci_dir / "sriov_numvfs").write_text(f"{dev.sriov_numvfs}\n")
        link = node.pci_link(dev.bus_id)
        # Relative, as the kernel makes them: the tree stays valid if the root moves.
        _symlink(os.path.relpath(pci_dir, link.parent), link)
        if dev.physfn is not None:
            _symlink(f"../{dev.physfn}", pci_dir / "physfn")
            pf_dir = pci_dir.parent / dev.physfn
            if pf_dir.is_dir():
                _symlink(f"../{dev.bus_id}", pf_dir / f"virtfn{_vf_index(dev)}")
    class_dir = node.sysfs_root / "class" / "rebellions" / dev.name
    class_dir.mkdir(parents=True, exist_ok=True)
    if pci_dir is not None:
        _symlink(os.path.relpath(pci_dir, class_dir), class_dir / "device")
    if dev.status is not None:
        (class_dir / "status").write_text(dev.status)
    make_dev_node(node.dev_root / dev.name, char_major, dev.npu)


def remove_device(node: NodePaths, dev: SimDevice) -> None:
    """Undo ``write_device``: the device vanishes from sysfs and /dev."""
    pci_dir = _pci_dir(node, dev)
    if pci_dir is not None:
        if dev.physfn is not None:
            (pci_dir.parent / dev.physfn / f"virtfn{_vf_index(dev)}").unlink(missing_ok=True)
        shutil.rmtree(pci_dir, ignore_errors=True)
    node.pci_link(dev.bus_id).unlink(missing_ok=True)
    shutil.rmtree(node.sysfs_root / "class" / "rebellions" / dev.name, ignore_errors=True)
    (node.dev_root / dev.name).unlink(missing_ok=True)


def _vf_index(vf: SimDevice) -> int:
    # VF k sits at function k+1 of the PF's slot.
    return int(vf.bus_id.rsplit(".", 1)[1]) - 1


def _symlink(target: str, link: Path) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(target)
