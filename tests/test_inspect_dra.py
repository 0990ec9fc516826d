"""``rbln-device-plugin inspect``'s mode part against simulated nodes: the configured mode,
the sockets of either mode found on the node (by lstat, a symlink never followed), and in
dra mode the ResourceSlice devices the daemon's slice builder gives for the scan and the
claims its checkpoint holds.

The runs are those of ``test_inspect_cli`` (the CLI's own entry, in-process, each JSON
report validated against the shipped schema; one real process for the exit status and
streams); the checkpoint and the claims' CDI specs are written with the daemon's own
encoder and spec builder, where the daemon keeps them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rbln_device_plugin.dra import cdispec, names, slices
from rbln_device_plugin.dra import checkpoint as cp
from rbln_device_plugin.model import resources
from rbln_device_plugin_sim.node import SimNode

from .dra_scan import scanned
from .test_inspect_cli import AUDIT_HOOK, inspect, inspect_process, report, sim

NODE = "node-a"
UID = "9a3c1e7e-0f4b-4c1d-9a55-0c0ffee00001"
NPU_SOCKET = resources.NPU.socket_name


def registry(node: SimNode) -> Path:
    return node.root / "kubelet-plugins-registry"


def plugin_dir(node: SimNode) -> Path:
    return node.root / "kubelet-plugins" / names.DRIVER_NAME


def dra_flags(node: SimNode) -> list[str]:
    """The dra mode's flags as the chart gives them (beside the sim's host-path flags)."""
    return [
        "--mode=dra",
        "--node-name", NODE,
        "--kubelet-plugins-registry-path", str(registry(node)),
        "--kubelet-plugins-path", str(plugin_dir(node).parent),
    ]  # fmt: skip


@contextmanager
def listening(path: Path) -> Iterator[None]:
    """A unix socket bound at ``path``, as a plugin of either mode leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen(1)
        yield
    finally:
        server.close()
        path.unlink(missing_ok=True)


def prepared(node: SimNode, *devices: str, uid: str = UID, spec: bool = True) -> None:
    """The daemon's record of one prepared claim (and, with ``spec``, its CDI spec)."""
    entry = cp.ClaimEntry(
        "default",
        "claim-a",
        cp.COMPLETED,
        tuple(
            cp.PreparedDevice(
                "npu", NODE, device, tuple(cdispec.cdi_device_ids(uid, device, i == 0))
            )
            for i, device in enumerate(devices)
        ),
    )
    plugin_dir(node).mkdir(parents=True, exist_ok=True)
    checkpoint = cp.Checkpoint({uid: entry})
    (plugin_dir(node) / names.CHECKPOINT_FILE).write_bytes(cp.encode(checkpoint))
    if spec:
        data = cdispec.claim_spec(uid, devices, node.dev_root, node.dev_root / "rsd1")
        (node.cdi_root / names.spec_file_name(uid)).write_bytes(data)


def kinds(document: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(p["severity"], p["kind"], p["device"]) for p in document["problems"]]


def found(document: dict[str, Any]) -> dict[str, str]:
    return {s["path"]: s["found"] for s in document["mode"]["sockets"]}


# ----------------------------------------------------------------------------- the mode


def test_device_plugin_mode_names_the_mode_and_nothing_of_dra() -> None:
    with sim("rebel-4") as node:
        done = inspect(node)
        document, code = report(node)
    assert done.returncode == code == 0
    assert done.stdout.splitlines()[3] == "mode:     device-plugin (no socket of it here)"
    mode = document["mode"]
    assert mode["configured"] == "device-plugin"
    assert (mode["published"], mode["checkpoint"]) == (None, None)
    # The daemon's default DRA paths: looked at, absent; nothing of dra in the table.
    assert [(s["role"], s["found"]) for s in mode["sockets"]] == [
        ("registration", "absent"),
        ("service", "absent"),
    ]
    assert "ResourceSlice" not in done.stdout and "Prepared claims" not in done.stdout


async def daemon_pool(layout: str) -> slices.Pool:
    """The layout scanned by the daemon's DRA front end, through its slice builder."""
    async with scanned(layout) as daemon:
        return slices.build_pool(NODE, daemon.entries())


