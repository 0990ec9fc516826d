"""One daemon per node, through the real daemon: the instance lock survives the kubelet,
a daemon that lost it stops, and the health services say alive and ready apart.

The kubelet stand-in cleans its directory at every start as the 1.30-1.32 kubelets do
(every entry but directories and the checkpoint goes), which is the rule that deleted
the lock file of earlier versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rbln_device_plugin import options
from rbln_device_plugin.runtime.instancelock import (
    ANCHOR_NAME,
    LEGACY_LOCK_NAME,
    LOCK_DIR,
    LOCK_NAME,
)
from rbln_device_plugin_sim.state import Fault

from .daemon_process import DaemonProcess
from .fault_helpers import NPU, launch
from .probes import health, health_port

HEALTH = ["--healthcheck-port", "0"]
WAITING = (
    "Another rbln-device-plugin instance serves this kubelet directory; waiting for it to exit"
)
LOST = "Instance lock lost; another instance may serve this kubelet directory; exiting"
# Generous: the daemon's shutdown after losing its lock is bounded by the README's 5 s.
EXIT_WAIT_S = 20.0


@contextlib.asynccontextmanager
async def watching(port: int, service: str) -> AsyncIterator[asyncio.Queue[str]]:
    """Every status the health service reports for ``service``, in order."""
    seen: asyncio.Queue[str] = asyncio.Queue()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = health_pb2_grpc.HealthStub(channel)

    async def follow() -> None:
        async for reply in stub.Watch(health_pb2.HealthCheckRequest(service=service)):
            await seen.put(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await channel.close()


def lock_holders(path: Path) -> set[int]:
    """PIDs holding a flock on ``path``'s inode, from /proc/locks."""
    info = os.stat(path)
    holders: set[int] = set()
    with open("/proc/locks") as handle:
        for line in handle:
            fields = line.split()
            if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
                continue
            _, _, inode = fields[5].split(":")
            if int(inode) == info.st_ino:
                holders.add(int(fields[4]))
    return holders


@contextlib.contextmanager
def held_by_us(path: Path) -> Iterator[int]:
    """Create ``path`` and hold an exclusive flock on it (another process, to the daemon)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Truncated, as a daemon writes its PID: a longer PID left by an earlier holder
    # would otherwise trail ours ("426\n5\n") and read as no PID at all.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield fd
    finally:
        os.close(fd)


async def test_a_kubelet_start_leaves_the_instance_lock_alone() -> None:
    """A kubelet start used to delete the lock file, and a waiting second instance then
    started serving next to the first. Now the lock sits where no kubelet deletes."""
    async with launch("rebel-4", extra_args=HEALTH) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        first = h.daemon
        second = DaemonProcess([*h.node.daemon_args("300ms"), *HEALTH])
        try:
            (waiting,) = await second.await_log(WAITING)
            lock = Path(str(waiting["lockPath"]))
            before = os.stat(lock)
            await h.kubelet.restart()
            # The stand-in deleted every file of its directory, the old lock's place.
            assert LEGACY_LOCK_NAME in h.kubelet.deleted
            await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and len(v.devices) == 4)
            after = os.stat(lock)
            assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
            assert lock_holders(lock) == {first.proc.pid}
            assert not second.find("Instance lock acquired; starting")
            assert first.proc.poll() is None and not first.find(LOST)
            # The lock a second instance waits on lies outside the kubelet's directory.
            assert lock == h.node.rsd_lock_path.parent / ANCHOR_NAME
            # The second instance still takes over the moment the first one exits.
            assert first.stop() == 0
            await second.await_log("Instance lock acquired; starting")
            await h.kubelet.wait_for(NPU, lambda v: v.generation == 3 and len(v.devices) == 4)
        finally:
            second.kill()


async def test_a_daemon_whose_lock_was_taken_over_stops_serving() -> None:
    """The lock file replaced by one another process holds: two daemons could serve, so
    the holder exits at once, non-zero, with one error record."""
    async with launch("rebel-4", extra_args=HEALTH) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        lock = h.node.kubelet_dir / LOCK_DIR / LOCK_NAME
        if not lock.exists():  # a version that keeps the lock beside the sockets
            lock = h.node.kubelet_dir / LEGACY_LOCK_NAME
        replacement = lock.with_name("replacement")
        with held_by_us(replacement):
            os.rename(replacement, lock)  # atomic: the path never lacks a file
            (record,) = await h.daemon.await_log(LOST, timeout=EXIT_WAIT_S)
            code = await asyncio.to_thread(h.daemon.proc.wait, EXIT_WAIT_S)
        assert code == options.EXIT_LOCK_LOST == record["exitCode"]
        assert record["level"] == "error" and record["lockPath"] == str(lock)
        assert record["holderPid"] == os.getpid()
        errors = [r for r in h.daemon.records if r.get("level") == "error"]
        assert errors == [record]
        assert h.daemon.find("Shutdown complete")
        assert h.sockets() == ["kubelet.sock"]  # it stopped serving and cleaned up


async def test_an_older_version_holding_the_old_lock_file_is_waited_for() -> None:
    """Upgrading with surge: the old version locks the file beside the sockets."""
    async with launch("rebel-4", extra_args=HEALTH) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.daemon.kill()
        legacy = h.node.kubelet_dir / LEGACY_LOCK_NAME
        with held_by_us(legacy):
            daemon = h.new_daemon()
            (waiting,) = await daemon.await_log(WAITING)
            assert waiting["lockPath"] == str(legacy)
            assert waiting["holderPid"] == os.getpid()
            port = await health_port(daemon)
            assert await health(port, "liveness") == "SERVING"
            assert await health(port, "readiness") == "NOT_SERVING"
        await daemon.await_log("Instance lock acquired; starting")
        await daemon.await_log("Registered device plugin with kubelet", resourceName=NPU)
        assert lock_holders(legacy) == {daemon.proc.pid}


async def test_liveness_fails_while_a_scan_is_stuck_and_recovers_after() -> None:
    """A scan older than --scan-stall-limit means no progress: liveness NOT_SERVING until
    the scan ends, readiness untouched."""
    async with launch(
        "rebel-4", interval="300ms", extra_args=[*HEALTH, "--scan-stall-limit", "1s"]
    ) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await health_port(h.daemon)
        async with watching(port, "liveness") as liveness:
            assert await asyncio.wait_for(liveness.get(), 30) == "SERVING"
            # One rbln-smi listing takes 3 s (its own limit is 5 s): the scan outlives 1 s.
            h.node.inject_fault(Fault("slow", ("list",), delay=3.0, remaining=1))
            stalled = await h.daemon.await_log(
                "Device scan has not finished; liveness is NOT_SERVING until it does"
            )
            assert stalled[0]["level"] == "error" and stalled[0]["limit"] == "1s"
            assert await asyncio.wait_for(liveness.get(), 30) == "NOT_SERVING"
            assert await health(port, "readiness") == "SERVING"
            await h.daemon.await_log("Device scan finished; liveness is SERVING again")
            assert await asyncio.wait_for(liveness.get(), 30) == "SERVING"
