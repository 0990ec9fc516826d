"""Stall isolation, through the real daemon: whatever hangs stays with the one device or
call that caused it, and the kubelet is never told something false.

Each test reproduces one way a production node freezes or misleads a daemon: a status
or SR-IOV file that blocks (a FIFO stands in for a wedged driver), a stdout nobody
reads, a kubelet that never answers Register, a foreign ListAndWatch client, a second
daemon on the same kubelet directory, a daemon killed in the middle of a group change,
a directory where a device node should be, a chmod of kubelet.sock, a umask of 000.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

import grpc
import pytest

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin.runtime.instancelock import (
    ANCHOR_NAME,
    LEGACY_LOCK_NAME,
    LOCK_DIR,
    LOCK_NAME,
)
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.state import Fault

from .daemon_process import DaemonProcess
from .fault_helpers import (
    NPU,
    groups_are_consistent,
    launch,
    next_reconcile,
    pid_alive,
    smi_calls,
    trace_smi,
    wait_until,
)
from .probes import health, health_port
from .simnode import rejected

HEALTH = ["--healthcheck-port", "0"]
F_SETPIPE_SZ = 1031
STALLED = "Host access did not finish in time; treating it as unreadable"


def make_fifo(path: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)


def release_fifo(path: Path) -> None:
    """Let a reader stuck in open() of the FIFO go (it then reads end-of-file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # nobody is reading it
    os.close(fd)


# ---------------------------------------------------------------- 1. blocking sysfs reads
async def test_a_blocking_status_read_stalls_only_its_device() -> None:
    async with launch("rebel-4", extra_args=HEALTH) as h:
        port = await health_port(h.daemon)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln1", 4)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln1") == "Unhealthy")
        status = h.node.status_path("rbln1")
        make_fifo(status)
        try:
            (warn,) = await h.daemon.await_log(STALLED, path=str(status))
            assert warn["level"] == "warn"
            # The daemon goes on: scans, the health probe, other devices, their changes.
            await next_reconcile(h.daemon)
            await next_reconcile(h.daemon)
            assert await health(port) == "SERVING"
            response = await h.kubelet.allocate(NPU, [["rbln0"]])
            assert len(response.container_responses) == 1
            h.node.set_status("rbln2", 4)
            await h.kubelet.wait_for(NPU, lambda v: v.health("rbln2") == "Unhealthy")
            # The stuck device stays Unhealthy (its last read was FAULT), and Allocate's own
            # check of it answers at once instead of hanging.
            view = h.kubelet.view(NPU)
            assert view is not None and view.health("rbln1") == "Unhealthy"
            message = await rejected(h, NPU, [["rbln1"]])
            assert "rbln1 is UNREADABLE (last read FAULT)" in message
            # One warn for the stuck file, however many scans ran meanwhile.
            assert len(h.daemon.find(STALLED, path=str(status))) == 1
            # SIGTERM is obeyed with the read still outstanding.
            started = time.monotonic()
            assert h.daemon.stop(signal.SIGTERM, timeout=10) == 0
            print(f"exit after SIGTERM with a stuck read: {time.monotonic() - started:.2f} s")
        finally:
            release_fifo(status)


class SlowStatusFiles:
    """Status files that answer every read, each after ``delay`` seconds (a FIFO whose
    writer waits before it writes): slow reads that always finish."""

    def __init__(self, paths: list[Path], delay: float) -> None:
        self.paths = paths
        self.delay = delay
        self.reads = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._serve, args=(p,), daemon=True) for p in paths
        ]

    def __enter__(self) -> SlowStatusFiles:
        for path in self.paths:
            make_fifo(path)
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for path in self.paths:  # a writer waiting in open() needs a reader to go on
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        for thread in self._threads:
            thread.join(5)

    def _serve(self, path: Path) -> None:
        while not self._stop.is_set():
            fd = os.open(path, os.O_WRONLY)  # until the daemon opens it for its read
            try:
                time.sleep(self.delay)
                with contextlib.suppress(BrokenPipeError):
                    os.write(fd, b"0\n")
                self.reads += 1
            finally:
                os.close(fd)


