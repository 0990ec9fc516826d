"""InstanceLock on its own: where it locks, and what counts as losing it."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from rbln_device_plugin.host import ownfiles
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.runtime import instancelock
from rbln_device_plugin.runtime.instancelock import (
    LEGACY_LOCK_NAME,
    LOCK_DIR,
    LOCK_NAME,
    InstanceLock,
    _LockFile,
)

from .test_ownfiles import SPECIAL, opens_of


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


async def held_lock(directory: Path, hostio: HostIO) -> InstanceLock:
    lock = InstanceLock(directory, hostio)
    assert await lock.acquire(asyncio.Event())
    return lock


async def test_both_files_are_locked_and_name_the_holder(tmp_path: Path, hostio: HostIO) -> None:
    lock = await held_lock(tmp_path, hostio)
    try:
        for path in (tmp_path / LOCK_DIR / LOCK_NAME, tmp_path / LEGACY_LOCK_NAME):
            assert holds(path)
            assert path.read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()
    assert not holds(tmp_path / LOCK_DIR / LOCK_NAME)


async def test_a_deleted_file_nobody_took_is_locked_again(tmp_path: Path, hostio: HostIO) -> None:
    lock = await held_lock(tmp_path, hostio)
    try:
        (tmp_path / LEGACY_LOCK_NAME).unlink()  # what kubelets before 1.33 do
        shutil.rmtree(tmp_path / LOCK_DIR)
        assert await lock.check(create=False)  # the watch: nothing recreated under a remover
        assert not (tmp_path / LOCK_DIR).exists()
        assert await lock.check()  # the scan: both back, both ours
        assert holds(tmp_path / LOCK_DIR / LOCK_NAME) and holds(tmp_path / LEGACY_LOCK_NAME)
        assert not lock.lost.is_set()
    finally:
        lock.release()


async def test_a_replacement_someone_else_holds_is_a_loss(tmp_path: Path, hostio: HostIO) -> None:
    lock = await held_lock(tmp_path, hostio)
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        os.rename(tmp_path / "other", tmp_path / LEGACY_LOCK_NAME)
        assert not await lock.check(create=False)
        assert lock.lost.is_set() and lock.loss is not None
        assert lock.loss.path == tmp_path / LEGACY_LOCK_NAME
        assert "another process holds it" in lock.loss.reason
    finally:
        os.close(other)
        lock.release()


async def test_a_file_where_the_lock_directory_was_is_moved_aside(
    tmp_path: Path, hostio: HostIO
) -> None:
    lock = await held_lock(tmp_path, hostio)
    try:
        shutil.rmtree(tmp_path / LOCK_DIR)
        (tmp_path / LOCK_DIR).write_text("a file where the lock directory was")
        assert await lock.check()  # moved aside, made again, locked again: still ours
        (aside,) = tmp_path.glob(f"{LOCK_DIR}.moved-aside.*")
        assert aside.read_text() == "a file where the lock directory was"
        assert holds(tmp_path / LOCK_DIR / LOCK_NAME)
    finally:
        lock.release()


async def test_the_watch_notices_a_takeover_at_once(tmp_path: Path, hostio: HostIO) -> None:
    lock = await held_lock(tmp_path, hostio)
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
    assert lock.lock_now() is None
    assert not kubelet_dir.exists()


def test_the_anchor_is_waited_on_whatever_happens_to_the_kubelet_directory(
    tmp_path: Path, hostio: HostIO
) -> None:
    kubelet_dir, run = tmp_path / "kubelet", tmp_path / "run"
    kubelet_dir.mkdir()
    first = InstanceLock(kubelet_dir, hostio, run / "anchor.lock")
    second = InstanceLock(kubelet_dir, hostio, run / "anchor.lock")

    async def scenario() -> None:
        assert await first.acquire(asyncio.Event())
        shutil.rmtree(kubelet_dir)
        kubelet_dir.mkdir()
        stop = asyncio.Event()
        waiting = asyncio.create_task(second.acquire(stop))
        await asyncio.sleep(0.7)  # more than one retry of the waiter
        assert not waiting.done()
        assert await first.check()  # the holder locks its kubelet-directory files again
        first.release()
        assert await asyncio.wait_for(waiting, 10)
        second.release()

    asyncio.run(scenario())


async def test_a_lock_file_that_does_not_answer_never_holds_the_loop_or_a_stray_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock directory on a hung mount, as far as one can be had here: the first
    ``lock_now`` blocks (the file system part is real; only the hang is injected). The
    loop keeps running, the stall is said once, the late lock is let go, a retry wins."""
    released = threading.Event()
    blocked = threading.Event()
    real_lock_now = _LockFile.lock_now

    def hanging_once(self: _LockFile, *, create: bool = True) -> int | bool | None:
        if not blocked.is_set():
            blocked.set()
            released.wait(30)
        return real_lock_now(self, create=create)

    monkeypatch.setattr(_LockFile, "lock_now", hanging_once)
    records: list[dict[str, object]] = []
    monkeypatch.setattr(
        instancelock.log, "warning", lambda msg, **kw: records.append({"msg": msg, **kw})
    )
    lock = InstanceLock(tmp_path, hostio=HostIO(timeout=0.2))
    acquiring = asyncio.create_task(lock.acquire(asyncio.Event()))
    ticks = 0
    while not records:  # the loop turns while the call hangs: it is not on the loop
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks > 1 and not acquiring.done()
    (said,) = records
    assert said["msg"] == "Instance lock file did not answer in time; trying again"
    assert said["lockPath"] == str(tmp_path / LOCK_DIR / LOCK_NAME)
    released.set()  # the hung call returns now, with the lock it took: it must let go
    assert await asyncio.wait_for(acquiring, 10)
    try:
        assert len(records) == 1  # the retries while it hung were not said again
        assert holds(tmp_path / LOCK_DIR / LOCK_NAME)
    finally:
        lock.release()
    # Nothing of the abandoned attempt still holds the file: another process can lock it.
    assert not holds(tmp_path / LOCK_DIR / LOCK_NAME)
    assert not holds(tmp_path / LEGACY_LOCK_NAME)


