"""Shutdown signals, handled from before the first record until the process ends.

``signalcatch`` catches them (and the signals Go ignores) from the daemon's first line;
this is the consumer it passes each shutdown signal to once the logger exists, on the
catcher's own thread, whatever the main thread is doing:

- the first SIGTERM, SIGINT, SIGHUP or SIGQUIT (also one that came before the logger, held
  until now): one record ``Shutdown signal received`` and the daemon's stop event set
  (on its loop, thread-safely). Before the loop exists it is remembered, and the loop
  stops the moment it attaches: an orderly exit 0;
- any later one: the forced exit, ``128 +`` the signal's number, after one record
  ``Second shutdown signal received; exiting at once`` with its bounded flush. This
  thread is never the one holding the log queue's lock, so the record is not dropped.

The handlers stay installed until the process ends (nothing restores the default
action, which would kill the process without a record), and SIGINT never raises
``KeyboardInterrupt``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Final

from rbln_device_plugin import processtweaks, signalcatch
from rbln_device_plugin.telemetry import logs
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import call_soon_threadsafe

# The last record before a forced exit gets this long to reach stdout.
IMMEDIATE_EXIT_FLUSH_S: Final = 1.0
RECEIVED_MSG: Final = "Shutdown signal received"
FORCED_EXIT_MSG: Final = "Second shutdown signal received; exiting at once"

log = get_logger()


class ShutdownSignals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first: signal.Signals | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def install(self) -> None:
        """From the main thread: every shutdown signal to this object, for good (the
        catcher is installed now unless ``entry`` did it at the start)."""
        signalcatch.install().consume(self._received)

    def attach(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        """The running daemon's loop and stop event; set at once if a signal came first."""
        with self._lock:
            self._loop, self._stop = loop, stop
            if self.first is not None:
                stop.set()

    def detach(self) -> None:
        with self._lock:
            self._loop = self._stop = None

    def _received(self, signum: int) -> None:
        try:
            sig = signal.Signals(signum)
        except ValueError:
            return
        if sig not in signalcatch.SHUTDOWN:
            return
        with self._lock:
            second = self.first is not None
            if not second:
                self.first = sig
            loop, stop = self._loop, self._stop
        if second:
            self._exit_now(sig)
            return
        log.info(RECEIVED_MSG, signal=sig.name)
        if loop is not None and stop is not None:
            call_soon_threadsafe(loop, stop.set)

    @staticmethod
    def _exit_now(sig: signal.Signals) -> None:
        if not processtweaks.claim_exit():
            return  # the orderly exit is under way, its stop complete: nothing to force
        code = 128 + sig.value
        try:
            log.warning(FORCED_EXIT_MSG, signal=sig.name, exitCode=code)
            logs.flush(IMMEDIATE_EXIT_FLUSH_S)
        finally:  # the exit is claimed: the main thread waits for this one to end it
            os._exit(code)


_installed: ShutdownSignals | None = None


def install() -> ShutdownSignals:
    """The process's shutdown signal handling, installed on the first call."""
    global _installed
    if _installed is None:
        _installed = ShutdownSignals()
        _installed.install()
    return _installed