def test_dra_mode_lists_the_devices_the_slices_code_publishes() -> None:
    with sim("rebel-sriov") as node:
        done = inspect(node, *dra_flags(node))
        document, code = report(node, *dra_flags(node))
    pool = asyncio.run(daemon_pool("rebel-sriov"))

    def attr(device: slices.DeviceJSON, name: str) -> Any:
        value = device["attributes"].get(name)
        return None if value is None else next(iter(value.values()))

    expected = [
        {
            "name": d["name"],
            "slice": f"{NODE}-{names.DRIVER_NAME}-0",
            "deviceType": attr(d, slices.ATTR_DEVICE_TYPE),
            "pciBusID": attr(d, slices.ATTR_PCI_BUS_ID),
            "pcieRoot": attr(d, slices.ATTR_PCIE_ROOT),
            "numaNode": attr(d, slices.ATTR_NUMA),
            "healthy": attr(d, slices.ATTR_HEALTHY),
            "status": attr(d, slices.ATTR_STATUS),
        }
        for d in pool.slices[0].devices
    ]
    assert done.returncode == code == 0, done.stdout
    published = document["mode"]["published"]
    assert published["devices"] == expected
    assert (published["pool"], published["slices"]) == (NODE, list(pool.names))
    # VFs are devices, the PFs hosting them never are.
    names_listed = [d["name"] for d in published["devices"]]
    assert names_listed == ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3", "rbln1-0", "rbln2", "rbln3"]
    assert {d["deviceType"] for d in published["devices"]} == {"npu", "npu-vf1", "npu-vf4"}
    slice_rows = done.stdout.split("ResourceSlice devices")[1].splitlines()
    assert "rbln0-2  npu-vf4      0000:17:00.3  pci0000:16  0     true     READY" in slice_rows
    assert not [line for line in slice_rows if line.split()[:1] in (["rbln0"], ["rbln1"])]
    assert document["mode"]["checkpoint"] == {
        "path": str(plugin_dir(node) / names.CHECKPOINT_FILE),
        "present": False,
        "error": None,
        "claims": [],
    }
    assert "Prepared claims: none (no checkpoint at" in done.stdout


# ----------------------------------------------------------------------------- sockets


def test_a_socket_of_the_other_mode_is_a_warning() -> None:
    with sim("rebel-4") as node:
        reg = registry(node) / names.REGISTRATION_SOCKET
        with listening(reg):
            # The device-plugin mode with the dra mode's registration socket on the node.
            document, code = report(node, "--kubelet-plugins-registry-path", str(registry(node)))
            done = inspect(node, "--kubelet-plugins-registry-path", str(registry(node)))
        assert code == 0  # a warning: the configured mode itself works
        assert kinds(document) == [("warning", "other-mode-socket", None)]
        assert document["problems"][0]["details"] == {"mode": "dra", "paths": [str(reg)]}
        assert found(document)[str(reg)] == "socket"
        assert "dra socket here too (see problems)" in done.stdout.splitlines()[3]
        # The dra mode with a device plugin's socket in the kubelet's directory.
        with listening(node.kubelet_dir / NPU_SOCKET):
            document, code = report(node, *dra_flags(node))
        assert code == 0
        assert kinds(document) == [("warning", "other-mode-socket", None)]
        assert document["problems"][0]["details"]["paths"] == [str(node.kubelet_dir / NPU_SOCKET)]


def test_sockets_are_looked_at_never_followed() -> None:
    with sim("rebel-4") as node:
        elsewhere = node.root / "elsewhere.sock"
        service = plugin_dir(node) / names.SERVICE_SOCKET
        plugin_dir(node).mkdir(parents=True)
        service.symlink_to(elsewhere)
        with listening(elsewhere), listening(node.kubelet_dir / NPU_SOCKET):
            document, code = report(node, *dra_flags(node))
            # Its own mode's socket is no finding; a symlink to a socket is not a socket.
            document_dp, code_dp = report(node)
    assert found(document)[str(service)] == "symlink"
    assert kinds(document) == [("warning", "other-mode-socket", None)]
    assert code == 0
    assert found(document_dp)[str(node.kubelet_dir / NPU_SOCKET)] == "socket"
    assert (kinds(document_dp), code_dp) == ([], 0)


# ----------------------------------------------------------------------------- claims


def test_a_prepared_claim_is_shown_with_its_devices_and_cdi_spec() -> None:
    with sim("rebel-4") as node:
        prepared(node, "rbln1", "rbln2")
        done = inspect(node, *dra_flags(node))
        document, code = report(node, *dra_flags(node))
    assert done.returncode == code == 0, done.stdout
    (claim,) = document["mode"]["checkpoint"]["claims"]
    assert (claim["uid"], claim["namespace"], claim["name"]) == (UID, "default", "claim-a")
    assert claim["state"] == "PrepareCompleted"
    assert claim["cdiSpecFile"] == str(node.cdi_root / names.spec_file_name(UID))
    assert claim["cdiSpecFound"] == "file"
    assert [(d["device"], d["published"], d["healthy"]) for d in claim["devices"]] == [
        ("rbln1", True, True),
        ("rbln2", True, True),
    ]
    assert claim["devices"][0]["cdiDeviceIDs"] == [
        names.cdi_device_id(UID, "rbln1"),
        names.TOOLKIT_DEVICE,
    ]
    table = done.stdout.split("Prepared claims (1, checkpoint ")[1].splitlines()
    assert table[2].split() == ["default/claim-a", UID, "PrepareCompleted", "rbln1,", "rbln2",
                                "present"]  # fmt: skip


