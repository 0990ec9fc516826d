"""A hostile or careless host, through the real daemon: what sits where the daemon's own
files belong (symlinks, stray files, hard links) is never followed or written, and the
kubelet's directory deleted under a running daemon never makes two instances ready."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from rbln_device_plugin.host.ownfiles import MOVED_ASIDE_MSG
from rbln_device_plugin.kubelet.plugin import FOREIGN_REMOVED_MSG
from rbln_device_plugin.model.resources import socket_name
from rbln_device_plugin.runtime.instancelock import (
    ANCHOR_NAME,
    LEGACY_LOCK_NAME,
    LOCK_DIR,
    LOCK_NAME,
    UNUSABLE_DIR_MSG,
    USABLE_AGAIN_MSG,
)
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from .daemon_process import DaemonProcess
from .fault_helpers import NPU, VF1, VF4, allocate_direct, launch
from .metrics_helpers import P, Samples, metrics_port, scrape_until, value
from .probes import health, health_port
from .test_inspect_cli import device, report
from .test_tracing import receiver

HEALTH = ["--healthcheck-port", "0"]
VICTIM_TEXT = "".join(f"line {n}: precious\n" for n in range(10))
WAITING = (
    "Another rbln-device-plugin instance serves this kubelet directory; waiting for it to exit"
)
RELOCKED = "Instance lock file was deleted or replaced; locked it again"


def _victim(root: Path) -> Path:
    victim = root / "victim"
    victim.write_text(VICTIM_TEXT)
    victim.chmod(0o600)
    return victim


def _assert_untouched(victim: Path) -> None:
    assert victim.read_text() == VICTIM_TEXT
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def _moved(daemon: DaemonProcess, path: Path) -> dict[str, object]:
    (record,) = daemon.find(MOVED_ASIDE_MSG, path=str(path))
    assert record["level"] == "warn"
    return record


async def test_a_symlinked_lock_file_is_moved_aside_never_written_through() -> None:
    """The daemon's own lock files; a symlink at the path --rsd-lock-path names is refused
    at start instead (below)."""
    victims: list[Path] = []

    def plant(node: SimNode) -> None:
        victims.append(_victim(node.root))
        (node.kubelet_dir / LOCK_DIR).mkdir(mode=0o750)
        for link in (node.kubelet_dir / LOCK_DIR / LOCK_NAME, node.kubelet_dir / LEGACY_LOCK_NAME):
            link.symlink_to(victims[0])
        node.rsd_lock_path.parent.mkdir(parents=True, exist_ok=True)
        (node.rsd_lock_path.parent / ANCHOR_NAME).symlink_to(victims[0])

    async with launch("rebel-4", before_start=plant) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.kubelet.allocate(NPU, [["rbln0"]])  # takes the RSD lock too
        _assert_untouched(victims[0])
        for path in (
            h.node.kubelet_dir / LOCK_DIR / LOCK_NAME,
            h.node.kubelet_dir / LEGACY_LOCK_NAME,
            h.node.rsd_lock_path.parent / ANCHOR_NAME,
        ):
            record = _moved(h.daemon, path)
            assert "symbolic link" in str(record["problem"])
            assert os.readlink(str(record["movedTo"])) == str(victims[0])
            assert stat.S_ISREG(path.lstat().st_mode)  # the daemon's own file now
        assert h.daemon.stop() == 0
        _assert_untouched(victims[0])


async def test_a_symlinked_lock_directory_creates_nothing_where_it_points() -> None:
    elsewhere: list[Path] = []

    def plant(node: SimNode) -> None:
        outside = node.root / "elsewhere"
        outside.mkdir()
        elsewhere.append(outside)
        (node.kubelet_dir / LOCK_DIR).symlink_to(outside, target_is_directory=True)

    async with launch("rebel-4", before_start=plant) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        assert list(elsewhere[0].iterdir()) == []
        record = _moved(h.daemon, h.node.kubelet_dir / LOCK_DIR)
        assert "symbolic link" in str(record["problem"])
        assert (h.node.kubelet_dir / LOCK_DIR).lstat().st_mode & stat.S_IFDIR
        assert not (h.node.kubelet_dir / LOCK_DIR).is_symlink()
        assert h.daemon.stop() == 0
        assert list(elsewhere[0].iterdir()) == []


async def test_a_hard_link_in_place_of_the_lock_file_is_not_truncated() -> None:
    victims: list[Path] = []

    def plant(node: SimNode) -> None:
        victims.append(_victim(node.kubelet_dir.parent))
        os.link(victims[0], node.kubelet_dir / LEGACY_LOCK_NAME)

    async with launch("rebel-4", before_start=plant) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        record = _moved(h.daemon, h.node.kubelet_dir / LEGACY_LOCK_NAME)
        assert "hard links" in str(record["problem"])
        _assert_untouched(victims[0])


async def test_a_stray_file_where_the_lock_directory_belongs_does_not_stop_the_node() -> None:
    def plant(node: SimNode) -> None:
        (node.kubelet_dir / LOCK_DIR).write_text("left by an old script\n")

    async with launch("rebel-4", before_start=plant) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        record = _moved(h.daemon, h.node.kubelet_dir / LOCK_DIR)
        assert "regular file, not a directory" in str(record["problem"])
        moved = Path(str(record["movedTo"]))
        assert moved.parent == h.node.kubelet_dir
        assert moved.read_text() == "left by an old script\n"
        assert str(moved) in str(record["hint"])
        assert (h.node.kubelet_dir / LOCK_DIR / LOCK_NAME).is_file()
        assert not [r for r in h.daemon.records if r.get("level") == "error"]


@pytest.mark.parametrize(
    ("plant", "problem"),
    [
        pytest.param(lambda p: (p.mkdir(), (p / "victim").write_text(VICTIM_TEXT)),
                     "is a directory; name a file inside it, such as", id="directory"),
        pytest.param(lambda p: p.symlink_to(p.parent.parent, target_is_directory=True),
                     "is a symbolic link (to ", id="symlink"),
        pytest.param(lambda p: os.mkfifo(p), "is a named pipe, not a regular file", id="fifo"),
    ],
)  # fmt: skip
def test_an_rsd_lock_path_that_is_a_directory_a_symlink_or_a_pipe_is_refused_at_start(
    short_tmp: Path, plant: Callable[[Path], object], problem: str
) -> None:
    """A directory named by --rsd-lock-path was renamed to ``...moved-aside.<secs>`` at the
    first Allocate, a lock file put in its place. Now a usage error at start (exit 2), and
    nothing there or beside it is touched."""
    host = short_tmp / "host"
    host.mkdir()
    target = host / "rbln"
    plant(target)
    before = sorted(host.iterdir())
    daemon = DaemonProcess([
        "--healthcheck-port", "-1", "--kubelet-device-plugin-path", str(short_tmp / "kubelet"),
        "--rsd-lock-path", str(target),
    ])  # fmt: skip
    assert daemon.proc.wait(30) == 2
    daemon.stop()
    (record,) = daemon.find("Invalid command line")
    assert str(record["err"]).startswith(f"--rsd-lock-path (command line): {target} {problem}")
    assert f"rbln-device-plugin: error: --rsd-lock-path (command line): {target}" in daemon.stderr
    assert sorted(host.iterdir()) == before
    if target.is_dir() and not target.is_symlink():
        assert (target / "victim").read_text() == VICTIM_TEXT


async def test_a_directory_made_at_the_rsd_lock_path_after_start_is_never_renamed() -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        lock = h.node.rsd_lock_path
        lock.mkdir()
        (lock / "victim").write_text(VICTIM_TEXT)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await allocate_direct(h.node, NPU, [["rbln0"]], deadline=10)
        assert f"{lock} is a directory, not a regular file" in str(refused.value.details())
        assert "--rsd-lock-path (RSD_LOCK_PATH)" in str(refused.value.details())
        assert (lock / "victim").read_text() == VICTIM_TEXT
        assert not list(lock.parent.glob("*.moved-aside.*"))
        assert not h.daemon.find(MOVED_ASIDE_MSG)
        shutil.rmtree(lock)  # the operator's fix: the next Allocate makes the lock file
        await h.kubelet.allocate(NPU, [["rbln0"]])
        assert lock.is_file()
        assert h.daemon.stop() == 0


async def test_a_dangling_symlink_rsd_lock_directory_is_said_and_shown_by_probe_and_metric() -> (
    None
):
    """The directory of --rsd-lock-path (where the instance lock lies) a symlink to nowhere:
    the daemon waited for ever, alive and not ready, with no record. Now one error record,
    liveness NOT_SERVING (the chart's probe restarts the pod) and the instance state say
    why, until the link leads somewhere."""
    targets: list[Path] = []

    def plant(node: SimNode) -> None:
        run = node.rsd_lock_path.parent
        shutil.rmtree(run)
        targets.append(node.root / "driver-run")
        run.symlink_to(targets[0], target_is_directory=True)

    async with launch("rebel-4", extra_args=[*HEALTH, "--metrics-port", "0"],
                      before_start=plant) as h:  # fmt: skip
        run = h.node.rsd_lock_path.parent
        (said,) = await h.daemon.await_log(UNUSABLE_DIR_MSG)
        assert said["level"] == "error" and said["directory"] == str(run)
        assert said["reason"] == (
            f"{run} is a symbolic link to {str(targets[0])!r}, which does not exist"
        )
        port, metrics = await health_port(h.daemon), await metrics_port(h.daemon)
        assert await health(port, "liveness") == "NOT_SERVING"
        assert await health(port, "readiness") == "NOT_SERVING"
        samples = await scrape_until(metrics, lambda s: instance_state(s) == "lock_dir_unusable")
        assert value(samples, "instance_state", state="waiting_for_lock") == 0
        await asyncio.sleep(1.5)  # three retries of the lock: still one record
        assert len(h.daemon.find(UNUSABLE_DIR_MSG)) == 1
        assert not targets[0].exists()  # nothing made through the link
        targets[0].mkdir()  # the link leads somewhere now
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.daemon.await_log(USABLE_AGAIN_MSG, directory=str(run))
        assert await health(port, "liveness") == "SERVING"
        await scrape_until(metrics, lambda s: instance_state(s) == "serving")
        assert (targets[0] / ANCHOR_NAME).is_file()
        assert h.daemon.stop() == 0


def instance_state(samples: Samples) -> str | None:
    current = [dict(k[1])["state"] for k, v in samples.items()
               if k[0] == P + "instance_state" and v == 1]  # fmt: skip
    return current[0] if len(current) == 1 else None


SERVER_FAILED = "Cannot start device plugin server; retrying next scan"


async def test_what_sits_at_a_plugin_socket_path_is_removed_as_itself_or_named() -> None:
    """A stale socket (NPU) and a symlink (VF1) go as the entries themselves; a directory
    (VF4, what a hostPath DirectoryOrCreate makes) stays, is named once with what to do,
    and the resource starts the scan after the operator removed it."""
    victims: list[Path] = []

    def plant(node: SimNode) -> None:
        victims.append(_victim(node.root))
        bind_stale_socket(node.kubelet_dir / socket_name(NPU))
        (node.kubelet_dir / socket_name(VF1)).symlink_to(victims[0])
        (node.kubelet_dir / socket_name(VF4)).mkdir()

    async with launch("rebel-sriov", before_start=plant) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 2)
        await h.kubelet.wait_for(VF1, lambda v: len(v.devices) == 1)
        _assert_untouched(victims[0])
        (link,) = h.daemon.find(FOREIGN_REMOVED_MSG)  # none for the stale socket
        assert link["level"] == "warn" and link["kind"] == "symbolic link"
        assert link["linkTarget"] == str(victims[0])
        assert link["socketPath"] == str(h.node.kubelet_dir / socket_name(VF1))
        directory = h.node.kubelet_dir / socket_name(VF4)
        (refused,) = await h.daemon.await_log(SERVER_FAILED, resourceName=VF4)
        assert refused["level"] == "error" and refused["socketPath"] == str(directory)
        assert f"{directory} is a directory, not a socket" in str(refused["err"])
        assert f"remove the directory {directory}" in str(refused["err"])
        await h.daemon.await_log("Reconciled device inventory", count=4)
        # Said once, however many scans retried; the daemon serves the rest meanwhile.
        assert len(h.daemon.find(SERVER_FAILED, level="error")) == 1
        assert directory.is_dir() and h.kubelet.view(VF4) is None
        directory.rmdir()
        (started,) = await h.daemon.await_log("Device plugin server started", resourceName=VF4)
        assert int(started["failedAttempts"]) >= 2
        await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)
        assert h.sockets() == sorted(["kubelet.sock", *(socket_name(r) for r in (NPU, VF1, VF4))])
        assert h.daemon.stop() == 0
        _assert_untouched(victims[0])
        assert h.sockets() == ["kubelet.sock"]


def bind_stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


async def test_a_kubelet_directory_deleted_and_recreated_never_makes_two_instances_ready() -> None:
    # A slow schedule: the holder makes its kubelet-directory locks again only at its next
    # scan, which is when an instance waiting on those files alone would have taken over.
    async with launch("rebel-4", interval="3s", extra_args=HEALTH) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        first_port = await health_port(h.daemon)
        second = DaemonProcess([*h.node.daemon_args("3s"), *HEALTH])
        try:
            await second.await_log(WAITING)
            second_port = await health_port(second)
            assert await health(first_port, "readiness") == "SERVING"
            samples: list[tuple[str, str]] = []
            await h.kubelet.stop()
            shutil.rmtree(h.node.kubelet_dir)
            h.node.kubelet_dir.mkdir()
            relocks_before = len(h.daemon.find(RELOCKED))
            # Sample both every 20 ms until the holder has locked the new files and a
            # waiter's retry (0.5 s) and first scan have had time to follow.
            after_relock = 0
            while after_relock < 75:
                pair = await asyncio.gather(
                    health(first_port, "readiness"), health(second_port, "readiness")
                )
                samples.append((pair[0], pair[1]))
                if len(h.daemon.find(RELOCKED)) > relocks_before or after_relock:
                    after_relock += 1
                assert len(samples) < 2000, "the holder never locked the new files"
                await asyncio.sleep(0.02)
            assert ("SERVING", "SERVING") not in samples
            assert not second.find("Instance lock acquired; starting")
            assert h.daemon.proc.poll() is None
            assert (h.node.kubelet_dir / LOCK_DIR / LOCK_NAME).is_file()
        finally:
            second.kill()


SYSFS_MISSING = "sysfs does not show the host's PCI devices; VFs and REBEL PFs are not advertised"


async def test_a_missing_sysfs_root_never_advertises_a_vf_or_an_unknown_pf_as_a_whole_npu() -> None:
    async with launch("rebel-sriov", extra_args=["--sysfs-root", "/nonexistent"]) as h:
        (record,) = await h.daemon.await_log(SYSFS_MISSING)
        assert record["level"] == "error"
        assert record["path"] == "/nonexistent/bus/pci/devices"
        assert "/sys" in str(record["hint"])
        skipped = set(record["skippedDevices"])
        assert {"rbln0-0", "rbln0-3", "rbln1-0", "rbln1", "rbln2", "rbln3"} <= skipped
        # Several scans later: still one record, and nothing offered under any resource.
        await h.daemon.await_log("Reconciled device inventory", count=4)
        assert len(h.daemon.find(SYSFS_MISSING)) == 1
        assert not h.daemon.find("Skipping device that sysfs does not show")
        assert not h.daemon.find("Registered device plugin with kubelet")
        assert h.sockets() == ["kubelet.sock"]
        assert h.daemon.stop() == 0


async def test_a_missing_sysfs_root_on_an_atom_node_still_offers_its_whole_npus() -> None:
    async with launch("atom-max-8", extra_args=["--sysfs-root", "/nonexistent"]) as h:
        view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        assert {d.health for d in view.devices} == {"Healthy"}  # the spec's compatibility default
        (record,) = await h.daemon.await_log(SYSFS_MISSING)
        assert record["skippedDevices"] == []


def test_inspect_reports_a_missing_sysfs_root_as_an_error() -> None:
    root = short_tempdir()
    try:
        node = materialize(preset("rebel-sriov"), root)
        document, code = report(node, "--sysfs-root", "/nonexistent")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert code == 1
    (finding,) = [f for f in document["problems"] if f["kind"] == "sysfs-missing"]
    assert finding["severity"] == "error" and finding["message"] == SYSFS_MISSING
    assert finding["details"]["path"] == "/nonexistent/bus/pci/devices"
    assert device(document, "rbln0-0")["resourceName"] is None
    assert device(document, "rbln2")["resourceName"] is None


# ------------------------------------------------------------------------------ settings
IGNORED = "Setting ignored; using its default"


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"METRICS_PORT": "\uff18\uff10"}, [], "METRICS_PORT (environment"),
        ({"METRICS_PORT": " 9464"}, [], "METRICS_PORT (environment"),
        ({"DEVICE_SCAN_INTERVAL": "\uff15s"}, [], "DEVICE_SCAN_INTERVAL (environment"),
        ({"DEVICE_SCAN_INTERVAL": "5s "}, [], "DEVICE_SCAN_INTERVAL (environment"),
        ({"SCAN_STALL_LIMIT": "1ns"}, [], "SCAN_STALL_LIMIT (environment"),
        ({"METRICS_EXPORT_INTERVAL": "1ns"}, [], "METRICS_EXPORT_INTERVAL (environment"),
        ({}, ["--rsd-lock-path", "run/rsd.lock"], "--rsd-lock-path (command line)"),
        ({}, ["--dev-root", "dev"], "--dev-root (command line)"),
    ],
)
def test_settings_go_refuses_stop_the_daemon_with_a_usage_error(
    env: dict[str, str], args: list[str], named: str
) -> None:
    daemon = DaemonProcess(["--healthcheck-port", "-1", *args], env=env)
    assert daemon.proc.wait(30) == 2
    daemon.stop()  # collects the rest of its output
    (record,) = daemon.find("Invalid command line")
    assert str(record["err"]).startswith(named), record
    assert f"rbln-device-plugin: error: {named}" in daemon.stderr


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"OTEL_TRACES_EXPORTER": ""}, None),
        ({"OTEL_TRACES_EXPORTER": "console"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER"),
        ({"METRICS_PORT": "tcp://10.0.0.1:9464"}, "METRICS_PORT"),
    ],
)
async def test_settings_opentelemetry_and_kubernetes_define_are_never_a_crash_loop(
    env: dict[str, str], warned: str | None
) -> None:
    async with (
        receiver() as (collector, port),
        launch("rebel-4", env=env, extra_args=["--otlp-endpoint", f"127.0.0.1:{port}"]) as h,
    ):
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        ignored = h.daemon.find(IGNORED)
        if warned is None:
            assert ignored == []
        else:
            (record,) = ignored
            assert record["level"] == "warn" and str(record["setting"]).startswith(warned)
            assert record["value"] == env[warned]
        # Traces still go to the endpoint, as with the variable unset.
        await h.kubelet.allocate(NPU, [["rbln0"]])
        await collector.wait_spans(1)
        if "METRICS_PORT" in env:
            assert not h.daemon.find("Started metrics endpoint")
        assert h.daemon.stop() == 0
