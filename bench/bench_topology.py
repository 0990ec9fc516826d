"""Latency of one preferred-allocation search on ATOM-style nodes.

Run: ``.venv/bin/python -m bench.bench_topology``. Every row is one request shape timed
``REPEATS`` times; ``median_ms`` and ``worst_ms`` cover model building plus the search.
Random partial requests are timed once each and also report ``p99_ms``.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.layouts import atom_16_cards, atom_cards, atom_max_8
from rbln_device_plugin.topology import Candidate, preferred_allocation

REPEATS = 5
RANDOM_REQUESTS = 1000


def _time(call: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _sizes(layout: str, cands: Mapping[str, Candidate], repeats: int) -> list[dict[str, Any]]:
    ids = list(cands)
    rows = []
    for size in range(1, len(ids) + 1):
        samples = _time(lambda size=size: preferred_allocation(cands, ids, [], size), repeats)
        rows.append(
            {
                "layout": layout,
                "request": f"choose {size} of {len(ids)}",
                "median_ms": statistics.median(samples),
                "worst_ms": max(samples),
            }
        )
    return rows


def _partial(layout: str, cands: Mapping[str, Candidate], count: int) -> dict[str, Any]:
    """Random requests as a busy node sees them: some devices taken, some mandatory."""
    rng = random.Random(7)
    ids = list(cands)
    samples = []
    for _ in range(count):
        available = rng.sample(ids, rng.randint(len(ids) // 3, len(ids)))
        must = rng.sample(available, rng.randint(0, min(3, len(available))))
        size = rng.randint(len(must), len(available))
        samples += _time(
            lambda a=available, m=must, s=size: preferred_allocation(cands, a, m, s), 1
        )
    samples.sort()
    return {
        "layout": layout,
        "request": f"{count} random partial requests",
        "median_ms": statistics.median(samples),
        "p99_ms": samples[int(len(samples) * 0.99) - 1],
        "worst_ms": samples[-1],
    }


def run(repeats: int = REPEATS, random_requests: int = RANDOM_REQUESTS) -> list[dict[str, Any]]:
    """Benchmark rows (one dict per request shape) for ``make bench`` to aggregate."""
    atom8, cards16 = atom_max_8(), atom_16_cards()
    rows = _sizes("atom-max-8 (32)", atom8, repeats)
    rows += _sizes("16 cards (64)", cards16, repeats)
    one_numa = atom_cards(cards=8, numa_nodes=1)
    rows.append(
        {
            "layout": "8 cards, 1 NUMA (32)",
            "request": "choose 16 of 32",
            **_summary(
                _time(lambda: preferred_allocation(one_numa, list(one_numa), [], 16), repeats)
            ),
        }
    )
    rows.append(_partial("atom-max-8 (32)", atom8, random_requests))
    rows.append(_partial("16 cards (64)", cards16, random_requests))
    return rows


def _summary(samples: Sequence[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(samples), "worst_ms": max(samples)}


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'layout':<22} {'request':<32} {'median ms':>10} {'p99 ms':>7} {'worst ms':>9}")
    for row in rows:
        median, worst = row["median_ms"], row["worst_ms"]
        p99 = f"{row['p99_ms']:.2f}" if "p99_ms" in row else "-"
        print(f"{row['layout']:<22} {row['request']:<32} {median:>10.2f} {p99:>7} {worst:>9.2f}")
    for layout in sorted({row["layout"] for row in rows}):
        mine = [
            row for row in rows if row["layout"] == layout and row["request"].startswith("choose")
        ]
        if mine:
            worst = max(mine, key=lambda row: row["worst_ms"])
            print(f"worst single size on {layout}: {worst['worst_ms']:.2f} ms ({worst['request']})")


if __name__ == "__main__":
    _print(run())
