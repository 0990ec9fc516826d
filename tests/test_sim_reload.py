"""The simulator's driver reload and the kubelet stand-in's directory cleanup."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_device_plugin_sim.kubelet import CHECKPOINT, Cleanup, KubeletStub
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimError, SimNode, materialize, short_tempdir

SIM = [sys.executable, "-c", "import sys; from rbln_device_plugin_sim.cli import main; "
       "sys.exit(main())"]  # fmt: skip


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("rbln-r-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def listing(node: SimNode) -> dict[str, tuple[str, int, str]]:
    """What the node's rbln-smi -g -j prints: name -> (bus ID, npu, group)."""
    out = subprocess.run(
        [str(node.smi_path), "-g", "-j"], capture_output=True, text=True, check=True
    ).stdout
    return {
        d["device"]: (d["pci"]["bus_id"], d["npu"], d["group_id"])
        for d in json.loads(out)["devices"]
    }


def test_a_reload_swaps_names_and_everything_follows_the_name(root: Path) -> None:
    node = materialize(preset("rebel-sriov"), root / "n")
    before = listing(node)
    subprocess.run([*SIM, "renumber", "--root", str(node.root), "rbln2=rbln3", "rbln3=rbln2"],
                   check=True, capture_output=True)  # fmt: skip
    after = listing(SimNode.open(node.root))
    assert after["rbln2"][0] == before["rbln3"][0] and after["rbln3"][0] == before["rbln2"][0]
    # The driver's index stays with the name; every other device is as it was.
    assert after["rbln2"][1] == before["rbln2"][1]
    assert {k: v for k, v in after.items() if k not in ("rbln2", "rbln3")} == {
        k: v for k, v in before.items() if k not in ("rbln2", "rbln3")
    }
    # sysfs follows: the class entry of the new name leads to the other PCI function.
    link = node.sysfs_root / "class" / "rebellions" / "rbln2" / "device"
    assert Path(os.path.realpath(link)).name == before["rbln3"][0]


def test_a_reload_renames_a_pfs_vfs_and_resets_groups(root: Path) -> None:
    node = materialize(preset("rebel-4"), root / "n")
    node.repartition("rbln0", 4)
    node.repartition("rbln1", 4)
    before = listing(node)
    with node.store.transaction() as state:
        state.devices[0]["group_id"] = "3"
    renamed = node.renumber({"rbln0": "rbln1", "rbln1": "rbln0"})
    assert renamed["rbln0-2"] == "rbln1-2"
    after = listing(node)
    assert after["rbln1-2"][0] == before["rbln0-2"][0]
    assert {group for _, _, group in after.values()} == {"0"}


@pytest.mark.parametrize("names", [{"rbln0": "rbln1"}, {"rbln0": "rbln9", "rbln9": "rbln0"}])
def test_a_reload_that_is_not_a_permutation_is_refused(root: Path, names: dict[str, str]) -> None:
    node = materialize(preset("rebel-4"), root / "n")
    with pytest.raises(SimError):
        node.renumber(names)


@pytest.mark.parametrize(
    ("rule", "gone"),
    [
        (Cleanup.NON_DIRECTORIES, {"plugin.sock", "stale.lock", "link-to-sock", "link-to-dir"}),
        # os.Stat follows the link: one to a socket goes, one to a directory stays.
        (Cleanup.SOCKETS, {"plugin.sock", "link-to-sock"}),
    ],
)
async def test_the_stand_in_cleans_its_directory_like_the_kubelet(
    root: Path, rule: Cleanup, gone: set[str]
) -> None:
    directory = root / "k"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "inside.lock").touch()
    (directory / "stale.lock").touch()
    (directory / CHECKPOINT).write_text("{}")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(directory / "plugin.sock"))
    outside = socket.socket(socket.AF_UNIX)
    outside.bind(str(root / "outside.sock"))
    (directory / "link-to-sock").symlink_to(root / "outside.sock")
    (directory / "link-to-dir").symlink_to("sub")
    try:
        async with KubeletStub(directory, cleanup=rule) as kubelet:
            assert set(kubelet.deleted) == gone
            left = {p.name for p in directory.iterdir()}
            everything = {"sub", "stale.lock", CHECKPOINT, "plugin.sock", "link-to-sock",
                          "link-to-dir", "kubelet.sock"}  # fmt: skip
            assert left == everything - gone
            assert (directory / "sub" / "inside.lock").exists()
    finally:
        listener.close()
        outside.close()
