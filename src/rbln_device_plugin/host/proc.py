"""A bounded subprocess run: no shell, stdin closed, a deadline, an output cap.

The tool runs in a session of its own, so on timeout, oversized output or cancellation
the whole process group is killed, helpers that would hold our pipes open included.
Nothing here knows which tool it runs: ``smi`` adds rbln-smi's lookup, metrics and JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
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
# asyncio's own default for subprocess stream buffers.
_STREAM_LIMIT: Final = 64 * 1024


class CommandError(Exception):
    """A run failed: could not start, timed out, exited non-zero, printed too much."""

    def __init__(self, message: str, result: str = m.SMI_ERROR) -> None:
        super().__init__(message)
        self.result = result  # the metrics' result class (telemetry.metrics.SMI_*)


def trim_output(data: bytes, limit: int = ERROR_OUTPUT_BYTES) -> str:
    """Strip and middle-truncate tool output for an error message."""
    return middle_truncate(data, limit)


class _OutputTooLarge(Exception):
    pass


async def _read_capped(stream: asyncio.StreamReader | None, cap: int) -> bytes:
    if stream is None:
        return b""
    chunks: list[bytes] = []
    total = 0
    while chunk := await stream.read(64 * 1024):
        total += len(chunk)
        if total > cap:
            raise _OutputTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


async def _drain(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.read(64 * 1024):
        pass


class _Child:
    """A started process with its transport, which we keep to drop the pipes if needed."""

    def __init__(
        self, transport: asyncio.SubprocessTransport, process: asyncio.subprocess.Process
    ) -> None:
        self.transport = transport
        self.process = process

    async def kill_and_reap(self, tool: str) -> None:
        # The tool runs in its own session, so the whole group goes, including helpers
        # that would otherwise keep our pipes open (asyncio reaps only once the pipes
        # close, and a paused reader never sees EOF, hence the drain).
        proc = self.process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            await asyncio.wait_for(
                asyncio.gather(_drain(proc.stdout), _drain(proc.stderr), proc.wait()),
                _REAP_TIMEOUT_S,
            )
        except TimeoutError:
            # Something outside the group still holds a pipe: drop the pipes, stop waiting.
            self.transport.close()
            log.warning(f"{tool} did not exit after SIGKILL", pid=proc.pid)


async def _start(binary: Path, args: Sequence[str], pass_fds: Sequence[int]) -> _Child:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=_STREAM_LIMIT, loop=loop),
        str(binary),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    return _Child(transport, asyncio.subprocess.Process(transport, protocol, loop))


async def _collect(proc: asyncio.subprocess.Process, cap: int) -> tuple[bytes, bytes, int]:
    out_task = asyncio.ensure_future(_read_capped(proc.stdout, cap))
    err_task = asyncio.ensure_future(_read_capped(proc.stderr, cap))
    try:
        stdout, stderr = await asyncio.gather(out_task, err_task)
    finally:
        out_task.cancel()
        err_task.cancel()
    return stdout, stderr, await proc.wait()


async def run(
    binary: Path,
    args: Sequence[str],
    timeout: float,  # noqa: ASYNC109 - the tool's deadline; it is killed when it passes
    *,
    tool: str,
    max_output: int,
    pass_fds: Sequence[int] = (),
    started: float | None = None,
) -> str:
    """Run ``binary args`` and return its stdout (UTF-8, invalid bytes replaced).

    Raises CommandError naming the command, duration, exit status and the trimmed
    output. ``tool`` names the program in log records; ``pass_fds`` are inherited by
    the tool; ``started`` (monotonic) is when the caller's clock for durations began.
    """
    began = time.monotonic() if started is None else started
    command = " ".join([str(binary), *args])

    def elapsed_ms() -> int:
        return round((time.monotonic() - began) * 1000)

    try:
        child = await _start(binary, args, pass_fds)
    except OSError as exc:
        raise CommandError(f"`{command}` could not be started: {exc}", m.SMI_NOT_STARTED) from exc

    try:
        async with asyncio.timeout(timeout):
            stdout, stderr, returncode = await _collect(child.process, max_output)
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
        output = trim_output(stderr + b"\n" + stdout if stderr else stdout)
        raise CommandError(
            f"`{command}` {_describe_exit(returncode)} after {elapsed_ms()} ms"
            + (f": {output}" if output else " (no output)"),
            m.SMI_ERROR,
        )
    return stdout.decode("utf-8", errors="replace")
