"""The log sink: writers never wait for stdout; lost lines are counted and announced."""

from __future__ import annotations

import fcntl
import json
import os
import threading

import pytest

from rbln_device_plugin.telemetry.logsink import QueuedSink

F_SETPIPE_SZ = 1031


def notice(count: int) -> str:
    return json.dumps({"msg": "dropped", "droppedRecords": count})


def drain_bytes(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.set_blocking(fd, True)
    return b"".join(chunks)


def drain(fd: int) -> list[str]:
    return drain_bytes(fd).decode().splitlines()


def test_a_blocked_pipe_drops_and_counts_instead_of_blocking() -> None:
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)
    sink = QueuedSink(os.dup(write_fd), notice, capacity=50)
    lines = [json.dumps({"n": i, "pad": "x" * 200}) for i in range(2000)]

    def produce(batch: list[str]) -> None:
        for line in batch:
            sink.write(line)

    producer = threading.Thread(target=produce, args=(lines[:1000],))
    producer.start()
    producer.join(30)
    assert not producer.is_alive(), "writing a log line blocked on a full pipe"
    assert sink.dropped > 0

    # The reader comes back: queued lines, then the notice, then what follows.
    received: list[bytes] = []
    reader = threading.Thread(
        target=lambda: received.extend(iter(lambda: os.read(read_fd, 65536), b""))
    )
    reader.start()
    assert sink.flush(30)
    produce(lines[1000:1001])
    assert sink.close(30)
    os.close(write_fd)
    reader.join(30)
    records = [json.loads(line) for line in b"".join(received).splitlines()]
    numbers = [r["n"] for r in records if "n" in r]
    (gap,) = [r for r in records if "droppedRecords" in r]
    assert numbers == sorted(numbers) and numbers[-1] == 1000
    assert len(numbers) - 1 + gap["droppedRecords"] == 1000  # every line written or counted
    position = records.index(gap)
    assert records[position + 1]["n"] == 1000  # the notice stands where the lines were lost
    assert records[position - 1]["n"] < 1000
    os.close(read_fd)


def test_flush_waits_for_everything_queued() -> None:
    read_fd, write_fd = os.pipe()
    sink = QueuedSink(write_fd, notice)
    for i in range(100):
        sink.write(str(i))
    assert sink.flush(10)
    assert drain(read_fd) == [str(i) for i in range(100)]
    assert sink.close(5)
    os.close(read_fd)


def test_close_gives_up_on_a_blocked_output() -> None:
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)
    sink = QueuedSink(write_fd, notice)
    for _ in range(200):
        sink.write("y" * 200)
    assert not sink.close(0.3)  # bounded: the writer stays blocked, close returns
    os.close(read_fd)  # the blocked write now fails with EPIPE


def test_the_writer_survives_a_reader_that_goes_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """EPIPE (the collector is gone) loses lines, never the writer thread or the process."""
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)
    sink = QueuedSink(write_fd, notice)
    for _ in range(200):
        sink.write("y" * 200)  # more than the pipe holds: the writer blocks in write()
    os.close(read_fd)  # ... and its write fails with EPIPE
    # The writer carries on: later lines are taken off the queue (and lost) as before.
    for i in range(100):
        sink.write(str(i))
    assert sink.flush(30), "the writer stopped draining the queue after EPIPE"
    assert sink.close(30)
    assert thread_errors == []
