"""Load against the real daemon: concurrent GetPreferredAllocation and Allocate calls.

- 1,000 concurrent GetPreferredAllocation calls spread over the node's resources;
- 200 concurrent Allocate calls across resources (they serialise on the RSD lock);
- resident memory after 10,000 calls.

Run: ``python -m bench.bench_load [--quick]``. Prints a table; ``run()`` returns rows.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import Layout, SimDevice, generate, make_vfs

from . import cli
from .bench_daemon import Row, fast_smi, node_with_daemon, rss_mib

NPU = "rebellions.ai/npu"
VF4 = "rebellions.ai/npu-vf4"


def mixed_layout() -> Layout:
    """8 ATOM-like cards (32 PFs) plus two REBEL PFs in vf-4: two resources to load."""
    base = generate(8, 4, 2, name="bench-load")
    npu = max(d.npu for d in base.devices) + 1
    extra = []
    for index, bus in enumerate((0xC1, 0xD1)):
        pf_name = f"rbln{npu}"
        bdf = f"0000:{bus:02x}:00.0"
        pf = SimDevice(
            name=pf_name, npu=npu, product="RBLN-CR13", bus_id=bdf,
            sid=f"{21309000 + index:016d}", numa=str(index % 2),
            pci_path=(f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0", bdf),
            sriov_numvfs=4, listed=False,
        )  # fmt: skip
        extra += [pf, *make_vfs(pf, 4, npu + 1)]
        npu += 5
    return Layout("bench-load", (*base.devices, *extra))


async def timed(calls: Sequence[Callable[[], Awaitable[Any]]]) -> tuple[list[float], float, int]:
    """Run all calls concurrently; (latencies ms of successes, wall s, failures)."""
    latencies: list[float] = []
    failures = 0

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        nonlocal failures
        began = time.perf_counter()
        try:
            await call()
        except Exception:
            failures += 1
            return
        latencies.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(one(c) for c in calls))
    return latencies, time.perf_counter() - began, failures


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def preferred_calls(kubelet: KubeletStub, count: int, seed: int) -> list[Callable[[], Any]]:
    rng = random.Random(seed)
    npu_ids = [f"rbln{i}" for i in range(32)]
    view = kubelet.view(VF4)
    vf_ids = view.ids if view is not None else []
    calls: list[Callable[[], Any]] = []
    for _ in range(count):
        if vf_ids and rng.random() < 0.25:
            resource, pool = VF4, vf_ids
        else:
            resource, pool = NPU, npu_ids
        available = rng.sample(pool, rng.randint(max(2, len(pool) // 2), len(pool)))
        size = rng.randint(1, min(8, len(available) - 1))
        calls.append(lambda r=resource, a=available, s=size: kubelet.preferred(r, a, [], s))
    return calls


async def main_async(quick: bool) -> list[Row]:
    rows: list[Row] = []
    async with node_with_daemon(mixed_layout(), "5s", fast_smi) as (_, kubelet, proc, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 32, 30)
        await kubelet.wait_for(VF4, lambda v: len(v.devices) == 8, 30)
        rss_start = rss_mib(proc.pid)

        lat, wall, failed = await timed(preferred_calls(kubelet, 1000, 1))
        rows.append(row("1,000 concurrent GetPreferredAllocation", len(lat) / wall, "req/s",
                        f"p50 {pct(lat, 0.5):.1f} ms, p99 {pct(lat, 0.99):.1f} ms, "
                        f"{failed} failed"))  # fmt: skip

        count = 40 if quick else 200
        allocs: list[Callable[[], Any]] = []
        vf_ids = kubelet.view(VF4).ids  # type: ignore[union-attr]
        for index in range(count):
            if index % 4 == 3:
                allocs.append(lambda i=index: kubelet.allocate(VF4, [[vf_ids[i % len(vf_ids)]]]))
            else:
                allocs.append(lambda i=index: kubelet.allocate(NPU, [[f"rbln{i % 32}"]]))
        # Waves of 10: allocations queue for the RSD lock within its 5 s budget.
        lat, wall, failed = [], 0.0, 0
        for start in range(0, count, 10):
            wave_lat, wave_wall, wave_failed = await timed(allocs[start : start + 10])
            lat += wave_lat
            wall += wave_wall
            failed += wave_failed
        rows.append(row(f"{count} Allocate, 10 at a time (2 resources)", len(lat) / wall, "req/s",
                        f"p50 {pct(lat, 0.5):.0f} ms, p99 {pct(lat, 0.99):.0f} ms, "
                        f"{failed} failed; serialised on the RSD lock"))  # fmt: skip

        rss_after_load = rss_mib(proc.pid)
        total, samples = 10_000 if not quick else 3_000, []
        done = 0
        while done < total:
            batch = preferred_calls(kubelet, 1000, done)
            await timed(batch)
            done += len(batch)
            samples.append(rss_mib(proc.pid))
        rows.append(row("RSS after registration", rss_start, "MiB"))
        rows.append(row("RSS after the load above", rss_after_load, "MiB"))
        rows.append(row(f"RSS after {total:,} more calls", samples[-1], "MiB",
                        "per 1,000: " + " ".join(f"{s:.1f}" for s in samples)))  # fmt: skip
    return rows


def row(metric: str, value: float, unit: str, note: str = "") -> Row:
    return {"area": "load", "metric": metric, "value": value, "unit": unit, "note": note}


def run(quick: bool = False) -> list[Row]:
    return asyncio.run(main_async(quick))


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__)):
        print(f"{r['metric']:<48} {r['value']:>10.2f} {r['unit']:<6} {r['note']}")
