"""Bounded waits shared by every layer: events, timeouts and results from other threads.

The daemon never sleeps blindly: every pause ends early when the stop signal (or another
event that makes the pause pointless) is set. Threads that finish work for the event
loop hand their result back through ``set_result_threadsafe``, which stays quiet when
the loop has already closed (a read stuck past the daemon's exit has nobody to tell).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rbln_device_plugin import aiotasks

T = TypeVar("T")


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> bool:  # noqa: ASYNC109
    """Wait until one of ``events`` is set or ``timeout`` passes; True when one is set."""
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await aiotasks.cancel_and_wait(*waiters)
    return any(event.is_set() for event in events)


async def unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Run ``work``; cancel it when ``stop`` is set first. True when it completed.

    What ``work`` raised is raised here. Whatever happens, ``work`` has finished (its
    cleanup included) when this returns or raises; a cancellation of the caller itself
    is passed on, never taken for the cancellation of ``work``. A caller that runs work
    again and again under the same stop (the scan loop) keeps one ``StopScope``.
    """
    async with StopScope(stop) as scope:
        return await scope.run(work)


class StopScope:
    """Runs work one piece at a time, each cancelled when ``stop`` is set (as
    ``unless_stopped``): one task waits for the stop for the scope's whole life, where
    ``unless_stopped`` alone starts two tasks a run."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self._running: asyncio.Future[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StopScope:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watch is not None:
            await aiotasks.cancel_and_wait(self._watch)

    async def _cancel_on_stop(self) -> None:
        await self._stop.wait()
        if self._running is not None:
            self._running.cancel()

    async def run(self, work: Awaitable[None]) -> bool:
        """``work`` to its end, or cancelled by the stop (False); see ``unless_stopped``."""
        task = self._running = asyncio.ensure_future(work)
        if self._watch is None:  # started after the first work: that work starts first
            self._watch = aiotasks.start(self._cancel_on_stop(), "stop-scope")
        if self._stop.is_set():
            task.cancel()  # set before this run: the watch has already acted
        caller = asyncio.current_task()
        cancels = caller.cancelling() if caller is not None else 0
        try:
            # A cancelled caller cancels ``task`` and resumes once it has ended.
            await task
        except asyncio.CancelledError:
            if caller is not None and caller.cancelling() > cancels:
                raise  # the caller's own cancellation
            return False
        finally:
            self._running = None
        if caller is not None and caller.cancelling() > cancels:
            # ``work`` swallowed the cancellation the caller passed on: it ended, pass it on.
            raise asyncio.CancelledError
        return True


async def in_thread(run: Callable[[], T], name: str) -> T:
    """``run()`` on a daemon thread of its own, its result or exception here.

    Not ``asyncio.to_thread``: the default executor is joined without a bound when
    ``asyncio.run`` ends, so one call that never returns would hold the process exit.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def work() -> None:
        try:
            value = run()
        except BaseException as exc:
            call_soon_threadsafe(loop, _set_exception, done, exc)
        else:
            set_result_threadsafe(loop, done, value)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await done


def call_soon_threadsafe(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any
) -> None:
    """``loop.call_soon_threadsafe`` that does nothing once the loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def set_result_threadsafe(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], value: T
) -> None:
    """From any thread: complete ``future`` with ``value`` unless it is already done."""
    call_soon_threadsafe(loop, _set_result, future, value)


def _set_result(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
