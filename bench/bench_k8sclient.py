"""The Kubernetes client libraries the DRA front end could use, side by side: what
importing each costs a fresh process (time and resident memory, next to a process that
imports asyncio alone), whether it has typed ``resource.k8s.io/v1`` models
(ResourceSlice, ResourceClaim, DeviceClass), and whether it watches asynchronously.

Each candidate loads what a DRA plugin would: the asyncio client, the config loader,
the watch, and the resource models. Every figure is a median of fresh processes run in
turn (candidate after candidate, round after round), so a drift of the machine touches
all of them. A candidate that is not installed is reported as such, not measured.

Run: ``python -m bench.bench_k8sclient [--quick] [--runs N]``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

from . import cli

# name -> (the imports a DRA plugin makes, the checks that print what the library has)
_FLOOR = "import asyncio"
CANDIDATES: dict[str, str] = {
    "kubernetes 37 (kubernetes.aio)": (
        "from kubernetes.aio import client, config, watch\n"
        "typed = all(hasattr(client, n) for n in "
        "('V1ResourceSlice', 'ResourceV1ResourceClaim', 'V1DeviceClass', 'ResourceV1Api'))\n"
        "watches = asyncio.iscoroutinefunction(getattr(watch.Watch, 'close', None)) or "
        "hasattr(watch.Watch, '__aiter__') or hasattr(watch.Watch, 'stream')\n"
    ),
    "kubernetes-asyncio 36": (
        "from kubernetes_asyncio import client, config, watch\n"
        "typed = all(hasattr(client, n) for n in "
        "('V1ResourceSlice', 'ResourceV1ResourceClaim', 'V1DeviceClass', 'ResourceV1Api'))\n"
        "watches = hasattr(watch.Watch, 'stream')\n"
    ),
    "lightkube 1.0 + lightkube-models 1.37": (
        "from lightkube import AsyncClient, KubeConfig\n"
        "from lightkube.resources import resource_v1\n"
        "typed = all(hasattr(resource_v1, n) for n in "
        "('ResourceSlice', 'ResourceClaim', 'DeviceClass'))\n"
        "watches = hasattr(AsyncClient, 'watch')\n"
    ),
}
# Read in the probe process itself: VmRSS once everything is imported.
_PROBE = """
import asyncio, json, time
{body}
def rss_kib():
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    return 0
print(json.dumps({{'rss_kib': rss_kib(), 'typed': bool(typed), 'watches': bool(watches)}}))
"""


def probe(body: str) -> dict[str, Any] | None:
    """One fresh process: wall time, its final VmRSS and the library's answers; None
    when the library is not installed."""
    code = _PROBE.format(body=body)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        if "ModuleNotFoundError" in done.stderr:
            return None
        raise RuntimeError(f"probe failed: {done.stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    answer["wall_s"] = wall
    return answer


def measure(runs: int) -> dict[str, list[dict[str, Any]] | None]:
    bodies = {"floor": f"{_FLOOR}\ntyped = watches = False\n", **CANDIDATES}
    figures: dict[str, list[dict[str, Any]] | None] = {name: [] for name in bodies}
    for _ in range(runs):
        for name, body in bodies.items():
            runs_so_far = figures[name]
            if runs_so_far is None:
                continue
            answer = probe(body)
            if answer is None:
                figures[name] = None
            else:
                runs_so_far.append(answer)
    return figures


def run(quick: bool, runs: int | None = None) -> list[dict[str, Any]]:
    runs = runs or (3 if quick else 5)
    figures = measure(runs)
    floor = figures["floor"]
    assert floor
    floor_ms = statistics.median(f["wall_s"] for f in floor) * 1000
    floor_mib = statistics.median(f["rss_kib"] for f in floor) / 1024
    rows: list[dict[str, Any]] = [
        {
            "area": "k8sclient",
            "metric": "floor: python -c 'import asyncio', start to exit",
            "value": floor_ms,
            "unit": "ms",
            "note": f"median of {runs} fresh processes; VmRSS {floor_mib:.1f} MiB",
        }
    ]
    for name in CANDIDATES:
        answers = figures[name]
        if answers is None:
            rows.append(
                {"area": "k8sclient", "metric": f"{name}: not installed", "value": 0.0,
                 "unit": "", "note": "pip install it to measure"}
            )  # fmt: skip
            continue
        wall_ms = statistics.median(a["wall_s"] for a in answers) * 1000
        mib = statistics.median(a["rss_kib"] for a in answers) / 1024
        typed = "typed resource.k8s.io/v1 models" if answers[0]["typed"] else "NO typed v1 models"
        watches = "async watch" if answers[0]["watches"] else "NO async watch"
        rows.append(
            {
                "area": "k8sclient",
                "metric": f"{name}: import, start to exit",
                "value": wall_ms,
                "unit": "ms",
                "note": f"median of {runs}; {wall_ms - floor_ms:+.0f} ms and "
                f"{wall_ms / floor_ms:.1f}x the floor; {typed}; {watches}",
            }
        )
        rows.append(
            {
                "area": "k8sclient",
                "metric": f"{name}: VmRSS after import",
                "value": mib,
                "unit": "MiB",
                "note": f"median of {runs}; {mib - floor_mib:+.1f} MiB over the floor's "
                f"{floor_mib:.1f} MiB",
            }
        )
    return rows


def main(argv: list[str]) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--runs", type=int, default=None, help="processes each (default 5, 3 quick)")
    args = p.parse_args(argv)
    for row in run(args.quick, args.runs):
        print(f"{row['metric']:<62} {row['value']:>9.1f} {row['unit']:<4} {row['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
