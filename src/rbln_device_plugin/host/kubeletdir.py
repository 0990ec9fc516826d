"""The kubelet's device-plugin directory: waited for, never created.

The kubelet creates that directory when it starts. A daemon started before the kubelet,
or on a machine that is not a node at all, must not write into ``/var/lib/kubelet``: it
says once that the directory is missing, waits, and carries on the moment it appears.
The same holds when the directory disappears while the daemon runs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import wait_any

MISSING_MSG: Final = "Kubelet device-plugin directory does not exist; waiting for the kubelet"
FOUND_MSG: Final = "Kubelet device-plugin directory exists now; continuing"
POLL_S: Final = 1.0

log = get_logger()


class KubeletDirectory:
    """Whether the directory exists, with one record when it goes and one when it comes.

    The look runs off the event loop with the bound of every host access (``hostio``):
    the kubelet's directory on a mount that does not answer counts as not there yet
    (HostIO says so, naming it), without a record that it is missing.
    """

    def __init__(self, path: Path, hostio: HostIO) -> None:
        self.path = path
        self._io = hostio
        self._missing_since: float | None = None

    async def present(self) -> bool:
        exists = await self._io.call(str(self.path), self.path.is_dir)
        if isinstance(exists, Stalled):
            return False
        if not exists and self._missing_since is None:
            self._missing_since = time.monotonic()
            log.warning(MISSING_MSG, path=str(self.path))
        elif exists and self._missing_since is not None:
            waited = time.monotonic() - self._missing_since
            self._missing_since = None
            log.info(FOUND_MSG, path=str(self.path), waitedSeconds=round(waited, 1))
        return exists

    async def wait(self, stop: asyncio.Event) -> bool:
        """Until the directory exists (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if await self.present():
                return True
            # A missing directory cannot be watched with inotify; the kubelet creates it
            # once, at its start, so a slow poll costs nothing that matters.
            await wait_any(stop, timeout=POLL_S)
        return False
