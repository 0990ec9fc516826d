"""HostIO: blocking host calls run off the loop; a stuck one costs one item, once."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from rbln_device_plugin.host.hostio import HOST_IO_TIMEOUT_S, Call, HostIO, Stalled
from rbln_device_plugin.host.paths import ensure_dir

from .fault_helpers import wait_until


def read_text(path: Path) -> str:
    with open(path) as handle:
        return handle.read()


def make_files(root: Path, names: list[str]) -> list[Path]:
    paths = []
    for name in names:
        path = root / name
        path.write_text(name)
        paths.append(path)
    return paths


def reads(paths: list[Path]) -> list[Call[str]]:
    return [Call(str(p), lambda p=p: read_text(p)) for p in paths]  # type: ignore[misc]


def unblock(fifo: Path) -> None:
    """Open the FIFO for writing, releasing a reader stuck in open(); then close it."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody is reading it, so nobody is stuck on it
        return
    os.write(fd, b"7\n")
    os.close(fd)


async def test_a_batch_runs_in_order_off_the_loop(tmp_path: Path) -> None:
    io = HostIO(timeout=5)
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def where() -> int:
        seen.append(threading.get_ident())
        return len(seen)

    results = await io.map([Call(f"k{i}", where) for i in range(5)])
    assert results == [1, 2, 3, 4, 5]
    assert loop_thread not in seen and len(set(seen)) == 1  # one hop for the whole batch


async def test_a_slow_batch_of_healthy_calls_never_stalls(loaded_machine: int) -> None:
    # Each call takes well under the bound, the batch as a whole several times it.
    io = HostIO(timeout=0.5)

    def slow(value: int) -> int:
        time.sleep(0.2)
        return value

    results = await io.map([Call(f"k{i}", lambda i=i: slow(i)) for i in range(8)])  # type: ignore[misc]
    assert results == list(range(8))
    assert io.stuck == {}


async def test_a_blocking_read_stalls_only_its_own_item(
    tmp_path: Path, loaded_machine: int
) -> None:
    before, after = make_files(tmp_path, ["a", "b"]), make_files(tmp_path, ["c"])
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    # The daemon's own bound per read: on a machine this loaded (every core busy, and the
    # suite's other workers beside it) a plain file's read can take a scheduler slice or
    # three, and a shorter bound made of that a stall the daemon itself would not see.
    io = HostIO(timeout=HOST_IO_TIMEOUT_S)
    try:
        batch = asyncio.create_task(io.map(reads([*before, fifo, *after])))
        # The loop is free while the batch waits: this coroutine runs again before the
        # batch can finish (it cannot before its bound runs out, and the loop turns
        # to timers only after every ready callback, this one included).
        await asyncio.sleep(0)
        assert not batch.done()
        results = await batch
        assert results[:2] == ["a", "b"] and results[3] == "c"
        stalled = results[2]
        assert isinstance(stalled, Stalled) and not stalled.still_blocked
        assert str(fifo) in str(stalled)
        threads = io.threads

        # The next batch does not wait again, nor spend another thread on the same file.
        again = await io.map(reads([before[0], fifo]))
        assert again[0] == "a"
        assert isinstance(again[1], Stalled) and again[1].still_blocked
        assert io.threads == threads
    finally:
        await asyncio.to_thread(unblock, fifo)
    # Once the stuck read returns, the file is read normally again.
    await wait_until(lambda: str(fifo) not in io.stuck, 30, "the stuck read to return")
    (path,) = make_files(tmp_path, ["stuck2"])
    assert await io.map(reads([path])) == ["stuck2"]


async def test_every_thread_stuck_answers_at_once_without_blocking(tmp_path: Path) -> None:
    fifos = []
    for name in ("f1", "f2"):
        os.mkfifo(tmp_path / name)
        fifos.append(tmp_path / name)
    io = HostIO(timeout=0.2, max_threads=1)
    try:
        (first,) = await io.map(reads(fifos[:1]))
        assert isinstance(first, Stalled)
        (second,) = await io.map(reads(fifos[1:]))
        assert isinstance(second, Stalled) and second.no_thread
        assert str(fifos[1]) not in io.stuck  # nothing ran, so nothing is stuck on it
    finally:
        for fifo in fifos:
            await asyncio.to_thread(unblock, fifo)


async def test_a_reader_bug_raises_in_the_caller() -> None:
    def broken() -> str:
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        await HostIO(timeout=5).call("k", broken)


async def test_a_device_node_check_that_hangs_fails_the_wait_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stat() on a hung /dev: the check is held here, since no file can do that."""
    from rbln_device_plugin.host import devnodes

    release = threading.Event()
    real = devnodes.node_kind
    stuck = tmp_path / "rsd7"

    def node_kind(path: Path, accept_files: bool = False) -> str | None:
        if path == stuck:
            release.wait(30)
        return real(path, accept_files)

    monkeypatch.setattr(devnodes, "node_kind", node_kind)
    (tmp_path / "rbln0").touch()
    try:
        with pytest.raises(devnodes.DeviceNodeMissing) as caught:
            await devnodes.wait_for_nodes(
                [tmp_path / "rbln0", stuck],
                HostIO(timeout=1.0),
                timeout=1.5,
                interval=0.05,
                accept_files=True,
            )
        assert caught.value.missing == (stuck,)
        assert "did not finish" in str(caught.value) or "still blocked" in str(caught.value)
    finally:
        release.set()


def test_a_directory_swapped_for_a_symlink_after_mkdir_never_passes_its_mode_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race a writer of the parent can win: the daemon's new directory replaced by a
    # symlink to one of the host's between the mkdir and the mode change.
    victim = tmp_path / "etc"
    victim.mkdir(mode=0o755)
    victim.chmod(0o755)
    parent = tmp_path / "run"
    parent.mkdir()
    real_mkdir = Path.mkdir

    def mkdir_then_swap(self: Path, mode: int = 0o777, *args: object, **kwargs: object) -> None:
        real_mkdir(self, mode)
        if self.name == "rbln":
            self.rmdir()
            self.symlink_to(victim)

    monkeypatch.setattr(Path, "mkdir", mkdir_then_swap)
    with pytest.raises(OSError):
        ensure_dir(parent / "rbln")
    assert (victim.stat().st_mode & 0o777) == 0o755


async def test_close_ends_the_idle_threads_and_later_calls_still_run(tmp_path: Path) -> None:
    def host_io_threads() -> int:
        return sum(t.name == "host-io" for t in threading.enumerate())

    before = host_io_threads()
    io = HostIO(timeout=5)
    paths = make_files(tmp_path, ["a", "b"])
    assert await io.map(reads(paths)) == ["a", "b"]
    assert io.threads >= 1 and host_io_threads() == before + io.threads
    io.close()
    await wait_until(lambda: host_io_threads() == before, 10, "the idle threads to end")
    assert io.threads == 0
    assert await io.map(reads(paths[:1])) == ["a"]  # a call after close: a new thread
    io.close()
    await wait_until(lambda: host_io_threads() == before, 10, "the new thread to end")


async def test_a_call_stuck_at_close_ends_its_thread_when_it_returns() -> None:
    # A one-shot pass (inspect) closes its runner while a wedged read is still out: that
    # thread must end once the read returns, not wait for work for ever.
    release = threading.Event()
    started: list[threading.Thread] = []

    def wedged() -> str:
        started.append(threading.current_thread())
        release.wait(30)
        return "late"

    io = HostIO(timeout=0.2)
    assert isinstance((await io.map([Call("wedged", wedged)]))[0], Stalled)
    io.close()
    release.set()
    (thread,) = started
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive() and io.threads == 0
