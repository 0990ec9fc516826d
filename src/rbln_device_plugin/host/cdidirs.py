"""Reading the CDI spec directories the container runtimes read, carefully.

The directories belong to the host (the RBLN container toolkit and other vendors write
them), so nothing in them is trusted: every file is opened relative to the directory with
``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` (a FIFO never blocks the read, a
device node is never read), at most ``MAX_SPEC_BYTES`` is read, and a symlink is followed
only to a sibling in the same directory (what a toolkit does for a versioned file; a
link elsewhere is not read, and a loop ends after ``MAX_LINK_HOPS``). The configured
directory itself may be a symlink (``/var/run`` usually is).

Every function here blocks: the daemon runs them through ``HostIO``, one call per
directory, with its bound. A directory is re-read only when its listing changed (names,
inodes, sizes, modification times), so the check on each scan costs one listing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Final

from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.model.cdispec import (
    FileState,
    SpecDir,
    SpecError,
    SpecFile,
    is_spec_file_name,
    parse_spec,
)

MAX_SPEC_BYTES: Final = 1 << 20  # real specs are a few KiB; NVIDIA's largest ~100 KiB
MAX_SPEC_FILES: Final = 128  # per directory, checked in name order
MAX_LINK_HOPS: Final = 8
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

# What a listing looked like: (name, st_mode, st_ino, st_size, st_mtime_ns) per entry.
Signature = tuple[tuple[str, int, int, int, int], ...]


def _describe(exc: OSError) -> str:
    return f"{exc.strerror or exc} (errno {exc.errno})" if exc.errno else str(exc)


@contextlib.contextmanager
def _opened_dir(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _dir_error(path: str, exc: OSError) -> SpecDir:
    if exc.errno == errno.ENOENT:
        why = "does not exist here (not mounted into the plugin's container?)"
    elif exc.errno == errno.ENOTDIR:
        why = "is not a directory"
    else:
        why = f"cannot be listed: {_describe(exc)}"
    return SpecDir(path, error=why)


def _listing(fd: int) -> Signature:
    entries = []
    with os.scandir(fd) as it:
        for entry in it:  # every entry: a symlink's sibling target may change alone
            info = entry.stat(follow_symlinks=False)
            entries.append((entry.name, info.st_mode, info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(sorted(entries))


def _target_name(fd: int, name: str) -> str | SpecFile:
    """The sibling a symlink chain ends at, or why it is not followed."""
    current = name
    for _ in range(MAX_LINK_HOPS):
        try:
            info = os.stat(current, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return SpecFile("", FileState.MALFORMED, reason=f"dangling symlink (to {current!r})")
        if not stat.S_ISLNK(info.st_mode):
            return current
        target = os.readlink(current, dir_fd=fd)
        normal = os.path.normpath(target)
        if "/" in normal or normal in (".", ".."):
            return SpecFile(
                "", FileState.UNCHECKED,
                reason=f"symlink to {target[:200]!r} leaves the directory; not followed",
            )  # fmt: skip
        current = normal
    # The runtimes' read fails with ELOOP as well: the file is unusable, not unknown.
    return SpecFile("", FileState.MALFORMED, reason=f"symlink loop (more than {MAX_LINK_HOPS})")


def _read_file(fd: int, name: str, path: str) -> SpecFile:
    target = _target_name(fd, name)
    if isinstance(target, SpecFile):
        return SpecFile(path, target.state, reason=target.reason)
    try:
        file_fd = os.open(target, _OPEN_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a symlink since the look above
            return SpecFile(path, FileState.UNCHECKED, reason="became a symlink while read")
        if exc.errno == errno.EISDIR:
            return SpecFile(path, FileState.MALFORMED, reason="a directory, not a file")
        return SpecFile(path, FileState.UNCHECKED, reason=f"cannot open: {_describe(exc)}")
    try:
        info = os.fstat(file_fd)
        if stat.S_ISDIR(info.st_mode):
            return SpecFile(path, FileState.MALFORMED, reason="a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            # A runtime reading a FIFO waits for a writer: unusable, and worth saying.
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
            return SpecFile(path, FileState.MALFORMED, reason=f"{kind}; not read")
        if info.st_size > MAX_SPEC_BYTES:
            return SpecFile(
                path, FileState.UNCHECKED,
                reason=f"{info.st_size} bytes, larger than the {MAX_SPEC_BYTES} checked",
            )  # fmt: skip
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(file_fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return SpecFile(path, FileState.UNCHECKED, reason=f"cannot read: {_describe(exc)}")
    finally:
        os.close(file_fd)
    if size > MAX_SPEC_BYTES:
        return SpecFile(path, FileState.UNCHECKED, reason=f"grew past {MAX_SPEC_BYTES} bytes")
    try:
        spec = parse_spec(b"".join(chunks))
    except SpecError as exc:
        return SpecFile(path, FileState.MALFORMED, reason=str(exc))
    return SpecFile(path, FileState.USABLE, spec=spec)


async def read_spec_dirs(io: HostIO, reader: SpecDirReader, paths: Sequence[str]) -> list[SpecDir]:
    """Every directory through ``io`` (one bounded call each); a stalled one is not visible."""
    results = await io.map([Call(path, partial(reader.read, path)) for path in paths])
    return [
        SpecDir(path, error=f"not listed: {result}") if isinstance(result, Stalled) else result
        for path, result in zip(paths, results, strict=True)
    ]


class SpecDirReader:
    """Reads spec directories, re-reading one only when its listing changed.

    One instance per daemon; each directory is read by at most one thread at a time
    (``HostIO`` never starts a second call on a key that is still running).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[Signature, SpecDir]] = {}

    def read(self, path: str) -> SpecDir:
        try:
            with _opened_dir(path) as fd:
                listing = _listing(fd)
                with self._lock:
                    cached = self._last.get(path)
                if cached is not None and cached[0] == listing:
                    return cached[1]
                result = self._read_all(fd, path, listing)
        except OSError as exc:
            with self._lock:
                self._last.pop(path, None)
            return _dir_error(path, exc)
        with self._lock:
            self._last[path] = (listing, result)
        return result

    @staticmethod
    def _read_all(fd: int, path: str, listing: Signature) -> SpecDir:
        files: list[SpecFile] = []
        candidates = [  # subdirectories are skipped, as the runtimes do
            entry for entry in listing
            if is_spec_file_name(entry[0]) and not stat.S_ISDIR(entry[1])
        ]  # fmt: skip
        for name, *_ in candidates[:MAX_SPEC_FILES]:
            files.append(_read_file(fd, name, os.path.join(path, name)))
        return SpecDir(path, tuple(files), truncated=max(0, len(candidates) - MAX_SPEC_FILES))
