"""``make bench``: run every benchmark and print one table (plain text and Markdown).

Figures are printed, never asserted. ``--quick`` shortens the long runs (fewer scans,
a 15 s instead of 60 s idle window, fewer calls) for a smoke run.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from . import bench_daemon, bench_lean, bench_load, bench_scan, bench_topology

Row = dict[str, Any]


def scan_rows(quick: bool) -> list[Row]:
    rows = []
    for result in bench_scan.run(runs=200 if quick else 1000):
        rows.append(
            {
                "area": "scan",
                "metric": f"{result['case']}, {result['devices']} devices",
                "value": result["median_ms"],
                "unit": "ms",
                "note": f"median of {result['runs']}; p99 {result['p99_ms']:.2f} ms",
            }
        )
    return rows


def topology_rows(quick: bool) -> list[Row]:
    """Selected sizes per layout, the worst size overall, and random busy-node requests."""
    shown_sizes = {1, 2, 4, 8, 16, 24, 32, 48, 64}
    results = bench_topology.run(repeats=2 if quick else 5, random_requests=200 if quick else 1000)
    rows: list[Row] = []
    for layout in dict.fromkeys(r["layout"] for r in results):
        per_size = [
            r for r in results if r["layout"] == layout and r["request"].startswith("choose")
        ]
        for r in per_size:
            size = int(r["request"].split()[1])
            if size in shown_sizes or len(per_size) == 1:
                rows.append(_topology_row(layout, r["request"], r))
        if len(per_size) > 1:
            worst = max(per_size, key=lambda r: r["worst_ms"])
            rows.append(_topology_row(layout, f"worst of all sizes ({worst['request']})", worst))
        for r in results:
            if r["layout"] == layout and "random" in r["request"]:
                rows.append(_topology_row(layout, r["request"], r, p99=r["p99_ms"]))
    return rows


def _topology_row(layout: str, request: str, r: Row, p99: float | None = None) -> Row:
    note = f"median {r['median_ms']:.2f} ms"
    if p99 is not None:
        note += f", p99 {p99:.2f} ms"
    return {
        "area": "preferred",
        "metric": f"{layout}: {request}",
        "value": r["worst_ms"],
        "unit": "ms",
        "note": f"worst; {note}",
    }


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    sections: list[tuple[str, Callable[[bool], list[Row]]]] = [
        ("scan", scan_rows),
        ("topology", topology_rows),
        ("daemon", bench_daemon.run),
        ("lean", bench_lean.run),
        ("load", bench_load.run),
    ]
    rows: list[Row] = []
    began = time.monotonic()
    for name, runner in sections:
        print(f"running {name} benchmarks ...", file=sys.stderr, flush=True)
        rows += runner(quick)
    print(f"\nrbln-device-plugin benchmarks ({'quick' if quick else 'full'} run, "
          f"{time.monotonic() - began:.0f} s)")  # fmt: skip
    print(f"machine: {machine()}\n")
    width = max(len(r["metric"]) for r in rows)
    for r in rows:
        print(
            f"{r['area']:<9} {r['metric']:<{width}} {r['value']:>10.2f} {r['unit']:<6} {r['note']}"
        )
    print("\n| area | measurement | value | notes |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['area']} | {r['metric']} | {r['value']:.2f} {r['unit']} | {r['note']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
