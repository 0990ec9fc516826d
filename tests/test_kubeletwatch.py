"""Kubelet restart detection: by inotify, by the fallback poll, and never by a chmod."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from rbln_device_plugin.host import inotify
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.kubelet import watch
from rbln_device_plugin.kubelet.events import Events, KubeletSocketRecreated
from rbln_device_plugin.kubelet.watch import KubeletSocketWatch

from .fault_helpers import wait_until


class Kubelet:
    """Creates kubelet.sock the way the kubelet does: bind() a unix socket."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "kubelet.sock"
        self._sock: socket.socket | None = None

    def start(self) -> None:
        self.stop()
        self.path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@asynccontextmanager
async def watching(directory: Path) -> AsyncIterator[tuple[KubeletSocketWatch, Events]]:
    """The watch running on its own, and the session queue its events go to."""
    restarts: Events = asyncio.Queue()
    io = HostIO()
    watch = KubeletSocketWatch(directory, io)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop, restarts))
    try:
        await wait_until(lambda: watch.mode != "starting", 30, "the watch to start")
        yield watch, restarts
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        io.close()


async def next_restart(restarts: Events) -> str:
    event = await asyncio.wait_for(restarts.get(), 30)  # a hang guard
    return "restart" if isinstance(event, KubeletSocketRecreated) else repr(event)


