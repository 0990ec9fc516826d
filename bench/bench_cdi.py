"""CDI spec checks under hostile files: peak resident memory and CPU of one pass over the
spec directories, next to an idle floor.

Each case is a set of real files in a temporary directory, at most what the daemon reads
(``cdidirs.MAX_SPEC_FILES`` per directory, two directories, each file at most
``cdientry.MAX_SPEC_BYTES``). A fresh interpreter reads every file as the directory reader
does and checks it with ``cdispec.check_spec_file``, one ``Budget(PASS_UNITS)`` shared by
the pass, and once the budget is spent records the rest as unchecked without reading them
(reading 256 files of 1 MiB alone costs 60-230 ms of CPU); it reports its peak RSS
(``VmHWM``) and the CPU time (user + system) of the pass. The floor is the same
interpreter checking one trivial spec: the idle RSS and the CPU of a trivial parse.
Issue 49's target: at most 10 MiB above idle and 0.5 s of CPU for any set of files under
the caps (it measured 43 -> 292 MiB and 4-5 s for one 1 MiB ``[[],[],...]`` file before
the budget was applied while parsing).

Run: ``python -m bench.bench_cdi [--quick]``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rbln_device_plugin.host.cdidirs import MAX_SPEC_FILES
from rbln_device_plugin.host.cdientry import MAX_SPEC_BYTES

from . import cli
from .rows import floor_row

Row = dict[str, Any]
TRIVIAL = (
    b"cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices:\n"
    b"  - name: runtime\n    containerEdits: {env: [RBLN_CDI=1]}\n"
)

# The worker: argv[1] is a list of directories (JSON); it prints its figures (JSON).
_WORKER = r"""
import json, os, resource, sys
TRIVIAL = bytes.fromhex(sys.argv[2])
from rbln_device_plugin.model.cdispec import Budget, PASS_UNITS, FileState, check_spec_file
from rbln_device_plugin.host.cdientry import MAX_SPEC_BYTES

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

check_spec_file("warm.yaml", TRIVIAL)  # imports and first-call costs stay out of the figure
states = {}
started = cpu()
budget = Budget(PASS_UNITS)
for directory in json.loads(sys.argv[1]):
    for name in sorted(os.listdir(directory)):
        if budget.left <= 0:  # spent: the file is not even read (copying 1 MiB costs too)
            states["unchecked"] = states.get("unchecked", 0) + 1
            continue
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.read(fd, MAX_SPEC_BYTES + 1)
        finally:
            os.close(fd)
        state = check_spec_file(os.path.join(directory, name), data, budget).state
        states[state.value] = states.get(state.value, 0) + 1
seconds = cpu() - started
# VmHWM, not ru_maxrss: across the parent's vfork and exec, ru_maxrss keeps the parent's peak.
with open("/proc/self/status") as status:
    peak = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:")) / 1024
