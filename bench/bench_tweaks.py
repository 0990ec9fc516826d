"""What each tweak in ``rbln_device_plugin.processtweaks`` saves: the idle daemon's
resident memory with every tweak, and with each one turned off in turn.

The real daemon process runs against a simulated node (atom-max-8, 32 NPUs, a 1 h scan
interval, a shell-script ``rbln-smi``); its memory is read 3 s after every resource has
its devices at the kubelet stand-in (after Register, so after ``release_free_heap``).
A tweak is turned off by the command that starts the daemon, never by a setting of the
daemon: ``python -c`` rebinds a name of ``processtweaks`` before ``cli`` is imported.
The variants run in turn, round after round, so a drift of the machine touches all.

Run: ``python -m bench.bench_tweaks [--quick] [--rounds N]``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys

from rbln_device_plugin_sim.layout import preset

from . import cli
from .bench_daemon import fast_smi, node_with_daemon, rss_mib

NPU = "rebellions.ai/npu"

# Runs the daemon after executing its first argument in processtweaks' namespace.
_WRAPPER = (
    "import sys\n"
    "from rbln_device_plugin import processtweaks\n"
    "exec(sys.argv.pop(1), vars(processtweaks))\n"
    "from rbln_device_plugin.cli import main\n"
    "raise SystemExit(main())\n"
)
_SHUTIL_WIDTH = (
    "def terminal_columns():\n    import shutil\n    return shutil.get_terminal_size().columns\n"
)
# OTLP export on (to a port nothing listens on): the OpenTelemetry SDK imports
# importlib.metadata, and with it zipfile, shutil, bz2 and lzma.
OTLP = ("--otlp-endpoint", "127.0.0.1:9", "--metrics-otlp")
# name -> (the rebinding, the daemon's extra flags)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "every tweak": ("pass", ()),
    "without keeping ssl out": ("NEVER_USED = ('bz2', 'lzma')", ()),
    "without keeping bz2, lzma out": ("NEVER_USED = ('ssl',)", ()),
    "without the shutil-free help width": (_SHUTIL_WIDTH, ()),
    "without the help width nor bz2, lzma out": (_SHUTIL_WIDTH + "NEVER_USED = ('ssl',)", ()),
    "without malloc_trim": ("release_free_heap = lambda: False", ()),
    "OTLP on: every tweak": ("pass", OTLP),
    "OTLP on: without keeping bz2, lzma out": ("NEVER_USED = ('ssl',)", OTLP),
}
BASELINE = {"": "every tweak", "OTLP on": "OTLP on: every tweak"}


async def idle_rss(patch: str, flags: tuple[str, ...]) -> float:
    command = (sys.executable, "-c", _WRAPPER, patch)
    async with node_with_daemon(preset("atom-max-8"), "1h", fast_smi, flags, command) as (
        _node, kubelet, proc, _started,
    ):  # fmt: skip
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 32, 60)
        await asyncio.sleep(3)
        return rss_mib(proc.pid)


async def measure(rounds: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, (patch, flags) in VARIANTS.items():
            figures[name].append(await idle_rss(patch, flags))
    return figures


def main(argv: list[str]) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5, 1 with --quick)")
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    figures = asyncio.run(measure(rounds))
    print(f"idle daemon VmRSS, MiB, median of {rounds} (all runs); difference to every tweak")
    for name, values in figures.items():
        median = statistics.median(values)
        base = statistics.median(figures[BASELINE[name.partition(":")[0] if ":" in name else ""]])
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{name:42} {median:7.2f} {median - base:+6.2f}   ({runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
