"""What one idle scan costs, part by part, next to one host-I/O hop (the floor).

The daemon's runtime runs in this process (``runtime.daemon.serve``, as the in-process
tests run it) against a simulated node of 64 devices, its kubelet stand-in, and a
snapshot ``rbln-smi`` (``bench_daemon.fast_smi``: a shell ``cat``, so no interpreter
start-up is counted). Each part of a scan is wrapped, and the CPU the whole process
spent while it ran (``time.process_time``: every thread, the host-I/O workers
included) is added to that part. The node stays idle, so nothing else runs meanwhile
but the gRPC threads' own ticks. A scan's parts, from the start hook to the CDI check:

- the instance lock check (the scan-start hook),
- the kubelet socket check (``KubeletSession.restart_due``),
- rbln-smi: one ``-j`` run,
- discovery after rbln-smi (parse, sysfs facts, classification),
- device state: the status reads and the table update, per resource,
- the kubelet session's reconcile besides the device state (plugin socket checks),
- the CDI spec check.

The idle CPU share at the default interval is ``bench_lean``'s (a separate process over
40 s); this says where it goes. Run: ``python -m bench.bench_idle_parts [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from rbln_device_plugin import options
from rbln_device_plugin.core.devicestate import DeviceState
from rbln_device_plugin.host import scan as scan_module
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.kubelet.session import KubeletSession
from rbln_device_plugin.runtime import daemon as runtime
from rbln_device_plugin.runtime.cdicheck import CdiSpecCheck
from rbln_device_plugin.runtime.instancelock import InstanceLock
from rbln_device_plugin.runtime.manager import Manager
from rbln_device_plugin.telemetry import logs
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import generate
from rbln_device_plugin_sim.node import materialize, short_tempdir

from . import cli
from .bench_daemon import fast_smi
from .rows import Row, floor_row

NPU = "rebellions.ai/npu"

# (label, owner, attribute): the coroutine methods whose CPU is summed per part.
PARTS: tuple[tuple[str, Any, str], ...] = (
    ("instance lock check", InstanceLock, "scan_check"),
    ("kubelet socket check", KubeletSession, "restart_due"),
    ("rbln-smi -j run", scan_module, "run_smi"),
    ("discovery after rbln-smi", Scanner, "inventory"),
    ("status reads and table", DeviceState, "update"),
    ("session reconcile", KubeletSession, "reconcile"),
    ("CDI spec check", CdiSpecCheck, "check"),
    ("whole scan", Manager, "_scan_once"),
)
# Parts measured inside another part: subtracted from it so that each is counted once.
INSIDE = {"session reconcile": "status reads and table"}


class PartClock:
    """CPU seconds per part, and how often each ran."""

    def __init__(self, scans: int) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._scans = scans
        self.enough = asyncio.Event()  # set once ``scans`` whole scans were counted

    def wrap(self, label: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.process_time()
            try:
                return await method(*args, **kwargs)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.process_time() - began
                self.calls[label] = self.calls.get(label, 0) + 1
                if self.calls.get("whole scan", 0) >= self._scans:
                    self.enough.set()

        return timed

    def reset(self) -> None:
        self.spent.clear()
        self.calls.clear()


@contextlib.contextmanager
def patched(clock: PartClock) -> Any:
    saved = [(owner, name, getattr(owner, name)) for _, owner, name in PARTS]
    try:
        for label, owner, name in PARTS:
            setattr(owner, name, clock.wrap(label, getattr(owner, name)))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@contextlib.asynccontextmanager
async def idle_daemon(interval: str) -> AsyncIterator[KubeletStub]:
    root = short_tempdir("rbln-bench-")
    node = materialize(generate(16, 4, 2, name="idle-parts"), root / "node")
    fast_smi(node)
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    logs.install({"RBLN_DEVICE_PLUGIN_LOG_LEVEL": "error"})
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.serve(options.parse(node.daemon_args(interval), {}), stop))
    try:
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 64, 30)
        yield kubelet
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def hop_floor(runs: int) -> float:
    """CPU of one no-op host-I/O hop (thread hand-off and wake-up), in seconds."""
    io = HostIO()
    try:
        await io.call("noop", lambda: None)
        began = time.process_time()
        for _ in range(runs):
            await io.call("noop", lambda: None)
        return (time.process_time() - began) / runs
    finally:
        io.close()


async def measure(scans: int) -> list[Row]:
    clock = PartClock(scans)
    with patched(clock):
        async with idle_daemon("100ms"):
            await asyncio.sleep(1)  # past the start: its first scans fill caches
            clock.reset()
            await clock.enough.wait()
            spent, calls = dict(clock.spent), dict(clock.calls)
    floor = await hop_floor(200)
    done = calls["whole scan"]
    for outer, inner in INSIDE.items():
        spent[outer] = spent.get(outer, 0.0) - spent.get(inner, 0.0)
    parts = [label for label, _, _ in PARTS if label != "whole scan"]
    rest = spent["whole scan"] - sum(spent.get(label, 0.0) for label in parts)
    rows = [
        floor_row(
            "idle",
            f"{label} (per scan)",
            spent.get(label, 0.0) / done * 1e6,
            "us",
            floor * 1e6,
            f"{calls.get(label, 0) / done:.2f} calls per scan",
            ratio_digits=1,
        )
        for label in parts
    ]
    rows.append(floor_row("idle", "rest of the scan loop (per scan)",
                          rest / done * 1e6, "us", floor * 1e6, ratio_digits=1))  # fmt: skip
    rows.append(floor_row("idle", f"whole idle scan, 64 devices (mean of {done})",
                          spent["whole scan"] / done * 1e6, "us", floor * 1e6,
                          ratio_digits=1))  # fmt: skip
    return rows


def run(quick: bool = False) -> list[Row]:
    return asyncio.run(measure(40 if quick else 200))


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__)):
        print(r)
