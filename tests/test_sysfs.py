"""sysfs readers against real trees with real symlinks in a tmp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rbln_device_plugin.host import sysfs as sysfs_module
from rbln_device_plugin.host.sysfs import read_device_facts, read_pci_path, read_sriov, read_status
from rbln_device_plugin.model.inventory import SriovFacts


def add_pci_device(root: Path, chain: list[str]) -> Path:
    """Create devices/<chain...> and the bus/pci/devices/<last> symlink to it."""
    target = root.joinpath("devices", *chain)
    target.mkdir(parents=True, exist_ok=True)
    link_dir = root / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / chain[-1]
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(target, link_dir))
    return target


def write_status(root: Path, name: str, content: str | bytes) -> Path:
    path = root / "class" / "rebellions" / name / "status"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# --------------------------------------------------------------------- status
@pytest.mark.parametrize(
    ("content", "name"),
    [
        ("0\n", "READY"),
        ("1", "BUSY"),
        ("2", "PROBING"),
        ("3", "INIT"),
        ("4\n", "FAULT"),
        ("5", "FINISH"),
        ("77", "UNKNOWN(77)"),
    ],
)
def test_status_file_values(tmp_path: Path, content: str, name: str) -> None:
    write_status(tmp_path, "rbln0", content)
    assert read_status(tmp_path, "rbln0").name == name


def test_a_huge_integer_status_is_unknown_not_unreadable(tmp_path: Path) -> None:
    write_status(tmp_path, "rbln0", "1000000000000000000\n")
    assert read_status(tmp_path, "rbln0").name == "UNKNOWN(1000000000000000000)"
    write_status(tmp_path, "rbln1", "9" * 4000 + "\n")  # still within one sysfs page
    assert read_status(tmp_path, "rbln1").name == "UNKNOWN(9999999999999999...4000 digits)"


def test_missing_status_file_is_unreadable(tmp_path: Path) -> None:
    reading = read_status(tmp_path, "rbln0-1")
    assert reading.name == "UNREADABLE"
    assert "does not exist" in reading.reason


def test_malformed_status_file_is_unreadable(tmp_path: Path) -> None:
    write_status(tmp_path, "rbln0", "ready\n")
    assert read_status(tmp_path, "rbln0").reason.startswith("malformed status")


def test_binary_status_file_is_unreadable(tmp_path: Path) -> None:
    write_status(tmp_path, "rbln0", b"\xff\xfe0")
    reading = read_status(tmp_path, "rbln0")
    assert reading.code is None and "ASCII" in reading.reason


def test_huge_status_file_is_not_read_whole(tmp_path: Path) -> None:
    write_status(tmp_path, "rbln0", "0" + " " * 10_000_000)
    reading = read_status(tmp_path, "rbln0")
    assert reading.code is None and "more than 4096 bytes" in reading.reason


def test_status_path_that_is_a_directory_is_unreadable(tmp_path: Path) -> None:
    (tmp_path / "class" / "rebellions" / "rbln0" / "status").mkdir(parents=True)
    reading = read_status(tmp_path, "rbln0")
    assert reading.code is None and "cannot read" in reading.reason


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_status_permission_denied_is_unreadable(tmp_path: Path) -> None:
    write_status(tmp_path, "rbln0", "0").chmod(0)
    assert read_status(tmp_path, "rbln0").code is None


def test_path_like_name_is_refused_before_any_read(tmp_path: Path) -> None:
    write_status(tmp_path, "x", "0")
    reading = read_status(tmp_path / "class" / "rebellions" / "a", "../x")
    assert reading.code is None and "invalid device name" in reading.reason


# --------------------------------------------------------------------- PCI path
@pytest.fixture(params=["kernel", "realpath"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every PCI-path case runs with the O_PATH resolver and with the realpath fallback."""
    if request.param == "realpath":
        monkeypatch.setattr(sysfs_module, "_O_PATH", 0)
    return str(request.param)


CHAIN = ["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:05:00.0"]


def test_pci_path_is_the_chain_from_the_root(tmp_path: Path, resolver: str) -> None:
    add_pci_device(tmp_path, CHAIN)
    assert read_pci_path(tmp_path, "0000:05:00.0") == tuple(CHAIN)


def test_pci_path_accepts_uppercase_bus_id_and_returns_lowercase(
    tmp_path: Path, resolver: str
) -> None:
    add_pci_device(tmp_path, ["pci0000:a0", "0000:a0:01.0", "0000:af:00.0"])
    assert read_pci_path(tmp_path, "0000:AF:00.0") == ("pci0000:a0", "0000:a0:01.0", "0000:af:00.0")


def test_pci_path_missing_link_is_none(tmp_path: Path, resolver: str) -> None:
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


def test_pci_path_dangling_link_is_none(tmp_path: Path, resolver: str) -> None:
    link_dir = tmp_path / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True)
    (link_dir / "0000:05:00.0").symlink_to("../../../devices/pci0000:00/0000:05:00.0")
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


def test_pci_path_to_a_directory_with_another_name_is_none(tmp_path: Path, resolver: str) -> None:
    target = add_pci_device(tmp_path, ["pci0000:00", "0000:00:01.0", "0000:06:00.0"])
    (tmp_path / "bus" / "pci" / "devices" / "0000:05:00.0").symlink_to(target)
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


