"""One entry of a CDI spec directory: what it is, and its bytes, never opened unchecked.

The directories belong to the host (the RBLN container toolkit and other vendors write
them), so nothing in them is trusted. What an entry is comes from ``lstat`` and
``readlink`` relative to the directory, nothing opened: a FIFO, socket or device node is
never opened (a device's open can have side effects: a watchdog arms). A regular file is
then opened with ``O_PATH | O_NOFOLLOW`` (no open of the file itself), checked with
``fstat`` to be the file looked at, and only then reopened for reading through
``/proc/self/fd``: the same inode, whatever the name leads to meanwhile. At most
``MAX_SPEC_BYTES`` are read. A symlink is followed only to a sibling in the same
directory (what a toolkit does for a versioned file; a link elsewhere is not read, and a
chain ends after ``MAX_LINK_HOPS``).

What each kind is to the runtimes (their CDI library, ``tags.cncf.io/container-device-
interface`` v1.1.1 ``pkg/cdi/spec-dirs.go``, reads every ``*.json`` and ``*.yaml`` entry
that is not a directory with ``os.ReadFile``, which follows symlinks anywhere and blocks):
a FIFO blocks its refresh for good; a socket fails to open (unusable); a device node is
opened and read (what it says is unknown); a link elsewhere or a file over the cap is
read (unknown to the daemon, which does not read it).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from rbln_device_plugin.model.cdispec import FileState, SpecFile, is_spec_file_name

MAX_SPEC_BYTES: Final = 1 << 20  # real specs are a few KiB; NVIDIA's largest ~100 KiB
MAX_LINK_HOPS: Final = 8
_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_PATH_FLAGS: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

# One lstat/fstat: (st_dev, st_ino, st_mode, st_size, st_mtime_ns, st_ctime_ns).
Hop = tuple[int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class ToRead:
    """A spec-named entry that leads to a regular file, with the signature looked at."""

    directory: str
    name: str  # the entry
    path: str  # the entry, as records name it
    target: str  # the sibling read: the entry itself, or where its symlinks lead
    signature: tuple[Hop, ...]  # the entry, then each hop
    racy: bool  # changed too recently to trust the signature: never remembered


@dataclass(frozen=True, slots=True)
class Loaded:
    data: bytes | SpecFile  # the file's bytes, or why they were not read
    stable: bool  # the file did not change while read: what it says may be remembered


def describe(exc: OSError) -> str:
    return f"{exc.strerror or exc} (errno {exc.errno})" if exc.errno else str(exc)


def hop(info: os.stat_result) -> Hop:
    return (
        info.st_dev, info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
    )  # fmt: skip


@contextlib.contextmanager
def opened_dir(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def spec_names(fd: int) -> tuple[str, ...]:
    """The entries the runtimes would read, in name order: no stat of any entry (the
    listing's own type skips a subdirectory, as the library's ``entry.IsDir()`` does)."""
    with os.scandir(fd) as it:
        names = [
            entry.name for entry in it
            if is_spec_file_name(entry.name) and not entry.is_dir(follow_symlinks=False)
        ]  # fmt: skip
    return tuple(sorted(names))


def _not_a_file(path: str, mode: int) -> SpecFile:
    """An entry (or a symlink's target) that is not a regular file: what the runtimes'
    read does with it."""
    if stat.S_ISFIFO(mode):
        return SpecFile(
            path, FileState.HANGS,
            reason="a FIFO: the runtimes' CDI library blocks opening it for good, and every "
            "container with a CDI device then waits at creation; not opened",
        )  # fmt: skip
    if stat.S_ISDIR(mode):
        return SpecFile(path, FileState.MALFORMED, reason="a symlink to a directory, not a file")
    if stat.S_ISSOCK(mode):
        return SpecFile(path, FileState.MALFORMED, reason="a socket: the runtimes cannot open it")
    if stat.S_ISCHR(mode):
        kind = "a character device"
    elif stat.S_ISBLK(mode):
        kind = "a block device"
    else:
        kind = "not a regular file"
    return SpecFile(
        path, FileState.UNCHECKED,
        reason=f"{kind}: not opened (the runtimes would open and read it)",
    )  # fmt: skip


def probe(fd: int, directory: str, name: str, trusted_before_ns: int) -> SpecFile | ToRead | None:
    """What a spec-named entry is, from ``lstat`` and ``readlink`` alone; None when it is
    gone since the listing, or a directory now (its directory's times moved: the next
    check lists it again). A signature with a change time at or after
    ``trusted_before_ns`` is racy."""
    path = os.path.join(directory, name)
    hops: list[Hop] = []
    current = name
    try:
        for _ in range(MAX_LINK_HOPS + 1):
            try:
                info = os.stat(current, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not hops:
                    return None  # removed: the directory changed, and is listed again
                why = f"dangling symlink (to {current!r})"
                return SpecFile(path, FileState.MALFORMED, reason=why)
            this = hop(info)
            if any(seen[:2] == this[:2] for seen in hops):
                # The runtimes' read fails with ELOOP: unusable, not unknown.
                return SpecFile(path, FileState.MALFORMED, reason="symlink loop")
            hops.append(this)
            if stat.S_ISREG(info.st_mode):
                if info.st_size > MAX_SPEC_BYTES:
                    return SpecFile(
                        path, FileState.UNCHECKED,
                        reason=f"{info.st_size} bytes, larger than the {MAX_SPEC_BYTES} checked",
                    )  # fmt: skip
                racy = any(h[5] >= trusted_before_ns for h in hops)
                return ToRead(directory, name, path, current, tuple(hops), racy)
            if stat.S_ISDIR(info.st_mode) and len(hops) == 1:
                return None  # made a directory since the listing: skipped, as listed again
            if not stat.S_ISLNK(info.st_mode):
                return _not_a_file(path, info.st_mode)
            target = os.readlink(current, dir_fd=fd)
            normal = os.path.normpath(target)
            if "/" in normal or normal in (".", ".."):
                return SpecFile(
                    path, FileState.UNCHECKED,
                    reason=f"symlink to {target[:200]!r} leaves the directory; not followed",
                )  # fmt: skip
            current = normal
    except OSError as exc:
        return SpecFile(path, FileState.UNCHECKED, reason=f"cannot look at it: {describe(exc)}")
    return SpecFile(
        path, FileState.UNCHECKED, reason=f"more than {MAX_LINK_HOPS} symlinks; not followed"
    )


def _reopen(path_fd: int, dir_fd: int, name: str) -> int:
    """The file ``path_fd`` (``O_PATH``) holds, opened for reading: the same inode, never
    whatever the name leads to meanwhile."""
    try:
        return os.open(f"/proc/self/fd/{path_fd}", _READ_FLAGS)
    except FileNotFoundError:  # no /proc: by name, never following; the caller checks the inode
        return os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)


def _changed(item: ToRead, why: str) -> Loaded:
    return Loaded(SpecFile(item.path, FileState.UNCHECKED, reason=why), stable=False)


def load(item: ToRead) -> Loaded:
    """The bytes of the file ``item`` looked at; anything else there is not opened."""
    try:
        with opened_dir(item.directory) as fd:
            return _load(fd, item)
    except OSError as exc:
        why = f"cannot read: {describe(exc)}"
        return Loaded(SpecFile(item.path, FileState.UNCHECKED, reason=why), stable=False)


def _load(fd: int, item: ToRead) -> Loaded:
    expected = item.signature[-1]
    try:
        path_fd = os.open(item.target, _PATH_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return _changed(item, "removed while read; checked again at the next check")
    try:
        info = os.fstat(path_fd)
        if not stat.S_ISREG(info.st_mode) or hop(info)[:2] != expected[:2]:
            return _changed(item, "replaced while read; checked again at the next check")
        file_fd = _reopen(path_fd, fd, item.target)
    finally:
        os.close(path_fd)
    try:
        if hop(os.fstat(file_fd))[:2] != expected[:2]:
            return _changed(item, "replaced while read; checked again at the next check")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(file_fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        after = hop(os.fstat(file_fd))
    finally:
        os.close(file_fd)
    if size > MAX_SPEC_BYTES:
        return _changed(item, f"grew past {MAX_SPEC_BYTES} bytes while read")
    return Loaded(b"".join(chunks), stable=after == expected and not item.racy)
