"""GetPreferredAllocation through the daemon's socket, next to a floor from the same run.

The floor is a trivial unary call (``GetDevicePluginOptions``) on the same socket and
channel, so every figure can be read as "so many round trips". For each layout
(``bench.layouts``: 64 devices all readable, 64 with every second PCI path unreadable,
128 devices on 4 NUMA nodes) and every size 1..N the benchmark sends random requests:
random availability (at least the size, at least ~60 % of the node), random
must-include devices (0-3). Each request is sent ``repeats`` times and its time is the
median of those, so one preemption on a shared machine does not make a request look slow.

Reported per layout: floor p50; size 1 (median request and worst request); the worst
request over all sizes; the median over all requests; and the number of valid requests
answered with an empty list (a fallback to the kubelet, which should never happen).

Run: ``python -m bench.bench_preferred [--quick]``; ``run()`` returns rows for ``make bench``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpc import aio

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin_sim.layout import Layout

from . import cli
from .bench_daemon import fast_smi, node_with_daemon
from .layouts import node_64, node_64_half_unreadable, node_128

NPU = "rebellions.ai/npu"
Row = dict[str, Any]


@dataclass
class Result:
    layout: str
    devices: int
    floor_ms: float  # p50 of GetDevicePluginOptions
    size1_p50_ms: float
    size1_max_ms: float
    worst_ms: float
    worst_request: str
    median_ms: float
    requests: int
    fallbacks: int


def requests_for(
    ids: list[str], per_size: int, seed: int
) -> list[tuple[list[str], list[str], int]]:
    rng = random.Random(seed)
    out = []
    least = max(1, len(ids) * 5 // 8)
    for size in range(1, len(ids) + 1):
        for _ in range(per_size):
            count = rng.randint(max(size, least), len(ids))
            available = rng.sample(ids, count)
            must = rng.sample(available, rng.randint(0, min(3, size)))
            out.append((available, must, size))
    return out


async def _timed(call: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    samples = []
    answer = None
    for _ in range(repeats):
        began = time.perf_counter()
        answer = await call()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples), answer


async def measure(layout: Layout, per_size: int, repeats: int, floor_calls: int) -> Result:
    ids = [d.name for d in layout.devices]
    async with node_with_daemon(layout, "1h", fast_smi) as (node, kubelet, _, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == len(ids), 60)
        view = kubelet.view(NPU)
        assert view is not None
        async with aio.insecure_channel(f"unix:{node.kubelet_dir / view.endpoint}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)

            async def options() -> Any:
                return await stub.GetDevicePluginOptions(api_pb2.Empty())

            def preferred(available: list[str], must: list[str], size: int) -> Any:
                request = api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available,
                            must_include_deviceIDs=must,
                            allocation_size=size,
                        )
                    ]
                )
                return stub.GetPreferredAllocation(request)

            for _ in range(50):  # warm the channel and the daemon's caches
                await options()
            await preferred(ids, [], 2)
            floor = [(await _timed(options, 1))[0] for _ in range(floor_calls // 2)]
            times: list[tuple[float, int, str]] = []
            fallbacks = 0
            for available, must, size in requests_for(ids, per_size, seed=len(ids)):
                elapsed, answer = await _timed(
                    lambda a=available, m=must, s=size: preferred(a, m, s), repeats
                )
                got = list(answer.container_responses[0].deviceIDs)
                if len(got) != size:
                    fallbacks += 1
                label = f"size {size}, {len(available)} available, {len(must)} must"
                times.append((elapsed, size, label))
            floor += [(await _timed(options, 1))[0] for _ in range(floor_calls // 2)]
    size1 = [t for t, size, _ in times if size == 1]
    worst = max(times)
    return Result(
        layout=layout.name,
        devices=len(ids),
        floor_ms=statistics.median(floor),
        size1_p50_ms=statistics.median(size1),
        size1_max_ms=max(size1),
        worst_ms=worst[0],
        worst_request=worst[2],
        median_ms=statistics.median(t for t, _, _ in times),
        requests=len(times),
        fallbacks=fallbacks,
    )


async def main_async(quick: bool) -> list[Result]:
    per_size, repeats = (2, 3) if quick else (8, 3)
    results = []
    for make in (node_64, node_64_half_unreadable, node_128):
        results.append(await measure(make(), per_size, repeats, 400 if quick else 1000))
    return results


def rows(results: list[Result]) -> list[Row]:
    out: list[Row] = []
    for r in results:

        def ratio(ms: float, floor: float = r.floor_ms) -> str:
            return f"{ms / floor:.1f}x floor"

        name = f"{r.layout} ({r.devices})"
        out += [
            _row(f"{name}: floor (GetDevicePluginOptions p50)", r.floor_ms, "same socket"),
            _row(f"{name}: size 1, median request", r.size1_p50_ms, ratio(r.size1_p50_ms)),
            _row(f"{name}: size 1, worst request", r.size1_max_ms, ratio(r.size1_max_ms)),
            _row(
                f"{name}: worst request, sizes 1..{r.devices}",
                r.worst_ms,
                f"{ratio(r.worst_ms)}; {r.worst_request}",
            ),
            _row(f"{name}: median request", r.median_ms, ratio(r.median_ms)),
            {
                "area": "preferred",
                "metric": f"{name}: fallbacks to the kubelet",
                "value": float(r.fallbacks),
                "unit": "",
                "note": f"of {r.requests} random valid requests",
            },
        ]
    return out


def _row(metric: str, ms: float, note: str) -> Row:
    return {"area": "preferred", "metric": metric, "value": ms, "unit": "ms", "note": note}


def run(quick: bool = False) -> list[Row]:
    return rows(asyncio.run(main_async(quick)))


if __name__ == "__main__":
    for row in run(quick=cli.quick(__doc__)):
        print(f"{row['metric']:<60} {row['value']:>9.2f} {row['unit']:<3} {row['note']}")