# ------------------------------------------------------------------- issue 49's host files
@pytest.mark.parametrize(("make", "kind"), SPECIAL)
async def test_a_device_or_pipe_at_the_lock_path_is_moved_aside_never_opened(
    tmp_path: Path, hostio: HostIO, make: Callable[[Path], None], kind: str
) -> None:
    """The lock file used to be opened read-write before its type was checked: a device
    node there saw an open (some arm a watchdog on open), a named pipe a writer."""
    planted = tmp_path / LEGACY_LOCK_NAME
    make(planted)
    with opens_of(planted) as opens:
        lock = await held_lock(tmp_path, hostio)
        try:
            assert await lock._holder(lock._legacy) == os.getpid()  # the daemon's own file now
            assert opens.count() == 0
        finally:
            lock.release()
    (aside,) = tmp_path.glob(f"{LEGACY_LOCK_NAME}.moved-aside.*")
    assert ownfiles.kind_of(aside.lstat().st_mode) == kind


@pytest.mark.parametrize(("make", "kind"), SPECIAL)
def test_the_holders_pid_is_never_read_from_a_device_or_pipe(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    planted = tmp_path / LEGACY_LOCK_NAME
    make(planted)
    lock = _LockFile(planted, tmp_path, legacy=True)
    with opens_of(planted) as opens:
        assert lock.holder() == "unknown"
        assert opens.count() == 0


async def test_a_directory_moved_aside_onto_a_full_one_does_not_stop_the_daemon(
    tmp_path: Path, hostio: HostIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory where the lock file belongs, with one moved aside in the same second
    before it: renaming onto that non-empty directory failed (ENOTEMPTY) and the daemon
    exited 1 (InstanceLockError)."""
    monkeypatch.setattr(ownfiles.time, "time_ns", lambda: 1_800_000_000 * 1_000_000_000)
    earlier = tmp_path / f"{LEGACY_LOCK_NAME}.moved-aside.1800000000"
    earlier.mkdir()
    (earlier / "evidence").write_text("kept\n")
    (tmp_path / LEGACY_LOCK_NAME).mkdir()
    (tmp_path / LEGACY_LOCK_NAME / "content").write_text("kept too\n")
    lock = await held_lock(tmp_path, hostio)
    lock.release()
    assert (earlier / "evidence").read_text() == "kept\n"
    assert (earlier.with_name(earlier.name + ".1") / "content").read_text() == "kept too\n"


async def test_a_dangling_symlink_lock_directory_is_said_once_and_shown_until_fixed(
    tmp_path: Path, hostio: HostIO
) -> None:
    """The anchor's directory (that of --rsd-lock-path) a symlink to nowhere: the daemon
    used to wait for ever with no record, alive and never restarted. It now says why once,
    tells its caller (liveness and the instance state follow), and carries on when fixed."""
    kubelet_dir, run = tmp_path / "kubelet", tmp_path / "run"
    kubelet_dir.mkdir()
    run.mkdir()
    (run / "rbln").symlink_to(tmp_path / "driver-not-mounted-yet")
    lock = InstanceLock(kubelet_dir, hostio, run / "rbln" / instancelock.ANCHOR_NAME)
    told: list[bool] = []
    first = asyncio.Event()

    async def directory_unusable(now: bool) -> None:
        told.append(now)
        first.set()

    with structlog.testing.capture_logs() as records:
        acquiring = asyncio.create_task(lock.acquire(asyncio.Event(), directory_unusable))
        await asyncio.wait_for(first.wait(), 10)
        await asyncio.sleep(3 * instancelock.RETRY_S)  # several retries: still said once
        assert not acquiring.done() and told == [True]
        (said,) = [r for r in records if r["event"] == instancelock.UNUSABLE_DIR_MSG]
        assert said["log_level"] == "error"
        assert said["directory"] == str(run / "rbln")
        assert said["reason"] == (
            f"{run / 'rbln'} is a symbolic link to {str(tmp_path / 'driver-not-mounted-yet')!r}, "
            "which does not exist"
        )
        assert not (tmp_path / "driver-not-mounted-yet").exists()  # nothing made through it
        (tmp_path / "driver-not-mounted-yet").mkdir()  # the link leads somewhere now
        assert await asyncio.wait_for(acquiring, 10)
        try:
            assert told == [True, False]
            assert [r for r in records if r["event"] == instancelock.USABLE_AGAIN_MSG]
            assert holds(run / "rbln" / instancelock.ANCHOR_NAME)
        finally:
            lock.release()


async def test_the_watch_notices_a_takeover_of_the_anchor_at_once(
    tmp_path: Path, hostio: HostIO
) -> None:
    kubelet_dir, anchor = tmp_path / "kubelet", tmp_path / "run" / "anchor.lock"
    kubelet_dir.mkdir()
    lock = InstanceLock(kubelet_dir, hostio, anchor)
    assert await lock.acquire(asyncio.Event())
    stop = asyncio.Event()
    watch = asyncio.create_task(lock.watch(stop))
    other = os.open(anchor.with_name("other"), os.O_RDWR | os.O_CREAT)
    try:
        await asyncio.sleep(0.3)  # the watches are set up and their first checks done
        assert not lock.lost.is_set()
        fcntl.flock(other, fcntl.LOCK_EX)
        os.rename(anchor.with_name("other"), anchor)
        await asyncio.wait_for(lock.lost.wait(), 10)  # no scan runs here: the watch saw it
        assert lock.loss is not None and lock.loss.path == anchor
        await asyncio.wait_for(watch, 10)
    finally:
        stop.set()
        os.close(other)
        lock.release()


class CountingHostIO(HostIO):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    async def map(self, calls):  # type: ignore[no-untyped-def]
        self.keys.extend(call.key for call in calls)
        return await super().map(calls)


async def test_a_scan_looks_at_the_lock_files_only_when_a_watch_has_news(tmp_path: Path) -> None:
    kubelet_dir, anchor = tmp_path / "kubelet", tmp_path / "run" / "anchor.lock"
    kubelet_dir.mkdir()
    io = CountingHostIO()
    lock = InstanceLock(kubelet_dir, io, anchor)
    stop = asyncio.Event()
    try:
        assert await lock.acquire(asyncio.Event())
        io.keys.clear()
        assert await lock.scan_check()  # no watch yet: every scan looks
        assert await lock.scan_check()
        assert io.keys.count(str(anchor)) == 2
        watch = asyncio.create_task(lock.watch(stop))
        for _ in range(100):  # both watches started, their first checks done
            await asyncio.sleep(0.01)
        assert await lock.scan_check()  # the watches' start is news: one look
        io.keys.clear()
        for _ in range(5):
            assert await lock.scan_check()
        assert io.keys == []
        (anchor.parent / "unrelated").write_text("")  # any change in a lock's directory
        await asyncio.sleep(0.2)
        io.keys.clear()
        assert await lock.scan_check()
        assert str(anchor) in io.keys
        io.keys.clear()
        assert await lock.scan_check()
        assert io.keys == []
        stop.set()
        await asyncio.wait_for(watch, 10)
        assert await lock.scan_check()  # no live watch any more: looks again
        assert str(anchor) in io.keys
    finally:
        stop.set()
        lock.release()
        io.close()
