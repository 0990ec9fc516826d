"""Cost of one inventory scan without the rbln-smi process.

Each size gets a simulated node (real sysfs tree with symlinks); its ``rbln-smi -j``
output is captured once up front, then every timed run does what a scan does after the
tool returned: parse the JSON, read SR-IOV facts and PCI paths, classify, read every
advertised device's status. Run: ``python -m bench.bench_scan``.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rbln_device_plugin.host.smi import parse_inventory
from rbln_device_plugin.host.sysfs import read_status
from rbln_device_plugin.inventory import build_inventory
from rbln_device_plugin.scan import inventory_from_output
from rbln_device_plugin.sim.layout import generate
from rbln_device_plugin.sim.materialize import materialize

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

            def full_scan(text: str = output, sysfs: Path = sysfs) -> None:
                inventory = inventory_from_output(sysfs, text)
                # The plugins read every advertised device's status on each scan.
                for devices in inventory.resources.values():
                    for device in devices:
                        read_status(sysfs, device.name)

            def parse_and_classify(text: str = output) -> None:
                records, _ = parse_inventory(text)
                build_inventory(records, {})

            full_scan()  # sanity: every device is advertised
            inv = inventory_from_output(sysfs, output)
            assert sum(len(d) for d in inv.resources.values()) == size, inv
            results.append(_measure("scan without rbln-smi", size, runs, full_scan))
            results.append(_measure("parse + classify only", size, runs, parse_and_classify))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> None:
    print(f"{'case':<24} {'devices':>7} {'runs':>5} {'median ms':>10} {'p99 ms':>8} {'max ms':>8}")
    for row in run():
        print(
            f"{row['case']:<24} {row['devices']:>7} {row['runs']:>5} "
            f"{row['median_ms']:>10.3f} {row['p99_ms']:>8.3f} {row['max_ms']:>8.3f}"
        )


if __name__ == "__main__":
    main()
