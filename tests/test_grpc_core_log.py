"""The fd 2 relay for gRPC's C-core lines, in a child process (it takes over fd 2)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import textwrap

from rbln_device_plugin.telemetry import grpc_relay
from rbln_device_plugin.telemetry.grpc_relay import MAX_LINE_BYTES

_CHILD = textwrap.dedent(
    """
    import os, sys
    from rbln_device_plugin.telemetry import grpc_relay, logs

    logs.install(os.environ)
    relay = grpc_relay.install()
    assert relay is not None
    os.write(2, sys.argv[1].encode().decode("unicode_escape").encode("latin-1"))
    print("python-level stderr", file=sys.stderr)
    relay.stop()
    os.write(2, b"after stop\\n")
    """
)


def relay(raw: str, level: str = "debug") -> tuple[list[dict[str, object]], str]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, raw],
        capture_output=True,
        text=True,
        timeout=30,
        env={"RBLN_DEVICE_PLUGIN_LOG_LEVEL": level, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def test_abseil_lines_become_grpc_records_and_other_lines_stay_on_stderr() -> None:
    records, stderr = relay(
        "E1130 13:14:32.447534    5454 add_port.cc:83] Failed to add port: in use\\n"
        "W1130 13:14:32.5  77 chttp2_transport.cc:9] keepalive\\n"
        "I1130 13:14:32.600001 77 ev_epoll1_linux.cc:1] using epoll1\\n"
        "F1130 13:14:33.000000 77 check.cc:5] CHECK failed\\n"
        "plain C-level text\\n"
    )
    assert [(r["level"], r["msg"], r["source"], r["grpcSeverity"]) for r in records] == [
        ("warn", "Failed to add port: in use", "add_port.cc:83", "ERROR"),
        ("warn", "keepalive", "chttp2_transport.cc:9", "WARNING"),
        ("debug", "using epoll1", "ev_epoll1_linux.cc:1", "INFO"),
        ("error", "CHECK failed", "check.cc:5", "FATAL"),
    ]
    assert all(r["component"] == "grpc" for r in records)
    # Python writes directly, C-level text through the relay thread: either comes first.
    lines = stderr.splitlines()
    assert sorted(lines[:2]) == ["plain C-level text", "python-level stderr"]
    assert lines[2:] == ["after stop"]


def test_core_info_lines_are_hidden_at_info_level() -> None:
    records, _ = relay("I1130 13:14:32.600001 77 x.cc:1] chatty\\n", level="info")
    assert records == []


def test_an_over_long_line_is_cut_and_the_next_line_is_intact() -> None:
    long_text = "x" * (3 * MAX_LINE_BYTES)
    records, stderr = relay(
        f"E1130 13:14:32.1 1 a.cc:1] {long_text}\\nE1130 13:14:32.2 1 b.cc:2] next\\n"
    )
    first, second = records
    assert len(str(first["msg"])) <= MAX_LINE_BYTES + 16
    assert str(first["msg"]).endswith("...[cut]")
    assert second["msg"] == "next"
    assert "x" not in stderr


def test_a_last_line_without_newline_is_still_relayed() -> None:
    records, _ = relay("E1130 13:14:32.1 1 a.cc:1] no newline")
    assert [r["msg"] for r in records] == ["no newline"]


_FLOOD = textwrap.dedent(
    """
    import fcntl, os, struct, sys, termios, time
    from rbln_device_plugin.telemetry import grpc_relay, logs

    logs.install(os.environ)
    # The stop's 1 s bound is the daemon's shutdown budget, not what this test checks: on
    # a loaded machine (the suite's other workers) draining the queue and writing the
    # dropped-lines notice took longer than that once, and the notice was lost with it.
    grpc_relay._STOP_TIMEOUT_S = 30.0
    relay = grpc_relay.install()
    assert relay is not None
    line = b"raw C-core text that is not an abseil line " + b"x" * 40 + b"\\n"
    for _ in range(int(sys.argv[1])):
        while True:
            try:
                os.write(2, line)
                break
            except BlockingIOError:  # the relay's pipe is full for a moment
                time.sleep(0.001)
    # Written into the relay's pipe is not yet read by the relay: wait until its thread
    # has taken every byte, so that the lines met the blocked stderr before the test
    # drains it (on a loaded machine it lagged, and nothing was dropped: no notice).
    while struct.unpack("i", fcntl.ioctl(2, termios.FIONREAD, b"\\0" * 4))[0]:
        time.sleep(0.01)
    print("written", flush=True)
    sys.stdin.readline()  # the test drains stderr now
    relay.stop()
    logs.flush()
    """
)


def test_a_blocked_stderr_makes_the_relay_drop_and_count_lines_not_wait() -> None:
    lines = 5000  # far more than the pipe and the relay's queue hold
    child = subprocess.Popen(
        [sys.executable, "-c", _FLOOD, str(lines)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info", "PATH": "/usr/bin:/bin"},
    )
    assert child.stdout is not None and child.stderr is not None and child.stdin is not None
    try:
        # Nobody reads the child's stderr yet: a relay that waited for it would stop
        # reading fd 2, and these writes would never finish (generous guard).
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "writing to fd 2 blocked behind the unread stderr"
        assert child.stdout.readline() == "written\n"
        child.stdin.write("go\n")
        child.stdin.flush()
        stderr = child.stderr.read()
        records = [json.loads(line) for line in child.stdout.read().splitlines()]
        assert child.wait(30) == 0
    finally:
        child.kill()
    notices = [r for r in records if r["msg"] == grpc_relay.DROPPED_MSG]
    assert notices and all(r["level"] == "warn" and r["component"] == "grpc" for r in notices)
    dropped = sum(r["droppedLines"] for r in notices)
    copied = stderr.count("raw C-core text")
    # Every line is either copied or counted, except what the relay had not read yet
    # when it was stopped (it gets 1 s for that).
    assert dropped > 0 and copied > 0 and copied + dropped <= lines
    for notice in notices:
        count = notice["droppedLines"]
        assert f"{count} gRPC stderr lines dropped while stderr was blocked" in stderr
