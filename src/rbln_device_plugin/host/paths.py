"""Files the daemon creates on the host, with modes that do not depend on the umask.

Plugin sockets accept Allocate, which can tear down a running pod's RSD group, so they
are owner-only (0600); directories the daemon has to create are 0750. A process umask
of 000 (seen on hand-built images) must not widen either.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o750

FileIdentity = tuple[int, int, int]


def ensure_dir(path: Path, mode: int = DIR_MODE) -> None:
    """Create ``path`` and any missing parents with exactly ``mode``; leave existing ones."""
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue  # created meanwhile by someone else: theirs to set up
        _set_created_mode(directory, mode)


def _set_created_mode(path: Path, mode: int) -> None:
    """Give a directory just made ``mode`` (mkdir's is filtered by the umask).

    Through a descriptor opened without following a symlink: between the mkdir and this
    call, anyone who can write to the parent can swap the new directory for a symlink,
    and a chmod by path would then change the mode of whatever it points to.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Set the process umask for a block that creates files.

    Only the event-loop thread changes the umask (for the plugin socket's bind). Files
    and directories made on host I/O threads meanwhile set their mode explicitly right
    after creating them (``ownfiles``, ``ensure_dir``), so the change can only narrow
    their mode for that moment, never widen it.
    """
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def file_identity(path: os.PathLike[str] | str) -> FileIdentity | None:
    """Device, inode and modification time; None when the file is absent.

    A recreated file can get its predecessor's inode number, so the modification time
    (set when a socket is bound) tells the two apart. Unlike the change time, it does
    not move on chmod or chown, so a permission change is not mistaken for a new file.
    """
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns
