"""Waiting for device nodes that the driver creates asynchronously (e.g. /dev/rsd<G>)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

DEFAULT_TIMEOUT_S: Final = 5.0
DEFAULT_INTERVAL_S: Final = 0.1


class DeviceNodeMissing(Exception):
    """Device nodes that did not appear in time; ``missing`` lists them."""

    def __init__(self, missing: Sequence[Path], timeout: float) -> None:
        self.missing = tuple(missing)
        shown = ", ".join(str(path) for path in self.missing)
        super().__init__(f"device node(s) {shown} did not appear within {timeout:g} s")


async def wait_for_nodes(
    paths: Sequence[Path],
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 - a polling budget, not a call deadline
    interval: float = DEFAULT_INTERVAL_S,
) -> None:
    """Poll until every path exists; raise DeviceNodeMissing after ``timeout``.

    Each path is checked at least once, so a zero timeout is a plain existence check.
    """
    deadline = time.monotonic() + timeout
    missing = tuple(paths)
    while True:
        # A stat per node is far cheaper than a thread hop; the loop is not at risk.
        missing = tuple(path for path in missing if not os.path.exists(path))  # noqa: ASYNC240
        remaining = deadline - time.monotonic()
        if not missing:
            return
        if remaining <= 0:
            raise DeviceNodeMissing(missing, timeout)
        await asyncio.sleep(min(interval, remaining))