@pytest.mark.slow  # a busy loop per core for a few seconds
async def test_slow_status_reads_on_a_loaded_machine_are_not_stalls(loaded_machine: int) -> None:
    """Each read takes 0.4 s, a scan's batch of four 1.6 s: longer than the 1 s bound as a
    whole, never one read. With every core busy, no read is reported stalled."""
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        statuses = [h.node.status_path(f"rbln{i}") for i in range(4)]
        with SlowStatusFiles(statuses, delay=0.4) as slow:
            await next_reconcile(h.daemon)  # may have begun before the files turned slow
            scans = [await next_reconcile(h.daemon) for _ in range(3)]
            # A scan's one batch of status reads outlasts the 1 s bound as a whole (a read
            # can be a little shorter when its writer opened before the last reader left).
            assert max(scan["durationMs"] for scan in scans) >= 1000
            response = await h.kubelet.allocate(NPU, [["rbln0", "rbln1", "rbln2", "rbln3"]])
            assert len(response.container_responses) == 1
            assert slow.reads >= 4 * 4
        assert not h.daemon.find(STALLED), h.daemon.find(STALLED)
        assert not h.daemon.find("Cannot read device status")
        view = h.kubelet.view(NPU)
        assert view is not None and view.count("Healthy") == 4


async def test_a_blocking_sriov_file_skips_only_that_device() -> None:
    def wedge(node: object) -> None:
        from rbln_device_plugin_sim.node import SimNode

        assert isinstance(node, SimNode)
        bus_id = next(d.bus_id for d in node.layout.devices if d.name == "rbln3")
        make_fifo(node.pci_link(bus_id) / "sriov_numvfs")

    async with launch("rebel-4", extra_args=HEALTH, before_start=wedge) as h:
        port = await health_port(h.daemon)
        view = await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 3)
        assert sorted(view.ids) == ["rbln0", "rbln1", "rbln2"]
        (skipped,) = await h.daemon.await_log("Skipping device with indeterminate SR-IOV state")
        assert skipped["device"] == "rbln3" and "sriov_numvfs" in skipped["reason"]
        assert await health(port) == "SERVING"
        bus_id = next(d.bus_id for d in h.node.layout.devices if d.name == "rbln3")
        release_fifo(h.node.pci_link(bus_id) / "sriov_numvfs")


# ---------------------------------------------------------------- 2. blocked stdout
async def test_a_blocked_stdout_never_stops_the_daemon() -> None:
    async with launch("atom-max-8", extra_args=HEALTH) as h:
        port = await health_port(h.daemon)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        assert h.daemon.proc.stdout is not None
        fcntl.fcntl(h.daemon.proc.stdout.fileno(), F_SETPIPE_SZ, 4096)
        h.daemon.pause_reading()
        ids = [f"rbln{i}" for i in range(32)]
        # Far more debug records than a 4 KiB pipe and the log queue hold; every answer
        # still arrives.
        for round_ in range(3):
            answers = await asyncio.gather(
                *(h.kubelet.preferred(NPU, ids, [], 2) for _ in range(500))
            )
            assert all(len(a) == 2 for a in answers)
            assert await health(port) == "SERVING"
            response = await h.kubelet.allocate(NPU, [[ids[round_]]])
            assert len(response.container_responses) == 1
        h.daemon.resume_reading()
        (notice,) = await h.daemon.await_log("Log records dropped while stdout was blocked")
        assert notice["level"] == "warn" and notice["droppedRecords"] > 0
        assert all(r.get("msg") != "<<not json>>" for r in h.daemon.records)


