"""gRPC's C-core log lines, relayed from file descriptor 2 into the structured log.

grpcio has no hook for the lines its C core logs (abseil logging writes them straight
to fd 2), and a port already in use is only explained there. So while the daemon runs,
fd 2 is a pipe that one thread reads: each line in abseil's layout, such as

    E1130 13:14:32.447534    5454 add_port.cc:83] Failed to add port to server: ...

becomes a record with ``component=grpc``; any other line is copied to the real stderr
unchanged. Python's own stderr (tracebacks, warnings) is pointed at the real stderr
directly and never passes through the pipe.

Levels: abseil's INFO is shown at debug (like gRPC's Python info records); WARNING and
ERROR are warn, because gRPC cannot tell whether a device or a request became unusable:
the daemon's own record says that. FATAL is error.

Nothing gRPC writes to fd 2 ever waits, since a C-core thread that waits may hold the
GIL the relay thread needs to drain the pipe (a deadlock, seen with GRPC_TRACE=all): the
pipe holds 1 MiB, and a write to a full one fails at once, losing that line, uncounted.
Neither does the relay thread ever block on its own output, or the pipe would fill
behind it: records go through the log queue, and lines copied to the real stderr
through a bounded queue of their own with a writer thread. When nobody drains stderr
that queue fills, and further lines are dropped and counted; once it has room again (or
at stop), a notice line on stderr and a warn record ``gRPC stderr lines dropped while
stderr was blocked`` (``droppedLines``) say how many.

Limits (the README's logging section repeats them): a line written in the instant
before the process dies abruptly, such as a gRPC fatal check that aborts, can be lost
with the relay thread, so fatal signals also get Python's fault handler on the real
stderr; lines C code writes before ``install`` or after ``stop`` go to stderr raw.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import os
import re
import sys
import threading
from typing import Final

from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.logsink import QueuedSink

# Longer lines are cut: the record keeps the first part, the rest of the line is dropped.
MAX_LINE_BYTES: Final = 8192
_READ_BYTES: Final = 65536
_STOP_TIMEOUT_S: Final = 1.0
F_SETPIPE_SZ: Final = 1031  # fcntl.F_SETPIPE_SZ, named in Python 3.10+ on Linux only
PIPE_BYTES: Final = 1 << 20  # the default /proc/sys/fs/pipe-max-size
# Lines waiting for the real stderr; past this they are dropped and counted.
STDERR_QUEUE_LINES: Final = 1024
DROPPED_MSG: Final = "gRPC stderr lines dropped while stderr was blocked"
_ABSEIL_LINE: Final = re.compile(
    rb"([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ([^\s\]]+:\d+)\] ?(.*)", re.DOTALL
)
_SEVERITY: Final = {b"I": "INFO", b"W": "WARNING", b"E": "ERROR", b"F": "FATAL"}

log = get_logger()


class CoreLogRelay:
    """The running relay; ``stop`` puts the real stderr back on fd 2."""

    def __init__(self, read_fd: int, real_stderr: int) -> None:
        self._read_fd = read_fd
        self._real_stderr = real_stderr
        # A descriptor of its own: closing the queue must not close Python's sys.stderr.
        self._copies = QueuedSink(os.dup(real_stderr), _notice, capacity=STDERR_QUEUE_LINES)
        self._thread = threading.Thread(target=self._run, name="grpc-core-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Restore fd 2 and let the thread relay what is left (bounded waits)."""
        try:
            # Replacing fd 2 closes the pipe's last write end: the reader gets EOF.
            os.dup2(self._real_stderr, 2)
        except OSError:
            return
        self._thread.join(_STOP_TIMEOUT_S)
        self._copies.close(_STOP_TIMEOUT_S)

    def _run(self) -> None:
        pending = b""
        skipping = False  # dropping the rest of an over-long line
        try:
            while chunk := os.read(self._read_fd, _READ_BYTES):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if skipping:  # the end of a line already relayed in part
                        skipping = False
                    elif len(line) > MAX_LINE_BYTES:
                        self._route(line[:MAX_LINE_BYTES], cut=True)
                    else:
                        self._route(line)
                if len(pending) > MAX_LINE_BYTES and not skipping:
                    self._route(pending[:MAX_LINE_BYTES], cut=True)
                    skipping = True
                if skipping:
                    pending = b""
        except OSError:
            pass
        finally:
            if pending and not skipping:
                self._route(pending)
            os.close(self._read_fd)

    def _route(self, line: bytes, cut: bool = False) -> None:
        line = line.removesuffix(b"\r")
        match = _ABSEIL_LINE.fullmatch(line)
        if match is None:
            self._copy(line + (b"..." if cut else b"") + b"\n")
            return
        severity, source, text = match.groups()
        message = text.decode("utf-8", errors="replace") + (" ...[cut]" if cut else "")
        fields = {
            "component": "grpc",
            "source": source.decode("ascii", errors="replace"),
            "grpcSeverity": _SEVERITY[severity],
        }
        try:
            if severity == b"F":
                log.error(message, **fields)
            elif severity in (b"E", b"W"):
                log.warning(message, **fields)
            else:
                log.debug(message, **fields)
        except Exception:  # the relay must outlive any logging failure
            self._copy(line + b"\n")

    def _copy(self, data: bytes) -> None:
        self._copies.write(data.removesuffix(b"\n").decode("utf-8", errors="replace"))


def _notice(count: int) -> str:
    """Rendered by the stderr writer when the queue has room again: in both streams."""
    with contextlib.suppress(Exception):  # the notice line below still tells
        log.warning(DROPPED_MSG, component="grpc", droppedLines=count)
    return f"rbln-device-plugin: {count} gRPC stderr lines dropped while stderr was blocked"


def install() -> CoreLogRelay | None:
    """Point fd 2 at the relay. None when there is no usable stderr to begin with."""
    try:
        real_stderr = os.dup(2)
    except OSError:
        return None
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        os.close(real_stderr)
        return None
    # The relay thread needs the GIL to drain the pipe, and gRPC may write to fd 2 from a
    # thread that holds the GIL: a full pipe that blocked that write would deadlock the
    # daemon. So the pipe is large, and a write to a full one fails at once (that line
    # is lost) instead of waiting. Only fd 2 shares this pipe's write end.
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_fd, F_SETPIPE_SZ, PIPE_BYTES)
    try:
        os.set_blocking(write_fd, False)
        os.dup2(write_fd, 2)
    except OSError:
        for fd in (read_fd, write_fd, real_stderr):
            os.close(fd)
        return None
    os.close(write_fd)
    # Python-level stderr and crash reports bypass the pipe.
    sys.stderr = open(  # noqa: SIM115 - lives as long as the process
        real_stderr, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    _enable_fault_handler()
    return CoreLogRelay(read_fd, real_stderr)


def _enable_fault_handler() -> None:
    """Python's fault handler on the real stderr, enabled from a thread that then ends.

    ``faulthandler.enable`` gives the thread that calls it an alternate signal stack of a
    few KiB, and every Python signal handler runs on it (``SA_ONSTACK``). Signals that
    arrive together are delivered nested, one frame each: on the main thread six of
    them overflowed that stack into the heap (a burst of the signals the daemon ignores,
    see ``signalcatch``, killed it with SIGSEGV or a heap-corruption abort). Enabled
    from a thread of its own, no live thread keeps that stack, so every handler runs on
    its thread's own stack; a fatal signal still prints every thread's Python stack.
    """
    thread = threading.Thread(
        target=faulthandler.enable, kwargs={"file": sys.stderr}, name="faulthandler"
    )
    thread.start()
    thread.join()
