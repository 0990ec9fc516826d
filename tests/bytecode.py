"""Bytecode caching for a test run in an environment that turns it off.

With ``PYTHONDONTWRITEBYTECODE`` set (the development machine sets it, so that no
``__pycache__`` appears in the checkout) every Python process compiles each module it
imports from source: every daemon, ``inspect`` and simulator process the tests start
compiles the daemon's or the simulator's sources again (about 45 ms of CPU per daemon
start), and every pytest-xdist worker rewrites and compiles every test module's asserts
(about 3 s of CPU each). Then the bytecode goes under the virtualenv instead
(``<venv>/pycache``, Python's ``PYTHONPYCACHEPREFIX``), never into the checkout: the
pytest processes write it there, and the processes they start inherit the prefix and
read it, still writing nothing themselves. Python checks each cached file against its
source's size and modification time, so an edit is never run stale. Without the
variable nothing changes: Python caches bytecode in ``__pycache__`` as usual.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the daemon, inspect and simulator processes the tests start import.
SOURCES = (REPO / "src" / "rbln_device_plugin", REPO / "sim" / "src" / "rbln_device_plugin_sim")


def cache_outside_the_tree() -> None:
    """Write this process's bytecode under the virtualenv; children read it there."""
    if not sys.flags.dont_write_bytecode and not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return  # bytecode is cached the usual way
    if sys.prefix == sys.base_prefix:
        return  # not in a virtualenv: nowhere of ours to write to
    prefix = sys.pycache_prefix or str(Path(sys.prefix) / "pycache")
    sys.pycache_prefix = prefix
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False  # this process only: its children keep the variable


def compile_sources() -> None:
    """Bytecode for what the processes the tests start import; up-to-date files are kept.

    A prefix replaces every ``__pycache__``, the standard library's too, so the bytecode
    is written by a process like those: one that imports every module of the daemon and
    the simulator (and with them the libraries they use) with the prefix set from its
    start and writing allowed.
    """
    if sys.pycache_prefix is None:
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # A tree without one of them (the sdist's tests run a copy without the simulator)
    # still runs: the cache only saves time, so nothing here may fail a run.
    present = [source for source in SOURCES if source.is_dir()]
    commands = [[sys.executable, "-c", _IMPORT_EVERYTHING, *map(str, present)]] if present else []
    if SOURCES[1] in present:
        # The fake rbln-smi starts with -S (no site) and imports only its own two modules.
        commands.append([sys.executable, "-S", "-c", _IMPORT_SMI, str(SOURCES[1].parent)])
    for command in commands:
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            problem = "did not finish in 300 s"
        else:
            if done.returncode == 0:
                continue
            problem = f"exited {done.returncode}: {done.stderr.strip()[-500:]}"
        print(f"bytecode cache not warmed ({problem}); tests run, only slower", file=sys.stderr)


_IMPORT_EVERYTHING = """
import importlib, pkgutil, sys
from pathlib import Path
for source in map(Path, sys.argv[1:]):
    sys.path.insert(0, str(source.parent))
    for info in pkgutil.walk_packages([str(source)], source.name + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    importlib.import_module(source.name)
"""
_IMPORT_SMI = """
import sys
sys.path.insert(0, sys.argv[1])
import rbln_device_plugin_sim.smi_exe, rbln_device_plugin_sim.smi_tool
"""
