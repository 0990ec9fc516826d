"""What sits where a plugin socket belongs, on real files: anything but a directory goes
as the entry itself (never what it points to or shares content with); a directory stays
and is named with what to do."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from rbln_device_plugin.host import paths, pluginsocket
from rbln_device_plugin.host.pluginsocket import Cleared, SocketPathError

NAME = "rbln-device-plugin-rebellions-ai-npu.sock"


def bound_socket_file(path: Path) -> None:
    """A socket file nobody listens on any more: what a killed daemon leaves (0600, as
    the plugin binds it)."""
    with socket.socket(socket.AF_UNIX) as sock, paths.umask(0o177):
        sock.bind(str(path))


def test_nothing_there_is_nothing_to_do(short_tmp: Path) -> None:
    assert pluginsocket.clear(short_tmp / NAME) == Cleared()


def test_a_stale_socket_is_removed(short_tmp: Path) -> None:
    bound_socket_file(short_tmp / NAME)
    assert pluginsocket.clear(short_tmp / NAME) == Cleared("socket")
    assert not os.path.lexists(short_tmp / NAME)


@pytest.mark.parametrize("target_kind", ["file", "directory", "socket", "missing"])
def test_a_symlink_is_removed_as_the_link_its_target_untouched(
    short_tmp: Path, target_kind: str
) -> None:
    outside = short_tmp / "outside"
    outside.mkdir()
    target = outside / "victim"
    if target_kind == "file":
        target.write_text("precious\n")
        target.chmod(0o600)
    elif target_kind == "directory":
        target.mkdir()
        (target / "inside").write_text("precious\n")
    elif target_kind == "socket":
        bound_socket_file(target)
    before = target.lstat() if target_kind != "missing" else None
    (short_tmp / NAME).symlink_to(target)

    assert pluginsocket.clear(short_tmp / NAME) == Cleared("symbolic link", str(target))

    assert not os.path.lexists(short_tmp / NAME)
    if before is None:
        assert not os.path.lexists(target)
        return
    after = target.lstat()
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (
        before.st_ino, before.st_mode, before.st_mtime_ns,
    )  # fmt: skip
    if target_kind == "file":
        assert target.read_text() == "precious\n"
    if target_kind == "directory":
        assert (target / "inside").read_text() == "precious\n"


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("regular file", lambda p: p.write_text("not a socket\n")),
        ("named pipe", lambda p: os.mkfifo(p)),
    ],
)
def test_other_files_are_removed_as_the_name_only(short_tmp: Path, kind: str, make: object) -> None:
    path = short_tmp / NAME
    make(path)  # type: ignore[operator]
    assert pluginsocket.clear(path) == Cleared(kind)
    assert not os.path.lexists(path)


def test_a_hard_link_goes_and_its_content_stays(short_tmp: Path) -> None:
    victim = short_tmp / "victim"
    victim.write_text("precious\n")
    os.link(victim, short_tmp / NAME)
    assert pluginsocket.clear(short_tmp / NAME) == Cleared("regular file")
    assert victim.read_text() == "precious\n" and victim.stat().st_nlink == 1


def test_a_directory_stays_and_is_named_with_what_to_do(short_tmp: Path) -> None:
    path = short_tmp / NAME
    path.mkdir()
    (path / "inside").write_text("whatever a mistaken mount put here\n")
    outcome = pluginsocket.clear(path)
    assert isinstance(outcome, SocketPathError)
    message = str(outcome)
    assert f"{path} is a directory, not a socket" in message
    assert f"remove the directory {path}" in message and "DirectoryOrCreate" in message
    assert "starts at the next scan" in message
    assert (path / "inside").read_text() == "whatever a mistaken mount put here\n"


def test_a_missing_kubelet_directory_is_named(short_tmp: Path) -> None:
    outcome = pluginsocket.clear(short_tmp / "device-plugins" / NAME)
    assert isinstance(outcome, SocketPathError)
    assert f"the kubelet directory {short_tmp / 'device-plugins'} does not exist" in str(outcome)
    assert not (short_tmp / "device-plugins").exists()


def test_only_the_socket_that_was_bound_is_removed(short_tmp: Path) -> None:
    path = short_tmp / NAME
    bound_socket_file(path)
    identity = pluginsocket.bound_identity(path)
    assert not isinstance(identity, SocketPathError)
    path.unlink()
    bound_socket_file(path)  # someone else's socket now (a successor's)
    pluginsocket.remove_if_ours(path, identity)
    assert path.is_socket()
    ours = pluginsocket.bound_identity(path)
    assert not isinstance(ours, SocketPathError)
    pluginsocket.remove_if_ours(path, ours)
    assert not os.path.lexists(path)


def test_a_bound_socket_replaced_by_a_symlink_is_refused(short_tmp: Path) -> None:
    victim = short_tmp / "victim"
    bound_socket_file(victim)
    (short_tmp / NAME).symlink_to(victim)
    outcome = pluginsocket.bound_identity(short_tmp / NAME)
    assert isinstance(outcome, SocketPathError)
    assert "was replaced right after it was bound" in str(outcome)
