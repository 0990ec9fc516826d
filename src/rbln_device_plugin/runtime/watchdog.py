"""Is the scan loop making progress? The rule behind the liveness health service.

Every step of a scan is bounded (``rbln-smi`` is killed after 5 s, each host read is
given up after 1 s, a file that blocked once fails at once until it returns), so a scan
that is still running long after it started means the daemon is wedged: a bug such as a
lock never released, not a slow node. The rule is therefore about one scan's age, not
the time between scans (the interval may be up to 24 h, and waiting for the next scan is
progress): a scan still running ``limit`` seconds after it started turns liveness
NOT_SERVING, and its end turns it SERVING again.

No periodic work: each scan arms one timer at its start and disarms it at its end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from rbln_device_plugin import aiotasks
from rbln_device_plugin.durations import format_duration
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()


class ScanWatchdog:
    def __init__(self, limit: float, set_alive: Callable[[bool], Awaitable[None]]) -> None:
        self._limit = limit
        self._set_alive = set_alive
        self._timer: asyncio.TimerHandle | None = None
        self._started = 0.0
        self._stalled = False
        self._tasks = aiotasks.TaskSet("scan watchdog")

    def scan_started(self) -> None:
        self._disarm()
        self._started = time.monotonic()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._limit, self._expired)

    def scan_finished(self) -> None:
        self._disarm()
        if self._stalled:
            self._stalled = False
            log.info(
                "Device scan finished; liveness is SERVING again",
                scanSeconds=round(time.monotonic() - self._started, 1),
            )  # fmt: skip
            self._apply(True)

    def close(self) -> None:
        self._disarm()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        self._stalled = True
        log.error(
            "Device scan has not finished; liveness is NOT_SERVING until it does",
            scanSeconds=round(time.monotonic() - self._started, 1),
            limit=format_duration(self._limit),
        )  # fmt: skip
        self._apply(False)

    def _apply(self, alive: bool) -> None:
        async def apply() -> None:
            await self._set_alive(alive)

        self._tasks.spawn(apply(), f"liveness {alive}")
