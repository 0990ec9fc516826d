"""The process's entry (``rbln-device-plugin``, ``python -m rbln_device_plugin``): the
signal catcher first, then everything else.

The daemon's imports take about 0.2 s. Python's defaults during them would turn a SIGINT
into a ``KeyboardInterrupt`` traceback out of an import, and a SIGTERM (or a SIGUSR1)
into death with no record; so ``signalcatch`` is installed before them, and only the
interpreter's own start-up before this function (about 30 ms) is left to the defaults.
``inspect``, a command run by hand, keeps Python's usual Ctrl-C.
"""

from __future__ import annotations

import sys


def main() -> int:
    args = sys.argv[1:]
    if args[:1] != ["inspect"]:
        from rbln_device_plugin import signalcatch

        signalcatch.install()
    from rbln_device_plugin import cli

    return cli.main(args)
