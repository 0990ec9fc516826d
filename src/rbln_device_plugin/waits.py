"""Bounded waits shared by every layer: events, timeouts and results from other threads.

The daemon never sleeps blindly: every pause ends early when the stop signal (or another
event that makes the pause pointless) is set. Threads that finish work for the event
loop hand their result back through ``set_result_threadsafe``, which stays quiet when
the loop has already closed (a read stuck past the daemon's exit has nobody to tell).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> bool:  # noqa: ASYNC109
    """Wait until one of ``events`` is set or ``timeout`` passes; True when one is set."""
    if any(event.is_set() for event in events):
        return True
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return any(event.is_set() for event in events)


async def unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Run ``work``; cancel it when ``stop`` is set first. True when it completed.

    What ``work`` raised is raised here.
    """
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(stopped, return_exceptions=True)
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()
    return True


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
