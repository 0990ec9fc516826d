"""Task lifetimes in one place: start named tasks, stop them within a deadline, say
what failed.

Every background task of the daemon (the scan loop, the kubelet session, a plugin's
registration, the kubelet.sock watch, a retry) ends through these helpers, so each
ending follows the same rules:

- stopping means cancelling what has not finished and waiting for it to end, its
  cleanup included; a task that failed (not one that was cancelled) is logged once,
  with its name, instead of vanishing with its exception;
- a cancellation of the caller is passed on, never taken for the end of the tasks it
  waits for: ``gather(return_exceptions=True)`` turns the tasks' own cancellations into
  results and raises ``CancelledError`` only when the caller is cancelled;
- work that must not be cut short by a cancelled caller (removing a socket) runs to
  its end with ``run_to_end``; the caller may stop waiting, the work does not stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

# structlog's logger as telemetry.logs hands it out: this leaf module sits below telemetry.
log = structlog.get_logger()


def start(work: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """A named task for ``work`` (names show in the debug record and in tracebacks)."""
    return asyncio.get_running_loop().create_task(work, name=name)


async def cancel_and_wait(*tasks: asyncio.Future[Any], title: str | None = None) -> None:
    """Cancel the unfinished ``tasks`` and wait until every one has ended.

    With ``title``, a task that ended with an exception other than its cancellation is
    logged (once, here); without it, outcomes are only retrieved (the caller reports).
    """
    for task in tasks:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    if title is not None:
        _log_failures(title, tasks, outcomes)


async def wait_for_end(task: asyncio.Future[T], seconds: float) -> bool:
    """Wait up to ``seconds`` for ``task`` to end by itself; True when it did.

    The task is neither cancelled here nor by a cancellation of the caller. When it
    ended, what it raised is raised here.
    """
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done:
        task.result()
        return True
    return False


async def run_to_end(task: asyncio.Future[T]) -> T:
    """``task``'s result; a cancelled caller stops waiting, the task runs on to its end."""
    return await asyncio.shield(task)


async def settle_all(tasks: Iterable[asyncio.Future[T]]) -> list[T | BaseException]:
    """Wait for every task, each running to its end whatever happens to the caller; each
    task's result or exception, in order."""
    futures = list(tasks)
    return await asyncio.gather(*(asyncio.shield(f) for f in futures), return_exceptions=True)


class TaskSet:
    """Named tasks started one by one that end together (``stop``); each leaves the set
    as it finishes."""

    def __init__(self, title: str) -> None:
        self._title = title
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = start(work, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks, title=self._title)


def _log_failures(
    title: str, tasks: Iterable[asyncio.Future[Any]], outcomes: Iterable[object]
) -> None:
    for task, outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, Exception):
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            log.error(
                "Background task failed", during=title, task=name, err=repr(outcome),
                exc_info=outcome,
            )  # fmt: skip
