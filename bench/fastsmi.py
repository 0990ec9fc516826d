"""A compiled ``rbln-smi`` for the Allocate figures (``fast_smi.c``): the four commands of
the simulator's fake, the same JSON byte for byte, a fraction of a millisecond a call.

``install(node)`` compiles it once per process (``cc -O2``), puts it at the node's
``rbln-smi`` path and writes its state next to it from the simulator's own ``-g -j``
listing (checked to render identically). From then on the node's groups live in the
fast tool's state, not the simulator's: ``FastSmi.groups`` and ``ungroup`` read and reset
them. Each call appends its own start and end (CLOCK_MONOTONIC ns) to ``timings``.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import statistics
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from rbln_device_plugin_sim.node import SimNode

SOURCE = Path(__file__).with_name("fast_smi.c")
_SENTINEL = "@GROUP@"


class NoCompiler(RuntimeError):
    """No C compiler on this machine: the fast rbln-smi rows are skipped."""


@functools.cache
def binary() -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NoCompiler("no cc/gcc on PATH")
    scratch = tempfile.mkdtemp(prefix="rbln-fastsmi-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # one build per process
    out = Path(scratch) / "fast-smi"
    # Static when the C library allows it: no dynamic loader in every call.
    for extra in (["-static"], []):
        done = subprocess.run(
            [compiler, "-O2", *extra, "-o", str(out), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            return out
    raise NoCompiler(f"cc failed: {done.stderr[-2000:]}")


def _render(document: dict[str, object], devices: list[dict[str, object]]) -> tuple[str, str]:
    """The listing's text before the first device and after the last (the simulator's
    ``json.dumps(indent=4)`` layout)."""
    top = {k: v for k, v in document.items() if k != "devices"}
    head = json.dumps({**top, "devices": [_SENTINEL]}, indent=4)
    before, after = head.split(f'"{_SENTINEL}"')
    return before.rstrip(" "), after + "\n"


def _object(record: dict[str, object]) -> str:
    return textwrap.indent(json.dumps(record, indent=4), " " * 8)


@dataclass(frozen=True)
class FastSmi:
    path: Path
    state: Path  # <path>.d
    timings: Path

    def groups(self) -> list[int]:
        return [int(g) for g in (self.state / "groups").read_text().split()]

    def ungroup(self) -> None:
        """Every device back in the default group (outside any measured window)."""
        count = len(self.groups())
        (self.state / "groups").write_text("0\n" * count)

    def recorded(self) -> list[tuple[int, int]]:
        """(start ns, end ns) of each call since the last ``clear``."""
        pairs = []
        for line in self.timings.read_text().splitlines():
            start, end = line.split()
            pairs.append((int(start), int(end)))
        return pairs

    def clear(self) -> None:
        self.timings.write_text("")

    def call_cost_ms(self, runs: int = 30) -> float:
        """Median wall time of one ``-g -j`` spawned from here: the floor for one run."""
        samples = []
        for _ in range(runs):
            began = time.perf_counter()
            subprocess.run([str(self.path), "-g", "-j"], stdout=subprocess.DEVNULL, check=True)
            samples.append((time.perf_counter() - began) * 1000)
        self.clear()
        return statistics.median(samples)


def install(node: SimNode) -> FastSmi:
    listing = subprocess.run(
        [str(node.smi_path), "-g", "-j"], capture_output=True, text=True, check=True
    ).stdout
    document = json.loads(listing)
    devices: list[dict[str, object]] = document["devices"]
    head, tail = _render(document, devices)
    lines, groups = [], []
    for device in devices:
        plain = {k: v for k, v in device.items() if k != "group_id"}
        before, after = _object({**device, "group_id": _SENTINEL}).split(_SENTINEL)
        lines.append(f"{device['npu']}\t{_object(plain)}\t{before}\t{after}")
        groups.append(str(device.get("group_id", "0")))
    state = node.smi_path.with_name(node.smi_path.name + ".d")
    state.mkdir()
    (state / "records").write_text("".join(line + "\x1e" for line in lines))
    (state / "head").write_text(head)
    (state / "tail").write_text(tail)
    (state / "groups").write_text("\n".join(groups) + "\n")
    (state / "devroot").write_text(f"{node.dev_root}\n")
    node.smi_path.unlink()
    shutil.copy2(binary(), node.smi_path)
    fast = FastSmi(node.smi_path, state, state / "timings")
    shown = subprocess.run(
        [str(node.smi_path), "-g", "-j"], capture_output=True, text=True, check=True
    ).stdout
    if shown != listing:
        raise RuntimeError("the fast rbln-smi does not print the simulator's listing")
    fast.clear()
    return fast