def test_pci_path_without_a_root_segment_is_none(tmp_path: Path, resolver: str) -> None:
    add_pci_device(tmp_path, ["platform", "0000:00:01.0", "0000:05:00.0"])
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


def test_pci_path_with_a_non_bdf_segment_is_none(tmp_path: Path, resolver: str) -> None:
    add_pci_device(tmp_path, ["pci0000:00", "0000:00:01.0", "virtual-bridge", "0000:05:00.0"])
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


def test_pci_path_of_a_regular_file_is_none(tmp_path: Path, resolver: str) -> None:
    link_dir = tmp_path / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True)
    (link_dir / "0000:05:00.0").write_text("")
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


def test_pci_path_of_an_invalid_bus_id_is_none(tmp_path: Path, resolver: str) -> None:
    assert read_pci_path(tmp_path, "../../etc") is None


def test_pci_symlink_loop_is_none(tmp_path: Path, resolver: str) -> None:
    link_dir = tmp_path / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True)
    (link_dir / "0000:05:00.0").symlink_to("0000:05:00.0")
    assert read_pci_path(tmp_path, "0000:05:00.0") is None


# --------------------------------------------------------------------- SR-IOV
def make_partitioned(root: Path, numvfs: str | None = "4", vfs: int = 4) -> None:
    pf = add_pci_device(root, ["pci0000:16", "0000:16:01.0", "0000:17:00.0"])
    if numvfs is not None:
        (pf / "sriov_numvfs").write_text(numvfs + "\n")
    for k in range(1, vfs + 1):
        vf = add_pci_device(root, ["pci0000:16", "0000:16:01.0", f"0000:17:00.{k}"])
        (vf / "physfn").symlink_to("../0000:17:00.0")


def test_plain_pf_without_sriov_file_is_not_partitioned(tmp_path: Path) -> None:
    add_pci_device(tmp_path, CHAIN)
    assert read_sriov(tmp_path, "0000:05:00.0") == SriovFacts()


def test_pf_with_zero_vfs(tmp_path: Path) -> None:
    (add_pci_device(tmp_path, CHAIN) / "sriov_numvfs").write_text("0\n")
    assert read_sriov(tmp_path, "0000:05:00.0") == SriovFacts(vf_count=0)


def test_pf_hosting_vfs_reports_its_own_count(tmp_path: Path) -> None:
    make_partitioned(tmp_path, "4")
    assert read_sriov(tmp_path, "0000:17:00.0") == SriovFacts(vf_count=4)


@pytest.mark.parametrize("count", ["1", "4", "2"])
def test_vf_reports_parent_and_parent_count(tmp_path: Path, count: str) -> None:
    make_partitioned(tmp_path, count)
    assert read_sriov(tmp_path, "0000:17:00.2") == SriovFacts("0000:17:00.0", int(count))


def test_vf_with_missing_parent_count_is_indeterminate(tmp_path: Path) -> None:
    make_partitioned(tmp_path, None)
    facts = read_sriov(tmp_path, "0000:17:00.1")
    assert facts.parent_bus_id == "0000:17:00.0"
    assert "does not exist" in facts.error


@pytest.mark.parametrize("content", ["four", "", "-1", "1.0", "9" * 80])
def test_vf_with_malformed_parent_count_is_indeterminate(tmp_path: Path, content: str) -> None:
    make_partitioned(tmp_path, content)
    assert read_sriov(tmp_path, "0000:17:00.1").error.startswith("malformed")


def test_pf_with_malformed_own_count_is_indeterminate(tmp_path: Path) -> None:
    (add_pci_device(tmp_path, CHAIN) / "sriov_numvfs").write_text("x")
    assert read_sriov(tmp_path, "0000:05:00.0").error.startswith("malformed")


def test_unreadable_count_is_indeterminate(tmp_path: Path) -> None:
    # A directory in place of the attribute gives a real read error (EISDIR), even as root.
    (add_pci_device(tmp_path, CHAIN) / "sriov_numvfs").mkdir()
    assert read_sriov(tmp_path, "0000:05:00.0").error.startswith("cannot read")


def test_physfn_pointing_at_garbage_is_indeterminate(tmp_path: Path) -> None:
    vf = add_pci_device(tmp_path, ["pci0000:16", "0000:16:01.0", "0000:17:00.1"])
    (vf / "physfn").symlink_to("../not-a-device")
    assert "not a PCI device" in read_sriov(tmp_path, "0000:17:00.1").error


def test_physfn_that_is_not_a_symlink_is_indeterminate(tmp_path: Path) -> None:
    vf = add_pci_device(tmp_path, ["pci0000:16", "0000:16:01.0", "0000:17:00.1"])
    (vf / "physfn").mkdir()
    assert read_sriov(tmp_path, "0000:17:00.1").error


def test_device_facts_combine_sriov_and_path(tmp_path: Path) -> None:
    make_partitioned(tmp_path, "1", vfs=1)
    facts = read_device_facts(tmp_path, "0000:17:00.1")
    assert facts.sriov == SriovFacts("0000:17:00.0", 1)
    assert facts.pci_path == ("pci0000:16", "0000:16:01.0", "0000:17:00.1")
