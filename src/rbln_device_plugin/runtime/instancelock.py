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

A lock that is no longer ours (its file was deleted or replaced and someone else now
holds the new one, or it cannot be locked again at all) means two daemons could serve
the node: ``check`` reports it and the daemon exits rather than share the node. The lock
directory is watched with inotify, so a deletion is noticed at once; every scan checks
too, as a backstop (and instead, where inotify is unavailable, a 1 s poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rbln_device_plugin.host import inotify
from rbln_device_plugin.host.paths import ensure_subdir, file_identity
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import wait_any

LOCK_DIR: Final = "rbln-device-plugin"
LOCK_NAME: Final = "instance.lock"
LEGACY_LOCK_NAME: Final = "rbln-device-plugin.lock"
RETRY_S: Final = 0.5
FALLBACK_POLL_S: Final = 1.0
_PID_BYTES: Final = 32
_WATCH_EVENTS: Final = (
    inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO | inotify.IN_CREATE
    | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF
)  # fmt: skip

log = get_logger()


class InstanceLockError(Exception):
    """A lock file cannot be created or locked at all (not: someone else holds it)."""


@dataclass(frozen=True, slots=True)
class LockLoss:
    """Why this daemon can no longer be sure it is the only one serving the node."""

    path: Path
    reason: str
    holder_pid: int | str | None = None


class _LockFile:
    def __init__(self, path: Path, kubelet_dir: Path, *, legacy: bool) -> None:
        self.path = path
        self.kubelet_dir = kubelet_dir
        self.legacy = legacy
        self.fd: int | None = None

    def try_lock(self, *, create: bool = True) -> bool | None:
        """Lock the file now at ``path``; False while another process holds it.

        With ``create`` false a missing file is left missing (None).
        """
        while True:
            if not self.kubelet_dir.is_dir():
                # The kubelet's directory is the kubelet's to create: while it is gone
                # (the manager waits for it and says so), nothing is locked or made.
                return None
            try:
                if create and not self.legacy:
                    # Our own directory inside the kubelet's, never the kubelet's itself
                    # (it may have gone since the check above).
                    ensure_subdir(self.kubelet_dir, self.path.parent.name)
                flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
                fd = os.open(self.path, flags, 0o644)
            except FileNotFoundError:
                if create and self.kubelet_dir.is_dir():
                    raise InstanceLockError(f"cannot create {self.path}") from None
                return None
            except OSError as exc:
                raise InstanceLockError(f"cannot open {self.path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError as exc:
                os.close(fd)
                raise InstanceLockError(f"cannot lock {self.path}: {exc}") from exc
            if self._is_current(fd):
                break
            # Deleted or replaced between open and flock: a lock on it guards nothing.
            os.close(fd)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o644)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.close()  # a lock on a file that is gone from the path
        self.fd = fd
        return True

    def intact(self) -> bool:
        return self.fd is not None and self._is_current(self.fd)

    def _is_current(self, fd: int) -> bool:
        info = os.fstat(fd)
        return file_identity(self.path) == (info.st_dev, info.st_ino, info.st_mtime_ns)

    def close(self) -> None:
        # The file stays: unlinking it would let a waiter lock a file nobody else can see.
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def holder(self) -> int | str:
        try:
            with open(self.path, "rb") as handle:
                text = handle.read(_PID_BYTES).decode("ascii", errors="replace").strip()
        except OSError:
            return "unknown"
        return int(text) if text.isdigit() else "unknown"


class InstanceLock:
    def __init__(self, kubelet_dir: Path) -> None:
        self._primary = _LockFile(kubelet_dir / LOCK_DIR / LOCK_NAME, kubelet_dir, legacy=False)
        self._legacy = _LockFile(kubelet_dir / LEGACY_LOCK_NAME, kubelet_dir, legacy=True)
        self.path = self._primary.path
        self.lost = asyncio.Event()
        self.loss: LockLoss | None = None

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Take both locks, waiting as long as another instance holds either.

        False when ``stop`` was set first. Raises InstanceLockError when a file cannot be
        used at all.
        """
        started = time.monotonic()
        reported = False
        for lock in (self._primary, self._legacy):
            while not (locked := lock.try_lock()):
                if locked is not None and not reported:  # None: no kubelet directory yet
                    log.error(
                        "Another rbln-device-plugin instance serves this kubelet directory; "
                        "waiting for it to exit",
                        lockPath=str(lock.path), holderPid=lock.holder(),
                    )  # fmt: skip
                    reported = True
                await wait_any(stop, timeout=RETRY_S)
                if stop.is_set():
                    return False
        if reported:
            log.info(
                "Instance lock acquired; starting",
                lockPath=str(self.path), waitedSeconds=round(time.monotonic() - started, 1),
            )  # fmt: skip
        return True

    def check(self, *, create: bool = True) -> bool:
        """Are both locks still ours? Lock a deleted or replaced file again where nobody
        holds it; otherwise record the loss and set ``lost``. True while held.

        With ``create`` false (the watch) a deleted file is not made again: that happens
        at the next scan, so a directory being removed is not refilled under the remover.
        A file someone else created and locked meanwhile is still a loss.
        """
        if self.loss is not None:
            return False
        for lock in (self._primary, self._legacy):
            if lock.fd is None or lock.intact():
                continue
            try:
                locked = lock.try_lock(create=create)
            except InstanceLockError as exc:
                lock.close()
                self._lose(LockLoss(lock.path, f"the lock file was deleted or replaced and {exc}"))
                return False
            if locked is None:
                continue  # deleted; locked again at the next scan unless someone is faster
            if not locked:
                reason = "the lock file was deleted or replaced and another process holds it now"
                lock.close()
                self._lose(LockLoss(lock.path, reason, lock.holder()))
                return False
            if not lock.legacy:  # the kubelet deletes the legacy file on its own
                log.warning("Instance lock file was deleted or replaced; locked it again",
                            lockPath=str(lock.path))  # fmt: skip
        return True

    def _lose(self, loss: LockLoss) -> None:
        self.loss = loss
        self.lost.set()

    async def watch(self, stop: asyncio.Event) -> None:
        """Check at once whenever the primary lock's directory changes, until stop or loss."""
        await inotify.follow_entry(
            self.path.parent, LOCK_NAME, _WATCH_EVENTS, lambda: self.check(create=False),
            (stop, self.lost), FALLBACK_POLL_S,
        )  # fmt: skip

    def release(self) -> None:
        self._legacy.close()
        self._primary.close()
