"""The lean-daemon figures (issue 15), each next to a floor taken in the same run.

- idle CPU at a 1 h and at the default 5 s scan interval, 64 devices, against an idle
  process serving two ``grpc.aio`` servers (health on TCP, one unix socket) measured
  over the same window; at 5 s also against a bare scan: the same floor process that
  also, at the same interval, runs the snapshot ``rbln-smi -j`` (``subprocess.run``) and
  reads the 64 status files, on its one thread with no bookkeeping at all (what any
  scanner pays for the work a scan exists to do);
- resident memory after registration (tracing off) against that floor process;
- ``rbln-smi`` calls per Allocate, for fresh devices and for devices in an old group;
- Allocate overhead beyond the time inside ``rbln-smi``, against one trivial unary call
  (``GetDevicePluginOptions``) on the same socket;
- one scan without the ``rbln-smi`` process, 64 devices, unchanged node and changed
  listing, against one no-op hop through the host-I/O runner.

A shell-script ``rbln-smi`` answers ``-j`` from a snapshot, so the simulator's Python
start-up is not counted as the daemon's. CPU time comes from ``schedstat`` (nanoseconds,
every thread of the process). Run: ``python -m bench.bench_lean [--quick]``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import grpc

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.host import sysfs
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin.model.devicetable import DeviceTable
from rbln_device_plugin_sim.layout import generate
from rbln_device_plugin_sim.node import materialize, short_tempdir

from . import cli
from .bench_daemon import (
    daemon_with_timed_smi,
    fast_smi,
    node_with_daemon,
    recorded_smi_ms,
    rss_mib,
    wrapper_cost_ms,
)
from .rows import floor_row

NPU = "rebellions.ai/npu"
Row = dict[str, Any]

_FLOOR_SERVER = textwrap.dedent(
    """
    import asyncio, os, subprocess, sys
    import grpc
    from grpc_health.v1 import _async as health_aio, health_pb2_grpc

    async def main():
        servers = []
        for address in ("[::]:0", "unix:" + sys.argv[1]):
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
            server.add_insecure_port(address)
            await server.start()
            servers.append(server)
        print("ready", flush=True)
        if len(sys.argv) == 2:
            await asyncio.Event().wait()
        # The bare scan: rbln-smi -j and every status file, blocking, nothing kept.
        smi, interval, paths = sys.argv[2], float(sys.argv[3]), sys.argv[4:]
        while True:
            await asyncio.sleep(interval)
            subprocess.run([smi, "-j"], stdin=subprocess.DEVNULL, capture_output=True)
            for path in paths:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                os.read(fd, 4097)
                os.close(fd)

    asyncio.run(main())
    """
)


def cpu_ns(pid: int) -> int:
    """CPU time of every live thread of ``pid``, in nanoseconds."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class FloorProcess:
    """An idle process serving two grpc.aio servers: what any such daemon costs. With
    ``scan`` (rbln-smi, the interval in seconds, the status files): a bare scan besides."""

    def __init__(self, root: Path, scan: tuple[Path, float, list[str]] | None = None) -> None:
        name = "floor.sock" if scan is None else "bare-scan.sock"
        extra = [] if scan is None else [str(scan[0]), str(scan[1]), *scan[2]]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _FLOOR_SERVER, str(root / name), *extra],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


async def cpu_percent(pids: list[int], seconds: float) -> list[float]:
    before = [cpu_ns(pid) for pid in pids]
    began = time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - began
    return [100 * (cpu_ns(pid) - b) / 1e9 / elapsed for pid, b in zip(pids, before, strict=True)]


