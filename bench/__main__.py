"""``make bench``: run every benchmark and print one table (plain text and Markdown).

Figures are printed, never asserted. ``--quick`` shortens the long runs (fewer scans,
a 15 s instead of 60 s idle window, fewer calls) for a smoke run; ``--idle-window S``
sets the idle window of the fast-rbln-smi figures (600 s in a full run).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from . import (
    bench_cdi,
    bench_cdidirs,
    bench_daemon,
    bench_dra,
    bench_dra_scale,
    bench_fast,
    bench_http,
    bench_idle_parts,
    bench_k8sclient,
    bench_lean,
    bench_load,
    bench_metrics,
    bench_preferred,
    bench_scan,
    bench_topology,
    cli,
)

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
    """Preferred allocation: through the daemon's socket next to the floor, then in process."""
    return bench_preferred.run(quick) + bench_topology.run(quick)


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
    p = cli.parser(__doc__)
    cli.idle_window(p)
    args = p.parse_args(argv)
    quick, idle_window = args.quick, args.idle_window
    sections: list[tuple[str, Callable[[bool], list[Row]]]] = [
        ("scan", scan_rows),
        ("preferred allocation", topology_rows),
        ("daemon", bench_daemon.run),
        ("lean", bench_lean.run),
        ("idle scan", bench_idle_parts.run),
        ("fast rbln-smi", lambda quick: bench_fast.run(quick, idle_window)),
        ("metrics", bench_metrics.run),
        ("metrics HTTP layer", bench_http.run),
        ("load", bench_load.run),
        ("CDI spec directories", bench_cdidirs.run),
        ("CDI spec checks", bench_cdi.run),
        ("Kubernetes client libraries", bench_k8sclient.run),
        ("dra mode", bench_dra.run),
        ("dra mode at scale", bench_dra_scale.run),
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
