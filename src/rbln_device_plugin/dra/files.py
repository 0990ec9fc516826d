"""The DRA front end's files: a claim's CDI spec in the CDI root and the checkpoint in the
driver's directory, written whole or not at all, never through a symlink.

Each write goes to a temporary name in the same directory (created exclusively, no
symlink followed), is synced, then renamed over the final name, and the directory is
synced: a reader (the container runtime's CDI cache, the next start of this plugin) sees
the old file or the new one, never half of one. The rename replaces whatever entry held
the name, a symlink included, without following it. The temporary name starts with a
dot and ends in ``.tmp``: the CDI library reads only ``*.json`` and ``*.yaml``.

Every function here blocks: callers run them through ``HostIO``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_MAX_READ: Final = 16 * 1024 * 1024  # a checkpoint of thousands of claims is far smaller


def write_atomically(directory: Path, name: str, data: bytes, mode: int = 0o644) -> None:
    dir_fd = os.open(directory, _DIR_FLAGS)
    try:
        temporary = f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=dir_fd)  # a crashed write's leftover
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, mode, dir_fd=dir_fd)
        try:
            os.fchmod(fd, mode)  # not the umask's
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove(directory: Path, name: str) -> bool:
    """Remove the entry ``name`` (the name only, never a link's target); False when absent."""
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
        os.fsync(dir_fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dir_fd)


def read_regular(path: Path) -> bytes | None:
    """A regular file's bytes, or None when nothing is there; a symlink or anything but a
    regular file is an error naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open {path} (a symlink?): {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_READ:
                raise OSError(f"{path} is larger than {_MAX_READ} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)
