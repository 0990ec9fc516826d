"""One daemon per kubelet directory, enforced by exclusive locks that the kubelet never deletes.

Two instances on one directory (the operator's operand next to this chart, or a
rolling update with surge) would delete each other's sockets on every scan and fail
each other's allocations. The second one instead waits for the lock, with its readiness
NOT_SERVING, and starts the moment the first one exits (the kernel drops a flock when
its holder dies, however it dies).

Where the lock lives matters: a starting kubelet cleans its device-plugin directory.
Kubernetes 1.31.1 to 1.32 (and every release before 1.31) delete every entry there that
is not a directory, except their checkpoint file; 1.31.0 and 1.33 on delete only
sockets. None of them touches a directory, so the lock file sits in a subdirectory of
its own, ``<kubelet dir>/rbln-device-plugin/instance.lock``.

Versions of this daemon before that locked ``<kubelet dir>/rbln-device-plugin.lock``.
That file is locked too, after the first one, so an older instance on the node (an
upgrade with surge) and this one still wait for each other. The kubelet may delete it:
it is then simply locked again.

The kubelet's directory itself can go, though (deleted and made again by hand, or by a
node reset script): with it go both files, a waiting instance would lock new ones at
once, and for the moment until the holder noticed, two instances would answer ready.
So the first lock, the one a second instance waits on, is anchored outside it, beside
the RSD lock (``<dir of --rsd-lock-path>/rbln-device-plugin.instance.lock``; the chart
puts that directory on the host's ``/run/rbln``, which no kubelet cleans). That
directory is by definition the one every instance on the node shares; deriving the
anchor from it needs no new setting, and a deployment without a shared RSD lock
directory keeps the kubelet-directory locks as before.

Every file is looked at before it is opened (an ``O_PATH`` descriptor: no device's or
pipe's ``open`` runs), relative to its directory's descriptor, never through a symlink,
and checked before it is written (see ``host.ownfiles``): whatever else sits in the way
is renamed aside with a warning.

The anchor's directory is the daemon's to create. When it cannot be made or opened (a
symlink there leads nowhere or to a file, a file sits there), waiting cannot end by
itself: that is said once (an error record naming the component in the way), and
``acquire`` tells its caller, which turns liveness NOT_SERVING and the instance state
``lock_dir_unusable`` until the directory can be used.

A lock that is no longer ours (its file was deleted or replaced and someone else now
holds the new one, or it cannot be locked again at all) means two daemons could serve
the node: ``check`` reports it and the daemon exits rather than share the node. The lock
directories are watched with inotify, so a deletion is noticed at once; a scan checks
too, as a backstop, when a watch is not live or reported a change, and at least once a
minute (``model.looks``; where inotify is unavailable, the primary lock is also polled
every second).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin.host import inotify, ownfiles
from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.host.paths import ensure_dir
from rbln_device_plugin.model.looks import BACKUP_S, LookSchedule, WatchState
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import wait_any

LOCK_DIR: Final = "rbln-device-plugin"
LOCK_NAME: Final = "instance.lock"
LEGACY_LOCK_NAME: Final = "rbln-device-plugin.lock"
# Beside the RSD lock (the chart: /run/rbln on the host), see the module docstring.
ANCHOR_NAME: Final = "rbln-device-plugin.instance.lock"
RETRY_S: Final = 0.5
FALLBACK_POLL_S: Final = 1.0
_PID_BYTES: Final = 32
_WATCH_EVENTS: Final = (
    inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO | inotify.IN_CREATE
    | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF
)  # fmt: skip

UNUSABLE_DIR_MSG: Final = "The instance lock's directory cannot be used; waiting until it can"
USABLE_AGAIN_MSG: Final = "The instance lock's directory can be used again"

log = get_logger()


# Asks the holder of the first lock for its descriptors (see ``acquire``).
TakeOver = Callable[[], Awaitable[list[int | None] | None]]


class InstanceLockError(Exception):
    """A lock file cannot be created or locked at all (not: someone else holds it)."""


@dataclass(frozen=True, slots=True)
class DirectoryUnusable:
    """The directory of a lock file the daemon creates cannot be made or opened."""

    lock_path: Path
    directory: Path
    reason: str  # the component in the way (``ownfiles.why_not_a_directory``)


@dataclass(frozen=True, slots=True)
class LockLoss:
    """Why this daemon can no longer be sure it is the only one serving the node."""

    path: Path
    reason: str
    holder_pid: int | str | None = None


class _LockFile:
    """One lock file. ``parent_owned``: its directory is the daemon's to create (the anchor
    under ``/run/rbln``); otherwise it lies in the kubelet's directory, which only the
    kubelet makes, optionally inside a subdirectory of the daemon's own (``subdir``)."""

    def __init__(
        self, path: Path, kubelet_dir: Path, *, legacy: bool, subdir: str | None = None,
        parent_owned: bool = False,
    ) -> None:  # fmt: skip
        self.path = path
        self.kubelet_dir = kubelet_dir
        self.legacy = legacy
        self.subdir = subdir
        self.parent_owned = parent_owned
        self.fd: int | None = None

    def _open(self, create: bool) -> int | DirectoryUnusable | None:
        """The lock file's descriptor, every step relative to its parent's, never followed
        (see ``ownfiles``); None when it (or the kubelet's directory) is missing."""
        top = self.path.parent if self.subdir is None else self.path.parent.parent
        made = self.parent_owned and create
        if made:
            # A component in the way (a dangling symlink, a file) fails here or below.
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                ensure_dir(top)
        try:
            top_fd = ownfiles.open_dir(top)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
            if made:
                # Ours to make, and still not a directory: nothing will change that but
                # whoever put it there (see the module's doc).
                return DirectoryUnusable(self.path, top, ownfiles.why_not_a_directory(top))
            if exc.errno == errno.ELOOP:
                raise
            # The kubelet's directory is the kubelet's to create: while it is gone (the
            # manager waits for it and says so), nothing is locked or made.
            return None
        try:
            if self.subdir is None:
                return ownfiles.open_file(top_fd, top, self.path.name, create=create)
            sub_fd = ownfiles.open_subdir(top_fd, top, self.subdir, create=create)
            if sub_fd is None:
                return None
            try:
                return ownfiles.open_file(sub_fd, self.path.parent, self.path.name, create=create)
            finally:
                os.close(sub_fd)
        except FileNotFoundError:
            return None  # the directory went meanwhile
        finally:
            os.close(top_fd)

    def lock_now(self, *, create: bool = True) -> int | bool | DirectoryUnusable | None:
        """Blocking: lock the file now at ``path``; its descriptor (locked, holding our PID),
        False while another process holds it, None when it is missing (with ``create``
        false, or the kubelet's directory gone), DirectoryUnusable when its directory,
        which the daemon makes, cannot be. Raises InstanceLockError.

        Runs on a host I/O thread (see ``_Attempt``), never on the event loop.
        """
        while True:
            try:
                fd = self._open(create)
            except ownfiles.UnsafeEntry as exc:
                raise InstanceLockError(str(exc)) from exc
            except OSError as exc:
                raise InstanceLockError(f"cannot open {self.path}: {exc}") from exc
            if fd is None or isinstance(fd, DirectoryUnusable):
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError as exc:
                os.close(fd)
                raise InstanceLockError(f"cannot lock {self.path}: {exc}") from exc
            if self.is_current(fd):
                break
            # Deleted or replaced between open and flock: a lock on it guards nothing.
            os.close(fd)
        # A regular file of ours, checked on its descriptor (ownfiles): safe to write.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def take(self, fd: int) -> None:
        """From now on ``fd`` is this file's lock (on the loop, after ``lock_now``)."""
        self.close()  # a lock on a file that is gone from the path
        self.fd = fd

    def is_current(self, fd: int) -> bool:
        """Blocking: is ``fd`` the file now at ``path`` (not deleted or replaced)?"""
        info = os.fstat(fd)
        try:
            now = os.lstat(self.path)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)

    def close(self) -> None:
        # The file stays: unlinking it would let a waiter lock a file nobody else can see.
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def holder(self) -> int | str:
        """Blocking: the PID the file names, or "unknown"."""
        # Never followed, and only a regular file is opened (a device node or a named pipe
        # planted there is never opened, see ``ownfiles``).
        fd = ownfiles.open_regular_to_read(self.path)
        if fd is None:
            return "unknown"
        try:
            text = os.pread(fd, _PID_BYTES, 0).decode("ascii", errors="replace").strip()
        except OSError:
            return "unknown"
        finally:
            os.close(fd)
        return int(text) if text.isdigit() else "unknown"


