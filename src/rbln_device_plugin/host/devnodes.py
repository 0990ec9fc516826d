"""Waiting for device nodes that the driver creates asynchronously (e.g. /dev/rsd<G>).

Only a character device counts as a device node. A directory, a regular file or anything
else at the path fails at once, naming it; only the test-only setting
``--test-file-device-nodes`` lets a regular file pass, for the simulated node, which
cannot create character devices without root. The checks run off the event loop with a
bounded wait, like every other host access.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin.host.hostio import Call, HostIO, Stalled

DEFAULT_TIMEOUT_S: Final = 5.0
DEFAULT_INTERVAL_S: Final = 0.1


class DeviceNodeMissing(Exception):
    """Device nodes that did not appear in time; ``missing`` lists them."""

    def __init__(self, missing: Sequence[Path], timeout: float, why: str = "") -> None:
        self.missing = tuple(missing)
        shown = ", ".join(str(path) for path in self.missing)
        super().__init__(
            f"device node(s) {shown} did not appear within {timeout:g} s"
            + (f" ({why})" if why else "")
        )


class NotADeviceNode(Exception):
    """Something other than a device node sits at a device node's path."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        super().__init__(f"{path} is a {kind}, not a device node")


def node_kind(path: Path, accept_files: bool = False) -> str | None:
    """None when ``path`` is usable as a device node; else what it is ("missing", ...).

    ``accept_files``: a regular file is usable too (test only; see the module docstring).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable entry ({exc.strerror or exc})"
    if stat.S_ISCHR(mode) or (accept_files and stat.S_ISREG(mode)):
        return None
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


async def wait_for_nodes(
    paths: Sequence[Path],
    hostio: HostIO,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 - a polling budget, not a call deadline
    interval: float = DEFAULT_INTERVAL_S,
    *,
    accept_files: bool = False,
) -> None:
    """Poll until every path is a device node; raise DeviceNodeMissing after ``timeout``.

    Each path is checked at least once, so a zero timeout is a plain existence check.
    Raises NotADeviceNode at once for a directory or another kind of file.
    """
    loop = asyncio.get_running_loop()  # the budget's clock, as every budget in async code
    deadline = loop.time() + timeout
    missing = tuple(paths)
    why = ""
    while True:
        kinds = await hostio.map(
            [Call(str(p), partial(node_kind, p, accept_files)) for p in missing]
        )
        still: list[Path] = []
        for path, kind in zip(missing, kinds, strict=True):
            if kind is None:
                continue
            if isinstance(kind, Stalled):
                why = str(kind)
            elif kind != "missing" and not kind.startswith("unreadable"):
                raise NotADeviceNode(path, kind)
            still.append(path)
        missing = tuple(still)
        remaining = deadline - loop.time()
        if not missing:
            return
        if remaining <= 0:
            raise DeviceNodeMissing(missing, timeout, why)
        await asyncio.sleep(min(interval, remaining))