print(json.dumps({"cpu_s": seconds, "peak_mib": peak, "states": states}))
"""


def _nested_lists(size: int) -> bytes:
    return (b"[" + b"[]," * (size // 3))[: size - 3] + b"[]]"


def _null_key_lists(size: int) -> bytes:
    # The value of a null key is skipped, never decoded: only the budget stops the reader.
    body = b"[]," * ((size - 16) // 3)
    return b"{~: [" + body[: size - 16] + b"[]]}\n"


def _long_env(size: int, json_text: bool) -> bytes:
    # A usable spec, as large as the cap allows: one env list of ~100,000 entries.
    entries = (size - 200) // 10
    if json_text:
        env = ",".join([f'"A{i:06d}=1"' for i in range(entries)])
        text = (
            '{"cdiVersion": "0.6.0", "kind": "rebellions.ai/npu", "devices": '
            '[{"name": "runtime", "containerEdits": {"env": [' + env + "]}}]}"
        )
    else:
        env = ",".join([f"A{i:06d}=1" for i in range(entries)])
        text = (
            "cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ndevices:\n- name: runtime\n"
            f"  containerEdits: {{env: [{env}]}}\n"
        )
    return text.encode()[:size]


def _alias_bomb() -> bytes:
    env = ", ".join(["A=1"] * 1000)
    devices = "".join(f"  - {{name: d{i}, containerEdits: {{env: *e}}}}\n" for i in range(2000))
    return (
        f"cdiVersion: 0.6.0\nkind: rebellions.ai/npu\ncontainerEdits: {{env: &e [{env}]}}\n"
        f"devices:\n{devices}"
    ).encode()


def _toolkit_spec() -> bytes:
    """A realistic large spec (~100 KiB, like an NVIDIA toolkit spec): 8 devices, 500
    mounts."""
    lines = ["cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:"]
    for i in range(8):
        lines += [f"- name: '{i}'", "  containerEdits:", "    deviceNodes:",
                  f"    - path: /dev/nvidia{i}"]  # fmt: skip
    lines += ["containerEdits:", "  env: [NVIDIA_VISIBLE_DEVICES=void]", "  mounts:"]
    for i in range(500):
        lib = f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.{i}"
        lines += [f"  - hostPath: {lib}", f"    containerPath: {lib}",
                  "    options: [ro, nosuid, nodev, bind]"]  # fmt: skip
    return ("\n".join(lines) + "\n").encode()


# name -> (files per directory, directories, one file's bytes, suffix)
def cases(quick: bool) -> list[tuple[str, int, int, Callable[[], bytes], str]]:
    cap = MAX_SPEC_BYTES
    full = MAX_SPEC_FILES
    return [
        ("one 1 MiB [[],[],...] file (issue 49)", 1, 1, lambda: _nested_lists(cap), ".yaml"),
        (f"{2 * full} files of 1 MiB [[],...]", full, 2, lambda: _nested_lists(cap), ".yaml"),
        (f"{2 * full} files of 1 MiB [[],...] as .json", full, 2, lambda: _nested_lists(cap),
         ".json"),
        (f"{2 * full} files of 1 MiB {{~: [[],...]}} (skipped, never refused)", full, 2,
         lambda: _null_key_lists(cap), ".yaml"),
        (f"{2 * full} usable 1 MiB specs (100k env entries)", full, 2,
         lambda: _long_env(cap, False), ".yaml"),
        (f"{2 * full} usable 1 MiB JSON specs", full, 2, lambda: _long_env(cap, True), ".json"),
        (f"{2 * full} alias bombs (2,000 aliases of 1,000 values)", full, 2, _alias_bomb,
         ".yaml"),
        (f"{2 * full} toolkit specs of ~100 KiB", full, 2, _toolkit_spec, ".yaml"),
    ][: 3 if quick else None]  # fmt: skip


def _measure(dirs: list[Path]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, json.dumps([str(d) for d in dirs]), TRIVIAL.hex()],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run(quick: bool = False) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="rbln-bench-cdi-"))
    rows: list[Row] = []
    try:
        trivial = root / "trivial"
        trivial.mkdir()
        (trivial / "rbln.yaml").write_bytes(TRIVIAL)
        floor = _measure([trivial])
        rows.append(row("idle: one trivial spec, peak RSS", floor["peak_mib"], "MiB"))
        rows.append(row("idle: one trivial spec, CPU", floor["cpu_s"] * 1000, "ms"))
        for index, (label, files, ndirs, make, suffix) in enumerate(cases(quick)):
            data = make()
            dirs = []
            for d in range(ndirs):
                directory = root / f"case{index}-{d}"
                directory.mkdir()
                for f in range(files):
                    (directory / f"spec{f:03d}{suffix}").write_bytes(data)
                dirs.append(directory)
            result = _measure(dirs)
            states = ", ".join(f"{n} {s}" for s, n in sorted(result["states"].items()))
            rows.append(row(f"{label}: peak RSS", result["peak_mib"], "MiB", floor["peak_mib"],
                            f"+{result['peak_mib'] - floor['peak_mib']:.1f} MiB over idle "
                            f"(target +10); {states}"))  # fmt: skip
            rows.append(row(f"{label}: CPU", result["cpu_s"] * 1000, "ms", floor["cpu_s"] * 1000,
                            "target 500 ms"))  # fmt: skip
            for directory in dirs:
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def row(metric: str, value: float, unit: str, floor: float | None = None, extra: str = "") -> Row:
    return floor_row("cdi", metric, value, unit, floor, extra, ratio_digits=1)


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__)):
        print(f"{r['metric']:<72} {r['value']:>9.2f} {r['unit']:<4} {r['note']}")