# ---------------------------------------------------------------- 3. a silent kubelet
async def test_a_kubelet_that_never_answers_register_blocks_nothing() -> None:
    async with launch("rebel-sriov", extra_args=HEALTH) as h:
        h.kubelet.go_silent()
        port = await health_port(h.daemon)
        resources = {NPU, "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"}

        def all_waiting() -> bool:
            return {c.resource for c in h.kubelet.silent_calls} == resources

        # Every resource's Register is in flight at once, none waits for another ...
        await wait_until(all_waiting, 10, "a Register call for every resource")
        # ... and while all of them hang, the scans go on and the probe says SERVING.
        await next_reconcile(h.daemon)
        assert await health(port) == "SERVING"
        assert not h.kubelet.registrations  # still no answer given
        h.kubelet.speak()
        for resource in resources:
            await h.kubelet.wait_for(resource, timeout=20)


# ---------------------------------------------------------------- 4. foreign streams
async def test_the_kubelets_stream_drives_reregistration_not_a_foreign_one() -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        target = f"unix:{h.node.kubelet_dir / socket_name(NPU)}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            foreign = stub.ListAndWatch(api_pb2.Empty())
            first = await foreign.read()
            assert len(first.devices) == 4
            registrations = len(h.kubelet.registrations)
            await h.kubelet.drop_stream(NPU)
            # The kubelet's stream ended: the plugin registers again although a foreign
            # stream is still open.
            await h.kubelet.wait_registrations(registrations + 1, timeout=10)
            await h.daemon.await_log("ListAndWatch stream ended; registering again")
            await h.kubelet.wait_for(NPU, lambda v: v.ended is None and len(v.devices) == 4)
            # The foreign client still gets correct updates.
            h.node.set_status("rbln3", 4)
            update = await asyncio.wait_for(foreign.read(), 10)
            assert {d.ID: d.health for d in update.devices}["rbln3"] == "Unhealthy"
            # The foreign stream ending is no reason to register again.
            foreign.cancel()
        registrations = len(h.kubelet.registrations)
        for _ in range(3):
            await next_reconcile(h.daemon)
        assert len(h.kubelet.registrations) == registrations
        assert len(h.daemon.find("ListAndWatch stream ended; registering again")) == 1


# ---------------------------------------------------------------- 5. two daemons
async def test_a_second_daemon_waits_for_the_first_instead_of_fighting() -> None:
    async with launch("rebel-4", extra_args=HEALTH) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        first = h.daemon
        second = DaemonProcess([*h.node.daemon_args("300ms"), *HEALTH])
        try:
            port = await health_port(second)
            (waiting,) = await second.await_log(
                "Another rbln-device-plugin instance serves this kubelet directory; "
                "waiting for it to exit"
            )
            assert waiting["level"] == "error" and waiting["holderPid"] == first.proc.pid
            # It waits on the lock beside the RSD lock, outside the kubelet's directory.
            assert waiting["lockPath"] == str(h.node.rsd_lock_path.parent / ANCHOR_NAME)
            registrations = len(h.kubelet.registrations)
            for _ in range(3):
                await next_reconcile(first)
            # Alive (the chart's liveness probe leaves it be), not serving the kubelet.
            assert await health(port, "liveness") == "SERVING"
            assert await health(port, "readiness") == "NOT_SERVING"
            assert await health(port, "") == "NOT_SERVING"
            assert len(h.kubelet.registrations) == registrations  # no socket fight
            for device in ("rbln0", "rbln1", "rbln2"):
                response = await h.kubelet.allocate(NPU, [[device]])
                assert len(response.container_responses) == 1
            # A rolling update: the old instance ends, the new one takes over at once.
            assert first.stop() == 0
            await second.await_log("Instance lock acquired; starting")
            await second.await_log("Registered device plugin with kubelet", resourceName=NPU)
            await h.kubelet.wait_for(NPU, lambda v: v.ended is None and len(v.devices) == 4)
            assert await health(port, "readiness") == "SERVING"
        finally:
            second.kill()


