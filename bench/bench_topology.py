"""The preferred-allocation search in process, without gRPC: what the daemon's CPU does.

Same layouts and the same random requests as ``bench.bench_preferred``. Each request is
answered by one prepared allocator (as the daemon keeps one per device set) three times;
its time is the fastest of the three, which removes preemption on a shared machine and
leaves the search's own cost. Reported per layout: the one-time preparation, size 1, the
median and worst request, and how many answers hit the safety cap (should be none).

Run: ``.venv/bin/python -m bench.bench_topology [--quick]``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import cli
from bench.bench_preferred import requests_for
from bench.layouts import candidates, node_64, node_64_half_unreadable, node_128
from rbln_device_plugin.topology import Topology

Row = dict[str, Any]


def measure(name: str, cands: dict[str, Any], per_size: int) -> list[Row]:
    began = time.perf_counter()
    allocator = Topology(cands)
    allocator.plan  # noqa: B018 - the per-inventory preparation is part of the figure
    prepared_ms = (time.perf_counter() - began) * 1000
    ids = list(cands)
    times: list[tuple[float, int]] = []
    capped = 0
    for available, must, size in requests_for(ids, per_size, seed=len(ids)):
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            result = allocator.preferred(available, must, size)
            best = min(best, (time.perf_counter() - began) * 1000)
        capped += result.capped is not None
        times.append((best, size))
    size1 = [t for t, size in times if size == 1]
    worst = max(times)
    label = f"{name} ({len(ids)}), in process"
    return [
        _row(f"{label}: preparation once per device set", prepared_ms, ""),
        _row(f"{label}: size 1, worst request", max(size1), ""),
        _row(f"{label}: median request", statistics.median(t for t, _ in times), ""),
        _row(f"{label}: worst request", worst[0], f"size {worst[1]}"),
        {
            "area": "preferred",
            "metric": f"{label}: answers past the safety cap",
            "value": float(capped),
            "unit": "",
            "note": f"of {len(times)} random requests",
        },
    ]


def _row(metric: str, ms: float, note: str) -> Row:
    return {"area": "preferred", "metric": metric, "value": ms, "unit": "ms", "note": note}


def run(quick: bool = False) -> list[Row]:
    per_size = 2 if quick else 8
    rows: list[Row] = []
    for make in (node_64, node_64_half_unreadable, node_128):
        layout = make()
        rows += measure(layout.name, candidates(layout), per_size)
    return rows


if __name__ == "__main__":
    for row in run(quick=cli.quick(__doc__)):
        print(f"{row['metric']:<64} {row['value']:>9.3f} {row['unit']:<3} {row['note']}")
