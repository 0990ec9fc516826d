"""Runs the real daemon as a subprocess and collects its JSON log stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Record = dict[str, Any]


class DaemonProcess:
    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        level: str = "debug",
        umask: int = -1,
        process_group: int = -1,
        command: Sequence[str] = (sys.executable, "-m", "rbln_device_plugin"),
    ) -> None:
        full_env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RBLN_", "OTEL_", "KUBELET_", "CDI_", "HEALTHCHECK_", "NODE_"))
        }
        full_env["RBLN_DEVICE_PLUGIN_LOG_LEVEL"] = level
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=full_env,
            text=True,
            umask=umask,
            process_group=None if process_group < 0 else process_group,
        )
        self.lines: list[str] = []
        self.records: list[Record] = []
        self.stderr = ""
        self._cond = threading.Condition()
        self._reading = threading.Event()  # cleared: stdout is left unread (a stalled collector)
        self._reading.set()
        self._reading_err = threading.Event()  # cleared: stderr is left unread
        self._reading_err.set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._reading.wait()
            with self._cond:
                self.lines.append(line)
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    self.records.append({"msg": "<<not json>>", "raw": line})
                self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._reading_err.wait()
            with self._cond:
                self.stderr += line
                self._cond.notify_all()

    def pause_reading(self) -> None:
        """Stop draining stdout: once the pipe buffer is full, the daemon's writes block."""
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def pause_stderr(self) -> None:
        """Stop draining stderr: once the pipe buffer is full, writes to it block."""
        self._reading_err.clear()

    def resume_stderr(self) -> None:
        self._reading_err.set()

    # ``msg=None`` matches records by their fields alone (messages outside the README's
    # catalogue are not the contract; their fields are).
    def find(self, msg: str | None, **fields: Any) -> list[Record]:
        with self._cond:
            return self.find_unlocked(msg, **fields)

    def wait_for(
        self,
        msg: str | None,
        timeout: float = 15.0,
        count: int = 1,
        where: Callable[[Record], bool] = lambda _: True,
        **fields: Any,
    ) -> list[Record]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [r for r in self.find_unlocked(msg, **fields) if where(r)]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no {count}x {msg!r} {fields} within {timeout}s; exit={self.proc.poll()}; "
                        f"last records: {self.records[-15:]}; stderr: {self.stderr[-2000:]}"
                    )
                self._cond.wait(min(remaining, 0.1))

    def find_unlocked(self, msg: str | None, **fields: Any) -> list[Record]:
        return [
            r
            for r in self.records
            if (msg is None or r.get("msg") == msg)
            and all(r.get(k) == v for k, v in fields.items())
        ]

    def send(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
            raise AssertionError(f"daemon did not exit within {timeout}s of {sig.name}") from None
        self._reader.join(5)
        self._err_reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    async def await_log(
        self,
        msg: str | None,
        timeout: float = 15.0,
        count: int = 1,
        where: Callable[[Record], bool] = lambda _: True,
        **fields: Any,
    ) -> list[Record]:
        """wait_for from async tests: the event loop keeps serving (e.g. the kubelet stub)."""
        import asyncio

        return await asyncio.to_thread(self.wait_for, msg, timeout, count, where, **fields)

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def settled_fds(self, window: float = 1.5) -> int:
        """The fewest descriptors seen over ``window`` seconds.

        A scan's ``rbln-smi`` child holds three descriptors (two pipes and a pidfd) for as
        long as it runs, so one sample can land inside a scan. A leaked descriptor stays
        open, so the minimum over a window longer than the scan interval still shows it.
        """
        deadline = time.monotonic() + window
        fewest = self.open_fds()
        while time.monotonic() < deadline:
            time.sleep(0.02)
            fewest = min(fewest, self.open_fds())
        return fewest