async def idle_rows(window: float) -> list[Row]:
    rows: list[Row] = []
    layout = generate(16, 4, 2, name="lean-64")
    for interval in ("1h", "5s"):
        async with node_with_daemon(layout, interval, fast_smi) as (node, kubelet, proc, _):
            await kubelet.wait_for(NPU, lambda v: len(v.devices) == 64, 30)
            floor = FloorProcess(node.root)
            bare = None
            if interval == "5s":
                paths = [str(node.status_path(f"rbln{i}")) for i in range(64)]
                bare = FloorProcess(node.root, (node.smi_path, 5.0, paths))
            pids = [proc.pid, floor.proc.pid] + ([bare.proc.pid] if bare else [])
            try:
                await asyncio.sleep(1)
                if interval == "1h":
                    daemon_rss, floor_rss = rss_mib(proc.pid), rss_mib(floor.proc.pid)
                    rows.append(row("resident memory after registration, tracing off",
                                    daemon_rss, "MiB", floor_rss, "MiB"))  # fmt: skip
                daemon_cpu, floor_cpu, *bare_cpu = await cpu_percent(pids, window)
            finally:
                floor.stop()
                if bare is not None:
                    bare.stop()
            rows.append(row(f"daemon CPU, scan interval {interval}, {window:g} s window",
                            daemon_cpu, "%", floor_cpu, "%"))  # fmt: skip
            if bare_cpu:
                rows.append(row(f"bare scan process, interval {interval}, {window:g} s window "
                                "(floor + rbln-smi -j + 64 status reads)",
                                bare_cpu[0], "%", floor_cpu, "%",
                                f"the daemon is {daemon_cpu / bare_cpu[0]:.2f}x it"))  # fmt: skip
    return rows


async def allocate_rows(calls: int) -> list[Row]:
    rows: list[Row] = []
    async with daemon_with_timed_smi(generate(16, 4, 2, name="lean-alloc")) as (
        node,
        _,
        timings,
    ):
        target = f"unix:{node.kubelet_dir / socket_name(NPU)}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            floor_ms = []
            for _ in range(200):
                began = time.perf_counter()
                await stub.GetDevicePluginOptions(api_pb2.Empty())
                floor_ms.append((time.perf_counter() - began) * 1000)
            floor = statistics.median(floor_ms)
            wrapper_ms = wrapper_cost_ms(node.smi_path, timings)
            counts = {"fresh": [], "regrouped": []}
            for size in (1, 4, 16):
                overheads = []
                for call in range(calls):
                    ids = [f"rbln{(call * size + k) % 64}" for k in range(size)]
                    for kind in ("fresh", "regrouped"):
                        if kind == "fresh":  # back to the default group first
                            await _ungroup(node)
                        timings.write_text("")
                        began = time.perf_counter()
                        await stub.Allocate(
                            api_pb2.AllocateRequest(
                                container_requests=[
                                    api_pb2.ContainerAllocateRequest(devices_ids=ids)
                                ]
                            )
                        )
                        total = (time.perf_counter() - began) * 1000
                        made = len(timings.read_text().splitlines())
                        counts[kind].append(made)
                        overheads.append(total - recorded_smi_ms(timings) - made * wrapper_ms)
                rows.append(row(f"Allocate overhead beyond rbln-smi, {size} devices",
                                statistics.median(overheads), "ms", floor, "ms"))  # fmt: skip
    for kind, label in (("fresh", "devices in the default group"),
                        ("regrouped", "devices in an old group")):  # fmt: skip
        rows.append(row(f"rbln-smi calls per Allocate, {label}",
                        statistics.median(counts[kind]), "calls"))  # fmt: skip
    return rows


async def in_process_allocate_row(calls: int) -> Row:
    """Allocate inside this process: total minus the wall time of each rbln-smi run.

    Whatever a process spawn costs the caller is on the rbln-smi side here, so what
    remains is the plugin's own work: validation, the status and node checks, the lock,
    parsing, the response, the records.
    """
    import io as textio

    from rbln_device_plugin import options
    from rbln_device_plugin.core.devicestate import DeviceState
    from rbln_device_plugin.host import rsd
    from rbln_device_plugin.kubelet.events import PluginRef
    from rbln_device_plugin.kubelet.plugin import ResourcePlugin
    from rbln_device_plugin.kubelet.services import SharedServices
    from rbln_device_plugin.telemetry import logs
    from rbln_device_plugin.telemetry.tracing import NoopTracer

    logs.install({logs.LEVEL_ENV: "error"}, stream=textio.StringIO())  # as the bench daemons
    root = short_tempdir("rbln-bench-")
    node = materialize(generate(16, 4, 2, name="lean-inproc"), root / "node")
    # The daemon's own settings for this node, test-only file device nodes included.
    cfg = options.parse(node.daemon_args("5s"), {})
    io = HostIO()
    scanned = await Scanner(sysfs_root=cfg.sysfs_root, smi_path=cfg.rbln_smi, hostio=io).scan()
    state = DeviceState(NPU, cfg.sysfs_root, io)
    services = SharedServices(cfg, NoopTracer(), hostio=io)
    plugin = ResourcePlugin(PluginRef(NPU, 1), services, state, asyncio.Queue())
    await plugin.update(scanned.resources[NPU])
    smi_ms: list[float] = []
    real_run = rsd.run_smi

    async def timed_run(*args: Any, **kwargs: Any) -> str:
        began = time.perf_counter()
        try:
            return await real_run(*args, **kwargs)
        finally:
            smi_ms.append((time.perf_counter() - began) * 1000)

    class Context:
        async def abort(self, code: Any, message: str) -> None:
            raise RuntimeError(message)

    rsd.run_smi = timed_run  # type: ignore[assignment]
    overheads = []
    try:
        for call in range(calls):
            await _ungroup(node)
            smi_ms.clear()
            request = api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[f"rbln{call % 64}"])
                ]
            )
            began = time.perf_counter()
            await plugin.servicer.Allocate(request, Context())  # type: ignore[arg-type]
            overheads.append((time.perf_counter() - began) * 1000 - sum(smi_ms))
    finally:
        rsd.run_smi = real_run  # type: ignore[assignment]
        shutil.rmtree(root, ignore_errors=True)
    return row("Allocate overhead inside the daemon, rbln-smi runs excluded whole",
               statistics.median(overheads), "ms")  # fmt: skip


