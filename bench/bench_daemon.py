"""Daemon-level figures against the simulated node with the real daemon process.

- start-to-registration and re-registration after a kubelet restart;
- daemon CPU per idle scan (32 and 64 devices) and resident memory after 1,000 scans;
- idle CPU at the default 5 s interval;
- Allocate overhead: RPC time minus the time spent inside rbln-smi (1, 4, 16 devices).

Run: ``python -m bench.bench_daemon [--quick]``. Prints a table; ``run()`` returns rows.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import Layout, generate, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.processes import stop_process

from . import cli

NPU = "rebellions.ai/npu"
CLK_TCK = os.sysconf("SC_CLK_TCK")
Row = dict[str, Any]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process itself (children such as rbln-smi excluded)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fast_smi(node: SimNode) -> None:
    """Replace the simulator's Python rbln-smi with a snapshot printer for `-j`.

    Scan-cost figures are about the daemon, not about a Python interpreter starting.
    """
    snapshot = node.root / "inventory.json"
    result = subprocess.run([str(node.smi_path), "-j"], capture_output=True, check=True)
    snapshot.write_bytes(result.stdout)
    real = node.smi_path.with_name("rbln-smi.sim")
    node.smi_path.rename(real)
    node.smi_path.write_text(
        f'#!/bin/sh\nif [ "$1" = "-j" ] && [ $# -eq 1 ]; then exec cat {snapshot}; fi\n'
        f'exec {real} "$@"\n'
    )
    node.smi_path.chmod(0o755)


def timed_smi(node: SimNode) -> Path:
    """Wrap rbln-smi so each call appends its wall time (ns) to a file."""
    timings = node.root / "smi-ns"
    real = node.smi_path.with_name("rbln-smi.timed")
    node.smi_path.rename(real)
    # $EPOCHREALTIME is a bash builtin: no extra process inside the measured window.
    node.smi_path.write_text(
        "#!/bin/bash\n"
        f's=$EPOCHREALTIME; {real} "$@"; rc=$?; e=$EPOCHREALTIME\n'
        f'echo "$s $e" >> {timings}\nexit $rc\n'
    )
    node.smi_path.chmod(0o755)
    return timings


def recorded_smi_ms(timings: Path) -> float:
    pairs = (line.split() for line in timings.read_text().splitlines() if line.strip())
    return sum((float(end) - float(start)) * 1000 for start, end in pairs)


def wrapper_cost_ms(smi: Path, timings: Path, runs: int = 10) -> float:
    """Per-call cost of the timing wrapper itself (bash start-up), which is not the daemon's."""
    costs = []
    for _ in range(runs):
        timings.write_text("")
        began = time.perf_counter()
        subprocess.run([str(smi), "-g", "-j"], capture_output=True, check=True)
        costs.append((time.perf_counter() - began) * 1000 - recorded_smi_ms(timings))
    return statistics.median(costs)