class _Attempt:
    """One ``lock_now`` on a host I/O thread whose caller may give up on it (a stall, or a
    cancelled caller): a descriptor it gets after that is closed, so no lock is ever held
    that the daemon does not know of (it would lock this daemon out of its own file)."""

    def __init__(self, lock: _LockFile, create: bool) -> None:
        self._lock = lock
        self._create = create
        self._guard = threading.Lock()
        self._abandoned = False
        self._fd: int | None = None

    def run(self) -> int | bool | InstanceLockError | DirectoryUnusable | None:
        try:
            outcome = self._lock.lock_now(create=self._create)
        except InstanceLockError as exc:
            return exc  # host calls return problems as data (see hostio.Call)
        if isinstance(outcome, (bool, DirectoryUnusable)) or outcome is None:
            return outcome
        with self._guard:
            if self._abandoned:
                os.close(outcome)
                return None
            self._fd = outcome
        return outcome

    def abandon(self) -> None:
        with self._guard:
            self._abandoned = True
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class InstanceLock:
    def __init__(self, kubelet_dir: Path, hostio: HostIO, anchor: Path | None = None) -> None:
        # Every file access runs off the event loop, bounded (see ``hostio``): a lock
        # directory on a hung mount must not freeze the loop serving the kubelet.
        self._io = hostio
        # acquire, check and the watch's checks one at a time: two at once would each
        # open and flock the same new file, and the second would see the first as another
        # holder.
        self._serial = asyncio.Lock()
        self._stall_said = False
        # The lock directory found unusable, said once until it can be used again.
        self._unusable: DirectoryUnusable | None = None
        self._primary = _LockFile(
            kubelet_dir / LOCK_DIR / LOCK_NAME, kubelet_dir, legacy=False, subdir=LOCK_DIR
        )
        self._legacy = _LockFile(kubelet_dir / LEGACY_LOCK_NAME, kubelet_dir, legacy=True)
        # The anchor comes first: it is where a second instance waits, and nothing that
        # happens to the kubelet's directory frees it while its holder lives.
        self._locks: tuple[_LockFile, ...] = (self._primary, self._legacy)
        self._anchor: _LockFile | None = None
        if anchor is not None:
            self._anchor = _LockFile(anchor, kubelet_dir, legacy=False, parent_owned=True)
            self._locks = (self._anchor, *self._locks)
        # The scans' checks rely on the watches of the lock files' directories while they
        # are live (``model.looks``); the legacy file's, the kubelet's directory, is the
        # kubelet session's to watch (``follow``).
        self._watched = {lock.path: WatchState() for lock in self._locks if not lock.legacy}
        self._looks = LookSchedule(*self._watched.values())
        self.path = self._primary.path
        self.lost = asyncio.Event()
        self.loss: LockLoss | None = None
        # The locks came from a holder still alive (a hand-over), not from a free file.
        self.taken_over = False
        # The other instance of this installation while a hand-over lasts (its PID).
        self.partner_pid: int | None = None

    async def acquire(
        self,
        stop: asyncio.Event,
        directory_unusable: Callable[[bool], Awaitable[None]] | None = None,
        take_over: TakeOver | None = None,
    ) -> bool:
        """Take both locks, waiting as long as another instance holds either.

        False when ``stop`` was set first. Raises InstanceLockError when a file cannot be
        used at all. A lock file that does not answer within the host I/O bound is said
        once and tried again, like a held one: nothing is known to be wrong with it yet.
        A lock directory the daemon cannot make is said once and tried again too, and
        ``directory_unusable`` is told when that starts (True) and ends (False).

        ``take_over`` (an installation that hands over, see ``runtime.handover``) is
        asked whenever the first lock is held by another process: the holder's own
        descriptors it returns (one per lock file, in order; None for a file it does not
        hold) are this instance's locks from then on, shared with the holder.
        """
        started = time.monotonic()
        reported = False
        shown = False
        for lock in self._locks:
            while lock.fd is None:  # not taken over from the holder
                async with self._serial:
                    locked = await self._try_lock(lock, create=True)
                unusable = isinstance(locked, DirectoryUnusable)
                if not isinstance(locked, Stalled) and unusable != shown:
                    shown = unusable
                    reported = True
                    if directory_unusable is not None:
                        await directory_unusable(unusable)
                if locked is True:
                    break
                if locked is False and take_over is not None and lock is self._locks[0]:
                    fds = await take_over()
                    if fds is not None and await self._adopt(fds):
                        break
                if locked is False and not reported:
                    log.error(
                        "Another rbln-device-plugin instance serves this kubelet directory; "
                        "waiting for it to exit",
                        lockPath=str(lock.path), holderPid=await self._holder(lock),
                    )  # fmt: skip
                    reported = True
                # None: no kubelet directory yet; a Stalled or an unusable directory: said
                # in _try_lock
                await wait_any(stop, timeout=RETRY_S)
                if stop.is_set():
                    return False
        if reported:
            log.info(
                "Instance lock acquired; starting",
                lockPath=str(self.path), waitedSeconds=round(time.monotonic() - started, 1),
            )  # fmt: skip
        return True

    def held_fds(self) -> list[int | None]:
        """Per lock file, in order: the descriptor holding it (None: not held now)."""
        return [lock.fd for lock in self._locks]

    async def _adopt(self, fds: Sequence[int | None]) -> bool:
        """Take the holder's descriptors as this instance's locks: each one checked to be
        the file at its path (one that is not is closed, and that file is locked as
        usual). True when the first lock, the one every other instance waits on, is ours."""
        pairs = [(lock, fd) for lock, fd in zip(self._locks, fds, strict=False) if fd is not None]
        for fd in fds[len(pairs) :]:
            if fd is not None:
                os.close(fd)
        async with self._serial:
            looks = await self._io.map(
                [Call(str(lock.path), partial(lock.is_current, fd)) for lock, fd in pairs]
            )
            for (lock, fd), current in zip(pairs, looks, strict=True):
                if current is True and lock.fd is None:
                    lock.take(fd)
                else:
                    os.close(fd)
        self.taken_over = self._locks[0].fd is not None
        return self.taken_over

    async def _try_lock(
        self, lock: _LockFile, *, create: bool
    ) -> bool | Stalled | DirectoryUnusable | None:
        """``lock.lock_now`` through host I/O: True when ``lock`` is ours now."""
        attempt = _Attempt(lock, create)
        try:
            outcome = await self._io.call(str(lock.path), attempt.run)
        except BaseException:
            attempt.abandon()
            raise
        if isinstance(outcome, Stalled):
            attempt.abandon()
            self._stalled(lock, outcome)
            return outcome
        self._stall_said = False
        if isinstance(outcome, InstanceLockError):
            raise outcome
        if isinstance(outcome, DirectoryUnusable):
            self._directory_unusable(outcome)
            return outcome
        unusable = self._unusable
        if unusable is not None and unusable.lock_path == lock.path and outcome is not None:
            log.info(USABLE_AGAIN_MSG, directory=str(unusable.directory))
            self._unusable = None
        if isinstance(outcome, bool) or outcome is None:
            return outcome
        lock.take(outcome)
        return True

    def _directory_unusable(self, found: DirectoryUnusable) -> None:
        if self._unusable == found:
            return  # said already (a different reason is said again)
        self._unusable = found
        log.error(
            UNUSABLE_DIR_MSG,
            lockPath=str(found.lock_path), directory=str(found.directory), reason=found.reason,
            hint=f"the directory of --rsd-lock-path holds the instance lock, and the daemon "
            f"makes it when it is missing: remove or fix what is in the way ({found.reason})",
        )  # fmt: skip

    def _stalled(self, lock: _LockFile, stalled: Stalled) -> None:
        if not self._stall_said:
            log.warning(
                "Instance lock file did not answer in time; trying again",
                lockPath=str(lock.path), err=str(stalled),
            )  # fmt: skip
            self._stall_said = True

    async def _holder(self, lock: _LockFile) -> int | str:
        holder = await self._io.call(str(lock.path), lock.holder)
        return "unknown" if isinstance(holder, Stalled) else holder

    async def _intact(self) -> list[bool]:
        """Per lock: still the file at its path (one host-I/O hop for all of them)? A lock
        not held, or a look that stalled (no evidence either way), counts as intact."""
        held = [(lock, lock.fd) for lock in self._locks if lock.fd is not None]
        looks = await self._io.map(
            [Call(str(lock.path), partial(lock.is_current, fd)) for lock, fd in held]
        )
        current = dict(zip((id(lock) for lock, _ in held), looks, strict=True))
        intact: list[bool] = []
        for lock in self._locks:
            look = current.get(id(lock), True)
            if isinstance(look, Stalled):
                self._stalled(lock, look)
                look = True  # the next check looks again
            intact.append(look)
        return intact

    def follow(self, kubelet_dir_changes: WatchState) -> None:
        """The kubelet directory's watch, where the legacy lock file lives."""
        self._looks.follow(kubelet_dir_changes)

    async def scan_check(self) -> bool:
        """A scan's ``check``: only when a watch is not live or reported a change since the
        last one, or the backup look is due. True while held."""
        now = time.monotonic()
        if not self._looks.due(now):
            return self.loss is None
        self._looks.looking(now)
        return await self.check()

    async def check(self, *, create: bool = True) -> bool:
        """Are both locks still ours? Lock a deleted or replaced file again where nobody
        holds it; otherwise record the loss and set ``lost``. True while held.

        With ``create`` false (the watch) a deleted file is not made again: that happens
        at the next scan, so a directory being removed is not refilled under the remover.
        A file someone else created and locked meanwhile is still a loss.
        """
        async with self._serial:
            return await self._check(create)

    async def _check(self, create: bool) -> bool:
        if self.loss is not None:
            return False
        for lock, intact in zip(self._locks, await self._intact(), strict=True):
            if intact:
                continue
            try:
                locked = await self._try_lock(lock, create=create)
            except InstanceLockError as exc:
                lock.close()
                self._lose(LockLoss(lock.path, f"the lock file was deleted or replaced and {exc}"))
                return False
            if locked is None or isinstance(locked, (Stalled, DirectoryUnusable)):
                continue  # deleted (locked again at the next scan unless someone is faster)
            if not locked:
                reason = "the lock file was deleted or replaced and another process holds it now"
                lock.close()
                holder = await self._holder(lock)
                if holder == self.partner_pid and lock is not self._locks[0]:
                    # The other instance of this installation locked the new file first
                    # (both saw it go): still one installation. The first lock, the one
                    # everyone else waits on, is still held by both.
                    log.debug(
                        "Instance lock file locked again by the other instance of "
                        "this installation",
                        lockPath=str(lock.path),
                        holderPid=holder,
                    )
                    continue
                self._lose(LockLoss(lock.path, reason, holder))
                return False
            if not lock.legacy:  # the kubelet deletes the legacy file on its own
                log.warning("Instance lock file was deleted or replaced; locked it again",
                            lockPath=str(lock.path))  # fmt: skip
        return True

    def _lose(self, loss: LockLoss) -> None:
        self.loss = loss
        self.lost.set()

    async def watch(self, stop: asyncio.Event) -> None:
        """Check at once whenever a lock's directory changes, until stop or loss.

        Without inotify the primary lock's directory is polled every second; the anchor's
        is then looked at by each scan only, as the legacy file's always is."""
        await asyncio.gather(
            *(self._watch_one(path, state, stop) for path, state in self._watched.items())
        )

    async def _watch_one(self, path: Path, state: WatchState, stop: asyncio.Event) -> None:
        poll_s = FALLBACK_POLL_S if path == self.path else BACKUP_S
        entry = inotify.WatchedEntry(path.parent, path.name, _WATCH_EVENTS, poll_s)
        try:
            await inotify.check_entry(
                entry,
                partial(self.check, create=False),
                (stop, self.lost),
                on_mode=lambda mode, _reason: state.set_live(mode == "inotify"),
                on_any=state.changed,
            )
        finally:
            state.set_live(False)  # nothing follows the directory now: scans look

    def release(self) -> None:
        for lock in reversed(self._locks):
            lock.close()
