"""The RSD lock file opened ahead of its use (in an Allocate's first batch of host checks):
it is the one locked, and every path that does not lock it closes it."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rbln_device_plugin.host.hostio import Stalled
from rbln_device_plugin.host.rsd import (
    OpenedLockFile,
    RsdError,
    RsdGroup,
    open_lock_file_ahead,
)

from .test_ownfiles import make_char_device, make_fifo, opens_of
from .test_rsd import BUS, RsdNode, lock_is_free


def fds_on(path: Path) -> set[str]:
    """This process's descriptors open on ``path``. Only these: other tests' objects
    (an in-process daemon's) may close descriptors of their own meanwhile."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                held.add(fd)
        except OSError:
            continue  # closed while listing
    return held


@pytest.fixture
def node(short_tmp: Path) -> RsdNode:
    return RsdNode(short_tmp)


async def test_the_lock_file_opened_ahead_is_locked_then_closed(node: RsdNode) -> None:
    ahead = open_lock_file_ahead(node.lock)
    assert isinstance(ahead, OpenedLockFile)
    assert fds_on(node.lock)
    assert node.lock.is_file()  # created (with its directories) when missing
    group = await node.recreate([BUS[1]], opened_lock=ahead)
    assert group == RsdGroup(1, node.dev / "rsd1", (BUS[1],))
    assert node.calls() == ["-g -j", "group -c 1 -a 1", "-g -j"]
    assert lock_is_free(node.lock)
    assert fds_on(node.lock) == set()
    with pytest.raises(RuntimeError, match="already taken"):
        ahead.take()


async def test_a_refused_request_closes_the_lock_file_opened_ahead(node: RsdNode) -> None:
    for bus_ids in ([], ["../../etc/passwd"]):
        ahead = open_lock_file_ahead(node.lock)
        assert fds_on(node.lock)
        with pytest.raises(RsdError, match="bus IDs"):
            await node.recreate(bus_ids, opened_lock=ahead)
    assert node.calls() == []
    assert fds_on(node.lock) == set()


async def test_a_failed_or_stalled_open_ahead_fails_the_group_naming_the_file(
    node: RsdNode,
) -> None:
    node.lock.parent.parent.mkdir(parents=True, exist_ok=True)
    node.lock.parent.write_text("not a directory")  # where the lock's directory belongs
    failed = open_lock_file_ahead(node.lock)
    assert isinstance(failed, OSError)
    with pytest.raises(RsdError, match=f"cannot open RSD lock file {node.lock}"):
        await node.recreate([BUS[0]], opened_lock=failed)
    stalled = Stalled(str(node.lock), 1.0)
    with pytest.raises(RsdError, match="did not finish within 1 s"):
        await node.recreate([BUS[0]], opened_lock=stalled)
    assert node.calls() == []


def test_a_lock_file_opened_ahead_and_dropped_is_closed(tmp_path: Path) -> None:
    lock = tmp_path / "rsd.lock"
    ahead = open_lock_file_ahead(lock)
    assert isinstance(ahead, OpenedLockFile)
    assert fds_on(lock)
    del ahead  # a cancelled batch's results are dropped like this
    gc.collect()
    assert fds_on(lock) == set()


@pytest.mark.parametrize(
    ("plant", "kind"),
    [
        pytest.param(lambda p: (p.mkdir(), (p / "host data").write_text("kept\n")), "directory",
                     id="directory"),
        pytest.param(lambda p: p.symlink_to(p.parent), "symbolic link", id="symlink"),
        pytest.param(make_fifo, "named pipe", id="fifo"),
        pytest.param(make_char_device, "character device", id="character-device"),
    ],
)  # fmt: skip
async def test_what_sits_at_the_configured_lock_path_fails_the_group_and_stays_untouched(
    node: RsdNode, plant: Callable[[Path], object], kind: str
) -> None:
    """--rsd-lock-path naming a host directory: the first Allocate renamed that directory
    to ``...moved-aside.<secs>`` and put a lock file in its place. A path the operator
    named is never renamed, written through or opened unless it is a lock file."""
    node.lock.parent.mkdir(parents=True)
    plant(node.lock)
    before = node.lock.lstat()
    with opens_of(node.lock) as opens:
        refused = open_lock_file_ahead(node.lock)
        assert isinstance(refused, OSError)
        with pytest.raises(RsdError) as failed:
            await node.recreate([BUS[0]], opened_lock=refused)
        assert opens.count() == 0
    message = str(failed.value)
    assert message.startswith(f"cannot open RSD lock file {node.lock}: {node.lock} is a {kind}")
    assert "never moves aside the path --rsd-lock-path (RSD_LOCK_PATH) names" in message
    assert node.calls() == []
    after = node.lock.lstat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in node.lock.parent.iterdir()) == [node.lock.name]
    if kind == "directory":
        assert (node.lock / "host data").read_text() == "kept\n"
