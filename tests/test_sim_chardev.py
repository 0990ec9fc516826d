"""The simulated node with real character devices (root only): what stands behind the
real kubelet and container runtime in the real-node tests."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.state import RSD_MINOR_BASE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
MAJOR = 243


@pytest.fixture
def node() -> Iterator[SimNode]:
    root = short_tempdir("rbln-t-")
    yield materialize(
        preset("rebel-sriov"), root / "n", char_major=MAJOR, smi_interpreter=sys.executable
    )
    shutil.rmtree(root, ignore_errors=True)


def numbers(path: Path) -> tuple[int, int]:
    mode = os.stat(path)
    assert stat.S_ISCHR(mode.st_mode), f"{path} is not a character device"
    return os.major(mode.st_rdev), os.minor(mode.st_rdev)


def test_every_device_node_is_a_character_device_numbered_by_its_index(node: SimNode) -> None:
    for dev in node.layout.devices:
        assert numbers(node.dev_root / dev.name) == (MAJOR, dev.npu)
    assert numbers(node.dev_root / "rsd0") == (MAJOR, RSD_MINOR_BASE)
    assert node.char_major == MAJOR


def test_group_create_makes_a_character_device_and_destroy_removes_it(node: SimNode) -> None:
    def smi(*args: str) -> None:
        done = subprocess.run([str(node.smi_path), *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    smi("group", "-c", "3", "-a", "4")
    assert numbers(node.dev_root / "rsd3") == (MAJOR, RSD_MINOR_BASE + 3)
    smi("group", "-d", "3")
    assert not (node.dev_root / "rsd3").exists()


def test_the_script_runs_a_copy_of_the_simulator_under_the_root(node: SimNode) -> None:
    script = node.smi_path.read_text()
    assert script.startswith(f"#!{sys.executable} -S\n")
    assert str(node.root / "lib") in script
    assert (node.root / "lib" / "rbln_device_plugin_sim" / "smi_tool.py").is_file()


def test_runtime_changes_keep_making_character_devices(node: SimNode) -> None:
    (vf,) = node.repartition("rbln2", 1)
    assert numbers(node.dev_root / vf) == (MAJOR, node.layout.device(vf).npu)
