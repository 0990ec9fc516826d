"""The CLI as a real process: stdout carries only JSON log records."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rbln_device_plugin import __version__, config, options
from rbln_device_plugin.telemetry import logs

from .daemon_process import DaemonProcess
from .probes import health, health_port

BIN = Path(sys.executable).parent / "rbln-device-plugin"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RBLN_")}
    full_env.update(env or {})
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=30, env=full_env
    )


def test_help_goes_to_stderr_and_lists_every_flag() -> None:
    result = run("--help")
    assert result.returncode == 0
    assert result.stdout == ""
    help_text = " ".join(result.stderr.split())
    for option in config.OPTIONS:
        assert option.flag in help_text
        assert f"env {option.env}" in help_text
        assert f"default {option.help_default}" in help_text


@pytest.mark.parametrize("columns", [None, "60", "140", "0", "-3", "wide"])
def test_help_is_as_wide_as_with_argparse_s_own_lookup(
    monkeypatch: pytest.MonkeyPatch, columns: str | None
) -> None:
    # The width is found without shutil (see the next test) but must be the one
    # argparse's own lookup finds: $COLUMNS, else the terminal, else 80, minus 2.
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    parser = options.daemon_parser()
    ours = parser.format_help()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    with_argparse_width = parser.format_help()
    wrapped = options._HelpFormatter("x")
    assert wrapped._width == argparse.HelpFormatter("x")._width
    # The same text wherever the flags' help has no hyphenated words to keep whole.
    assert len(ours.splitlines()[0]) == len(with_argparse_width.splitlines()[0])


def test_parsing_the_daemon_flags_loads_no_compression_modules() -> None:
    # argparse's terminal lookup imports shutil, and shutil bz2 and lzma: 0.5 MiB of a
    # daemon's idle memory for a width it never prints.
    probe = (
        "import sys; from rbln_device_plugin import options; options.daemon_parser(); "
        "print(sorted(m for m in ('shutil', 'bz2', 'lzma') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]"


def test_help_shows_defaults_and_limits_as_the_readme_does() -> None:
    help_text = " ".join(run("--help").stderr.split())
    assert "RBLN_SMI_PATH; default search]" in help_text
    assert "DEVICE_SCAN_INTERVAL; default 5s]" in help_text
    assert "at most 24h0m0s" in help_text  # Go's spelling, not 24h
    levels = help_text.split(f"{logs.LEVEL_ENV} accepts ", 1)[1].split(" (default", 1)[0]
    listed = re.findall(r"[a-z]+", levels.replace("(or ", ""))
    assert listed == ["error", "warning", "warn", "info", "debug"]
    for spelling in listed:  # each one listed is really accepted
        assert not logs.resolve_settings({logs.LEVEL_ENV: spelling}).fallbacks


def test_negative_interval_after_a_space_names_the_flag_like_after_equals() -> None:
    spaced = run("--device-scan-interval", "-1s")
    joined = run("--device-scan-interval=-1s")
    for result in (spaced, joined):
        assert result.returncode == 2
        (record,) = [json.loads(line) for line in result.stdout.splitlines()]
        assert record["err"] == (
            "--device-scan-interval (command line): interval must be positive, got '-1s'"
        )
    assert spaced.stderr == joined.stderr
    assert "expected one argument" not in spaced.stderr


def test_version_goes_to_stderr() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout == ""
    assert __version__ in result.stderr


@pytest.mark.parametrize(
    "args",
    [["--no-such-flag"], ["positional"], ["--device-scan-interval=0s"],
     ["--healthcheck-port", "70000"]],
)  # fmt: skip
def test_usage_errors_exit_2_with_json_only_on_stdout(args: list[str]) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert "usage:" in result.stderr
    lines = result.stdout.splitlines()
    assert lines, "the usage error is also reported through the logger"
    parsed = [json.loads(line) for line in lines]
    # One error record, whose err names the offending flag or word.
    (error,) = [r for r in parsed if r["level"] == "error"]
    assert args[0].split("=")[0] in error["err"], error


def test_usage_error_respects_text_format() -> None:
    result = run("--bogus", env={"RBLN_DEVICE_PLUGIN_LOG_FORMAT": "text"})
    assert result.returncode == 2
    assert "level=error" in result.stdout


def _daemon_args(tmp: Path, port: str = "0", interval: str = "200ms") -> list[str]:
    missing_smi = tmp / "no-rbln-smi"
    (tmp / "kubelet").mkdir(exist_ok=True)  # the kubelet's to create; a node has it
    return [
        "--kubelet-device-plugin-path", str(tmp / "kubelet"),
        "--cdi-root", str(tmp / "cdi"),
        "--sysfs-root", str(tmp / "sys"),
        "--dev-root", str(tmp / "dev"),
        "--rbln-smi", str(missing_smi),
        "--rsd-lock-path", str(tmp / "rsd.lock"),
        "--healthcheck-port", port,
        "--device-scan-interval", interval,
    ]  # fmt: skip


def test_startup_logs_version_and_resolved_configuration(short_tmp: Path) -> None:
    daemon = DaemonProcess(_daemon_args(short_tmp, interval="90m"))
    try:
        (start,) = daemon.wait_for("Starting rbln-device-plugin")
        assert start["version"] == __version__
        assert start["config"]["kubeletDir"] == str(short_tmp / "kubelet")
        assert start["config"]["scanInterval"] == "1h30m0s"  # as Go prints 90 minutes
        daemon.wait_for("Started healthcheck service")
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_each_shutdown_signal_is_named_and_exits_0(short_tmp: Path, sig: signal.Signals) -> None:
    daemon = DaemonProcess(_daemon_args(short_tmp), level="info")
    try:
        daemon.wait_for("Started healthcheck service")
        daemon.wait_for("Device discovery failed; reporting zero devices until it recovers")
    finally:
        code = daemon.stop(sig, timeout=6)
    assert code == 0
    (record,) = daemon.find("Shutdown signal received")
    assert record["signal"] == sig.name
    assert daemon.find("Shutdown complete")
    assert all(r["msg"] != "<<not json>>" for r in daemon.records)


def test_port_in_use_exits_1_with_a_clear_record(short_tmp: Path) -> None:
    holder = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    holder.bind(("::", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        daemon = DaemonProcess(_daemon_args(short_tmp, str(port)))
        code = daemon.proc.wait(20)
        daemon.stop()
    finally:
        holder.close()
    assert code == 1
    (record,) = daemon.find("Cannot start healthcheck service")
    assert record["level"] == "error" and str(port) in record["err"]
    assert "GRPC_VERBOSITY" not in record["err"]  # the detail is in the log, not behind a knob
    # gRPC's C core explains the bind failure in its own words: those lines are records
    # (component grpc, the C source, its severity), not raw stderr.
    core = [r for r in daemon.records if r.get("component") == "grpc" and "source" in r]
    assert core, daemon.records
    assert all(r["level"] == "warn" and r["source"].split(":")[0].endswith(".cc") for r in core)
    assert {r["grpcSeverity"] for r in core} <= {"ERROR", "WARNING"}
    assert not [line for line in daemon.stderr.splitlines() if ".cc:" in line], daemon.stderr
    assert "Traceback" not in daemon.stderr


async def test_health_service_turns_serving_after_the_first_scan(short_tmp: Path) -> None:
    import asyncio

    daemon = DaemonProcess(_daemon_args(short_tmp))
    try:
        port = await health_port(daemon)
        await daemon.await_log("Reconciled device inventory")
        for service in ("", "liveness"):
            assert await health(port, service) == "SERVING"
    finally:
        assert await asyncio.to_thread(daemon.stop) == 0
