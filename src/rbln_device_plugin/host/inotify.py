"""A minimal inotify directory watch on the event loop (Linux).

The inotify library bindings on PyPI locate libc with ``ctypes.util.find_library``,
which runs ``/sbin/ldconfig`` (and may look for a C compiler on ``PATH``): the daemon
must run no program but ``rbln-smi``. The three calls needed here are resolved from the
libc the interpreter is already linked against instead, and the descriptor is served
by the event loop's reader callbacks, so an idle watch costs nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin import aiotasks
from rbln_device_plugin.waits import wait_any

IN_MODIFY: Final = 0x00000002
IN_ATTRIB: Final = 0x00000004
IN_CLOSE_WRITE: Final = 0x00000008
IN_MOVED_FROM: Final = 0x00000040
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_DELETE_SELF: Final = 0x00000400
IN_MOVE_SELF: Final = 0x00000800
IN_UNMOUNT: Final = 0x00002000
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC

# The watched directory itself went away (deleted, renamed, unmounted): watch anew.
DIRECTORY_GONE: Final = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT

_HEADER: Final = struct.Struct("iIII")  # wd, mask, cookie, len
_READ_SIZE: Final = 64 * 1024


class InotifyUnavailable(OSError):
    """No inotify here: not Linux, no such libc symbols, or the kernel refused."""


@dataclass(frozen=True, slots=True)
class Event:
    mask: int
    name: str  # the entry inside the watched directory ("" for the directory itself)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    for symbol in ("inotify_init1", "inotify_add_watch"):
        if not hasattr(libc, symbol):
            raise InotifyUnavailable(errno.ENOSYS, f"libc has no {symbol}")
    return libc


# What the parent's watch follows: the watched directory's own name coming and going.
_PARENT_EVENTS: Final = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ONLYDIR


class DirectoryWatch:
    """Delivers events about entries of one directory to ``on_events`` on the loop.

    The directory's parent is watched too, for the directory's own name: a directory
    removed while something still holds it (a unix socket bound inside keeps it, so a
    daemon's own plugin socket does) reports its own deletion only once the last holder
    lets go, and a directory made again at the path is a new one this watch does not see.
    The parent reports the removal (or a rename) at once, as ``IN_DELETE_SELF``.
    """

    def __init__(self, directory: os.PathLike[str] | str, mask: int) -> None:
        try:
            libc = _libc()
        except OSError as exc:
            raise InotifyUnavailable(exc.errno or errno.ENOSYS, str(exc)) from None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise InotifyUnavailable(code, f"inotify_init1: {os.strerror(code)}")
        path = os.fsencode(directory)
        wd = libc.inotify_add_watch(fd, path, mask | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            os.close(fd)
            raise InotifyUnavailable(code, f"inotify_add_watch {directory!s}: {os.strerror(code)}")
        self._fd: int | None = fd
        self._parent_wd = -1
        parent, self._name = os.path.split(os.path.normpath(path))
        if parent and self._name:
            # Best effort: without it (an unreadable parent) the directory's own events and
            # the readers' backup looks remain.
            parent_wd = libc.inotify_add_watch(fd, parent, _PARENT_EVENTS)
            if parent_wd >= 0 and parent_wd != wd:
                self._parent_wd = parent_wd
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, on_events: Callable[[list[Event]], None]) -> None:
        if self._fd is None:
            raise ValueError("watch is closed")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable, on_events)

    def _readable(self, on_events: Callable[[list[Event]], None]) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            return
        events: list[Event] = []
        for wd, event in parse_events(data):
            if wd != self._parent_wd or event.mask & IN_Q_OVERFLOW:
                events.append(event)
            elif os.fsencode(event.name) == self._name or event.mask & DIRECTORY_GONE:
                events.append(Event(IN_DELETE_SELF, ""))  # the path leads elsewhere now
        if events:
            on_events(events)

    def close(self) -> None:
        if self._fd is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None


def parse_events(data: bytes) -> list[tuple[int, Event]]:
    """Split a read of the inotify descriptor into (watch descriptor, event) pairs (names
    are NUL-padded)."""
    events: list[tuple[int, Event]] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _, length = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        raw = data[start : start + length].split(b"\0", 1)[0]
        events.append((wd, Event(mask, os.fsdecode(raw))))
        offset = start + length
    return events


@dataclass(frozen=True, slots=True)
class WatchedEntry:
    """One entry of a directory to follow: which events count, and the poll without
    inotify."""

    directory: os.PathLike[str] | str
    name: str
    mask: int
    poll_s: float


def _no_mode(mode: str, reason: str | None) -> None:
    pass


def _nothing() -> None:
    pass


async def follow_entry(
    entry: WatchedEntry,
    on_change: Callable[[], object],
    until: Sequence[asyncio.Event],
    on_mode: Callable[[str, str | None], None] = _no_mode,
    on_any: Callable[[], None] = _nothing,
) -> None:
    """Call ``on_change`` whenever ``entry.name`` of ``entry.directory`` may have changed.

    It is called once as each watch starts (for what happened before it existed), on
    every batch of events that names the entry or overflowed the queue, and when the
    directory itself goes, after which a new watch is tried. Without inotify it polls
    every ``entry.poll_s`` and tries inotify again each time; ``on_mode`` hears "inotify" or
    "poll" (with the reason) before each start; ``on_any`` hears of every batch of events,
    whatever entry they name. Returns once any of ``until`` is set.
    """
    name = entry.name
    while not any(event.is_set() for event in until):
        try:
            watch = DirectoryWatch(entry.directory, entry.mask)
        except InotifyUnavailable as exc:
            on_mode("poll", str(exc))
            on_change()
            await wait_any(*until, timeout=entry.poll_s)
            continue
        gone = asyncio.Event()

        def on_events(events: list[Event], gone: asyncio.Event = gone) -> None:
            on_any()
            if any(e.mask & DIRECTORY_GONE for e in events):
                gone.set()
            if gone.is_set() or any(e.name == name or e.mask & IN_Q_OVERFLOW for e in events):
                on_change()

        try:
            watch.start(on_events)
            on_mode("inotify", None)
            on_change()
            await wait_any(*until, gone)
        finally:
            watch.close()


async def check_entry(
    entry: WatchedEntry,
    check: Callable[[], Awaitable[object]],
    until: Sequence[asyncio.Event],
    on_mode: Callable[[str, str | None], None] = _no_mode,
    on_any: Callable[[], None] = _nothing,
) -> None:
    """``follow_entry`` for a check that awaits (host I/O through HostIO, off the loop).

    inotify's callback is plain, so it only asks; one task runs the checks, one at a
    time. Changes that arrive during a check ask for one more after it, never for a
    second check beside it.
    """
    wanted = asyncio.Event()

    async def checks() -> None:
        while True:
            await wait_any(wanted, *until)
            if any(event.is_set() for event in until):
                return
            wanted.clear()  # changes from now on ask for one more check
            await check()

    checker = aiotasks.start(checks(), f"check {entry.name}")
    try:
        await follow_entry(entry, wanted.set, until, on_mode, on_any)
    finally:
        await aiotasks.cancel_and_wait(checker, title=f"watch of {entry.name}")
