"""What the CDI spec check costs at idle: a spec directory holding 50,000 unrelated files
next to an empty one (the floor), one check at a time.

A check is ``SpecDirReader.read`` of one directory on this thread (what the daemon's
host-I/O thread runs once per directory and scan), timed in CPU (``time.thread_time``),
the median of batches. Rows: the idle check of an empty directory (the floor); of 50,000
unrelated files, and of the same with the toolkit's ``rbln.yaml``; a check right after
the directory changed (listed again: names and types from the listing, no stat of any
entry); and what every check cost before the directory's own signature was looked at
(a listing with an ``lstat`` of every entry), for comparison. The share of a core is at
a 1 s scan interval, the daemon's shortest in practice (the default is 5 s).

Run: ``python -m bench.bench_cdidirs [--quick]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rbln_device_plugin.host.cdidirs import SpecDirReader

from . import cli
from .rows import Row, floor_row

FILES = 50_000
TOOLKIT_SPEC = (
    "cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices:\n"
    "  - name: runtime\n    containerEdits:\n      env: [RBLN_CDI=1]\n"
)


def _cpu_ms(action: Callable[[], object], calls: int, batches: int = 5) -> float:
    """Median over ``batches`` of the CPU milliseconds one call of ``action`` takes."""
    action()  # warm: the first look lists and reads
    figures = []
    for _ in range(batches):
        started = time.thread_time()
        for _ in range(calls):
            action()
        figures.append((time.thread_time() - started) * 1000 / calls)
    return statistics.median(figures)


def _full_listing(path: str) -> None:
    """Every check before: the listing with an ``lstat`` of each entry."""
    with os.scandir(path) as it:
        for entry in it:
            entry.stat(follow_symlinks=False)


def _fill(directory: Path, count: int) -> None:
    for index in range(count):
        os.close(os.open(directory / f"unrelated-{index}.log", os.O_CREAT | os.O_WRONLY, 0o644))


def _share(ms: float) -> str:
    return f"{ms / 10:.3f} % of a core at a 1 s interval"


def run(quick: bool = False) -> list[Row]:
    calls, relists = (200, 3) if quick else (2000, 10)
    with tempfile.TemporaryDirectory(prefix="bench-cdi-") as tmp:
        empty, crowded = Path(tmp) / "empty", Path(tmp) / "crowded"
        empty.mkdir()
        crowded.mkdir()
        _fill(crowded, FILES)
        # A signature younger than the reader's 1 s margin is not trusted yet.
        time.sleep(1.2)
        readers = {d: SpecDirReader() for d in (empty, crowded)}
        floor = _cpu_ms(lambda: readers[empty].read(str(empty)), calls)
        idle = _cpu_ms(lambda: readers[crowded].read(str(crowded)), calls)
        (crowded / "rbln.yaml").write_text(TOOLKIT_SPEC)
        time.sleep(1.2)
        idle_spec = _cpu_ms(lambda: readers[crowded].read(str(crowded)), calls)
        toggle = crowded / "toggle.log"

        def changed() -> None:
            if toggle.exists():
                toggle.unlink()
            else:
                toggle.write_text("")
            readers[crowded].read(str(crowded))

        relist = _cpu_ms(changed, relists, batches=3)
        before = _cpu_ms(lambda: _full_listing(str(crowded)), relists, batches=3)
    area = "cdi"
    return [
        floor_row(
            area, "idle CDI check, empty spec directory (floor)", floor, "ms", extra=_share(floor)
        ),
        floor_row(
            area, f"idle CDI check, {FILES:,} unrelated files", idle, "ms", floor, _share(idle)
        ),
        floor_row(
            area,
            f"idle CDI check, {FILES:,} unrelated files and rbln.yaml",
            idle_spec,
            "ms",
            floor,
            _share(idle_spec),
        ),
        floor_row(
            area,
            f"CDI check after the directory changed, {FILES:,} files (listed again)",
            relist,
            "ms",
            floor,
            f"median of {relists}",
        ),
        floor_row(
            area,
            f"before: a listing with an lstat of each of {FILES:,} entries",
            before,
            "ms",
            floor,
            _share(before),
        ),
    ]


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__, sys.argv[1:])):
        print(f"{r['metric']:<72} {r['value']:>9.4f} {r['unit']:<3} {r['note']}")
