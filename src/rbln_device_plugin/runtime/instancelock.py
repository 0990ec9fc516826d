"""One daemon per kubelet directory, enforced by an exclusive lock on a file in it.

Two instances on one directory (the operator's operand next to this chart, or a
rolling update with surge) would delete each other's sockets on every scan and fail
each other's allocations. The second one instead waits for the lock, with its health
service NOT_SERVING, and starts the moment the first one exits (the kernel drops a
flock when its holder dies, however it dies). The file holds the holder's PID for the
error record; the kubelet deletes only sockets, so the file survives kubelet restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Final

from rbln_device_plugin.host.paths import file_identity
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import wait_any

LOCK_NAME: Final = "rbln-device-plugin.lock"
RETRY_S: Final = 0.5
_PID_BYTES: Final = 32

log = get_logger()


class InstanceLockError(Exception):
    """The lock file cannot be created or locked at all (not: someone else holds it)."""


class InstanceLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Take the lock, waiting as long as another instance holds it.

        False when ``stop`` was set first. Raises InstanceLockError when the file cannot
        be used at all.
        """
        started = time.monotonic()
        reported = False
        while not stop.is_set():
            if self._try_lock():
                if reported:
                    log.info(
                        "Instance lock acquired; starting",
                        lockPath=str(self.path),
                        waitedSeconds=round(time.monotonic() - started, 1),
                    )
                return True
            if not reported:
                log.error(
                    "Another rbln-device-plugin instance serves this kubelet directory; "
                    "waiting for it to exit",
                    lockPath=str(self.path), holderPid=self._holder(),
                )  # fmt: skip
                reported = True
            await wait_any(stop, timeout=RETRY_S)
        return False

    def ensure_held(self) -> None:
        """Lock the file again if it was deleted (the kubelet directory was recreated)."""
        if self._fd is None or not self.path.parent.is_dir():
            return  # the directory itself is gone: the manager waits for it and says so
        current = file_identity(self.path)
        info = os.fstat(self._fd)
        if current == (info.st_dev, info.st_ino, info.st_mtime_ns):
            return
        os.close(self._fd)
        self._fd = None
        try:
            locked = self._try_lock()
        except InstanceLockError as exc:
            log.warning("Cannot recreate the instance lock file", lockPath=str(self.path), err=exc)
            return
        if not locked:
            log.error(
                "Instance lock file was replaced and another instance holds it now",
                lockPath=str(self.path), holderPid=self._holder(),
            )  # fmt: skip

    def release(self) -> None:
        # The file stays: unlinking it would let a waiter lock a file nobody else can see.
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _try_lock(self) -> bool:
        try:
            # Never ensure_dir here: the kubelet's directory is the kubelet's to create.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o644)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def _holder(self) -> int | str:
        try:
            with open(self.path, "rb") as handle:
                text = handle.read(_PID_BYTES).decode("ascii", errors="replace").strip()
        except OSError:
            return "unknown"
        return int(text) if text.isdigit() else "unknown"
