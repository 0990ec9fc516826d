"""Catchable signals, handled as Go's runtime handles them, from the daemon's first line.

``entry`` installs this before any other module of the daemon is imported (the imports
take about 0.2 s), so from then on no signal meets Python's defaults: a
``KeyboardInterrupt`` traceback out of an import, or death by the default action with no
record and the plugin sockets left behind. Only the interpreter's own start-up before
that line (about 30 ms) keeps them.

What each catchable signal does, after Go's ``runtime/sigtab_linux_generic.go`` and the
Go plugin's ``signal.Notify(SIGHUP, SIGINT, SIGTERM, SIGQUIT)``:

- ``SHUTDOWN`` (SIGHUP, SIGINT, SIGTERM, SIGQUIT): the orderly shutdown, a second one
  the forced exit (``runtime.signals``, the consumer attached once the logger exists);
- ``IGNORED``: Go's runtime catches these and does nothing (``_SigNotify`` alone), where
  Python's default action would end the process: SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM,
  SIGPROF, SIGIO, SIGPWR, SIGXCPU and the real-time signals SIGRTMIN+1 to SIGRTMAX. They
  get a handler that does nothing, not ``SIG_IGN``: a handler is reset on ``exec``, so
  ``rbln-smi`` starts with the default actions, as a child of the Go plugin does;
- already without effect before this runs: SIGPIPE and SIGXFSZ (the interpreter sets
  ``SIG_IGN``; a write to a closed pipe fails with ``EPIPE``), SIGCHLD, SIGURG, SIGWINCH
  and SIGCONT (ignored by default);
- left to the default action, as Go leaves them: SIGTSTP, SIGTTIN and SIGTTOU stop the
  process until SIGCONT (Go's ``_SigDefault``); SIGRTMIN (34; glibc keeps 32 and 33)
  ends it (Go installs no handler there); SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE,
  SIGSEGV, SIGSTKFLT and SIGSYS end it at once (Go exits with a goroutine dump; here
  ``faulthandler`` prints the Python stacks for five of them, see ``grpc_relay``).

No Python handler does any work: a signal handler runs on the main thread only when it
next executes bytecode, possibly inside a lock the interrupted code holds. The C-level
handler writes the signal's number to a pipe (``signal.set_wakeup_fd``) and a thread of
this module reads it at once, whatever the main thread is doing, and passes it to the
consumer. Before a consumer is attached (there is no logger yet) the first shutdown
signal is held and given to the consumer when it attaches; a second one exits at once
with 128 + its number, without a record since nothing can write one yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading

# Not ``typing.TYPE_CHECKING``: this module runs before the daemon's imports, and typing
# and collections.abc alone would add some 20 ms to that window (mypy reads the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final

    Consumer = Callable[[int], None]

SHUTDOWN: Final = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT})
IGNORED: Final = frozenset(
    {
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGVTALRM,
        signal.SIGPROF,
        signal.SIGIO,
        signal.SIGPWR,
        signal.SIGXCPU,
        *range(signal.SIGRTMIN + 1, signal.SIGRTMAX + 1),
    }
)
# The wakeup pipe's size: more bytes (one per signal delivered) than a user may have
# signals queued (RLIMIT_SIGPENDING: 96,369 on the development machine), so a flood of
# ignored signals cannot push a shutdown signal's byte out while the thread drains it.
_PIPE_BYTES: Final = 1 << 20  # the default /proc/sys/fs/pipe-max-size
_F_SETPIPE_SZ: Final = 1031  # fcntl.F_SETPIPE_SZ, named in Python 3.10+ on Linux only
_READ: Final = 4096


def _nothing(_signum: int, _frame: object) -> None:
    """The Python-level handler: the work happens on the catcher's thread (see above)."""


class SignalCatcher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._held: int | None = None  # the first shutdown signal, before any consumer
        self._reader, self._writer = os.pipe()
        os.set_blocking(self._writer, False)
        with contextlib.suppress(OSError):  # a smaller pipe still works, with less room
            fcntl.fcntl(self._writer, _F_SETPIPE_SZ, _PIPE_BYTES)
        self._thread = threading.Thread(target=self._run, name="signals", daemon=True)

    def install(self) -> None:
        """From the main thread: every signal of ``SHUTDOWN`` and ``IGNORED`` is caught
        from now until the process ends (nothing restores the default actions)."""
        self._thread.start()
        signal.set_wakeup_fd(self._writer, warn_on_full_buffer=False)
        for signum in sorted(SHUTDOWN | IGNORED):
            signal.signal(signum, _nothing)

    def consume(self, consumer: Consumer) -> None:
        """Give every shutdown signal from now on to ``consumer`` (on the catcher's
        thread), the one held since the start first."""
        with self._lock:
            self._consumer = consumer
            held, self._held = self._held, None
            if held is not None:
                consumer(held)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._reader, _READ)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self._dispatch(signum)

    def _dispatch(self, signum: int) -> None:
        if signum not in SHUTDOWN:
            return  # an ignored signal: Go's runtime does nothing either
        # Under the lock, so that a signal arriving while ``consume`` hands over the held
        # one reaches the consumer after it, in the order they came.
        with self._lock:
            if self._consumer is not None:
                self._consumer(signum)
            elif self._held is None:
                self._held = signum
            else:
                os._exit(128 + signum)  # a second one before any logger: at once


_installed: SignalCatcher | None = None


def installed() -> bool:
    return _installed is not None


def install() -> SignalCatcher:
    """The process's signal catcher, installed on the first call (from the main thread)."""
    global _installed
    if _installed is None:
        _installed = SignalCatcher()
        _installed.install()
    return _installed
