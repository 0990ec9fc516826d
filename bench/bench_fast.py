"""The figures where a cheap ``rbln-smi`` leaves the daemon's own cost in view (issue 35).

The node's ``rbln-smi`` is ``fast_smi.c`` (``fastsmi``): the simulator's four commands,
its JSON byte for byte, well under a millisecond a call. Each figure has a floor taken
in the same run, and the ratio:

- Allocate, one container of 2 devices and two containers of 2 devices each, devices
  back in the default group before every call (the common case: two ``rbln-smi`` runs
  per container): p50 and p99 of the RPC as the client sees it, against one trivial
  unary RPC on the same socket plus that many runs of the tool spawned from here;
- the daemon's own share of it: the RPC minus the tool's own run times (its own
  CLOCK_MONOTONIC stamps from ``main`` to its last write), against the unary RPC;
- start to Register: from the daemon's exec to the moment the kubelet stand-in receives
  ``Register`` for the first resource, 8-device node (32 NPUs), against
  ``python -c 'import grpc'`` timed the same way;
- idle CPU at a 1 h scan interval from ``/proc/<pid>/task/*/schedstat`` (nanoseconds),
  with wake-ups per minute (voluntary plus involuntary context switches of every
  thread), against an idle process serving three ``grpc.aio`` servers over the same
  window;
- resident memory after registration with metrics and tracing off, against that floor.

Run: ``python -m bench.bench_fast [--quick] [--idle-window SECONDS]
[--only allocate,start,idle]``.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from . import cli, fastsmi
from .bench_daemon import node_with_daemon, rss_mib
from .rows import floor_row

NPU = "rebellions.ai/npu"
Row = dict[str, Any]
PARTS = ("allocate", "start", "idle")
IDLE_WINDOW_S = 600.0  # the full run's idle window: schedstat resolves 0.001 % over it


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(metric: str, value: float, unit: str, floor: float | None = None, extra: str = "") -> Row:
    return floor_row("fast", metric, value, unit, floor, extra)


# ---------------------------------------------------------------------------- Allocate


async def allocate_rows(calls: int) -> list[Row]:
    tools: list[fastsmi.FastSmi] = []

    def prepare(node: SimNode) -> None:
        tools.append(fastsmi.install(node))

    rows: list[Row] = []
    layout = preset("atom-max-8")
    async with node_with_daemon(layout, "1h", prepare) as (node, kubelet, _, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 32, 30)
        tool = tools[0]
        target = f"unix:{node.kubelet_dir / socket_name(NPU)}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            for _ in range(50):  # warm: the channel, the daemon's first calls
                await stub.GetDevicePluginOptions(api_pb2.Empty())
            for containers in (1, 2):
                # The floors are taken call by call, interleaved with the Allocate calls,
                # so that a busy moment of a shared machine weighs on both alike.
                totals, own, runs, unary, spawn = [], [], [], [], []
                for call in range(calls):
                    first = (call * 4) % 32
                    requests = [
                        api_pb2.ContainerAllocateRequest(
                            devices_ids=[f"rbln{(first + 2 * c + k) % 32}" for k in range(2)]
                        )
                        for c in range(containers)
                    ]
                    began = time.perf_counter()
                    await stub.GetDevicePluginOptions(api_pb2.Empty())
                    unary.append((time.perf_counter() - began) * 1000)
                    spawn.append(tool.call_cost_ms(runs=1))
                    tool.ungroup()
                    tool.clear()
                    began = time.perf_counter()
                    await stub.Allocate(api_pb2.AllocateRequest(container_requests=requests))
                    total = (time.perf_counter() - began) * 1000
                    recorded = tool.recorded()
                    totals.append(total)
                    own.append(total - sum(end - start for start, end in recorded) / 1e6)
                    runs.append(len(recorded))
                made = statistics.median(runs)
                rpc_floor, spawn_floor = statistics.median(unary), statistics.median(spawn)
                label = "one container" if containers == 1 else "two containers"
                rows.append(row(
                    f"Allocate, {label} of 2 devices, p50", statistics.median(totals), "ms",
                    rpc_floor + made * spawn_floor,
                    f"p99 {percentile(totals, 0.99):.2f} ms; floor: one unary RPC "
                    f"{rpc_floor:.2f} ms + {made:g} rbln-smi runs of {spawn_floor:.2f} ms "
                    f"spawned from Python; {calls} calls",
                ))  # fmt: skip
                rows.append(row(
                    f"Allocate daemon share, {label}, p50", statistics.median(own), "ms",
                    rpc_floor,
                    f"p99 {percentile(own, 0.99):.2f} ms; total minus the tool's own run "
                    f"times; floor: one unary RPC on the same socket",
                ))  # fmt: skip
    return rows


# ---------------------------------------------------------------- start to Register


class TimedKubelet(KubeletStub):
    """The kubelet stand-in, noting when each Register call arrives."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.register_arrivals: list[float] = []

    async def Register(self, request: Any, context: Any) -> Any:
        self.register_arrivals.append(time.monotonic())
        return await super().Register(request, context)


