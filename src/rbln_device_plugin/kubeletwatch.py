"""Noticing a kubelet restart: a new ``kubelet.sock`` in the device-plugin directory.

A starting kubelet deletes every socket in its directory and creates a fresh
``kubelet.sock``; every plugin must then register again. The directory is watched with
inotify (as the Go plugin does with fsnotify), so an idle daemon does no periodic work
for this at all. Where inotify is unavailable (no kernel support, watch limit reached,
a file system without notifications) a slow poll takes over.

Either way a restart is a *new file*: its identity (device, inode, modification time)
differs from the last one seen. A chmod or chown of the socket changes neither, so it
is not a restart and does not wipe the plugins' health history.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from rbln_device_plugin.host.paths import FileIdentity, file_identity
from rbln_device_plugin.logs import get_logger

KUBELET_SOCKET: Final = "kubelet.sock"
# Polling is the fallback only; with inotify nothing wakes up while the node is idle.
FALLBACK_POLL_S: Final = 1.0

log = get_logger()


class KubeletSocketWatch:
    """Tracks the identity of ``kubelet.sock``; ``on_restart`` runs for each new one."""

    def __init__(self, directory: Path, on_restart: Callable[[], None]) -> None:
        self.directory = directory
        self.socket_path = directory / KUBELET_SOCKET
        self._on_restart = on_restart
        self.identity: FileIdentity | None = file_identity(self.socket_path)
        self.mode = "starting"  # "inotify" or "poll", for logs and tests

    def check(self) -> bool:
        """Compare the socket with the last one seen; True (and the callback) when new."""
        identity = file_identity(self.socket_path)
        if identity == self.identity:
            return False
        previous, self.identity = self.identity, identity
        if identity is None:
            return False  # the kubelet is down; its new socket is what counts
        log.info(
            "Detected kubelet socket recreation; restarting device plugins",
            kubeletSocket=str(self.socket_path), hadSocket=previous is not None,
        )  # fmt: skip
        self._on_restart()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop``; switches between inotify and polling as conditions allow."""
        while not stop.is_set():
            inotify = _open_inotify(self.directory)
            if inotify is None:
                await self._poll_once(stop)
                continue
            try:
                self._set_mode("inotify")
                self.check()  # anything that happened before the watch existed
                await self._follow(inotify, stop)
            finally:
                inotify.close()

    async def _follow(self, inotify: Any, stop: asyncio.Event) -> None:
        """Handle events until stop, or until the directory itself goes away."""
        from asyncinotify import Mask

        gone = Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED | Mask.UNMOUNT
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while True:
                event = asyncio.ensure_future(inotify.get())
                done, _ = await asyncio.wait({event, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if stopped in done:
                    event.cancel()
                    await asyncio.gather(event, return_exceptions=True)
                    return
                item = event.result()
                if item.mask & gone:
                    log.debug("Kubelet directory watch ended", path=str(self.directory))
                    self.check()
                    return
                if item.mask & Mask.Q_OVERFLOW or (item.name and str(item.name) == KUBELET_SOCKET):
                    self.check()
        finally:
            stopped.cancel()
            await asyncio.gather(stopped, return_exceptions=True)

    async def _poll_once(self, stop: asyncio.Event) -> None:
        self._set_mode("poll")
        self.check()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), FALLBACK_POLL_S)

    def _set_mode(self, mode: str) -> None:
        if mode != self.mode:
            level = log.debug if mode == "inotify" or self.mode == "starting" else log.info
            level(
                "Watching for kubelet restarts",
                mode=mode, path=str(self.directory), previousMode=self.mode,
            )  # fmt: skip
            self.mode = mode


def _open_inotify(directory: Path) -> Any | None:
    """An inotify instance watching ``directory``, or None where that is impossible."""
    try:
        from asyncinotify import Inotify, Mask
    except (ImportError, OSError):  # not Linux, or no libc inotify symbols
        return None
    try:
        inotify = Inotify()
    except OSError:
        return None
    mask = Mask.CREATE | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ONLYDIR
    try:
        inotify.add_watch(directory, mask)
    except OSError:  # the directory is missing, or the watch limit is reached
        inotify.close()
        return None
    return inotify
