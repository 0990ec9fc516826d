"""Where rendered log lines go: a bounded queue drained by one writer thread.

Nothing that logs ever waits for stdout. A stalled log pipeline (nobody reads the
container's stdout) would otherwise fill the pipe buffer and block the event loop on
its next record, freezing every gRPC answer. Lines are queued instead; when the queue is
full they are dropped and counted, and a notice with ``droppedRecords`` is written in
their place as soon as the queue has room again, so the gap is visible in the stream.

The real stdout is written through a duplicate of its file descriptor, never through
``sys.stdout``: a writer thread blocked inside ``sys.stdout`` would hold its buffer lock
and make interpreter shutdown fail, while a raw descriptor holds nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final, TextIO

DEFAULT_CAPACITY: Final = 1024


class _Dropped:
    """Queue marker: this many lines were lost at this point of the stream."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class QueuedSink:
    """Thread-safe line sink; ``write`` never blocks on the output."""

    def __init__(
        self,
        output: TextIO | int,
        render_notice: Callable[[int], str],
        *,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        # An int is a raw descriptor (the real stdout); a stream is written as text (tests).
        self._output = output
        self._render_notice = render_notice
        self._capacity = capacity
        self._pending: deque[str | _Dropped] = deque()
        self._dropped = 0
        self._dropped_total = 0  # every line ever dropped, for the metrics
        self._busy = False  # the writer holds lines it has not finished writing
        self._closed = False
        # How long ``write`` may wait for the lock; -1: as long as it takes.
        self.wait_limit = -1.0
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        # wait_limit: see last_words in logs; -1 (wait as long as it takes) otherwise.
        if not self._lock.acquire(timeout=self.wait_limit):
            return
        try:
            if self._closed:
                return
            if len(self._pending) >= self._capacity:
                self._dropped += 1
                self._dropped_total += 1
                return
            if self._dropped:
                self._pending.append(_Dropped(self._dropped))
                self._dropped = 0
            self._pending.append(line)
            self._ready.notify()
        finally:
            self._lock.release()

    @property
    def dropped(self) -> int:
        """Lines lost since the last notice was queued."""
        with self._lock:
            return self._dropped

    @property
    def dropped_total(self) -> int:
        """Lines lost since the sink was created (read from any thread without the lock)."""
        return self._dropped_total

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is written; False when that took too long."""
        deadline = time.monotonic() + timeout
        # Bounded even when the lock is held by the very code a signal handler interrupted.
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            return False
        try:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        finally:
            self._lock.release()
        return True

    def close(self, timeout: float) -> bool:
        """Flush (bounded), then refuse further lines. A blocked writer is abandoned.

        Lines dropped since the last notice get their notice first, so the count of
        lost lines is complete whenever the output drains in time.
        """
        with self._lock:
            if self._dropped and not self._closed:
                self._pending.append(_Dropped(self._dropped))
                self._dropped = 0
                self._ready.notify()
        flushed = self.flush(timeout)
        with self._lock:
            self._closed = True
            self._ready.notify()
        # Our own duplicate of stdout goes too, but only once the writer is done with it:
        # a writer still blocked on it would later write into whatever reused the number.
        if isinstance(self._output, int) and flushed:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                os.close(self._output)
        return flushed

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._idle.notify_all()
                    self._ready.wait()
                if not self._pending:
                    self._idle.notify_all()
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
            self._emit("".join(self._line(item) for item in batch))
            with self._lock:
                self._busy = False
                if not self._pending:
                    self._idle.notify_all()

    def _line(self, item: str | _Dropped) -> str:
        if isinstance(item, _Dropped):
            return self._render_notice(item.count) + "\n"
        return item + "\n"

    def _emit(self, text: str) -> None:
        output = self._output
        # A closed or broken stdout (collector gone, harness detached) must never take the
        # daemon down: the lines are lost, the daemon runs on.
        with contextlib.suppress(OSError, ValueError):
            if isinstance(output, int):
                _write_all(output, text.encode("utf-8", errors="replace"))
            else:
                output.write(text)
                output.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