def import_grpc_s() -> float:
    """The floor: a bare ``python -c 'import grpc'``, exec to exit."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import grpc"], check=True)
    return time.monotonic() - began


async def start_rows(runs: int) -> list[Row]:
    starts, floors = [], []
    for _ in range(runs):
        floors.append(import_grpc_s())
        root = short_tempdir("rbln-bench-")
        node = materialize(preset("atom-max-8"), root)
        fastsmi.install(node)
        kubelet = TimedKubelet(node.kubelet_dir)
        await kubelet.start()
        env = {**os.environ, "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "error"}
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rbln_device_plugin", *node.daemon_args("1h")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            await kubelet.wait_for(NPU, lambda v: v.messages > 0, 30)
            starts.append(kubelet.register_arrivals[0] - started)
        finally:
            proc.terminate()
            proc.wait(10)
            await kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)
    floor = statistics.median(floors)
    return [
        row("start to Register, 8 cards (32 devices)", statistics.median(starts), "s", floor,
            f"median of {runs}, min {min(starts):.3f} s; floor: python -c 'import grpc'"),
    ]  # fmt: skip


# ------------------------------------------------------------------- idle and memory

_FLOOR_SERVERS = textwrap.dedent(
    """
    import asyncio, sys
    import grpc
    from grpc_health.v1 import _async as health_aio, health_pb2_grpc

    async def main():
        servers = []
        for address in ("[::]:0", "unix:" + sys.argv[1] + ".a", "unix:" + sys.argv[1] + ".b"):
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
            server.add_insecure_port(address)
            await server.start()
            servers.append(server)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def task_counters(pid: int) -> tuple[int, int]:
    """(CPU ns, context switches) summed over every live thread of ``pid``."""
    cpu = switches = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                cpu += int(stat.read().split()[0])
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.endswith("ctxt_switches:", 0, line.find(":") + 1):
                        switches += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return cpu, switches


async def idle_rows(window: float) -> list[Row]:
    rows: list[Row] = []
    async with node_with_daemon(preset("atom-max-8"), "1h", fastsmi.install) as (
        node, kubelet, proc, _,
    ):  # fmt: skip
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 32, 30)
        floor = subprocess.Popen(
            [sys.executable, "-c", _FLOOR_SERVERS, str(node.root / "floor")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert floor.stdout is not None
            floor.stdout.readline()
            await asyncio.sleep(2)  # past the start-up's own work
            rows.append(row("resident memory idle, metrics and tracing off",
                            rss_mib(proc.pid), "MiB", rss_mib(floor.pid),
                            "floor: grpc.aio with three servers started"))  # fmt: skip
            pids = (proc.pid, floor.pid)
            before = [task_counters(pid) for pid in pids]
            began = time.monotonic()
            await asyncio.sleep(window)
            elapsed = time.monotonic() - began
            after = [task_counters(pid) for pid in pids]
        finally:
            floor.kill()
            floor.wait(5)
    (cpu, wake), (floor_cpu, floor_wake) = (
        (100 * (a[0] - b[0]) / 1e9 / elapsed, (a[1] - b[1]) * 60 / elapsed)
        for a, b in zip(after, before, strict=True)
    )
    rows.append(row(f"idle CPU, 1 h scan interval, {window:g} s window", cpu, "%",
                    floor_cpu, "schedstat, every thread; floor: the idle process"))  # fmt: skip
    rows.append(row("idle wake-ups per minute, 1 h scan interval", wake, "/min", floor_wake,
                    "context switches of every thread"))  # fmt: skip
    return rows


async def main_async(
    quick: bool, idle_window: float | None, parts: tuple[str, ...] = ("allocate", "start", "idle")
) -> list[Row]:
    rows: list[Row] = []
    if "allocate" in parts:
        rows += await allocate_rows(20 if quick else 100)
    if "start" in parts:
        rows += await start_rows(3 if quick else 5)
    if "idle" in parts:
        rows += await idle_rows(idle_window or (15 if quick else IDLE_WINDOW_S))
    return rows


def run(
    quick: bool = False,
    idle_window: float | None = None,
    parts: tuple[str, ...] = PARTS,
) -> list[Row]:
    return asyncio.run(main_async(quick, idle_window, parts))


def main(argv: Sequence[str] | None = None) -> int:
    p = cli.parser(__doc__)
    cli.idle_window(p)
    p.add_argument(
        "--only", type=lambda v: tuple(v.split(",")), default=PARTS, metavar="PARTS",
        help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all)",
    )  # fmt: skip
    args = p.parse_args(argv)
    unknown = sorted(set(args.only) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {','.join(unknown)}; choose from {','.join(PARTS)}")
    for r in run(quick=args.quick, idle_window=args.idle_window, parts=args.only):
        print(f"{r['metric']:<58} {r['value']:>9.3f} {r['unit']:<4} {r['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