def test_a_claim_whose_device_faulted_or_vanished_or_lost_its_spec_is_a_finding() -> None:
    with sim("rebel-4") as node:
        prepared(node, "rbln2")
        node.set_status("rbln2", 4)
        document, code = report(node, *dra_flags(node))
        assert code == 1
        assert kinds(document) == [
            ("error", "unhealthy", "rbln2"),
            ("warning", "claim-device-unhealthy", "rbln2"),
        ]
        problem = document["problems"][1]
        assert problem["details"] == {"claim": "default/claim-a", "uid": UID, "status": "FAULT"}
        (claim,) = document["mode"]["checkpoint"]["claims"]
        assert claim["devices"][0]["healthy"] is False
        # The device gone from the node and the claim's CDI spec removed.
        node.remove_device("rbln2")
        (node.cdi_root / names.spec_file_name(UID)).unlink()
        document, code = report(node, *dra_flags(node))
    assert code == 1
    assert kinds(document) == [
        ("error", "claim-device-not-published", "rbln2"),
        ("error", "claim-cdi-spec-missing", None),
    ]
    assert document["problems"][1]["details"]["found"] == "absent"
    assert "rbln2" not in [d["name"] for d in document["mode"]["published"]["devices"]]


def test_a_corrupt_checkpoint_is_a_finding_and_exit_1_not_a_crash() -> None:
    with sim("rebel-4") as node:
        prepared(node, "rbln1")
        path = plugin_dir(node) / names.CHECKPOINT_FILE
        document = json.loads(path.read_bytes())
        document["claims"][UID]["devices"][0]["device"] = "rbln3"  # changed behind its back
        path.write_text(json.dumps(document))
        done = inspect_process(node, *dra_flags(node))
        report_doc, code = report(node, *dra_flags(node))
        # A symlink in its place is not followed: the daemon's reader refuses it too.
        os.replace(path, node.root / "checkpoint.json")
        path.symlink_to(node.root / "checkpoint.json")
        linked, linked_code = report(node, *dra_flags(node))
    assert (done.returncode, done.stderr) == (1, "")
    assert "Traceback" not in done.stdout
    assert "Prepared claims: checkpoint" in done.stdout and "is unusable" in done.stdout
    assert code == linked_code == 1
    assert kinds(report_doc) == [("error", "checkpoint-unusable", None)]
    assert "checksum mismatch" in report_doc["problems"][0]["details"]["err"]
    assert report_doc["mode"]["checkpoint"]["claims"] == []
    assert kinds(linked) == [("error", "checkpoint-unusable", None)]
    assert "symlink" in linked["problems"][0]["details"]["err"]


def test_dra_mode_inspect_writes_nothing_and_opens_no_socket() -> None:
    """The audit of test_inspect_cli in dra mode, with a checkpoint, a claim's CDI spec
    and a live registration socket on the node: nothing written or changed, no socket
    bound or connected to, the node's files the same."""
    site = Path(tempfile.mkdtemp(prefix="rbln-audit-", dir="/tmp"))
    (site / "sitecustomize.py").write_text(AUDIT_HOOK)
    audit_log = site / "audit.jsonl"
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": python_path, "RBLN_TEST_AUDIT_LOG": str(audit_log)}
    try:
        with sim("rebel-4") as node:
            prepared(node, "rbln1")
            reg = registry(node) / names.REGISTRATION_SOCKET
            with listening(reg):
                identity = reg.lstat().st_ino
                before = snapshot(node.root)
                done = inspect_process(node, *dra_flags(node), env=env)
                after = snapshot(node.root)
                assert reg.lstat().st_ino == identity
        events = [json.loads(line) for line in audit_log.read_text().splitlines()]
    finally:
        shutil.rmtree(site, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Prepared claims (1," in done.stdout
    assert after == before
    assert [e for e in events if e["event"] == "exit"] == [{"event": "exit", "grpc": []}]
    assert {e["path"] for e in events if e["event"] == "open-for-write"} <= {os.devnull}
    assert [e for e in events if e["event"].startswith(("os.", "shutil.", "fcntl."))] == []
    assert {e["event"] for e in events if e["event"].startswith("socket.")} <= {"socket.__new__"}


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """test_inspect_cli's snapshot (kind, mode, mtime, contents or link target of every
    entry), a socket by its lstat: it has no contents to read."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISSOCK(info.st_mode):
            out[str(path)] = ("socket", info.st_ino, info.st_mode, info.st_mtime_ns)
        elif stat.S_ISLNK(info.st_mode):
            out[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            out[str(path)] = ("dir", info.st_mode, info.st_mtime_ns)
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path)] = ("file", info.st_mode, info.st_mtime_ns, digest)
    return out
