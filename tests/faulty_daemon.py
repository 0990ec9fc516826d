"""The real daemon with one injected fault: a scan that fails while a stop cancels it.

No host state provokes that through the simulator: every failure a scan meets on the
host is caught and logged where it happens (a failing or hanging ``rbln-smi`` is a
discovery failure, a plugin that cannot stop is logged per plugin). What is left is a
bug in the scan's own clean-up, which this stands in for, so that the daemon's answer to
it (its record, its exit code, the sockets it still removes) is tested on the real
process, signals and exit path included. Run as a script: ``python faulty_daemon.py
<daemon args>``.
"""

from __future__ import annotations

import asyncio

from rbln_device_plugin import cli
from rbln_device_plugin.runtime.manager import Manager

INJECTED = "injected: the scan failed while it was being stopped"

_real_scan_once = Manager._scan_once


async def _scan_failing_when_cancelled(self: Manager) -> None:
    try:
        await _real_scan_once(self)
    except asyncio.CancelledError:
        raise RuntimeError(INJECTED) from None


if __name__ == "__main__":
    Manager._scan_once = _scan_failing_when_cancelled  # type: ignore[method-assign]
    raise SystemExit(cli.main())
