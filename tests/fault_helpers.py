"""Shared pieces of the fault and hostile-input suites.

A launcher that can prepare the node before the daemon starts and swap the daemon for a
new instance mid-test, leak checks (sockets, RSD lock, descriptors, asyncio tasks,
ListAndWatch streams), an rbln-smi wrapper that records when each invocation ran, and an
event loop on a background thread for synchronous (hypothesis) tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.model.resources import socket_name
from rbln_device_plugin.runtime.instancelock import LEGACY_LOCK_NAME, LOCK_DIR
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import Layout, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from .daemon_process import DaemonProcess, Record

NPU = "rebellions.ai/npu"
VF1 = "rebellions.ai/npu-vf1"
VF4 = "rebellions.ai/npu-vf4"
RECONCILED = "Reconciled device inventory"
T = TypeVar("T")


# --------------------------------------------------------------------------- launching
@dataclass
class FaultHarness:
    """A simulated node, its kubelet stub and the current daemon instance."""

    node: SimNode
    kubelet: KubeletStub
    daemon: DaemonProcess
    interval: str
    env: dict[str, str] | None
    extra_args: Sequence[str] = ()

    def sockets(self) -> list[str]:
        return sorted(p.name for p in self.node.kubelet_dir.iterdir() if p.is_socket())

    def entries(self) -> list[str]:
        """Everything in the kubelet directory, sockets or not."""
        return sorted(p.name for p in self.node.kubelet_dir.iterdir())

    def new_daemon(self) -> DaemonProcess:
        """Start another daemon instance against the same node (the old one must be gone)."""
        self.daemon = DaemonProcess(
            [*self.node.daemon_args(self.interval), *self.extra_args], env=self.env
        )
        return self.daemon


@contextlib.asynccontextmanager
async def launch(
    layout: str | Layout,
    interval: str = "300ms",
    *,
    before_start: Callable[[SimNode], None] | None = None,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    umask: int = -1,
    command: Sequence[str] | None = None,
    process_group: int = -1,
) -> AsyncIterator[FaultHarness]:
    """Like ``simnode.running``, with a hook that prepares the node before the daemon runs
    (``command``: what runs the daemon, ``python -m rbln_device_plugin`` by default)."""
    root = short_tempdir()
    node = materialize(preset(layout) if isinstance(layout, str) else layout, root)
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    if before_start is not None:
        before_start(node)
    args = [*node.daemon_args(interval), *extra_args]
    if command is None:
        daemon = DaemonProcess(args, env=env, umask=umask, process_group=process_group)
    else:
        daemon = DaemonProcess(
            args, env=env, umask=umask, command=command, process_group=process_group
        )
    harness = FaultHarness(node, kubelet, daemon, interval, env, tuple(extra_args))
    try:
        yield harness
    finally:
        harness.daemon.kill()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def allocate_direct(
    node: SimNode, resource: str, containers: Sequence[Sequence[str]], deadline: float
) -> api_pb2.AllocateResponse:
    """Allocate straight on the plugin socket with our own deadline (the stub's is 10 s)."""
    target = f"unix:{node.kubelet_dir / socket_name(resource)}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers
            ]
        )
        return await stub.Allocate(request, timeout=deadline)


# --------------------------------------------------------------------------- leak checks
def expected_sockets(resources: Iterable[str]) -> list[str]:
    return sorted(["kubelet.sock", *(socket_name(r) for r in resources)])


def expected_entries(resources: Iterable[str]) -> list[str]:
    """The kubelet directory of a running daemon: sockets, its lock directory and the lock
    file older versions use (held too, so they wait for this one)."""
    return sorted([*expected_sockets(resources), LOCK_DIR, LEGACY_LOCK_NAME])