async def _ungroup(node: Any) -> None:
    groups = [gid for gid in node.groups() if gid != "0"]
    if groups:
        subprocess.run(
            [str(node.smi_path), "group", "-d", ",".join(groups)], capture_output=True, check=True
        )


async def scan_rows(runs: int) -> list[Row]:
    root = short_tempdir("rbln-bench-")
    node = materialize(generate(16, 4, 2, name="lean-scan"), root / "node")
    io = HostIO()
    scanner = Scanner(sysfs_root=node.sysfs_root, smi_path=node.smi_path, hostio=io)
    text = subprocess.run(
        [str(node.smi_path), "-j"], capture_output=True, text=True, check=True
    ).stdout
    other = text.replace('"status": "', '"status": " ', 1)  # a byte-different listing
    table = DeviceTable()
    root_path = node.sysfs_root

    async def scan_once(listing: str) -> None:
        """What a scan does after rbln-smi returned, the plugin's status reads included."""
        inventory = await scanner.inventory(listing)
        devices = inventory.resources[NPU]
        readings = await sysfs.read_statuses(io, root_path, (d.name for d in devices))
        table.apply_scan(devices, readings)

    async def hop() -> None:
        await io.call("noop", lambda: None)

    async def timed(listings: list[str] | None) -> list[float]:
        samples = []
        for i in range(runs):
            began = time.perf_counter()
            if listings is None:
                await hop()
            else:
                await scan_once(listings[i % len(listings)])
            samples.append((time.perf_counter() - began) * 1000)
        return sorted(samples)

    await scan_once(text)
    floor = statistics.median(await timed(None))
    steady = await timed([text])
    changing = await timed([other, text])
    rows = [
        row("one scan without rbln-smi, 64 devices, unchanged node",
            statistics.median(steady), "ms", floor, "ms",
            f"p99 {steady[int(0.99 * (len(steady) - 1))]:.2f} ms"),
        row("one scan without rbln-smi, 64 devices, listing changed every scan",
            statistics.median(changing), "ms", floor, "ms",
            f"p99 {changing[int(0.99 * (len(changing) - 1))]:.2f} ms"),
    ]  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return rows


def row(
    metric: str,
    value: float,
    unit: str,
    floor: float | None = None,
    floor_unit: str = "",
    extra: str = "",
) -> Row:
    return floor_row(
        "lean", metric, value, unit, floor, extra, floor_unit=floor_unit, ratio_digits=1
    )


async def main_async(quick: bool) -> list[Row]:
    rows = await scan_rows(200 if quick else 1000)
    rows += await allocate_rows(3 if quick else 10)
    rows.append(await in_process_allocate_row(10 if quick else 30))
    rows += await idle_rows(15 if quick else 40)
    return rows


def run(quick: bool = False) -> list[Row]:
    return asyncio.run(main_async(quick))


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__)):
        print(f"{r['metric']:<66} {r['value']:>9.3f} {r['unit']:<5} {r['note']}")
