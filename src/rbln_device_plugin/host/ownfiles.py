"""The daemon's own files inside directories it does not own, never followed or trusted blindly.

The kubelet's device-plugin directory, the CDI root and ``/run/rbln`` are host
directories other privileged programs write into. Whatever sits where one of the daemon's
files belongs (its lock subdirectory, a lock file) is looked at before it is opened: an
``O_PATH`` descriptor relative to its parent's, with ``O_NOFOLLOW``, opens nothing (no
device driver's ``open``, no named pipe's wait) and follows no symlink, and its ``fstat``
must show the right type, owned by root or by the daemon's user, writable by nobody else,
and (for a file) with no second hard link. Only then is that same file opened for I/O,
through ``/proc/self/fd`` (which reaches exactly the inode looked at), or where there is
no ``/proc`` by name again, compared with what was looked at. A directory is opened with
``O_DIRECTORY``, which refuses anything else before any driver sees it.

Anything else found where a file the daemon names itself belongs is renamed aside, next
to where it was (``<name>.moved-aside.<seconds since the epoch>``, ``.1``, ``.2``... when
that name is taken: the rename never replaces anything), with a warning naming both
paths, and the daemon's own entry is made afresh. Renaming touches neither the entry's
target nor its content, keeps it for whoever wants to look, and keeps the node serving: a
stray file left by a careless ``touch`` or an old script must not take every NPU of the
node out of service until someone finds it. At most ``KEEP_MOVED_ASIDE`` such entries are
kept per name: older ones are removed if they are not directories (which removes a name,
never a symlink's target or a hard link's other name) or are empty directories; a
directory with anything in it is never deleted, and while those fill the quota nothing
more is moved aside. Only when the entry cannot be moved aside does the caller get
``UnsafeEntry``, whose message names the path and what to remove.

A path the operator named in a setting (``--rsd-lock-path``) is never renamed: whatever
unusable entry sits there is refused with ``UnsafeEntry`` naming the setting.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from rbln_device_plugin.host.noreplace import rename_noreplace
from rbln_device_plugin.telemetry.logs import get_logger

DIR_MODE: Final = 0o750
FILE_MODE: Final = 0o644
_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR: Final = _OPEN_DIR | os.O_NOFOLLOW
_LOOK: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_WRITE: Final = os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC
MOVED_ASIDE_MSG: Final = "Moved a foreign entry aside where the daemon's own file belongs"
REMOVED_ASIDE_MSG: Final = "Removed old moved-aside entries"
ASIDE_INFIX: Final = ".moved-aside."
# Entries moved aside that are kept per name (the newest): enough to see what keeps
# appearing there, few enough that a loop that keeps planting entries fills nothing.
KEEP_MOVED_ASIDE: Final = 5
_MAX_SUFFIX: Final = 100

log = get_logger()


class UnsafeEntry(OSError):
    """Where the daemon's own file or directory belongs sits something it cannot use or move."""

    def __init__(self, path: Path, problem: str, remedy: str | None = None) -> None:
        super().__init__(
            f"{path} {problem}; "
            + (
                remedy
                or f"it was not followed or written, and it could not be moved aside: remove "
                f"{path} (the daemon makes it again)"
            )
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


def why_not_a_directory(path: Path) -> str:
    """What keeps ``path`` from being opened as a directory, for a message: the first
    component (from the root) that is missing, a dangling symlink, a symlink loop or no
    directory. Looks only (``stat``, ``lstat``, ``readlink``)."""
    parts = path.parts
    for end in range(1, len(parts) + 1):
        prefix = Path(*parts[:end])
        try:
            info = os.stat(prefix)
        except FileNotFoundError:
            target = _link_target(prefix)
            if target is None:
                return f"{prefix} does not exist"
            return f"{prefix} is a symbolic link to {target!r}, which does not exist"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{prefix} is a symbolic link that leads round in a loop"
            return f"{prefix} cannot be looked at ({exc.strerror})"
        if stat.S_ISDIR(info.st_mode):
            continue
        target = _link_target(prefix)
        kind = kind_of(info.st_mode)
        if target is None:
            return f"{prefix} is a {kind}, not a directory"
        return f"{prefix} is a symbolic link to {target!r}, a {kind}, not a directory"
    return f"{path} could not be opened as a directory"


def _link_target(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def configured_file_problem(path: Path) -> str | None:
    """Why the entry at ``path``, a file a setting names, cannot be the daemon's lock file;
    None when it can, or when nothing is there (it is made when first needed). Looks only:
    ``lstat``, never an ``open``."""
    try:
        info = os.lstat(path)
    except OSError:
        return None  # missing, or its directory is (said where the directory is used)
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {_link_target(path)!r}), which the daemon never follows"
    if stat.S_ISDIR(info.st_mode):
        return f"is a directory; name a file inside it, such as {path / 'rsd-group.lock'}"
    return problem_with(info, False)


def _asides(dir_fd: int, name: str) -> list[str]:
    """The entries of ``name`` moved aside in the directory, oldest first."""
    pattern = re.compile(re.escape(name + ASIDE_INFIX) + r"([0-9]+)(?:\.([0-9]+))?")
    found: list[tuple[int, int, str]] = []
    for entry in os.listdir(dir_fd):
        match = pattern.fullmatch(entry)
        if match is not None:
            found.append((int(match[1]), int(match[2] or 0), entry))
    return [entry for *_, entry in sorted(found)]


def _remove_aside(dir_fd: int, aside: str) -> bool:
    """Remove an entry moved aside if that loses nothing but a name or an empty directory."""
    try:
        info = os.stat(aside, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            os.rmdir(aside, dir_fd=dir_fd)  # fails unless empty: never a recursive delete
        else:
            os.unlink(aside, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _make_room(dir_fd: int, parent: Path, name: str, problem: str) -> None:
    """Remove the oldest entries moved aside for ``name`` until one more keeps the count at
    ``KEEP_MOVED_ASIDE``; UnsafeEntry when the ones left cannot be removed."""
    asides = _asides(dir_fd, name)
    excess = len(asides) - (KEEP_MOVED_ASIDE - 1)
    removed: list[str] = []
    for aside in asides:
        if excess <= 0:
            break
        if _remove_aside(dir_fd, aside):
            removed.append(str(parent / aside))
            excess -= 1
    if removed:
        log.info(
            REMOVED_ASIDE_MSG,
            path=str(parent / name), removed=removed, kept=KEEP_MOVED_ASIDE,
            hint="the oldest entries moved aside beyond the newest kept ones: files, links "
            "and empty directories only",
        )  # fmt: skip
    if excess > 0:
        raise UnsafeEntry(
            parent / name,
            problem,
            f"it was not followed or written, and {len(asides)} entries moved aside before "
            f"({name}{ASIDE_INFIX}*) are still in {parent}, directories with content that "
            f"the daemon never deletes: remove them and {parent / name}",
        )


def _move_aside(parent_fd: int, parent: Path, name: str, problem: str) -> None:
    _make_room(parent_fd, parent, name, problem)
    base = f"{name}{ASIDE_INFIX}{time.time_ns() // 1_000_000_000}"
    for attempt in range(_MAX_SUFFIX):
        aside = base if attempt == 0 else f"{base}.{attempt}"
        try:
            rename_noreplace(parent_fd, name, aside)
        except FileExistsError:
            continue  # moved aside earlier in the same second: the next free suffix
        except FileNotFoundError:
            return  # gone meanwhile: nothing in the way any more
        except OSError as exc:
            raise UnsafeEntry(parent / name, f"{problem} (renaming it failed: {exc})") from exc
        log.warning(
            MOVED_ASIDE_MSG,
            path=str(parent / name), movedTo=str(parent / aside), problem=problem,
            hint=f"nothing there was followed or written; delete {parent / aside} once "
            "inspected",
        )  # fmt: skip
        return
    raise UnsafeEntry(parent / name, f"{problem} (no free name {base}.N to move it aside to)")


def _set_aside(
    parent_fd: int, parent: Path, name: str, problem: str, configured_by: str | None
) -> None:
    """Move the entry aside, or refuse it (UnsafeEntry) when a setting names its path."""
    if configured_by is None:
        _move_aside(parent_fd, parent, name, problem)
        return
    raise UnsafeEntry(
        parent / name,
        problem,
        f"it was not followed, opened or renamed: the daemon never moves aside the path "
        f"{configured_by} names; remove it (the daemon then makes the file) or name another "
        "file",
    )


def open_subdir(parent_fd: int, parent: Path, name: str, *, create: bool = True) -> int | None:
    """The daemon's own directory ``parent/name`` (0750), made if missing; None when missing
    and ``create`` is false. FileNotFoundError when ``parent`` itself has gone."""
    for _ in range(3):
        try:
            # O_DIRECTORY: anything but a directory fails before any driver's open runs.
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


def _look(dir_fd: int | None, name: str | Path) -> tuple[int, os.stat_result] | None:
    """An ``O_PATH`` descriptor of the entry (never followed: a symlink is the link itself;
    nothing opened: no driver, no pipe) and its ``fstat``; None when missing."""
    try:
        fd = os.open(name, _LOOK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def _reopen(
    path_fd: int, looked: os.stat_result, flags: int, by_name: Callable[[], int]
) -> int | None:
    """Open for I/O the very file ``path_fd`` looked at; None when it was replaced meanwhile.

    ``/proc/self/fd/<n>`` of an ``O_PATH`` descriptor opens exactly that inode, whatever
    happened to its name since. Without ``/proc`` the name is opened again (``by_name``,
    never followed) and compared: the one window left is a swap in between, whose new
    entry's type has not been checked before its open.
    """
    try:
        fd = os.open(f"/proc/self/fd/{path_fd}", flags)
    except FileNotFoundError:
        try:
            fd = by_name()
        except OSError:
            return None  # gone or replaced by something that does not open so
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) != (looked.st_dev, looked.st_ino):
        os.close(fd)
        return None
    return fd


def open_file(
    dir_fd: int,
    directory: Path,
    name: str,
    *,
    create: bool = True,
    configured_by: str | None = None,
) -> int | None:
    """The daemon's own regular file ``directory/name`` (0644) opened read-write, made if
    missing; None when missing and ``create`` is false.

    ``configured_by``: the setting that names this path (its flag and variable); then
    nothing found there is moved aside (see the module's doc).
    """
    for _ in range(3):
        looked = _look(dir_fd, name)
        if looked is None:
            if not create:
                return None
            try:
                fd = os.open(name, _READ_WRITE | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             FILE_MODE, dir_fd=dir_fd)  # fmt: skip
            except FileExistsError:
                continue
            os.fchmod(fd, FILE_MODE)  # the creation mode is filtered by the umask
        else:
            path_fd, info = looked
            try:
                problem = problem_with(info, False)
                if problem is not None:
                    _set_aside(dir_fd, directory, name, problem, configured_by)
                    continue
                reopened = _reopen(
                    path_fd, info, _READ_WRITE,
                    lambda: os.open(name, _READ_WRITE | os.O_NOFOLLOW, dir_fd=dir_fd),
                )  # fmt: skip
            finally:
                os.close(path_fd)
            if reopened is None:
                continue  # replaced between the look and the open: look again
            fd = reopened
        # Checked again on the open file: its mode or links may have changed meanwhile.
        problem = problem_with(os.fstat(fd), False)
        if problem is None:
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
        _set_aside(dir_fd, directory, name, problem, configured_by)
    raise UnsafeEntry(directory / name, "keeps being replaced by something else")


def open_regular_to_read(path: Path) -> int | None:
    """A regular file at ``path`` opened read-only and non-blocking, its last component
    never followed and nothing else opened (a device node or a named pipe planted there
    stays closed); None when there is none."""
    try:
        looked = _look(None, path)
    except OSError:
        return None
    if looked is None:
        return None
    path_fd, info = looked
    try:
        if not stat.S_ISREG(info.st_mode):
            return None
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        return _reopen(path_fd, info, flags, lambda: os.open(path, flags | os.O_NOFOLLOW))
    except OSError:
        return None
    finally:
        os.close(path_fd)


@contextlib.contextmanager
def opened_dir(path: Path) -> Iterator[int]:
    fd = open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)
