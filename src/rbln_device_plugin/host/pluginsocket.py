"""The plugin socket's place in the kubelet's directory: cleared before a bind, removed after.

The kubelet's directory is the kubelet's, and other privileged programs write into it.
Before the plugin binds its socket, whatever sits at its name is looked at without
following it (``lstat`` relative to the directory's descriptor):

- nothing: the usual case;
- a socket: a stale one (ours, from a process that died), removed;
- a symbolic link, a regular file, a named pipe, a device node: removed as the entry
  itself. ``unlink`` removes a name and nothing else: a link's target, wherever it
  points, and the content of a file with another name (a hard link) stay exactly as
  they were. This is the rule of the kubelet's own cleanup (1.31.1 to 1.32 and releases
  before 1.31: every entry not a directory goes); the record names what was removed,
  and a link's target;
- a directory (what a hostPath volume of type ``DirectoryOrCreate`` makes where a
  socket is missing, or a mount point): not ours to remove and no place to serve on, so
  the plugin does not start and the error names the path and what to do. The kubelet
  session retries at every scan, so the plugin serves the moment the operator has removed it.

Every function here blocks: the plugin runs them through ``HostIO``, which bounds them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rbln_device_plugin.host import paths
from rbln_device_plugin.host.ownfiles import kind_of
from rbln_device_plugin.model import resources

_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class SocketPathError(RuntimeError):
    """The socket's place holds something the plugin must neither remove nor serve on."""


@dataclass(frozen=True, slots=True)
class Cleared:
    """What was at the socket's name before the bind (None: nothing)."""

    removed: str | None = None  # what it was: "socket", "symbolic link", "regular file"...
    link_target: str | None = None


def clear(socket_path: Path) -> Cleared | SocketPathError:
    """Make the socket's name free for a bind; never follows or removes anything else."""
    directory = socket_path.parent
    try:
        dir_fd = os.open(directory, _OPEN_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return SocketPathError(f"the kubelet directory {directory} does not exist")
    except OSError as exc:
        return SocketPathError(f"cannot open the kubelet directory {directory}: {exc.strerror}")
    try:
        return _clear_at(dir_fd, socket_path)
    finally:
        os.close(dir_fd)


def _clear_at(dir_fd: int, socket_path: Path) -> Cleared | SocketPathError:
    name = socket_path.name
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return Cleared()
    except OSError as exc:
        return SocketPathError(f"cannot look at {socket_path}: {exc.strerror}")
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return SocketPathError(_refusal(socket_path))
    target = None
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            target = os.readlink(name, dir_fd=dir_fd)
    try:
        os.unlink(name, dir_fd=dir_fd)  # the name itself: a target or other names stay
    except FileNotFoundError:
        return Cleared()  # gone meanwhile
    except IsADirectoryError:  # swapped for a directory since the look
        return SocketPathError(_refusal(socket_path))
    except OSError as exc:
        return SocketPathError(
            f"cannot remove the {kind_of(mode)} at {socket_path}: {exc.strerror}; remove it"
        )
    return Cleared(kind_of(mode), target)


def _refusal(socket_path: Path) -> str:
    return (
        f"{socket_path} is a directory, not a socket: the plugin cannot serve there and does "
        f"not remove a directory it did not make; remove the directory {socket_path} (a "
        "hostPath volume of type DirectoryOrCreate makes one where a socket is missing: mount "
        "the kubelet's directory instead), and the plugin starts at the next scan"
    )


def bound_identity(socket_path: Path) -> paths.FileIdentity | SocketPathError:
    """The identity of the socket just bound, after checking it is that socket (0600)."""
    try:
        info = os.lstat(socket_path)
    except OSError as exc:
        return SocketPathError(f"{socket_path} vanished right after it was bound: {exc.strerror}")
    # No chmod: it would follow a symlink swapped in since the bind. The umask already
    # made the socket 0600; check that what is there now is that socket.
    if not stat.S_ISSOCK(info.st_mode) or stat.S_IMODE(info.st_mode) & 0o177:
        return SocketPathError(f"{socket_path} was replaced right after it was bound")
    return info.st_dev, info.st_ino, info.st_mtime_ns


def remove_if_ours(socket_path: Path, identity: paths.FileIdentity | None) -> None:
    """Remove the socket at ``socket_path`` if it is still the one bound (``identity``)."""
    if identity is None or paths.file_identity(socket_path) != identity:
        return  # replaced (a restarted kubelet, a successor): not ours to remove
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)


def remove_instance_sockets(directory: Path, token: str | None, keep: str) -> list[str]:
    """Remove the plugin sockets of an instance that is gone: those carrying ``token`` (""
    the fixed names), or with None those of every instance but ``keep`` (see
    ``resources.socket_name``); their names.

    Only a socket by a name of ours is removed, looked at without following it; the
    kubelet's own socket and any other plugin's never match.
    """
    try:
        dir_fd = os.open(directory, _OPEN_DIR)
    except OSError:
        return []  # no directory: nothing of anyone's is left there
    removed: list[str] = []
    try:
        for name in sorted(os.listdir(dir_fd)):
            found = resources.instance_token_of(name)
            if found is None or found == keep or (token is not None and found != token):
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISSOCK(info.st_mode):
                    continue
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                continue  # gone meanwhile, or not ours to remove after all
            removed.append(name)
    finally:
        os.close(dir_fd)
    return removed
