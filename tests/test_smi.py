"""rbln-smi: lookup, running real fake binaries, parsing its JSON."""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from rbln_device_plugin.host import proc
from rbln_device_plugin.host.proc import ERROR_OUTPUT_BYTES
from rbln_device_plugin.host.smi import (
    DiscoveryError,
    SmiError,
    locate_rbln_smi,
    parse_inventory,
    run_smi,
)
from rbln_device_plugin.shorten import middle_truncate
from rbln_device_plugin.telemetry import logs

from .fault_helpers import wait_until

SAMPLE: dict[str, Any] = {
    "KMD_version": "1.3.73",
    "devices": [
        {
            "npu": 0,
            "name": "RBLN-CA25",
            "sid": "0000000022502229",
            "uuid": "6B3A...",
            "device": "rbln0",
            "status": "normal",
            "fw_ver": "1.0",
            "pci": {
                "dev": "1250",
                "bus_id": "0000:05:00.0",
                "numa_node": "0",
                "link_speed": "16GT/s",
                "link_width": "16",
            },
            "memory": {"used": "0", "total": "17179869184"},
        }
    ],
}


def write_tool(directory: Path, body: str, name: str = "rbln-smi") -> Path:
    """An executable Python script standing in for rbln-smi."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\nimport os, sys, time, json, signal, subprocess\n{body}\n")
    path.chmod(0o755)
    return path


def write_pid_tool(directory: Path, body: str) -> tuple[Path, Path]:
    """A stand-in that first writes its PID to a file, and that file (to find it later)."""
    pidfile = directory / "pid"
    return write_tool(
        directory, f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n{body}"
    ), pidfile


async def tool_gone(pidfile: Path, what: str) -> None:
    pid = int(pidfile.read_text())
    await wait_until(lambda: not alive(pid), 30, f"{what} to be gone")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # an unreaped orphan of a killed process is gone for our purposes


# --------------------------------------------------------------------- locate
def make_exec(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_locate_prefers_configured_path(tmp_path: Path) -> None:
    configured = make_exec(tmp_path / "custom" / "rbln-smi")
    first = make_exec(tmp_path / "usr" / "bin" / "rbln-smi")
    assert locate_rbln_smi(configured, [first]) == configured


def test_locate_configured_but_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="not an executable file"):
        locate_rbln_smi(tmp_path / "nope", [make_exec(tmp_path / "a" / "rbln-smi")])


def test_locate_takes_first_usable_candidate_in_order(tmp_path: Path) -> None:
    not_executable = make_exec(tmp_path / "1" / "rbln-smi", 0o644)
    directory = tmp_path / "2" / "rbln-smi"
    directory.mkdir(parents=True)
    third = make_exec(tmp_path / "3" / "rbln-smi")
    fourth = make_exec(tmp_path / "4" / "rbln-smi")
    if os.geteuid() == 0:
        # root may execute any file with at least one x bit; ours has none, so it is skipped.
        assert not os.stat(not_executable).st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    found = locate_rbln_smi(
        None, [tmp_path / "0" / "rbln-smi", not_executable, directory, third, fourth]
    )
    assert found == third


def test_locate_falls_back_to_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = make_exec(tmp_path / "bin" / "rbln-smi")
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}:{on_path.parent}")
    found = locate_rbln_smi(None, [tmp_path / "missing"])
    assert found == on_path


def test_locate_nothing_found_names_the_candidates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DiscoveryError, match=r"rbln-smi not found .*missing"):
        locate_rbln_smi(None, [tmp_path / "missing"])


# --------------------------------------------------------------------- run
async def test_run_returns_stdout_only(tmp_path: Path) -> None:
    tool = write_tool(tmp_path, "print(json.dumps(sys.argv[1:])); print('noise', file=sys.stderr)")
    assert json.loads(await run_smi(tool, ["-g", "-j"], 5)) == ["-g", "-j"]


async def test_run_never_uses_a_shell(tmp_path: Path) -> None:
    tool = write_tool(tmp_path, "print(sys.argv[1])")
    assert (await run_smi(tool, ["$(touch pwned); *"], 5)).strip() == "$(touch pwned); *"
    assert not (tmp_path / "pwned").exists()


async def test_run_gives_the_tool_an_empty_stdin(tmp_path: Path) -> None:
    tool = write_tool(tmp_path, "print(repr(sys.stdin.read()))")
    assert (await run_smi(tool, [], 5)).strip() == "''"


async def test_nonzero_exit_names_command_code_duration_and_output(tmp_path: Path) -> None:
    tool = write_tool(
        tmp_path, "print('partial'); print('driver not loaded', file=sys.stderr); sys.exit(3)"
    )
    with pytest.raises(SmiError) as info:
        await run_smi(tool, ["-j"], 5)
    message = str(info.value)
    assert f"`{tool} -j` exited with code 3 after" in message
    assert " ms: driver not loaded" in message and "partial" in message


async def test_nonzero_exit_without_output_says_so(tmp_path: Path) -> None:
    tool = write_tool(tmp_path, "sys.exit(1)")
    with pytest.raises(SmiError, match=r"exited with code 1 after \d+ ms \(no output\)"):
        await run_smi(tool, ["-j"], 5)


async def test_death_by_signal_is_named(tmp_path: Path) -> None:
    tool = write_tool(tmp_path, "os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(SmiError, match="killed by signal SIGSEGV"):
        await run_smi(tool, ["-j"], 5)


async def test_missing_binary_is_an_smi_error(tmp_path: Path) -> None:
    with pytest.raises(SmiError, match="could not be started"):
        await run_smi(tmp_path / "gone", ["-j"], 5)


async def test_timeout_kills_the_tool_and_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    tool = write_tool(
        tmp_path,
        # A helper child inherits stdout: killing only the parent would leave the pipe open.
        # Both would run for an hour: a run_smi that waited for them would hang the test.
        "child = subprocess.Popen(['sleep', '3600'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(3600)",
    )
    with pytest.raises(SmiError) as info:
        await run_smi(tool, ["-j"], 0.5)
    assert "timed out after" in str(info.value) and "(limit 0.5 s) and was killed" in str(
        info.value
    )
    for pid in map(int, pids.read_text().split()):
        # SIGKILLed: gone once the kernel (and, for the orphaned child, init) reaps it.
        await wait_until(lambda pid=pid: not alive(pid), 30, f"process {pid} to be gone")


async def test_the_tool_leads_a_process_group_of_its_own(tmp_path: Path) -> None:
    # What the kills above rely on: a group holding the tool and whatever it starts,
    # apart from the daemon's, so that killing it never reaches the daemon itself. A
    # group in the daemon's session: a session per run would cost a scheduling group per
    # run where the kernel's autogroup is on (docs/performance.md).
    tool = write_tool(
        tmp_path,
        "print(json.dumps([os.getpid(), os.getpgid(0), os.getpgid(os.getppid()), "
        "os.getsid(0), os.getsid(os.getppid())]))",
    )
    pid, group, parent_group, session, parent_session = json.loads(await run_smi(tool, ["-j"], 30))
    assert group == pid
    assert parent_group == os.getpgid(0) != group
    assert session == parent_session


async def test_cancellation_kills_the_tool(tmp_path: Path) -> None:
    tool, pidfile = write_pid_tool(tmp_path, "time.sleep(3600)")
    task = asyncio.create_task(run_smi(tool, ["-j"], 30))
    await wait_until(lambda: pidfile.exists() and bool(pidfile.read_text()), 30, "the tool")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not alive(int(pidfile.read_text()))


async def test_runaway_output_is_capped_and_the_tool_killed(tmp_path: Path) -> None:
    tool, pidfile = write_pid_tool(
        tmp_path, "chunk = b'x' * 65536\nwhile True: sys.stdout.buffer.write(chunk)"
    )
    with pytest.raises(SmiError, match=r"printed more than 1000000 bytes .*and was killed"):
        await run_smi(tool, ["-j"], 10, max_output=1_000_000)
    await tool_gone(pidfile, "the runaway tool")


async def test_a_tool_that_closes_its_pipes_and_keeps_running_times_out(tmp_path: Path) -> None:
    # The pipes' EOF is not the end of the run: the exit is, and the deadline still holds.
    tool, pidfile = write_pid_tool(
        tmp_path, "print('early'); sys.stdout.flush(); os.close(1); os.close(2); time.sleep(3600)"
    )
    with pytest.raises(SmiError, match=r"timed out after .*and was killed"):
        await run_smi(tool, ["-j"], 0.5)
    await tool_gone(pidfile, "the tool")


async def test_output_in_pieces_and_both_streams_are_read_while_it_runs(tmp_path: Path) -> None:
    # More than a pipe holds on both streams: unread, the tool would block forever.
    tool = write_tool(
        tmp_path,
        "for i in range(40):\n"
        "    sys.stdout.write('o' * 8192); sys.stderr.write('e' * 8192)\n"
        "    sys.stdout.flush(); sys.stderr.flush(); time.sleep(0.001)\n",
    )
    assert await run_smi(tool, ["-j"], 10) == "o" * 8192 * 40


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "no-pidfd"])
async def test_runs_leave_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfds: bool
) -> None:
    # Without pidfds (kernels before 5.3) the exit is polled once the pipes closed.
    if not pidfds:
        monkeypatch.setattr(proc, "_pidfd", lambda pid: None)
    tool, pidfile = write_pid_tool(tmp_path, "print('done'); sys.exit(4)")
    with pytest.raises(SmiError, match="exited with code 4"):
        await run_smi(tool, ["-j"], 5)
    assert (await run_smi(write_tool(tmp_path, "print('ok')", "ok"), [], 5)).strip() == "ok"
    pid = int(pidfile.read_text())
    with pytest.raises(ChildProcessError):  # reaped: no zombie is left to this process
        os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never waits


async def test_long_error_output_is_middle_truncated(tmp_path: Path) -> None:
    tool = write_tool(tmp_path, "sys.stderr.write('HEAD' + 'm' * 20000 + 'TAIL'); sys.exit(2)")
    with pytest.raises(SmiError) as info:
        await run_smi(tool, ["-j"], 5)
    message = str(info.value)
    assert "HEAD" in message and "TAIL" in message
    assert "bytes omitted" in message
    assert len(message) < 4096 + 300


def test_error_output_is_stripped_and_middle_truncated() -> None:
    assert middle_truncate(b"  hello\n", ERROR_OUTPUT_BYTES) == "hello"
    assert middle_truncate(b"\xffok", ERROR_OUTPUT_BYTES) == "\ufffdok"
    long = middle_truncate(b"a" * 3000 + b"b" * 3000, 4096)
    assert long.startswith("a" * 2048) and long.endswith("b" * 2048)
    assert "[1904 bytes omitted]" in long


# --------------------------------------------------------------------- parse
def test_parse_sample_output() -> None:
    records, problems = parse_inventory(json.dumps(SAMPLE))
    assert problems == []
    (record,) = records
    assert (record.name, record.product, record.bus_id) == ("rbln0", "RBLN-CA25", "0000:05:00.0")
    assert (record.pci_device_id, record.numa_node, record.sid, record.npu) == (
        "1250",
        "0",
        "0000000022502229",
        0,
    )
    assert record.group_id is None


def test_parse_group_id_with_dash_g() -> None:
    doc = json.loads(json.dumps(SAMPLE))
    doc["devices"][0]["group_id"] = "3"
    assert parse_inventory(json.dumps(doc))[0][0].group_id == "3"


def test_parse_ignores_unknown_keys_and_tolerates_missing_optional_fields() -> None:
    text = json.dumps(
        {
            "devices": [
                {
                    "device": "rbln1",
                    "name": "RBLN-CR13",
                    "pci": {"bus_id": "0000:06:00.0"},
                    "new": {"x": 1},
                }
            ],
            "extra": 1,
        }
    )
    records, problems = parse_inventory(text)
    assert problems == []
    assert (records[0].numa_node, records[0].sid, records[0].npu) == ("", "", None)


def test_parse_accepts_numbers_where_strings_are_usual() -> None:
    text = json.dumps(
        {
            "devices": [
                {
                    "device": "rbln1",
                    "name": "RBLN-CR13",
                    "npu": "7",
                    "pci": {"bus_id": "0000:06:00.0", "numa_node": -1, "dev": 2130},
                }
            ]
        }
    )
    record = parse_inventory(text)[0][0]
    assert (record.numa_node, record.pci_device_id, record.npu) == ("-1", "2130", 7)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "{",
        "null",
        "[]",
        '"devices"',
        "{}",
        '{"devices": {}}',
        '{"devices": "none"}',
        '{"KMD_version": "1.2", "Devices": null}',
        "[" * 100_000,
        '{"devices": [' + "1" * 5000 + "]}",
    ],
    ids=[
        "empty",
        "garbage",
        "truncated",
        "null",
        "list",
        "string",
        "no-devices",
        "devices-object",
        "devices-string",
        "devices-key-misspelt",
        "deep",
        "huge-int",
    ],
)
def test_malformed_top_level_is_a_discovery_error(text: str) -> None:
    with pytest.raises(DiscoveryError, match="rbln-smi"):
        parse_inventory(text)


def test_null_devices_is_an_empty_inventory_with_a_debug_record() -> None:
    out = io.StringIO()
    logs.install({logs.LEVEL_ENV: "debug"}, stream=out)
    assert parse_inventory('{"KMD_version": "1.2.0", "devices": null}') == ([], [])
    assert logs.flush(5.0)
    (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["level"] == "debug"
    assert "null" in record["msg"]


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("rbln0", "entry is a str"),
        ({"name": "RBLN-CA25", "pci": {"bus_id": "0000:05:00.0"}}, "device is missing"),
        ({"device": "rbln0", "pci": {"bus_id": "0000:05:00.0"}}, "name is missing"),
        ({"device": "rbln0", "name": "RBLN-CA25"}, "pci is missing"),
        ({"device": "rbln0", "name": "RBLN-CA25", "pci": "0000:05:00.0"}, "pci is not an object"),
        ({"device": "rbln0", "name": "RBLN-CA25", "pci": {}}, "pci.bus_id is missing"),
        (
            {"device": ["rbln0"], "name": "RBLN-CA25", "pci": {"bus_id": "0000:05:00.0"}},
            "device is list",
        ),
        ({"device": "rbln0", "name": True, "pci": {"bus_id": "0000:05:00.0"}}, "name is bool"),
        (
            {"device": "rbln0", "name": "RBLN-CA25", "sid": 1.5, "pci": {"bus_id": "0000:05:00.0"}},
            "sid is float",
        ),
        (
            {"device": "rbln0", "name": "RBLN-CA25", "npu": -1, "pci": {"bus_id": "0000:05:00.0"}},
            "npu is -1",
        ),
    ],
)
def test_malformed_entry_is_skipped_with_a_problem_naming_it(entry: Any, reason: str) -> None:
    good = SAMPLE["devices"][0]
    records, problems = parse_inventory(json.dumps({"devices": [good, entry, good]}))
    assert len(records) == 2
    (problem,) = problems
    assert problem.message == "Skipping malformed rbln-smi device entry"
    assert problem.fields["entry"].startswith("entry 1")
    assert reason in problem.fields["reason"]


def test_parse_keeps_duplicates_for_the_policy_to_resolve() -> None:
    good = SAMPLE["devices"][0]
    records, _ = parse_inventory(json.dumps({"devices": [good, good]}))
    assert len(records) == 2


def test_parse_huge_output() -> None:
    base = SAMPLE["devices"][0]
    devices = [
        {
            **base,
            "device": f"rbln{i}",
            "pci": {**base["pci"], "bus_id": f"0000:{i // 32:02x}:{i % 32:02x}.0"},
        }
        for i in range(20_000)
    ]
    records, problems = parse_inventory(json.dumps({"devices": devices}))
    assert len(records) == 20_000 and problems == []