@pytest.fixture
def no_inotify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without notifications: every watch attempt is refused."""

    def refuse(*_: object) -> None:
        raise inotify.InotifyUnavailable(95, "operation not supported")

    monkeypatch.setattr(inotify, "DirectoryWatch", refuse)
    monkeypatch.setattr(watch, "FALLBACK_POLL_S", 0.1)


@pytest.mark.parametrize("mode", ["inotify", "poll"])
async def test_a_new_socket_is_a_restart_and_a_chmod_is_not(
    short_tmp: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "poll":
        request.getfixturevalue("no_inotify")
    kubelet = Kubelet(short_tmp)
    kubelet.start()
    async with watching(short_tmp) as (watch, restarts):
        assert watch.mode == mode
        info = kubelet.path.stat()
        os.chmod(kubelet.path, 0o600)
        os.chown(kubelet.path, info.st_uid, info.st_gid)
        # The comparison both the events and the poll go through: not a new socket.
        assert await watch.check() is False
        for _ in range(3):  # the same inode number may come back: still a new file
            kubelet.start()
            assert await next_restart(restarts) == "restart"
        # The kubelet going away is not a restart; its new socket is.
        kubelet.stop()
        kubelet.path.unlink()
        assert await watch.check() is False
        kubelet.start()
        assert await next_restart(restarts) == "restart"
        # Events arrive in order: had the chmod or the removal counted, one of the four
        # restarts awaited above would still be queued now.
        assert restarts.empty()
    kubelet.stop()


async def test_the_watch_survives_the_directory_going_away(short_tmp: Path) -> None:
    directory = short_tmp / "device-plugins"
    directory.mkdir()
    kubelet = Kubelet(directory)
    kubelet.start()
    async with watching(directory) as (watch, restarts):
        assert watch.mode == "inotify"
        kubelet.stop()
        directory.rename(short_tmp / "gone")
        await wait_until(lambda: watch.mode == "poll", 30, "polling")
        directory.mkdir()
        kubelet.start()
        assert await next_restart(restarts) == "restart"
        await wait_until(lambda: watch.mode == "inotify", 30, "inotify again")
        kubelet.start()
        assert await next_restart(restarts) == "restart"
    kubelet.stop()


def test_parse_events_splits_padded_names() -> None:
    import struct

    def raw(mask: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name))
        return struct.pack("iIII", 1, mask, 0, len(padded)) + padded

    data = raw(inotify.IN_CREATE, b"kubelet.sock") + raw(inotify.IN_MOVED_TO, b"x")
    events = inotify.parse_events(data)
    assert [(wd, e.mask, e.name) for wd, e in events] == [
        (1, inotify.IN_CREATE, "kubelet.sock"),
        (1, inotify.IN_MOVED_TO, "x"),
    ]


async def test_the_daemon_learns_of_a_restart_without_scanning() -> None:
    from .simnode import running

    # With an hour between scans only the directory watch can notice the restart.
    async with running("rebel-4", interval="1h") as h:
        npu = "rebellions.ai/npu"
        await h.kubelet.wait_for(npu, lambda v: len(v.devices) == 4)
        (watching_record,) = await h.daemon.await_log("Watching for kubelet restarts")
        assert watching_record["mode"] == "inotify"
        for generation in (2, 3):
            await h.kubelet.restart()
            await h.kubelet.wait_for(
                npu, lambda v, g=generation: v.generation == g and len(v.devices) == 4
            )
        # Each restart was detected once: a detection comes before the re-registration it
        # causes, so once the daemon has exited every one of them is in the records.
        assert await asyncio.to_thread(h.daemon.stop) == 0
        detected = "Detected kubelet socket recreation; restarting device plugins"
        assert len(h.daemon.find(detected)) == 2


async def primed_watch(
    directory: Path, io: HostIO
) -> tuple[Kubelet, KubeletSocketWatch, list[str]]:
    """A running kubelet stand-in, a watch through ``io`` that knows its socket, and the
    list each restart the watch counts is appended to."""
    kubelet = Kubelet(directory)
    kubelet.start()
    restarts: list[str] = []

    class Counted(KubeletSocketWatch):
        async def check(self) -> bool:
            new = await super().check()
            restarts.extend("restart" for _ in range(self.restarts - len(restarts)))
            return new

    socket_watch = Counted(directory, io)
    await socket_watch.prime()
    return kubelet, socket_watch, restarts


async def test_a_kubelet_directory_that_hangs_never_stalls_the_loop(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hung mount under the kubelet's directory: the stat of kubelet.sock never returns.
    io = HostIO(timeout=0.3)
    kubelet, socket_watch, restarts = await primed_watch(short_tmp, io)
    release = threading.Event()
    real_identity = watch.file_identity

    def hung(path: Path) -> object:
        release.wait(30)
        return real_identity(path)

    monkeypatch.setattr(watch, "file_identity", hung)
    try:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        kubelet.start()  # a restart it cannot see while the stat hangs
        assert await asyncio.wait_for(socket_watch.check(), 5) is False
        assert await asyncio.wait_for(socket_watch.check(), 5) is False  # still stuck: at once
        ticker.cancel()
        assert ticks >= 10  # the loop ran on throughout the 0.3 s bound
        assert restarts == []
    finally:
        release.set()
    monkeypatch.setattr(watch, "file_identity", real_identity)
    await wait_until(lambda: not io.stuck, 10, "the stuck stat to end")
    assert await socket_watch.check() is True  # the stat answers again: the restart is seen
    assert restarts == ["restart"]
    kubelet.stop()


async def test_a_stat_that_returns_late_never_counts_one_restart_twice(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watch's check and a scan's check at once: the first stat saw the old socket but
    # answers after the kubelet made its new one.
    kubelet, socket_watch, restarts = await primed_watch(short_tmp, HostIO(timeout=10))
    old = watch.file_identity(kubelet.path)
    release = threading.Event()
    real_identity = watch.file_identity
    calls = 0

    def first_is_late(path: Path) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            release.wait(10)
            return old  # what it read before the kubelet restarted
        return real_identity(path)

    monkeypatch.setattr(watch, "file_identity", first_is_late)
    late = asyncio.create_task(socket_watch.check())
    await wait_until(lambda: calls == 1, 10, "the first stat to start")
    kubelet.start()  # the restart
    fresh = asyncio.create_task(socket_watch.check())
    await asyncio.sleep(0.2)
    release.set()
    await asyncio.gather(late, fresh)
    assert restarts == ["restart"]
    assert await socket_watch.check() is False  # settled on the new socket
    kubelet.stop()


async def test_a_directory_removed_while_a_socket_inside_holds_it_is_watched_anew(
    tmp_path: Path,
) -> None:
    """A unix socket bound in the directory (the daemon's own plugin socket) keeps it
    alive after ``rm -r``: its own deletion event waits for the socket to close. The
    parent's watch says at once that the path leads elsewhere, and a directory made
    again there is watched, so a kubelet.sock made in it is seen."""
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.bind(str(directory / "plugin.sock"))
    modes: list[str] = []
    changes = asyncio.Event()
    stop = asyncio.Event()
    entry = inotify.WatchedEntry(directory, "kubelet.sock", inotify.IN_CREATE, 0.05)
    watch = asyncio.create_task(
        inotify.follow_entry(entry, changes.set, (stop,), lambda mode, _: modes.append(mode))
    )
    try:
        await asyncio.wait_for(changes.wait(), 10)  # the first call as the watch starts
        changes.clear()
        shutil.rmtree(directory)
        directory.mkdir()
        async with asyncio.timeout(10):
            while modes.count("inotify") < 2:  # the new directory is watched
                await changes.wait()
                changes.clear()
        (directory / "kubelet.sock").write_text("")
        await asyncio.wait_for(changes.wait(), 10)
    finally:
        stop.set()
        held.close()
        await asyncio.wait_for(watch, 10)


async def test_the_same_socket_moved_away_and_back_is_no_restart(tmp_path: Path) -> None:
    """An exiting kubelet leaves its socket file where it was; the simulator's kubelet
    moves it aside while gRPC stops and back afterwards. The watch sees the name go and
    the same file come back: no new kubelet, so the plugins keep their registration."""
    kubelet = Kubelet(tmp_path)
    kubelet.start()
    aside = tmp_path / "parked"
    try:
        async with watching(tmp_path) as (watch, restarts):
            await watch.check()
            kubelet.path.rename(aside)
            assert not await watch.check()  # gone: the kubelet is down
            aside.rename(kubelet.path)
            assert not await watch.check()  # the same file back
            assert watch.restarts == 0 and restarts.empty()
            kubelet.start()  # a new kubelet: a new file
            assert await next_restart(restarts) == "restart"
            assert watch.restarts == 1
    finally:
        kubelet.stop()
