"""What ``inspect`` sees of the daemon's mode on the node (read-only I/O and its data).

Which sockets of either mode exist, and in dra mode the checkpoint of prepared claims and
each claim's CDI spec file. Every path is looked at with ``lstat`` (a symlink is reported
as one, never followed) and no socket is ever opened: a socket that exists says a plugin
of that mode is (or was) here, which is all inspect needs. The checkpoint is read with
the daemon's own reader (``dra.files.read_regular``: no symlink followed, regular files
only) and decoder (``dra.checkpoint.decode``). ``drareport`` explains what is gathered.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Final

from rbln_device_plugin import config
from rbln_device_plugin.dra import checkpoint as cp
from rbln_device_plugin.dra import files, names
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.model import resources

DEVICE_PLUGIN: Final = config.MODE_DEVICE_PLUGIN
DRA: Final = config.MODE_DRA
# PathSeen.kind values; "socket" is the one that says a plugin serves (or served) there.
SOCKET: Final = "socket"
ABSENT: Final = "absent"
UNREADABLE: Final = "unreadable"


@dataclass(frozen=True, slots=True)
class PathSeen:
    """One path of one mode and what ``lstat`` found there."""

    mode: str  # the mode whose path it is
    role: str  # "registration", "service", "spec", or the resource's socket name
    path: str
    kind: str  # socket, absent, symlink, file, directory, other, unreadable
    error: str = ""  # why it is unreadable


@dataclass(frozen=True, slots=True)
class CheckpointSeen:
    path: str
    present: bool = False
    checkpoint: cp.Checkpoint | None = None  # None: absent or unusable
    error: str = ""  # why it is unusable (the daemon's own message)


@dataclass(frozen=True, slots=True)
class ModeFacts:
    mode: str  # config.mode
    node_name: str
    cdi_root: str
    device_plugin_dir: str
    device_plugin_dir_error: str = ""  # why the directory could not be listed
    device_plugin_sockets: tuple[PathSeen, ...] = ()  # our socket names found there
    dra_sockets: tuple[PathSeen, ...] = ()  # registration, service: always both
    checkpoint: CheckpointSeen | None = None  # dra mode only
    spec_files: Mapping[str, PathSeen] = field(default_factory=dict)  # by claim UID


def path_kind(path: Path) -> tuple[str, str]:
    """(kind, error) of ``path`` by ``lstat``: never follows a symlink, never opens it."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT, ""
    except OSError as exc:
        return UNREADABLE, exc.strerror or str(exc)
    for test, kind in (
        (stat.S_ISSOCK, SOCKET),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return kind, ""
    return "other", ""


def seen(mode: str, role: str, path: Path) -> PathSeen:
    kind, error = path_kind(path)
    return PathSeen(mode, role, str(path), kind, error)


def device_plugin_sockets(directory: Path) -> tuple[tuple[PathSeen, ...], str]:
    """The entries of ``directory`` named as this plugin names its sockets (with or
    without an instance token), and why the directory could not be listed."""
    try:
        listed = sorted(os.listdir(directory))
    except FileNotFoundError:
        return (), "no such directory"
    except OSError as exc:
        return (), exc.strerror or str(exc)
    found = [n for n in listed if resources.instance_token_of(n) is not None]
    return tuple(seen(DEVICE_PLUGIN, n, directory / n) for n in found), ""


def dra_sockets(cfg: config.Config) -> tuple[PathSeen, ...]:
    plugin_dir = cfg.kubelet_plugins_path / names.DRIVER_NAME
    return (
        seen(DRA, "registration", cfg.kubelet_plugins_registry_path / names.REGISTRATION_SOCKET),
        seen(DRA, "service", plugin_dir / names.SERVICE_SOCKET),
    )


def read_checkpoint(path: Path) -> CheckpointSeen:
    """The daemon's checkpoint, read and decoded as the daemon does at start."""
    try:
        data = files.read_regular(path)
        if data is None:
            return CheckpointSeen(str(path))
        return CheckpointSeen(str(path), True, cp.decode(data, str(path)))
    except cp.CheckpointError as exc:
        return CheckpointSeen(str(path), True, error=str(exc))
    except OSError as exc:
        return CheckpointSeen(str(path), True, error=str(exc))


async def gather_mode(cfg: config.Config, io: HostIO) -> ModeFacts:
    """Everything the mode part of the report needs; each read bounded by ``io``."""
    dp_dir = cfg.kubelet_dir
    listed = await io.call(str(dp_dir), partial(device_plugin_sockets, dp_dir))
    dp_sockets, dp_error = ((), str(listed)) if isinstance(listed, Stalled) else listed
    dra = await io.call(str(cfg.kubelet_plugins_path), partial(dra_sockets, cfg))
    facts = ModeFacts(
        mode=cfg.mode,
        node_name=cfg.node_name,
        cdi_root=str(cfg.cdi_root),
        device_plugin_dir=str(dp_dir),
        device_plugin_dir_error=dp_error,
        device_plugin_sockets=dp_sockets,
        dra_sockets=() if isinstance(dra, Stalled) else dra,
    )
    if cfg.mode != DRA:
        return facts
    path = cfg.kubelet_plugins_path / names.DRIVER_NAME / names.CHECKPOINT_FILE
    read = await io.call(str(path), partial(read_checkpoint, path))
    checkpoint = (
        CheckpointSeen(str(path), True, error=str(read)) if isinstance(read, Stalled) else read
    )
    specs: dict[str, PathSeen] = {}
    uids = checkpoint.checkpoint.claims if checkpoint.checkpoint is not None else {}
    for uid in uids:
        if names.claim_uid_problem(uid) is not None:
            continue  # never a path: drareport names the UID
        spec = cfg.cdi_root / names.spec_file_name(uid)
        found = await io.call(str(spec), partial(seen, DRA, "spec", spec))
        specs[uid] = (
            PathSeen(DRA, "spec", str(spec), UNREADABLE, str(found))
            if isinstance(found, Stalled)
            else found
        )
    return replace(facts, checkpoint=checkpoint, spec_files=specs)