# ---------------------------------------------------------------- 6. orphaned rbln-smi
@pytest.mark.slow  # the successor waits out the 5 s lock budget once
async def test_an_orphaned_rbln_smi_cannot_destroy_a_successors_group() -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.kubelet.allocate(NPU, [["rbln0"]])
        assert h.node.groups()["1"] == ["rbln0"]
        calls = trace_smi(h.node)
        # The group -d runs until the test lets it go: the daemon dies in the middle of it.
        h.node.inject_fault(Fault("hold", commands=("group-delete",), remaining=1))
        pending = asyncio.ensure_future(h.kubelet.allocate(NPU, [["rbln0"]]))
        await wait_until(lambda: bool(h.node.held()), 30, "the group -d to start")
        h.daemon.proc.send_signal(signal.SIGKILL)  # in the middle of the group change
        h.daemon.proc.wait(5)
        with pytest.raises(grpc.aio.AioRpcError):
            await pending
        (orphan,) = [c for c in smi_calls(calls) if c.args.startswith("group -d")]
        assert pid_alive(orphan.pid)

        h.new_daemon()
        await h.daemon.await_log("Registered device plugin with kubelet", resourceName=NPU)
        await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and len(v.devices) == 4)
        # While the orphan runs it holds the lock: the successor waits its 5 s budget for
        # it and gives up, naming the lock, without having run rbln-smi at all.
        message = await rejected(h, NPU, [["rbln0"]])
        assert "waiting for the RSD lock" in message and str(h.node.rsd_lock_path) in message
        later = [c for c in smi_calls(calls) if c.start > orphan.start and c.args != "-j"]
        assert later == []  # scans list devices (-j); nothing touched a group
        h.node.release_held()  # the orphan finishes its group -d, still under the lock
        await wait_until(lambda: not pid_alive(orphan.pid), 30, "the orphan to finish")
        response = await h.kubelet.allocate(NPU, [["rbln0"]])
        host_rsd = response.container_responses[0].devices[0].host_path
        # The successor's group is intact: the orphan finished before it listed groups.
        assert Path(host_rsd).exists()
        assert h.node.groups()[host_rsd.rsplit("rsd", 1)[1]] == ["rbln0"]
        groups_are_consistent(h.node)
        (destroy,) = [c for c in smi_calls(calls) if c.args.startswith("group -d")]
        successor = [c for c in smi_calls(calls) if c.start > orphan.start and c.pid != orphan.pid]
        assert destroy.end is not None
        assert all(c.start >= destroy.end for c in successor if c.args.startswith("-g"))


# ---------------------------------------------------------------- 8. not a device node
async def test_a_directory_at_a_device_node_path_fails_the_allocation() -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        node_path = h.node.dev_root / "rbln1"
        node_path.unlink()
        node_path.mkdir()
        message = await rejected(h, NPU, [["rbln1"]])
        assert f"{node_path} is a directory, not a device node" in message
        shutil.rmtree(node_path)
        node_path.touch()
        response = await h.kubelet.allocate(NPU, [["rbln1"]])
        assert len(response.container_responses) == 1
        # The simulated node's regular files pass only under the test-only setting, and
        # the daemon says so at start.
        (warning,) = h.daemon.find("Test-only setting enabled: regular files pass as device nodes")
        assert warning["level"] == "warn"


async def test_a_regular_file_is_no_device_node_without_the_test_only_setting() -> None:
    async with launch("rebel-4", extra_args=["--test-file-device-nodes=false"]) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        message = await rejected(h, NPU, [["rbln1"]])
        assert f"{h.node.dev_root / 'rbln1'} is a regular file, not a device node" in message
        assert not h.daemon.find("Test-only setting enabled: regular files pass as device nodes")


