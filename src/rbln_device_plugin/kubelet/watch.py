"""Noticing a kubelet restart: a new ``kubelet.sock`` in the device-plugin directory.

A starting kubelet deletes every socket in its directory and creates a fresh
``kubelet.sock``; every plugin must then register again. The directory is watched with
inotify (as the Go plugin does with fsnotify), so an idle daemon does no periodic work
for this at all. Where inotify is unavailable (no kernel support, watch limit reached,
a file system without notifications) a slow poll takes over.

Either way a restart is a *new file*: its identity (device, inode, modification time)
differs from the last one seen. A chmod or chown of the socket changes neither, so it
is not a restart and does not make the plugins register again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Final

from rbln_device_plugin.api import KUBELET_SOCKET
from rbln_device_plugin.host import inotify
from rbln_device_plugin.host.paths import FileIdentity, file_identity
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import wait_any

# Polling is the fallback only; with inotify nothing wakes up while the node is idle.
FALLBACK_POLL_S: Final = 1.0

_EVENTS: Final = (
    inotify.IN_CREATE | inotify.IN_MOVED_TO | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF
)
# The watched directory itself went away (deleted, renamed, unmounted): watch anew.
_GONE: Final = (
    inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_IGNORED | inotify.IN_UNMOUNT
)

log = get_logger()


class KubeletSocketWatch:
    """Tracks the identity of ``kubelet.sock``; ``on_restart`` runs for each new one."""

    def __init__(self, directory: Path, on_restart: Callable[[], None]) -> None:
        self.directory = directory
        self.socket_path = directory / KUBELET_SOCKET
        self._on_restart = on_restart
        self.identity: FileIdentity | None = file_identity(self.socket_path)
        self.mode = "starting"  # "inotify" or "poll", for logs and tests
        self._poll_reason = ""

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
            try:
                watch = inotify.DirectoryWatch(self.directory, _EVENTS)
            except inotify.InotifyUnavailable as exc:
                self._poll_reason = str(exc)
                await self._poll_once(stop)
                continue
            try:
                await self._follow(watch, stop)
            finally:
                watch.close()

    async def _follow(self, watch: inotify.DirectoryWatch, stop: asyncio.Event) -> None:
        """Handle events until stop, or until the directory itself goes away."""
        ended = asyncio.Event()

        def on_events(events: list[inotify.Event]) -> None:
            for event in events:
                if event.mask & _GONE:
                    ended.set()
                elif event.mask & inotify.IN_Q_OVERFLOW or event.name == KUBELET_SOCKET:
                    self.check()
            if ended.is_set():
                log.debug("Kubelet directory watch ended", path=str(self.directory))
                self.check()

        watch.start(on_events)
        self._set_mode("inotify")
        self.check()  # anything that happened before the watch existed
        await wait_any(stop, ended)

    async def _poll_once(self, stop: asyncio.Event) -> None:
        self._set_mode("poll")
        self.check()
        await wait_any(stop, timeout=FALLBACK_POLL_S)

    def _set_mode(self, mode: str) -> None:
        if mode != self.mode:
            level = log.debug if mode == "inotify" or self.mode == "starting" else log.info
            fields: dict[str, object] = {
                "mode": mode,
                "path": str(self.directory),
                "previousMode": self.mode,
            }
            if mode == "poll":
                fields.update(reason=self._poll_reason, pollSeconds=FALLBACK_POLL_S)
            level("Watching for kubelet restarts", **fields)
            self.mode = mode
