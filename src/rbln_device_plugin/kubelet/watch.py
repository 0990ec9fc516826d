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
import errno
import socket
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin.api import KUBELET_SOCKET
from rbln_device_plugin.host import inotify
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.host.paths import FileIdentity, file_identity
from rbln_device_plugin.kubelet.events import Events, KubeletSocketRecreated
from rbln_device_plugin.model.looks import WatchState
from rbln_device_plugin.telemetry.logs import get_logger

# Polling is the fallback only; with inotify nothing wakes up while the node is idle.
FALLBACK_POLL_S: Final = 1.0

# Deletions too: they tell the plugins' socket looks (``state``) that something went.
_EVENTS: Final = (
    inotify.IN_CREATE
    | inotify.IN_MOVED_TO
    | inotify.IN_DELETE
    | inotify.IN_MOVED_FROM
    | inotify.IN_DELETE_SELF
    | inotify.IN_MOVE_SELF
)

log = get_logger()


# What connecting to the socket of a kubelet that exited gives: nobody listens there.
_NOT_SERVING: Final = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK})


def kubelet_serving(socket_path: Path) -> bool:
    """Whether a kubelet listens on ``socket_path`` (blocking; run it through HostIO).

    A kubelet that exited leaves its socket behind until the next one replaces it:
    connecting is then refused. Any other failure counts as serving, so the caller
    registers and its error says what is wrong.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        probe.connect(str(socket_path))
    except OSError as exc:
        return exc.errno not in _NOT_SERVING
    finally:
        probe.close()
    return True


class KubeletSocketWatch:
    """Tracks the identity of ``kubelet.sock`` and counts each new one (``restarts``).

    The stat goes through ``hostio`` (off the loop, bounded): the kubelet's directory is
    a host mount like any other, and one that hangs must not stall the loop. A stat that
    does not answer changes nothing; the next event or scan asks again. Whoever checks
    learns of a new socket from ``check``'s answer or from the count; the watch's own
    task (``run``) also puts ``KubeletSocketRecreated`` on the session's queue.
    """

    def __init__(self, directory: Path, hostio: HostIO) -> None:
        self.directory = directory
        self.socket_path = directory / KUBELET_SOCKET
        self._hostio = hostio
        self.identity: FileIdentity | None = None
        self._last_file: FileIdentity | None = None  # the last socket file seen, kept while none is
        self.restarts = 0  # new sockets seen since the start (the first one is no restart)
        self._primed = False
        # One check at a time: a stat that returned late with the old socket must not
        # undo a newer one and count the same restart twice (the watch and each scan check).
        self._checking = asyncio.Lock()
        self.mode = "starting"  # "inotify" or "poll", for logs and tests
        # Every change in the directory while the watch is live, for the looks that rely on
        # it (this socket's, the plugins' sockets', the legacy instance lock's).
        self.state = WatchState()

    async def prime(self) -> None:
        """Take the socket present now as the known one: it is no restart."""
        identity = await self._stat()
        if not isinstance(identity, Stalled):
            self.identity, self._primed = identity, True
            self._last_file = identity

    async def check(self) -> bool:
        """Compare the socket with the last one seen; True (and one more restart) when new."""
        async with self._checking:
            return self._compare(await self._stat())

    def _compare(self, identity: FileIdentity | Stalled | None) -> bool:
        if isinstance(identity, Stalled):
            return False
        if not self._primed:
            self.identity, self._primed = identity, True
            self._last_file = identity
            return False
        if identity == self.identity:
            return False
        previous, self.identity = self.identity, identity
        if identity is None:
            return False  # the kubelet is down; its new socket is what counts
        if identity == self._last_file:
            # The same file back at its name (moved away and back, or a look that fell
            # between the two): no new kubelet made it.
            return False
        self._last_file = identity
        log.info(
            "Detected kubelet socket recreation; restarting device plugins",
            kubeletSocket=str(self.socket_path), hadSocket=previous is not None,
        )  # fmt: skip
        self.restarts += 1
        return True

    async def run(self, stop: asyncio.Event, events: Events) -> None:
        """Watch until ``stop``; switches between inotify and polling as conditions allow.
        Each new socket this watch finds goes on ``events``."""
        if not self._primed:
            await self.prime()

        async def check_and_tell() -> None:
            if await self.check():
                events.put_nowait(KubeletSocketRecreated())

        entry = inotify.WatchedEntry(self.directory, KUBELET_SOCKET, _EVENTS, FALLBACK_POLL_S)
        try:
            await inotify.check_entry(
                entry, check_and_tell, (stop,), on_mode=self._set_mode, on_any=self.state.changed
            )
        finally:
            self.state.set_live(False)  # nothing follows the directory now: scans look

    async def _stat(self) -> FileIdentity | Stalled | None:
        return await self._hostio.call(
            str(self.socket_path), partial(file_identity, self.socket_path)
        )

    def _set_mode(self, mode: str, reason: str | None) -> None:
        self.state.set_live(mode == "inotify")
        if mode != self.mode:
            level = log.debug if mode == "inotify" or self.mode == "starting" else log.info
            fields: dict[str, object] = {
                "mode": mode,
                "path": str(self.directory),
                "previousMode": self.mode,
            }
            if mode == "poll":
                fields.update(reason=reason, pollSeconds=FALLBACK_POLL_S)
            level("Watching for kubelet restarts", **fields)
            self.mode = mode