@asynccontextmanager
async def node_with_daemon(
    layout: Layout,
    interval: str,
    prepare: Any = None,
    extra_args: Sequence[str] = (),
    command: Sequence[str] = (sys.executable, "-m", "rbln_device_plugin"),
) -> AsyncIterator[tuple[SimNode, KubeletStub, subprocess.Popen[bytes], float]]:
    root = short_tempdir("rbln-bench-")
    node = materialize(layout, root)
    if prepare is not None:
        prepare(node)
    kubelet = KubeletStub(node.kubelet_dir)
    await kubelet.start()
    env = {**os.environ, "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "error"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [*command, *node.daemon_args(interval), *extra_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        yield node, kubelet, proc, started
    finally:
        stop_process(proc)
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def registration_times(runs: int) -> tuple[list[float], list[float]]:
    starts, restarts = [], []
    for _ in range(runs):
        async with node_with_daemon(preset("atom-max-8"), "5s") as (_, kubelet, _, started):
            await kubelet.wait_for(NPU, lambda v: v.messages > 0, 30)
            starts.append(time.monotonic() - started)
            for generation in range(2, 5):
                began = time.monotonic()
                await kubelet.restart()
                await kubelet.wait_for(
                    NPU, lambda v, g=generation: v.generation == g and v.messages > 0, 10
                )
                restarts.append(time.monotonic() - began)
    return starts, restarts


async def idle_scan_cost(devices: int, scans: int) -> tuple[float, float, float]:
    """(CPU ms per scan, RSS MiB at start, RSS MiB after ``scans`` scans) at 20 ms interval."""
    layout = generate(devices // 4, 4, 2, name=f"bench-{devices}")
    async with node_with_daemon(layout, "20ms", fast_smi) as (_, kubelet, proc, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == devices, 30)
        await asyncio.sleep(0.5)
        rss_start = rss_mib(proc.pid)
        cpu_start, wall_start = cpu_seconds(proc.pid), time.monotonic()
        await asyncio.sleep(scans * 0.02)
        elapsed = time.monotonic() - wall_start
        done = elapsed / 0.02
        cpu_per_scan = (cpu_seconds(proc.pid) - cpu_start) / done * 1000
        return cpu_per_scan, rss_start, rss_mib(proc.pid)


async def idle_cpu_default_interval(seconds: float) -> tuple[float, float]:
    """Daemon CPU %, RSS MiB over ``seconds`` at the default 5 s interval (atom-max-8)."""
    async with node_with_daemon(preset("atom-max-8"), "5s", fast_smi) as (_, kubelet, proc, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 32, 30)
        cpu_start, wall_start = cpu_seconds(proc.pid), time.monotonic()
        await asyncio.sleep(seconds)
        cpu = cpu_seconds(proc.pid) - cpu_start
        return 100 * cpu / (time.monotonic() - wall_start), rss_mib(proc.pid)


@asynccontextmanager
async def daemon_with_timed_smi(
    layout: Layout,
) -> AsyncIterator[tuple[SimNode, KubeletStub, Path]]:
    """A registered daemon (1 h scans) whose rbln-smi records its own wall time per call."""
    timings_path: list[Path] = []

    def prepare(node: SimNode) -> None:
        timings_path.append(timed_smi(node))

    async with node_with_daemon(layout, "1h", prepare) as (node, kubelet, _, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == len(layout.devices), 30)
        yield node, kubelet, timings_path[0]


async def allocate_overhead(sizes: tuple[int, ...], calls: int) -> dict[int, tuple[float, float]]:
    """Per size: (median total ms, median overhead ms = total minus time inside rbln-smi)."""
    out: dict[int, tuple[float, float]] = {}
    async with daemon_with_timed_smi(generate(8, 4, 2, name="bench-alloc")) as (
        node,
        kubelet,
        timings,
    ):
        wrapper_ms = wrapper_cost_ms(node.smi_path, timings)
        for size in sizes:
            totals, overheads = [], []
            for call in range(calls):
                first = (call * size) % 32
                ids = [f"rbln{(first + k) % 32}" for k in range(size)]
                timings.write_text("")
                began = time.perf_counter()
                await kubelet.allocate(NPU, [ids])
                total = (time.perf_counter() - began) * 1000
                calls = len(timings.read_text().splitlines())
                smi_ms = recorded_smi_ms(timings) + calls * wrapper_ms
                totals.append(total)
                overheads.append(total - smi_ms)
            out[size] = (statistics.median(totals), statistics.median(overheads))
    return out


async def main_async(quick: bool) -> list[Row]:
    rows: list[Row] = []
    starts, restarts = await registration_times(2 if quick else 3)
    rows.append(row("start to registration (atom-max-8)", statistics.median(starts) * 1000, "ms"))
    rows.append(row("kubelet restart to re-registration", statistics.median(restarts) * 1000, "ms"))
    for devices in (32, 64):
        cpu, rss0, rss1 = await idle_scan_cost(devices, 200 if quick else 1000)
        scans = 200 if quick else 1000
        rows.append(row(f"daemon CPU per idle scan, {devices} devices", cpu, "ms"))
        rows.append(row(f"RSS after {scans} scans, {devices} devices", rss1, "MiB",
                        f"{rss0:.1f} MiB after registration"))  # fmt: skip
    cpu_pct, rss = await idle_cpu_default_interval(15 if quick else 60)
    rows.append(row(f"idle CPU at 5s interval over {15 if quick else 60}s", cpu_pct, "%"))
    rows.append(row("RSS at steady state (atom-max-8)", rss, "MiB"))
    for size, (total, overhead) in (
        await allocate_overhead((1, 4, 16), 5 if quick else 15)
    ).items():
        rows.append(row(f"Allocate overhead, {size} devices", overhead, "ms",
                        f"median; total {total:.1f} ms including rbln-smi"))  # fmt: skip
    return rows


def row(metric: str, value: float, unit: str, note: str = "") -> Row:
    return {"area": "daemon", "metric": metric, "value": value, "unit": unit, "note": note}


def run(quick: bool = False) -> list[Row]:
    return asyncio.run(main_async(quick))


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        print(f"{r['metric']:<48} {r['value']:>10.2f} {r['unit']:<4} {r['note']}")


if __name__ == "__main__":
    print_rows(run(quick=cli.quick(__doc__)))