def lock_is_free(path: Path) -> bool:
    """True when nobody holds the RSD flock (a missing lock file is free too)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also drops the lock we may have taken
    return True


async def next_reconcile(
    daemon: DaemonProcess, where: Callable[[Record], bool] = lambda _: True, timeout: float = 10
) -> Record:
    """The first scan record written from now on that satisfies ``where``."""
    deadline = time.monotonic() + timeout
    seen = len(daemon.find(RECONCILED))
    while True:
        remaining = max(deadline - time.monotonic(), 0.1)
        records = await daemon.await_log(RECONCILED, timeout=remaining, count=seen + 1)
        for record in records[seen:]:
            if where(record):
                return record
        seen = len(records)


@dataclass(frozen=True)
class Baseline:
    fds: int
    tasks: int


async def take_baseline(h: FaultHarness, resources: Sequence[str]) -> Baseline:
    """Descriptor and task counts of an idle, registered daemon.

    The task figure is the highest of three idle scans, so a transient task at the moment
    of one scan does not make the baseline unreachably low. The descriptor window opens
    once a scan has seen every stream, and runs beside the other two scans: both only watch
    the idle daemon.
    """

    async def idle_scans(count: int) -> list[int]:
        tasks = []
        for _ in range(count):
            record = await next_reconcile(h.daemon, lambda r: r["streams"] == len(resources))
            tasks.append(int(record["tasks"]))
        return tasks

    first = await idle_scans(1)
    fds, later = await asyncio.gather(asyncio.to_thread(h.daemon.settled_fds), idle_scans(2))
    return Baseline(fds=fds, tasks=max(first + later))


async def assert_settles(
    h: FaultHarness, base: Baseline, resources: Sequence[str], timeout: float = 10.0
) -> Record:
    """The daemon is alive and, within ``timeout``, back to its baseline with no leaks."""
    assert h.daemon.proc.poll() is None, f"daemon exited: {h.daemon.stderr[-2000:]}"
    deadline = time.monotonic() + timeout
    last: Record = {}
    fds = -1
    while time.monotonic() < deadline:
        try:
            last = await next_reconcile(h.daemon, timeout=max(deadline - time.monotonic(), 0.5))
        except AssertionError:
            # No scan before the deadline: fail below, with what had not settled.
            deadline = time.monotonic()
            continue
        fds = h.daemon.open_fds()
        if fds > base.fds:
            # One sample right after a scan record lands in what that scan does next (the
            # CDI check holds its directories open): the fewest over a window, as the
            # baseline was taken; a leaked descriptor stays in that minimum too.
            fds = await asyncio.to_thread(h.daemon.settled_fds)
        if (
            last["streams"] == len(resources)
            and last["resourceCount"] == len(resources)
            and int(last["tasks"]) <= base.tasks
            and fds <= base.fds
            and h.sockets() == expected_sockets(resources)
        ):
            break
    else:
        raise AssertionError(
            f"daemon did not settle: baseline {base}, fds now {fds}, last scan {last}, "
            f"sockets {h.sockets()} (want {expected_sockets(resources)})"
        )
    assert lock_is_free(h.node.rsd_lock_path), "the RSD lock is still held"
    assert h.daemon.proc.poll() is None
    return last


async def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll a condition that no event announces (files, other processes)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        await asyncio.sleep(0.05)


def groups_are_consistent(node: SimNode) -> None:
    """Every non-default RSD group in rbln-smi's state has its /dev node."""
    for gid, names in node.groups().items():
        if gid == "0":
            continue
        assert names, f"group {gid} is empty"
        assert (node.dev_root / f"rsd{gid}").exists(), f"group {gid} has no rsd{gid} node"


# --------------------------------------------------------------------------- crashes
def crash_records(daemon: DaemonProcess, allowed_errors: Iterable[str] = ()) -> list[Record]:
    """Records that show the daemon broke, rather than handled, something.

    A line that is not JSON, any record carrying a traceback (``exception``, or a
    ``Traceback`` anywhere in it), and any error record whose message is not one the test
    expects (``allowed_errors``). A fault the daemon handles produces the documented
    records; anything else at error level is a bug or an undocumented outcome.
    """
    allowed = set(allowed_errors)
    return [
        r
        for r in daemon.records
        if r.get("msg") == "<<not json>>"
        or "exception" in r
        or "Traceback" in json.dumps(r)
        or (r.get("level") == "error" and r.get("msg") not in allowed)
    ]


def no_crash_records(
    daemon: DaemonProcess, allowed_errors: Iterable[str] = (), *, check_stderr: bool = True
) -> None:
    bad = crash_records(daemon, allowed_errors)
    assert not bad, bad[:5]
    if check_stderr:
        # stderr is complete once the process is gone: no Python traceback may be in it.
        assert "Traceback" not in daemon.stderr, daemon.stderr[-3000:]


# --------------------------------------------------------------------------- rbln-smi
@dataclass(frozen=True)
class SmiCall:
    pid: int
    args: str
    start: float
    end: float | None  # None: it never finished (killed, or still running)


def trace_smi(node: SimNode) -> Path:
    """Wrap the node's rbln-smi so every invocation records its pid, arguments and times.

    CLOCK_MONOTONIC is shared by all processes, so the intervals are comparable. The
    running daemon may look for or run rbln-smi at any moment (a scan, an Allocate): at
    every instant the path holds an executable, the real tool until one rename puts the
    finished wrapper there (a rename first, then a write and a chmod, left a moment with
    no rbln-smi or one that could not run, and a scan in it failed the test once).
    """
    real = node.smi_path.with_name("rbln-smi.real")
    os.link(node.smi_path, real)
    log_path = node.root / "smi-calls.log"
    wrapper = f"""#!{sys.executable} -S
import os, subprocess, sys, time
def note(text):
    fd = os.open({str(log_path)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, text.encode())
    os.close(fd)
note(f"start {{os.getpid()}} {{time.monotonic()}} {{' '.join(sys.argv[1:])}}\\n")
code = subprocess.call([{str(real)!r}, *sys.argv[1:]])
note(f"end {{os.getpid()}} {{time.monotonic()}}\\n")
sys.exit(code)
"""
    staged = node.smi_path.with_name("rbln-smi.tracing")
    staged.write_text(wrapper)
    staged.chmod(0o755)
    staged.replace(node.smi_path)
    return log_path


def smi_calls(log_path: Path) -> list[SmiCall]:
    starts: dict[int, tuple[float, str]] = {}
    ends: dict[int, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in log_path.read_text().splitlines():
            kind, pid, stamp, *rest = line.split(" ")
            if kind == "start":
                starts[int(pid)] = (float(stamp), " ".join(rest))
            else:
                ends[int(pid)] = float(stamp)
    return sorted(
        (SmiCall(pid, args, start, ends.get(pid)) for pid, (start, args) in starts.items()),
        key=lambda c: c.start,
    )


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# --------------------------------------------------------------------------- threads
class BackgroundLoop:
    """An asyncio loop on its own thread: async servers for synchronous tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
