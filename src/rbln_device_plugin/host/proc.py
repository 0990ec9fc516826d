"""A bounded subprocess run: no shell, stdin closed, a deadline, an output cap.

The tool runs in a process group of its own, so on timeout, oversized output or
cancellation the whole group is killed, helpers that would hold our pipes open included.
A group, not a session: ``setsid`` does the same for ``killpg`` but costs more per run
(where the kernel's autogroup scheduling is on, each new session is a new scheduling
group: 0.3-0.5 ms a run on a loaded machine, see docs/performance.md), and the tool has
no terminal to be detached from (stdin is /dev/null, its output goes to pipes).
Nothing here knows which tool it runs: ``smi`` adds rbln-smi's lookup, metrics and JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from rbln_device_plugin.shorten import middle_truncate
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

ERROR_OUTPUT_BYTES: Final = 4096
# After SIGKILL the reap is normally instant; this bounds a stuck pipe holder.
_REAP_TIMEOUT_S: Final = 2.0
# One read of a readable pipe (asyncio's own default buffer size).
_STREAM_LIMIT: Final = 64 * 1024
# Without pidfds (kernels before 5.3): how often to look for the exit once the pipes closed.
_EXIT_POLL_S: Final = 0.01


class CommandError(Exception):
    """A run failed: could not start, timed out, exited non-zero, printed too much."""

    def __init__(self, message: str, result: str = m.SMI_ERROR) -> None:
        super().__init__(message)
        self.result = result  # the metrics' result class (telemetry.metrics.SMI_*)


class _OutputTooLarge(Exception):
    pass


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _pidfd(pid: int) -> int | None:
    """A descriptor that turns readable when ``pid`` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class _Child:
    """A started tool: its pipes read on the event loop, its exit learnt from a pidfd.

    No transports, protocols or child watcher: each Allocate runs the tool twice, and
    asyncio's subprocess machinery costs more loop turns than the tool itself. The pipes
    are non-blocking and read as they turn readable; once both are closed the exit is
    looked at, and when it is not there yet, waited for on a pidfd turning readable (or,
    without pidfds, a 10 ms poll). Nothing blocks.
    """

    def __init__(self, process: subprocess.Popen[bytes], cap: int) -> None:
        self.process = process
        self.pid = process.pid
        self._loop = asyncio.get_running_loop()
        self._cap = cap
        assert process.stdout is not None and process.stderr is not None
        self._stdout, self._stderr = process.stdout.fileno(), process.stderr.fileno()
        self._chunks: dict[int, list[bytes]] = {self._stdout: [], self._stderr: []}
        self._sizes = dict.fromkeys(self._chunks, 0)
        self._open = set(self._chunks)
        self._discard = False  # after a kill: drain the pipes, keep nothing
        self._returncode: int | None = None
        self._changed: asyncio.Future[None] = self._loop.create_future()
        self._overflow = False
        for fd in self._chunks:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._readable, fd)
        # Opened once both pipes closed and the exit is not known yet: a tool that closes
        # its output by exiting has usually exited by then, and needs no exit watch.
        self._pidfd: int | None = None

    # ------------------------------------------------------------ loop callbacks
    def _wake(self) -> None:
        # Only for what the waiter acts on (both pipes closed and the exit seen, or too
        # much output): each wake costs the waiting task a turn of the loop.
        if self._changed.done() or not (self._finished() or self._overflow):
            return
        self._changed.set_result(None)

    def _readable(self, fd: int) -> None:
        try:
            chunk = os.read(fd, _STREAM_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(fd)
            self._open.discard(fd)
            if not self._open:
                self._watch_exit()
            self._wake()
            return
        if self._discard:
            return
        self._sizes[fd] += len(chunk)
        if self._sizes[fd] > self._cap:
            self._discard = True
            self._overflow = True
            self._wake()
            return
        self._chunks[fd].append(chunk)

    def _exited(self) -> None:
        returncode = self.process.poll()
        if returncode is None:
            return  # not reaped yet (cannot happen once the pidfd is readable): wait on
        self._returncode = returncode
        self._close_pidfd()
        self._wake()

    def _watch_exit(self) -> None:
        """Both pipes closed: the exit now, else once the pidfd turns readable (or a poll)."""
        returncode = self.process.poll()
        if returncode is not None:
            self._returncode = returncode
            return
        self._pidfd = _pidfd(self.pid)
        if self._pidfd is None:
            self._poll_exit()
        else:
            self._loop.add_reader(self._pidfd, self._exited)

    def _poll_exit(self) -> None:
        returncode = self.process.poll()
        if returncode is None:
            self._loop.call_later(_EXIT_POLL_S, self._poll_exit)
            return
        self._returncode = returncode
        self._wake()

    # ------------------------------------------------------------------- waiting
    def _finished(self) -> bool:
        return not self._open and self._returncode is not None

    async def _next_change(self) -> None:
        """Until a callback saw something (perhaps before this call: then at once)."""
        try:
            await self._changed
        finally:
            # Done, or cancelled with its waiter (a timeout): the next wait needs a new one.
            if self._changed.done():
                self._changed = self._loop.create_future()

    async def collect(self) -> tuple[bytes, bytes, int]:
        """Both pipes to EOF and the exit; raises _OutputTooLarge past the cap."""
        while not self._finished():
            await self._next_change()
            if self._overflow:
                raise _OutputTooLarge
        assert self._returncode is not None
        self.close()
        stdout, stderr = (b"".join(self._chunks[fd]) for fd in (self._stdout, self._stderr))
        return stdout, stderr, self._returncode

    async def kill_and_reap(self, tool: str) -> None:
        # The tool leads a process group of its own, so the whole group goes, including helpers
        # that would otherwise keep our pipes open; the pipes are drained, not kept.
        self._discard = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        try:
            async with asyncio.timeout(_REAP_TIMEOUT_S):
                while not self._finished():
                    await self._next_change()
        except TimeoutError:
            # Something outside the group still holds a pipe: drop the pipes, stop waiting.
            log.warning(f"{tool} did not exit after SIGKILL", pid=self.pid)
        finally:
            self.close()

    def close(self) -> None:
        """Stop watching; close our ends. An unreaped process is left to ``subprocess``."""
        if self._returncode is None:
            self.process.poll()  # reaped if it exited (killed, its pipes held elsewhere)
        for fd in list(self._open):
            self._loop.remove_reader(fd)
        self._open.clear()
        self._close_pidfd()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


def _start(binary: Path, args: Sequence[str], pass_fds: Sequence[int], cap: int) -> _Child:
    process = subprocess.Popen(
        [str(binary), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
        pass_fds=tuple(pass_fds),
    )
    try:
        return _Child(process, cap)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        raise


async def run(
    binary: Path,
    args: Sequence[str],
    timeout: float,  # noqa: ASYNC109 - the tool's deadline; it is killed when it passes
    *,
    tool: str,
    max_output: int,
    pass_fds: Sequence[int] = (),
) -> str:
    """Run ``binary args`` and return its stdout (UTF-8, invalid bytes replaced).

    Raises CommandError naming the command, duration, exit status and the trimmed
    output. ``tool`` names the program in log records; ``pass_fds`` are inherited by
    the tool.
    """
    began = time.monotonic()
    command = " ".join([str(binary), *args])

    def elapsed_ms() -> int:
        return round((time.monotonic() - began) * 1000)

    try:
        child = _start(binary, args, pass_fds, max_output)
    except OSError as exc:
        raise CommandError(f"`{command}` could not be started: {exc}", m.SMI_NOT_STARTED) from exc

    try:
        async with asyncio.timeout(timeout):
            stdout, stderr, returncode = await child.collect()
    except TimeoutError:
        await child.kill_and_reap(tool)
        raise CommandError(
            f"`{command}` timed out after {elapsed_ms()} ms (limit {timeout:g} s) and was killed",
            m.SMI_TIMEOUT,
        ) from None
    except _OutputTooLarge:
        await child.kill_and_reap(tool)
        raise CommandError(
            f"`{command}` printed more than {max_output} bytes within {elapsed_ms()} ms "
            "and was killed",
            m.SMI_OUTPUT_TOO_LARGE,
        ) from None
    except BaseException:
        await child.kill_and_reap(tool)
        raise

    if returncode != 0:
        output = middle_truncate(stderr + b"\n" + stdout if stderr else stdout, ERROR_OUTPUT_BYTES)
        raise CommandError(
            f"`{command}` {_describe_exit(returncode)} after {elapsed_ms()} ms"
            + (f": {output}" if output else " (no output)"),
            m.SMI_ERROR,
        )
    return stdout.decode("utf-8", errors="replace")
