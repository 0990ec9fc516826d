"""InstanceLock on its own: where it locks, and what counts as losing it."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from pathlib import Path

from rbln_device_plugin.runtime.instancelock import (
    LEGACY_LOCK_NAME,
    LOCK_DIR,
    LOCK_NAME,
    InstanceLock,
    _LockFile,
)


def holds(path: Path) -> bool:
    """Whether some other open file description holds the flock (we cannot take it)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


async def held_lock(directory: Path) -> InstanceLock:
    lock = InstanceLock(directory)
    assert await lock.acquire(asyncio.Event())
    return lock


async def test_both_files_are_locked_and_name_the_holder(tmp_path: Path) -> None:
    lock = await held_lock(tmp_path)
    try:
        for path in (tmp_path / LOCK_DIR / LOCK_NAME, tmp_path / LEGACY_LOCK_NAME):
            assert holds(path)
            assert path.read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()
    assert not holds(tmp_path / LOCK_DIR / LOCK_NAME)


async def test_a_deleted_file_nobody_took_is_locked_again(tmp_path: Path) -> None:
    lock = await held_lock(tmp_path)
    try:
        (tmp_path / LEGACY_LOCK_NAME).unlink()  # what kubelets before 1.33 do
        shutil.rmtree(tmp_path / LOCK_DIR)
        assert lock.check(create=False)  # the watch: nothing recreated under a remover
        assert not (tmp_path / LOCK_DIR).exists()
        assert lock.check()  # the scan: both back, both ours
        assert holds(tmp_path / LOCK_DIR / LOCK_NAME) and holds(tmp_path / LEGACY_LOCK_NAME)
        assert not lock.lost.is_set()
    finally:
        lock.release()


async def test_a_replacement_someone_else_holds_is_a_loss(tmp_path: Path) -> None:
    lock = await held_lock(tmp_path)
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        os.rename(tmp_path / "other", tmp_path / LEGACY_LOCK_NAME)
        assert not lock.check(create=False)
        assert lock.lost.is_set() and lock.loss is not None
        assert lock.loss.path == tmp_path / LEGACY_LOCK_NAME
        assert "another process holds it" in lock.loss.reason
    finally:
        os.close(other)
        lock.release()


async def test_a_file_where_the_lock_directory_was_is_moved_aside(tmp_path: Path) -> None:
    lock = await held_lock(tmp_path)
    try:
        shutil.rmtree(tmp_path / LOCK_DIR)
        (tmp_path / LOCK_DIR).write_text("a file where the lock directory was")
        assert lock.check()  # moved aside, made again, locked again: still ours
        (aside,) = tmp_path.glob(f"{LOCK_DIR}.moved-aside.*")
        assert aside.read_text() == "a file where the lock directory was"
        assert holds(tmp_path / LOCK_DIR / LOCK_NAME)
    finally:
        lock.release()


async def test_the_watch_notices_a_takeover_at_once(tmp_path: Path) -> None:
    lock = await held_lock(tmp_path)
    stop = asyncio.Event()
    watch = asyncio.create_task(lock.watch(stop))
    other = os.open(tmp_path / LOCK_DIR / "other", os.O_RDWR | os.O_CREAT)
    try:
        await asyncio.sleep(0)  # the watch is set up before the change
        fcntl.flock(other, fcntl.LOCK_EX)
        os.rename(tmp_path / LOCK_DIR / "other", tmp_path / LOCK_DIR / LOCK_NAME)
        await asyncio.wait_for(lock.lost.wait(), 10)  # no scan runs here: the watch saw it
        assert lock.loss is not None and lock.loss.holder_pid == "unknown"
        await asyncio.wait_for(watch, 10)
    finally:
        stop.set()
        os.close(other)
        lock.release()


def test_a_missing_kubelet_directory_is_never_created(tmp_path: Path) -> None:
    kubelet_dir = tmp_path / "device-plugins"
    lock = _LockFile(kubelet_dir / LOCK_DIR / LOCK_NAME, kubelet_dir, legacy=False, subdir=LOCK_DIR)
    assert lock.try_lock() is None
    assert not kubelet_dir.exists()


def test_the_anchor_is_waited_on_whatever_happens_to_the_kubelet_directory(
    tmp_path: Path,
) -> None:
    kubelet_dir, run = tmp_path / "kubelet", tmp_path / "run"
    kubelet_dir.mkdir()
    first = InstanceLock(kubelet_dir, run / "anchor.lock")
    second = InstanceLock(kubelet_dir, run / "anchor.lock")

    async def scenario() -> None:
        assert await first.acquire(asyncio.Event())
        shutil.rmtree(kubelet_dir)
        kubelet_dir.mkdir()
        stop = asyncio.Event()
        waiting = asyncio.create_task(second.acquire(stop))
        await asyncio.sleep(0.7)  # more than one retry of the waiter
        assert not waiting.done()
        assert first.check()  # the holder locks its kubelet-directory files again
        first.release()
        assert await asyncio.wait_for(waiting, 10)
        second.release()

    asyncio.run(scenario())