async def test_a_fifo_at_a_device_node_path_fails_the_allocation() -> None:
    # A privileged daemon must not hand a container a FIFO someone placed at /dev/rbln*:
    # refused at the first look (never opened, so it cannot hang the call), named with
    # its path and type; the other devices allocate as before.
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        node_path = h.node.dev_root / "rbln2"
        node_path.unlink()
        os.mkfifo(node_path)
        message = await rejected(h, NPU, [["rbln2", "rbln3"]])
        assert f"{node_path} is a FIFO, not a device node" in message
        response = await h.kubelet.allocate(NPU, [["rbln3"]])
        assert len(response.container_responses) == 1


# ---------------------------------------------------------------- 9. metadata changes
async def test_chmod_or_chown_of_kubelet_sock_is_not_a_restart() -> None:
    async with launch("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln2", 4)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln2") == "Unhealthy")
        h.node.set_status("rbln2", "garbage")  # the history keeps it Unhealthy
        await h.daemon.await_log("Device state changed", status="UNREADABLE (last read FAULT)")
        registrations = len(h.kubelet.registrations)
        socket = h.node.kubelet_dir / "kubelet.sock"
        info = socket.stat()
        socket.chmod(0o600)
        os.chown(socket, info.st_uid, info.st_gid)
        for _ in range(3):
            await next_reconcile(h.daemon)
        assert not h.daemon.find("Detected kubelet socket recreation; restarting device plugins")
        assert len(h.kubelet.registrations) == registrations
        view = h.kubelet.view(NPU)
        assert view is not None and view.health("rbln2") == "Unhealthy"
        # A real restart still counts.
        await h.kubelet.restart()
        await h.daemon.await_log("Detected kubelet socket recreation; restarting device plugins")


# ---------------------------------------------------------------- 10. permissions
async def test_sockets_and_created_directories_ignore_a_permissive_umask() -> None:
    async with launch("rebel-4", umask=0) as h:
        lock_dir = h.node.root / "made-by-daemon" / "rbln" / "locks"
        h.daemon.kill()
        h.extra_args = ("--rsd-lock-path", str(lock_dir / "rsd.lock"))
        h.daemon = DaemonProcess([*h.node.daemon_args("300ms"), *h.extra_args], umask=0)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.kubelet.allocate(NPU, [["rbln0"]])
        plugin_socket = h.node.kubelet_dir / socket_name(NPU)
        assert stat.S_IMODE(plugin_socket.stat().st_mode) == 0o600
        for created in (lock_dir.parent.parent, lock_dir.parent, lock_dir):
            assert stat.S_IMODE(created.stat().st_mode) == 0o750, created
        assert stat.S_IMODE((lock_dir / "rsd.lock").stat().st_mode) == 0o644
        lock = h.node.kubelet_dir / LOCK_DIR / LOCK_NAME
        assert stat.S_IMODE(lock.parent.stat().st_mode) == 0o750
        assert stat.S_IMODE(lock.stat().st_mode) == 0o644
        assert stat.S_IMODE((h.node.kubelet_dir / LEGACY_LOCK_NAME).stat().st_mode) == 0o644


async def test_a_missing_kubelet_directory_is_left_to_the_kubelet(short_tmp: Path) -> None:
    # Before, the daemon created it (0750); the kubelet makes it, so the daemon waits.
    async with launch("rebel-4", umask=0) as h:
        h.daemon.kill()
        kubelet_dir = short_tmp / "k" / "dp"
        h.daemon = DaemonProcess(
            [*h.node.daemon_args("300ms"), "--kubelet-device-plugin-path", str(kubelet_dir)],
            umask=0,
        )
        await h.daemon.await_log(
            "Kubelet device-plugin directory does not exist; waiting for the kubelet"
        )
        assert not kubelet_dir.parent.exists()
        stand_in = KubeletStub(kubelet_dir)
        await stand_in.start()
        try:
            await stand_in.wait_for(NPU, lambda v: len(v.devices) == 4)
            assert stat.S_IMODE((kubelet_dir / socket_name(NPU)).stat().st_mode) == 0o600
        finally:
            h.daemon.kill()
            await stand_in.stop()
