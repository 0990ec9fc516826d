"""The simulated sysfs resolves like a real one, and runtime changes keep views in step."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_device_plugin_sim.cli import main as sim_main
from rbln_device_plugin_sim.layout import SimDevice, preset
from rbln_device_plugin_sim.node import SimError, SimNode, materialize, short_tempdir


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("rbln-t-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sriov(root: Path) -> SimNode:
    return materialize(preset("rebel-sriov"), root / "n")


def pci_dir(node: SimNode, bus_id: str) -> Path:
    return Path(os.path.realpath(node.pci_link(bus_id)))


def smi_devices(node: SimNode) -> list[str]:
    out = subprocess.run([str(node.smi_path), "-j"], capture_output=True, text=True, check=True)
    return [d["device"] for d in json.loads(out.stdout)["devices"]]


def test_realpath_gives_the_pci_hierarchy(root: Path) -> None:
    node = materialize(preset("atom-max-8"), root / "n")
    real = pci_dir(node, "0000:13:00.0")
    assert real.is_dir() and real.name == "0000:13:00.0"
    assert real.relative_to(node.sysfs_root / "devices").parts == (
        "pci0000:00",
        "0000:00:03.1",
        "0000:11:00.0",
        "0000:12:00.0",
        "0000:13:00.0",
    )
    assert os.readlink(node.pci_link("0000:13:00.0")).startswith("../../../devices/")
    assert (real / "vendor").read_text() == "0x1eff\n"
    assert node.status_path("rbln4").read_text() == "0\n"


def test_sriov_files_mark_pfs_and_vfs(sriov: SimNode) -> None:
    vf = pci_dir(sriov, "0000:17:00.3")
    assert os.path.basename(os.readlink(vf / "physfn")) == "0000:17:00.0"
    assert (vf / "physfn").resolve() == pci_dir(sriov, "0000:17:00.0")
    assert (pci_dir(sriov, "0000:17:00.0") / "sriov_numvfs").read_text() == "4\n"
    assert (pci_dir(sriov, "0000:2a:00.0") / "sriov_numvfs").read_text() == "1\n"
    assert (pci_dir(sriov, "0000:3d:00.0") / "sriov_numvfs").read_text() == "0\n"
    assert not (pci_dir(sriov, "0000:51:00.0") / "sriov_numvfs").exists()
    pf = pci_dir(sriov, "0000:17:00.0")
    assert sorted(p.name for p in pf.glob("virtfn*")) == [f"virtfn{k}" for k in range(4)]
    assert (pf / "virtfn2").resolve() == pci_dir(sriov, "0000:17:00.3")
    assert not (pf / "physfn").exists()
    # A VF of the vf-1 PF has no status file; the vf-4 VFs do.
    assert not sriov.status_path("rbln1-0").exists()
    assert sriov.status_path("rbln0-2").read_text() == "0\n"


def test_missing_pci_link_and_unlisted_devices(root: Path) -> None:
    node = materialize(preset("readme-example"), root / "n")
    rbln6 = node.layout.device("rbln6")
    assert not os.path.lexists(node.pci_link(rbln6.bus_id))
    assert node.status_path("rbln6").exists() and (node.dev_root / "rbln6").exists()


def test_set_status_codes_garbage_and_missing(sriov: SimNode) -> None:
    sriov.set_status("rbln2", 4)
    assert sriov.status_path("rbln2").read_text() == "4\n"
    sriov.set_status("rbln2", "garbage")
    assert sriov.status_path("rbln2").read_text() == "garbage"
    sriov.set_status("rbln2", None)
    assert not sriov.status_path("rbln2").exists()
    sriov.set_status("rbln1-0", 0)  # a VF that had no file gets one
    assert sriov.status_path("rbln1-0").read_text() == "0\n"
    assert SimNode.open(sriov.root).layout.device("rbln2").status is None
    with pytest.raises(SimError, match="no device"):
        sriov.set_status("rbln99", 0)


def test_remove_and_add_devices(sriov: SimNode) -> None:
    gone = sriov.remove_device("rbln0")
    assert sorted(gone) == ["rbln0", "rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"]
    assert not os.path.lexists(sriov.pci_link("0000:17:00.2"))
    assert not (sriov.dev_root / "rbln0-1").exists()
    assert "rbln0-0" not in smi_devices(sriov)
    new = SimDevice(
        "rbln9",
        20,
        "RBLN-CR13",
        "0000:61:00.0",
        numa="1",
        pci_path=("pci0000:60", "0000:60:01.0", "0000:61:00.0"),
    )
    sriov.add_device(new)
    assert pci_dir(sriov, "0000:61:00.0").name == "0000:61:00.0"
    assert smi_devices(sriov)[-1] == "rbln9"
    with pytest.raises(SimError, match="duplicate"):
        sriov.add_device(dataclasses.replace(new, name="rbln10"))


def test_repartition_replaces_vfs_everywhere(sriov: SimNode) -> None:
    assert sriov.repartition("rbln0", 1) == ["rbln0-0"]
    pf = pci_dir(sriov, "0000:17:00.0")
    assert (pf / "sriov_numvfs").read_text() == "1\n"
    assert sorted(p.name for p in pf.glob("virtfn*")) == ["virtfn0"]
    assert not os.path.lexists(sriov.pci_link("0000:17:00.2"))
    assert [n for n in smi_devices(sriov) if n.startswith("rbln0-")] == ["rbln0-0"]
    assert sriov.repartition("rbln3", 2) == ["rbln3-0", "rbln3-1"]
    assert (pci_dir(sriov, "0000:51:00.2") / "physfn").resolve() == pci_dir(sriov, "0000:51:00.0")
    assert sriov.repartition("rbln3", 0) == []
    assert not os.path.lexists(sriov.pci_link("0000:51:00.1"))
    with pytest.raises(SimError, match="is a VF"):
        sriov.repartition("rbln1-0", 4)


def test_cli_changes_a_node_on_disk(sriov: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(sriov.root)
    assert sim_main(["set-status", "--root", root, "rbln2", "4"]) == 0
    assert sriov.status_path("rbln2").read_text() == "4\n"
    assert sim_main(["set-status", "--root", root, "rbln2", "--raw", "garbage"]) == 0
    assert sriov.status_path("rbln2").read_text() == "garbage"
    assert sim_main(["set-status", "--root", root, "rbln2", "--delete"]) == 0
    assert not sriov.status_path("rbln2").exists()
    assert sim_main(["repartition", "--root", root, "rbln3", "4"]) == 0
    assert (pci_dir(sriov, "0000:51:00.0") / "sriov_numvfs").read_text() == "4\n"
    assert sim_main(["remove-device", "--root", root, "rbln3-3"]) == 0
    assert sim_main(["fault", "--root", root, "error", "--only", "list"]) == 0
    with pytest.raises(subprocess.CalledProcessError):
        smi_devices(sriov)
    assert sim_main(["fault", "--root", root, "clear"]) == 0
    assert "rbln3-2" in smi_devices(sriov) and "rbln3-3" not in smi_devices(sriov)
    capsys.readouterr()
    assert sim_main(["groups", "--root", root]) == 0
    assert "0:" in capsys.readouterr().out
    # Bad input: a clear message and a non-zero exit, never a traceback.
    assert sim_main(["set-status", "--root", root, "rbln99", "4"]) != 0
    assert "rbln99" in capsys.readouterr().err
    assert sim_main(["groups", "--root", "/nonexistent"]) != 0
