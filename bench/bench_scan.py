"""Cost of one inventory scan without the rbln-smi process, with nothing cached.

Each size gets a simulated node (real sysfs tree with symlinks); its ``rbln-smi -j``
output is captured once up front, then every timed run does what a first scan does
after the tool returned, with a fresh scanner: parse the JSON, read SR-IOV facts and PCI
paths, classify, read every advertised device's status (all sysfs reads through the
host-I/O runner, as in the daemon). ``bench_lean`` times the steady state, where the
scanner's cache applies. Run: ``python -m bench.bench_scan``.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.host.smi import parse_inventory
from rbln_device_plugin.host.sysfs import read_statuses
from rbln_device_plugin.model.inventory import inventory_from, screen
from rbln_device_plugin_sim.layout import generate
from rbln_device_plugin_sim.node import materialize

from . import cli

SIZES = (32, 64)
RUNS = 1000
WARMUP = 50


def _percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


def _measure(label: str, devices: int, runs: int, action: Any) -> dict[str, Any]:
    for _ in range(WARMUP):
        action()
    samples: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "case": label,
        "devices": devices,
        "runs": runs,
        "median_ms": round(statistics.median(samples), 4),
        "p99_ms": round(_percentile(samples, 0.99), 4),
        "max_ms": round(samples[-1], 4),
    }


def run(sizes: tuple[int, ...] = SIZES, runs: int = RUNS) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for size in sizes:
        root = Path(tempfile.mkdtemp(prefix="rbln-bench-", dir="/tmp"))
        try:
            node = materialize(generate(size // 4, 4, 2), root / "node")
            output = subprocess.run(
                [str(node.smi_path), "-j"], capture_output=True, text=True, check=True
            ).stdout
            sysfs = node.sysfs_root

            io = HostIO()

            async def cold_scan(text: str, sysfs: Path, io: HostIO = io) -> int:
                inventory = await Scanner(sysfs_root=sysfs, hostio=io).inventory(text)
                # The plugins read every advertised device's status on each scan.
                for devices in inventory.resources.values():
                    await read_statuses(io, sysfs, (d.name for d in devices))
                return sum(len(d) for d in inventory.resources.values())

            loop = asyncio.new_event_loop()

            def full_scan(
                text: str = output, sysfs: Path = sysfs, loop: asyncio.AbstractEventLoop = loop
            ) -> int:
                return loop.run_until_complete(cold_scan(text, sysfs))

            def parse_and_classify(text: str = output) -> None:
                records, _ = parse_inventory(text)
                inventory_from(screen(records), {})

            assert full_scan() == size  # sanity: every device is advertised
            results.append(_measure("first scan without rbln-smi", size, runs, full_scan))
            results.append(_measure("parse + classify only", size, runs, parse_and_classify))
            loop.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> None:
    cli.parser(__doc__).parse_args()  # no flag of its own: --help, or a clear refusal
    print(f"{'case':<24} {'devices':>7} {'runs':>5} {'median ms':>10} {'p99 ms':>8} {'max ms':>8}")
    for row in run():
        print(
            f"{row['case']:<24} {row['devices']:>7} {row['runs']:>5} "
            f"{row['median_ms']:>10.3f} {row['p99_ms']:>8.3f} {row['max_ms']:>8.3f}"
        )


if __name__ == "__main__":
    main()
