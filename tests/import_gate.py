"""The daemon as ``python -m rbln_device_plugin`` runs it, held at one import of its start.

Run as a script: ``python import_gate.py MODULE GATE_FIFO [daemon args]`` (``-`` for
MODULE: no gate). When the
daemon's start-up first imports ``MODULE``, this writes ``import-gate: MODULE`` to
stderr and waits, inside that import, until a byte can be read from ``GATE_FIFO``; then
the import and the start go on. A test sends a signal while the gate holds: the signal
then arrives at a known point of the imports, with no timing involved. The core-dump
limit is 0, so a signal whose default action dumps core leaves no file behind.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import resource
import runpy
import sys
from collections.abc import Sequence
from types import ModuleType

PREFIX = "import-gate: "


class _Gate(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, fifo: str) -> None:
        self._module = module
        self._fifo = fifo

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self._module:
            sys.meta_path.remove(self)  # once
            sys.stderr.write(f"{PREFIX}{fullname}\n")
            sys.stderr.flush()
            with open(self._fifo, "rb") as gate:  # blocks until the test opens it
                gate.read(1)
        return None  # the normal finders import it


def main() -> None:
    module, fifo = sys.argv[1:3]
    del sys.argv[1:3]
    del sys.path[0]  # this directory: the tests' modules must not shadow anything
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if module != "-":
        sys.meta_path.insert(0, _Gate(module, fifo))
    runpy.run_module("rbln_device_plugin", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
