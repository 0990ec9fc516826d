"""Task lifetimes (aiotasks) and typed host batches: the rules every task ending and
every mixed off-loop batch of the daemon relies on."""

from __future__ import annotations

import asyncio
import threading
import weakref
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin import aiotasks
from rbln_device_plugin.host.hostio import Call, HostBatch, HostIO, Stalled


async def test_stopping_says_which_task_failed_and_not_the_cancelled_ones() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    async def waits() -> None:
        await asyncio.Event().wait()

    broken = aiotasks.start(fails(), "broken one")
    idle = aiotasks.start(waits(), "idle one")
    await asyncio.sleep(0)
    with capture_logs() as logs:
        await aiotasks.cancel_and_wait(broken, idle, title="a test stop")
    assert idle.cancelled()
    (record,) = logs
    assert (record["event"], record["log_level"]) == ("Background task failed", "error")
    assert (record["during"], record["task"]) == ("a test stop", "broken one")
    assert record["err"] == "ValueError('broken')"


async def test_without_a_title_failures_are_only_retrieved() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    task = aiotasks.start(fails(), "quiet")
    await asyncio.sleep(0)
    with capture_logs() as logs:
        await aiotasks.cancel_and_wait(task)
    assert logs == []


async def test_a_cancelled_caller_is_passed_on_while_its_tasks_still_end() -> None:
    ended = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)
            ended.set()

    inner = aiotasks.start(slow_cleanup(), "inner")
    await asyncio.sleep(0)
    outer = asyncio.ensure_future(aiotasks.cancel_and_wait(inner))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.wait_for(ended.wait(), 5)


async def test_run_to_end_finishes_the_work_when_the_caller_gives_up() -> None:
    finished = asyncio.Event()

    async def work() -> str:
        await asyncio.sleep(0.05)
        finished.set()
        return "done"

    task = aiotasks.start(work(), "work")
    caller = asyncio.ensure_future(aiotasks.run_to_end(task))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await task == "done"
    assert finished.is_set()


async def test_wait_for_end_neither_cancels_nor_hides_a_failure() -> None:
    release = asyncio.Event()

    async def work() -> None:
        await release.wait()
        raise ValueError("late failure")

    task = aiotasks.start(work(), "work")
    assert await aiotasks.wait_for_end(task, 0.05) is False
    assert not task.done()
    release.set()
    with pytest.raises(ValueError, match="late failure"):
        await aiotasks.wait_for_end(task, 5)


async def test_a_task_set_ends_every_task_it_still_holds() -> None:
    tasks = aiotasks.TaskSet("test set")

    async def forever() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        pass

    kept = tasks.spawn(forever(), "forever")
    tasks.spawn(quick(), "quick")
    await asyncio.sleep(0.01)
    assert len(tasks) == 1  # the finished one left the set by itself
    await tasks.stop()
    assert kept.cancelled()
    assert len(tasks) == 0


async def test_a_host_batch_hands_each_call_its_own_typed_result_in_one_hop(
    tmp_path: Path,
) -> None:
    threads: set[int] = set()

    def size(path: Path) -> int:
        threads.add(threading.get_ident())
        return path.stat().st_size

    def text(path: Path) -> str:
        threads.add(threading.get_ident())
        return path.read_text()

    (tmp_path / "a").write_text("hello")
    first, second = HostBatch(), HostBatch()
    sized = first.add(Call("a-size", lambda: size(tmp_path / "a")))
    read = second.add(Call("a-text", lambda: text(tmp_path / "a")))
    with pytest.raises(RuntimeError, match="has not run"):
        read.result()
    io = HostIO()
    try:
        await first.run(io, second)
    finally:
        io.close()
    assert sized.result() == 5
    assert read.result() == "hello"
    assert len(threads) == 1  # both batches went in one thread hop


async def test_a_stalled_call_in_a_host_batch_is_answered_as_stalled_alone() -> None:
    release = threading.Event()
    batch = HostBatch()
    stuck = batch.add(Call("stuck", lambda: release.wait(10)))
    after = batch.add(Call("after", lambda: "fine"))
    io = HostIO(timeout=0.2)
    try:
        await batch.run(io)
    finally:
        release.set()
        io.close()
    assert isinstance(stuck.result(), Stalled)
    assert after.result() == "fine"


async def test_what_an_abandoned_call_returns_is_freed_once_it_returns() -> None:
    """A cancelled caller (an Allocate the kubelet gave up on) leaves its batch to the
    worker: what the call then returns, an opened lock file say, must not stay alive in
    the idle thread until it next gets work."""
    release = threading.Event()
    returned = threading.Event()

    class Opened:
        pass

    freed = threading.Event()

    def opens() -> Opened:
        release.wait(10)
        value = Opened()
        weakref.finalize(value, freed.set)
        returned.set()
        return value

    io = HostIO(timeout=10)
    try:
        batch = HostBatch()
        batch.add(Call("opens", opens))
        caller = asyncio.ensure_future(batch.run(io))
        await asyncio.sleep(0.05)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        del batch, caller
        release.set()
        assert await asyncio.to_thread(returned.wait, 10)
        assert await asyncio.to_thread(freed.wait, 5), "the idle worker still holds it"
    finally:
        io.close()
