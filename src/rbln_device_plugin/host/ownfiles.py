"""The daemon's own files inside directories it does not own, never followed or trusted blindly.

The kubelet's device-plugin directory, the CDI root and ``/run/rbln`` are host
directories other privileged programs write into. Whatever sits where one of the daemon's
files belongs (its lock subdirectory, a lock file) is opened relative to its parent's
descriptor with ``O_NOFOLLOW``, so a symlink planted there is never followed, and checked
with ``fstat`` before anything is written: the right type, owned by root or by the
daemon's user, writable by nobody else, and (for a file) with no second hard link.

Anything else found there is renamed aside, next to where it was
(``<name>.moved-aside.<seconds since the epoch>``), with a warning naming both paths,
and the daemon's own entry is made afresh. Renaming touches neither the entry's target
nor its content, keeps it for whoever wants to look, and keeps the node serving: a stray
file left by a careless ``touch`` or an old script must not take every NPU of the node
out of service until someone finds it. Only when that rename fails too does the caller
get ``UnsafeEntry``, whose message names the path and what to remove.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from rbln_device_plugin.telemetry.logs import get_logger

DIR_MODE: Final = 0o750
_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR: Final = _OPEN_DIR | os.O_NOFOLLOW
MOVED_ASIDE_MSG: Final = "Moved a foreign entry aside where the daemon's own file belongs"

log = get_logger()


class UnsafeEntry(OSError):
    """Where the daemon's own file or directory belongs sits something it cannot use or move."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"{path} {problem}; it was not followed or written, and it could not be moved "
            f"aside: remove {path} (the daemon makes it again)"
        )
        self.path = path


def problem_with(info: os.stat_result, want_dir: bool) -> str | None:
    """Why an entry with ``info`` cannot be the daemon's own directory or file; None if it can."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if want_dir and not stat.S_ISDIR(mode):
        return f"is a {kind_of(mode)}, not a directory"
    if not want_dir and not stat.S_ISREG(mode):
        return f"is a {kind_of(mode)}, not a regular file"
    if info.st_uid not in (0, os.getuid()):
        return f"is owned by uid {info.st_uid}, not by root or the daemon's uid {os.getuid()}"
    if mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(mode):04o})"
    if not want_dir and info.st_nlink != 1:
        return f"has {info.st_nlink} hard links (another name shares its content)"
    return None


def kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"), (stat.S_ISREG, "regular file"), (stat.S_ISSOCK, "socket"),
        (stat.S_ISFIFO, "named pipe"), (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"), (stat.S_ISLNK, "symbolic link"),
    ):  # fmt: skip
        if test(mode):
            return name
    return "special file"


def open_dir(path: Path) -> int:
    """A descriptor of a directory the operator configured (its own path may hold symlinks)."""
    return os.open(path, _OPEN_DIR)


def _move_aside(parent_fd: int, parent: Path, name: str, problem: str) -> None:
    aside = f"{name}.moved-aside.{time.time_ns() // 1_000_000_000}"
    try:
        os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except FileNotFoundError:
        return  # gone meanwhile: nothing in the way any more
    except OSError as exc:
        raise UnsafeEntry(parent / name, f"{problem} (renaming it failed: {exc})") from exc
    log.warning(
        MOVED_ASIDE_MSG,
        path=str(parent / name), movedTo=str(parent / aside), problem=problem,
        hint=f"nothing there was followed or written; delete {parent / aside} once inspected",
    )  # fmt: skip


def open_subdir(parent_fd: int, parent: Path, name: str, *, create: bool = True) -> int | None:
    """The daemon's own directory ``parent/name`` (0750), made if missing; None when missing
    and ``create`` is false. FileNotFoundError when ``parent`` itself has gone."""
    for _ in range(3):
        try:
            fd = os.open(name, _NOFOLLOW_DIR, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
            except FileExistsError:
                continue  # made meanwhile (another instance): look at it again
            fd = os.open(name, _NOFOLLOW_DIR, dir_fd=parent_fd)
            os.fchmod(fd, DIR_MODE)  # mkdir's mode is filtered by the umask
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            _move_aside(parent_fd, parent, name, problem_with(info, True) or "is not a directory")
            continue
        problem = problem_with(os.fstat(fd), True)
        if problem is None:
            return fd
        os.close(fd)
        _move_aside(parent_fd, parent, name, problem)
    raise UnsafeEntry(parent / name, "keeps being replaced by something else")


def open_file(dir_fd: int, directory: Path, name: str, *, create: bool = True) -> int | None:
    """The daemon's own regular file ``directory/name`` (0644) opened read-write, made if
    missing; None when missing and ``create`` is false."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                return None
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
            except FileExistsError:
                continue
            os.fchmod(fd, 0o644)  # the creation mode is filtered by the umask
        except OSError as exc:
            # ELOOP: a symlink; EISDIR, ENXIO (a socket), EWOULDBLOCK: not a regular file.
            info = _lstat_at(dir_fd, name)
            if info is None:
                continue
            problem = problem_with(info, False)
            if problem is None:
                raise
            _move_aside(dir_fd, directory, name, f"{problem} ({exc.strerror})")
            continue
        problem = problem_with(os.fstat(fd), False)
        if problem is None:
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
        _move_aside(dir_fd, directory, name, problem)
    raise UnsafeEntry(directory / name, "keeps being replaced by something else")


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def opened_dir(path: Path) -> Iterator[int]:
    fd = open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)
