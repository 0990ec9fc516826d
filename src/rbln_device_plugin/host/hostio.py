"""Host reads off the event loop, each with a bounded wait.

A sysfs attribute of a wedged driver, or a path on a hung mount, can block a read
forever. The event loop serves every resource, the health probe and the kubelet streams,
so no such call ever runs on it: calls run on daemon threads (never joined, so a stuck
read cannot hold the process at exit) and the loop waits for them at most ``timeout``.

Calls come in batches: a scan reads dozens of small files, and one thread hop per batch
costs far less than one per file. The bound is per call, not per batch: the worker notes
when each call starts, and the loop gives up only on a call that has itself been running
for ``timeout`` (or on a batch no thread took up within ``timeout``). A batch of healthy
reads that is slow as a whole, on a loaded machine or because it is long, never turns
one of them into a stall. The item that did overrun is known: that item, and only that
item, is answered with :class:`Stalled`, and the rest of the batch runs again on a fresh
thread. The stuck key (a path) is remembered until its read finally returns, and is
answered with ``Stalled`` at once meanwhile, so a file that blocks forever costs one
thread and one timeout, not one per scan.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from rbln_device_plugin import aiotasks
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.metrics import NOOP, Metrics
from rbln_device_plugin.waits import call_soon_threadsafe, set_result_threadsafe

T = TypeVar("T")

HOST_IO_TIMEOUT_S: Final = 1.0
MAX_THREADS: Final = 16

log = get_logger()


@dataclass(frozen=True, slots=True)
class Stalled:
    """A call that did not return within the budget (or whose key is still stuck)."""

    key: str
    timeout: float
    # True: an earlier call on this key is still blocked, so this one was not started.
    still_blocked: bool = False
    # True: no thread was free to run it (every thread is stuck); nothing is stuck on key.
    no_thread: bool = False

    def __str__(self) -> str:
        if self.no_thread:
            return f"no free host I/O thread to access {self.key}"
        if self.still_blocked:
            return f"an earlier access to {self.key} is still blocked"
        return f"access to {self.key} did not finish within {self.timeout:g} s"


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    key: str  # what the call touches (a path): the unit of stall bookkeeping
    run: Callable[[], T]  # must not raise; host readers return problems as data


class Slot(Generic[T]):
    """One call's place in a ``HostBatch``: its own result, typed, once the batch ran."""

    __slots__ = ("_filled", "_result", "call")

    def __init__(self, call: Call[T]) -> None:
        self.call = call
        self._result: T | Stalled | None = None
        self._filled = False

    def result(self) -> T | Stalled:
        if not self._filled:
            raise RuntimeError(f"the batch holding {self.call.key} has not run")
        return self._result  # type: ignore[return-value]  # filled: a T or Stalled

    def _fill(self, value: T | Stalled) -> None:
        self._result, self._filled = value, True


class HostBatch:
    """Calls with results of different types, run as one off-loop batch in the order
    they were added (one thread hop for all of them); each ``add`` returns the slot that
    reads that call's result."""

    def __init__(self) -> None:
        self._slots: list[Slot[Any]] = []

    def add(self, call: Call[T]) -> Slot[T]:
        slot = Slot(call)
        self._slots.append(slot)
        return slot

    async def run(self, io: HostIO, *after: HostBatch) -> None:
        """Run this batch's calls, then those of each batch in ``after``, in one batch."""
        slots = [slot for batch in (self, *after) for slot in batch._slots]
        results = await io.map([slot.call for slot in slots])
        for slot, value in zip(slots, results, strict=True):
            slot._fill(value)


class _Batch:
    """One hand-off to a worker; the worker and the loop meet under ``lock``."""

    def __init__(self, calls: Sequence[Call[object]], done: Callable[[], None]) -> None:
        self.calls = calls
        self.results: list[object] = [_UNSET] * len(calls)
        self.next = 0  # index of the call running (or about to run)
        self.call_started = 0.0  # time.monotonic() when call ``next`` started
        self.started = False
        self.abandoned = False
        self.lock = threading.Lock()
        self.done = done


