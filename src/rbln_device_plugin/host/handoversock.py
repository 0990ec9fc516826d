"""The unix socket two instances of one installation talk over during a hand-over.

It lies beside the RSD lock and the instance lock's anchor (the chart: the host's
``/run/rbln``, a directory the daemon makes and only root writes), is created 0600, and
each side checks that the other runs as the same user (``SO_PEERCRED``) before it
believes a word. The holder's instance-lock descriptors cross it as ``SCM_RIGHTS``: a
flock belongs to the open file, not to a process, so the lock is held for as long as
either process keeps its copy, and nothing else can take it in between.

Sockets are non-blocking and driven by the event loop: a peer that says nothing costs a
waiting coroutine, never a thread.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import struct
from pathlib import Path
from typing import Final

from rbln_device_plugin.host import paths, pluginsocket

MAX_FDS: Final = 8
_CRED: Final = struct.Struct("3i")  # pid, uid, gid


class HandoverSocketError(RuntimeError):
    pass


def listen(path: Path) -> tuple[socket.socket, paths.FileIdentity] | HandoverSocketError:
    """Blocking: a listening socket at ``path`` (what sat there removed as the plugin
    socket's place is, see ``pluginsocket.clear``) and the identity of its file; the
    reason when it cannot be made (returned: host calls return problems as data)."""
    try:
        return _listen(path)
    except HandoverSocketError as exc:
        return exc


def _listen(path: Path) -> tuple[socket.socket, paths.FileIdentity]:
    cleared = pluginsocket.clear(path)
    if isinstance(cleared, pluginsocket.SocketPathError):
        raise HandoverSocketError(str(cleared))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with paths.umask(0o177):
            sock.bind(str(path))
        sock.listen(4)
        sock.setblocking(False)
        identity = pluginsocket.bound_identity(path)
        if isinstance(identity, pluginsocket.SocketPathError):
            raise HandoverSocketError(str(identity))
    except OSError as exc:
        sock.close()
        raise HandoverSocketError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    except HandoverSocketError:
        sock.close()
        raise
    return sock, identity


def remove(path: Path, identity: paths.FileIdentity) -> None:
    """Blocking: remove the listening socket's file if it is still ours."""
    pluginsocket.remove_if_ours(path, identity)


async def connect(path: Path, within: float) -> socket.socket | None:
    """A connection to the holder at ``path``; None when nobody listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, str(path)), within)
    except (OSError, TimeoutError):
        sock.close()
        return None
    return sock


def same_user(sock: socket.socket) -> bool:
    """Does the peer run as this process's user (root, for the daemon)?"""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    except OSError:
        return False
    _, uid, _ = _CRED.unpack(raw)
    return bool(uid == os.geteuid())


def send(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    """One message, with ``fds`` attached to its first byte. The messages are a few
    hundred bytes on a fresh connection: a full send buffer means a peer that reads
    nothing, which ends the link."""
    ancillary = []
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    sent = sock.sendmsg([data], ancillary)
    if sent != len(data):
        raise HandoverSocketError("the peer does not read")


class LineReader:
    """Lines from a non-blocking socket, with the descriptors that came along."""

    def __init__(self, sock: socket.socket, limit: int) -> None:
        self._sock = sock
        self._limit = limit
        self._buffer = b""
        self._eof = False
        self.fds: list[int] = []

    async def line(self) -> bytes | None:
        """The next line without its newline; None at the end of the connection.
        A line longer than the limit raises HandoverSocketError."""
        while b"\n" not in self._buffer:
            if self._eof:
                return None
            if len(self._buffer) > self._limit:
                raise HandoverSocketError("a line longer than the protocol allows")
            await self._readable()
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, self._limit + 1, MAX_FDS)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data, fds = b"", []
            self.fds.extend(fds)
            if not data:
                self._eof = True
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self._sock.fileno()
        loop.add_reader(fd, lambda: None if ready.done() else ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(fd)

    def close_fds(self) -> None:
        """Close every descriptor received and not taken (see ``take_fds``)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []

    def take_fds(self) -> list[int]:
        fds, self.fds = self.fds, []
        return fds
