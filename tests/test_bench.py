"""The benchmarks still run: `make bench` is where speed and memory are measured, so a
benchmark broken by a change in the daemon must fail here rather than on the day someone
wants the figures. Nothing is asserted about the figures themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AREAS = {"scan", "preferred", "daemon", "lean", "fast", "metrics", "load"}


@pytest.mark.slow  # the quick run of every benchmark takes minutes
@pytest.mark.timeout(1800)  # a hang guard, well past the 2-4 min the quick run takes
def test_every_benchmark_runs_and_reports_its_area() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=REPO, capture_output=True, text=True, timeout=1700, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    areas = {line.split("|")[1].strip() for line in table[1:]}
    assert areas == AREAS, done.stdout[-4000:]


@pytest.mark.timeout(300)
def test_the_allocate_breakdown_runs_and_reports_every_step() -> None:
    # Its hooks wrap daemon functions by name: a renamed step must fail here, not when
    # someone next profiles an Allocate.
    done = subprocess.run(
        [sys.executable, "-m", "bench.allocate_steps", "--calls", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    steps = {line.split()[0] for line in done.stdout.splitlines()[2:] if line.strip()}
    expected = {"gRPC", "checks", "lock", "spawn", "tool", "reap", "parse", "node", "rest"}
    assert expected | {"handler", "total", "share"} <= steps, done.stdout
    assert "thread hops 2" in done.stdout, done.stdout


BENCH_MODULES = [
    "bench", "bench.allocate_steps", "bench.bench_daemon", "bench.bench_fast",
    "bench.bench_http", "bench.bench_lean", "bench.bench_load", "bench.bench_metrics",
    "bench.bench_preferred", "bench.bench_scan", "bench.bench_topology",
]  # fmt: skip


@pytest.mark.parametrize("module", BENCH_MODULES)
def test_help_and_a_mistyped_flag_never_start_a_run(module: str) -> None:
    # Before, each benchmark looked for its flags in sys.argv by hand: `--help` or a
    # mistyped flag started a run of several minutes with the defaults.
    for argv, code in ((["--help"], 0), (["--qiuck"], 2)):
        done = subprocess.run(
            [sys.executable, "-m", module, *argv],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == code, (argv, done.stdout[-2000:], done.stderr[-2000:])
        assert "usage:" in (done.stdout if code == 0 else done.stderr)
