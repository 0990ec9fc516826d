"""The daemon's own records, step by step, for the demo's narrative.

The daemon writes one JSON record per line to its log file. After each step the demo
shows the records that step caused: it reads on until the records the step is known to
produce have been written (bounded), and keeps anything later for the next step, so each
record is shown under the step that caused it. Runs of one message (a "Device exposed"
per device) are folded into one line and a count.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

Record = dict[str, Any]
WIDTH: Final = 100
SHOWN_PER_RUN: Final = 1  # records shown of a run of one message before the count


@dataclass(slots=True)
class DaemonLog:
    path: Path
    _offset: int = 0
    _records: list[Record] = field(default_factory=list)  # every record read so far
    _shown: int = 0  # how many of them a step has taken

    def _read_new(self) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a half-written line waits for the next read
        self._offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            self._records.append(record if isinstance(record, dict) else {"raw": line})

    async def take(
        self,
        expected: Sequence[tuple[str, int]],
        timeout: float = 5.0,  # noqa: ASYNC109 - a bound on showing, not on the daemon
        writing: Callable[[], bool] = lambda: True,
    ) -> list[Record]:
        """Records up to the last one ``expected`` names (msg, how many), waiting for them
        while ``writing`` says the daemon still runs.

        On timeout, whatever arrived. Records after the last expected one stay pending.
        """
        deadline = time.monotonic() + timeout
        while True:
            still_writing = writing()  # before the read: an exit flushed everything
            self._read_new()
            end = _end_of(self._records[self._shown :], expected)
            if end is not None or not still_writing or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)  # the kubelet stand-in shares this loop
        start = self._shown
        self._shown = len(self._records) if end is None else start + end
        return self._records[start : self._shown]

    def tail(self, lines: int = 8) -> list[str]:
        """The last records of the whole log, shown or not."""
        self._read_new()
        return [record_line(r) for r in self._records[-lines:]]


def _end_of(records: Sequence[Record], expected: Sequence[tuple[str, int]]) -> int | None:
    """Index just past the record that completes ``expected``; None while incomplete."""
    wanted = {msg: count for msg, count in expected}
    for index, record in enumerate(records):
        msg = record.get("msg")
        if msg in wanted:
            wanted[msg] -= 1
            if all(left <= 0 for left in wanted.values()):
                return index + 1
    return None if wanted else 0


def folded(records: Sequence[Record], hidden: frozenset[str] = frozenset()) -> list[str]:
    """One line per record, runs of one message folded into a count; ``hidden`` keys left
    out (the demo has one resource, so its name says nothing)."""
    out: list[str] = []
    index = 0
    while index < len(records):
        msg = records[index].get("msg")
        run = 1
        while index + run < len(records) and records[index + run].get("msg") == msg:
            run += 1
        out += [record_line(r, hidden) for r in records[index : index + min(run, SHOWN_PER_RUN)]]
        if run > SHOWN_PER_RUN:
            out.append(f"... and {run - SHOWN_PER_RUN} more {msg!r}")
        index += run
    return out


def record_line(record: Record, hidden: frozenset[str] = frozenset()) -> str:
    """``level  msg  key=value ...`` in one line, shortened to WIDTH."""
    if "raw" in record:
        return _short(str(record["raw"]), WIDTH)
    fields = " ".join(
        f"{key}={_value(value)}"
        for key, value in record.items()
        if key not in ("ts", "level", "msg", "caller") and key not in hidden
    )
    text = f"{record.get('level', '?'):<5} {record.get('msg', '')}"
    return _short(f"{text}  {fields}" if fields else text, WIDTH)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
