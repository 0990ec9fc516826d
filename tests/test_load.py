"""Memory under sustained load: 10,000 calls must not make the daemon keep growing.

Resident memory is noisy: request buffers are returned to the allocator unevenly, and
the first few thousand calls fill caches that then stay. So the check warms up first,
keeps the number of calls in flight modest (the noise scales with it), samples after
every batch, and judges the trend with a Theil-Sen slope (the median of all pairwise
slopes), which a few outlying samples cannot move. A leak of 0.25 KiB per call, a
quarter of the smallest leak worth catching, is the limit; the detector itself is
checked on synthetic series below, so it is known to fail on a real leak.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from itertools import combinations

import pytest

from .simnode import running

NPU = "rebellions.ai/npu"
WARMUP_BATCHES = 4
BATCHES = 20
CALLS_PER_BATCH = 500
IN_FLIGHT = 50
# KiB of growth per 1,000 calls that fails the test: 0.25 KiB per call.
LEAK_LIMIT_KIB_PER_1000 = 250.0


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def growth_per_1000_calls(samples: list[int], calls_per_sample: int) -> float:
    """Theil-Sen slope of RSS samples, in KiB per 1,000 calls."""
    slopes = [(b - a) / (j - i) for (i, a), (j, b) in combinations(enumerate(samples), 2)]
    return statistics.median(slopes) * 1000 / calls_per_sample


def test_the_detector_catches_a_leak_and_ignores_noise() -> None:
    rng = random.Random(3)
    # Seen on this machine: samples swing by about +-1 MiB, and the allocator sometimes
    # grows once by a megabyte or so and then stays there. Neither is a leak.
    noise = [46_000 + rng.randint(-1_500, 1_500) for _ in range(BATCHES)]
    step = [46_000] * 8 + [47_500] * (BATCHES - 8)
    leak = [46_000 + round(i * CALLS_PER_BATCH * 0.5) + rng.randint(-1_500, 1_500)
            for i in range(BATCHES)]  # fmt: skip  # 0.5 KiB per call
    assert growth_per_1000_calls(noise, CALLS_PER_BATCH) < LEAK_LIMIT_KIB_PER_1000
    assert growth_per_1000_calls(step, CALLS_PER_BATCH) < LEAK_LIMIT_KIB_PER_1000
    assert growth_per_1000_calls(leak, CALLS_PER_BATCH) > LEAK_LIMIT_KIB_PER_1000


@pytest.mark.slow
async def test_resident_memory_levels_off_over_10000_calls() -> None:
    async with running("atom-max-8", interval="1s", level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        rng = random.Random(7)
        ids = [f"rbln{i}" for i in range(32)]
        samples = []
        for batch in range(WARMUP_BATCHES + BATCHES):
            for _ in range(CALLS_PER_BATCH // IN_FLIGHT):
                calls = []
                for _ in range(IN_FLIGHT):
                    available = rng.sample(ids, rng.randint(8, 32))
                    calls.append(
                        h.kubelet.preferred(NPU, available, available[:1], rng.randint(1, 6))
                    )
                results = await asyncio.gather(*calls, return_exceptions=True)
                assert not [r for r in results if isinstance(r, BaseException)]
            # Allocations too, accepted and refused.
            await h.kubelet.allocate(NPU, [[ids[batch % 32]]])
            refused = await asyncio.gather(
                h.kubelet.allocate(NPU, [["ghost"]]), return_exceptions=True
            )
            assert isinstance(refused[0], BaseException)
            # Sample between batches, never during one: a last call answered after every
            # other call of the batch was (the Theil-Sen slope absorbs the rest of the noise).
            await h.kubelet.preferred(NPU, ids, [], 1)
            if batch >= WARMUP_BATCHES:
                samples.append(rss_kib(h.daemon.proc.pid))
        growth = growth_per_1000_calls(samples, CALLS_PER_BATCH)
        print(f"RSS KiB per {CALLS_PER_BATCH} calls: {samples}; trend {growth:.0f} KiB/1000")
        assert growth < LEAK_LIMIT_KIB_PER_1000, samples
        assert h.daemon.proc.poll() is None