_UNSET: Final = object()


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class HostIO:
    """The daemon's runner for blocking host calls. One per daemon."""

    def __init__(
        self,
        timeout: float = HOST_IO_TIMEOUT_S,
        max_threads: int = MAX_THREADS,
        metrics: Metrics = NOOP,
    ) -> None:
        self.timeout = timeout
        self._metrics = metrics
        self._max_threads = max_threads
        # None asks one idle thread to end (``close``).
        self._jobs: queue.SimpleQueue[tuple[_Batch, Callable[[str], None]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = 0
        self._idle = 0
        self._backlog = 0
        self._closed = False  # set by close: a thread whose call returns ends, never idles
        self._count_lock = threading.Lock()
        self.stuck: dict[str, float] = {}  # key -> monotonic time its call was abandoned

    async def call(self, key: str, run: Callable[[], T]) -> T | Stalled:
        (result,) = await self.map([Call(key, run)])
        return result

    async def map(self, calls: Sequence[Call[T]]) -> list[T | Stalled]:
        """Run ``calls`` in order off the loop; a call that overruns becomes ``Stalled``."""
        results: list[T | Stalled | object] = [_UNSET] * len(calls)
        pending = list(range(len(calls)))
        while pending:
            runnable: list[int] = []
            if not self.stuck:  # the usual case: nothing blocked, everything runs
                runnable = pending
            for index in pending if self.stuck else ():
                key = calls[index].key
                if key in self.stuck:
                    results[index] = Stalled(key, self.timeout, still_blocked=True)
                else:
                    runnable.append(index)
            if not runnable:
                break
            pending = await self._run_batch([calls[i] for i in runnable], runnable, results)
        return results  # type: ignore[return-value]  # every slot is filled above

    async def _run_batch(
        self,
        calls: list[Call[T]],
        positions: list[int],
        results: list[T | Stalled | object],
    ) -> list[int]:
        """Run one batch; fill ``results``; return the positions still to run."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def done() -> None:
            set_result_threadsafe(loop, finished, None)

        def released(key: str) -> None:
            call_soon_threadsafe(loop, self._release, key)

        batch = _Batch(calls, done)  # type: ignore[arg-type]
        submitted = time.monotonic()
        self._submit(batch, released)
        wait = self.timeout
        while True:
            try:
                await aiotasks.wait_for_end(finished, wait)
            except asyncio.CancelledError:
                with batch.lock:
                    batch.abandoned = True
                raise
            with batch.lock:
                # Decided and acted on under the lock: the worker cannot move on to the
                # next call between the look at this one and giving up on it.
                now = time.monotonic()
                since = batch.call_started if batch.started else submitted
                if not finished.done() and now - since < self.timeout:
                    wait = since + self.timeout - now  # this call is still within its bound
                    continue
                batch.abandoned = True
                stopped_at = batch.next
                started = batch.started
                values = list(batch.results)
            break
        for offset, value in enumerate(values):
            if isinstance(value, _Raised):
                raise value.error
            if value is not _UNSET:
                results[positions[offset]] = value
        if not started:
            # No thread took the batch in time (every one is stuck): answer it all now.
            for offset, call in enumerate(calls):
                results[positions[offset]] = Stalled(call.key, self.timeout, no_thread=True)
            return []
        if stopped_at >= len(calls) or values[stopped_at] is not _UNSET:
            return positions[stopped_at + 1 :]  # it finished just as time ran out
        key = calls[stopped_at].key
        results[positions[stopped_at]] = Stalled(key, self.timeout)
        self.stuck[key] = time.monotonic()
        self._metrics.host_read_stalled()
        log.warning(
            "Host access did not finish in time; treating it as unreadable",
            path=key, timeoutSeconds=self.timeout,
        )  # fmt: skip
        return positions[stopped_at + 1 :]

    def _release(self, key: str) -> None:
        since = self.stuck.pop(key, None)
        if since is not None:
            log.info(
                "Blocked host access returned",
                path=key, blockedSeconds=round(time.monotonic() - since, 1),
            )  # fmt: skip

    def _submit(self, batch: _Batch, released: Callable[[str], None]) -> None:
        # Each batch gets a thread of its own (an idle one, else a new one), so a batch
        # never waits behind a stuck one; past the cap it queues for a thread to return.
        spawn = False
        with self._count_lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < self._max_threads:
                self._threads += 1
                spawn = True
            else:
                self._backlog += 1
        self._jobs.put((batch, released))
        if spawn:
            threading.Thread(target=self._worker, name="host-io", daemon=True).start()

    def close(self) -> None:
        """End the idle threads: a runtime that stops (the daemon's, or one of the many a
        test process starts) leaves none waiting. A stuck thread ends when its call
        returns; a call submitted afterwards still runs, on a thread of its own."""
        with self._count_lock:
            self._closed = True
            idle, self._idle = self._idle, 0
            self._threads -= idle
        for _ in range(idle):
            self._jobs.put(None)

    def _worker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch, released = job
            finished = _work(batch, released)
            with self._count_lock:
                ends = False
                if self._backlog:
                    self._backlog -= 1  # take a queued batch without becoming idle
                elif self._closed:
                    self._threads -= 1  # a stuck call that returned after close, or a late one
                    ends = True
                else:
                    self._idle += 1
            # Only now: a batch submitted right after this one finds this thread idle.
            if finished:
                batch.done()
            # An idle thread holds nothing of its last batch: what an abandoned call
            # returned (an RSD lock file opened ahead for an Allocate that was cancelled)
            # is freed now, not when this thread next gets work.
            job = batch = released = None  # type: ignore[assignment]
            if ends:
                return

    @property
    def threads(self) -> int:
        return self._threads


def _work(batch: _Batch, released: Callable[[str], None]) -> bool:
    """Run the batch's calls; True when all of them ran (the loop is still waiting).

    One critical section per call: it stores the result, sees whether the loop gave up
    meanwhile and starts the next call's clock (a status read of every device is one
    batch, so this runs 64 times a scan on a large node)."""
    with batch.lock:
        if batch.abandoned:
            return False  # the loop gave up before we started: it answered everything
        batch.started = True
        batch.next = 0
        batch.call_started = time.monotonic()
    for index, call in enumerate(batch.calls):
        try:
            value: object = call.run()
        except Exception as exc:  # a reader bug must not kill the worker: the caller raises
            value = _Raised(exc)
        with batch.lock:
            batch.results[index] = value
            if batch.abandoned:
                # The loop gave up on this very call: its key was marked stuck.
                released(call.key)
                return False
            batch.next = index + 1
            batch.call_started = time.monotonic()
    return True
