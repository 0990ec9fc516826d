"""The structured log stream: fields, levels, formats, fallbacks, the stdlib bridge."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime
from typing import Any

import pytest

from rbln_device_plugin.telemetry import logs


def install(env: dict[str, str]) -> tuple[io.StringIO, logs.LogSettings]:
    out = io.StringIO()
    settings = logs.install(env, stream=out)
    return out, settings


def written(out: io.StringIO) -> str:
    """What reached the stream: records are written by the sink's thread."""
    assert logs.flush(5.0), "the log writer did not drain its queue"
    return out.getvalue()


def records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in written(out).splitlines()]


def test_json_is_compact_and_keeps_the_call_sites_key_order() -> None:
    out, _ = install({})
    logs.get_logger().warning(
        "Device state changed", resourceName="rebellions.ai/npu", device="rbln3",
        health="Unhealthy", status="FAULT", deviceCount=8,
    )  # fmt: skip
    line = written(out).strip()
    assert line.startswith('{"ts":"')
    assert line.endswith(
        '"level":"warn","msg":"Device state changed","resourceName":"rebellions.ai/npu",'
        '"device":"rbln3","health":"Unhealthy","status":"FAULT","deviceCount":8}'
    )
    assert ", " not in line and '": ' not in line


def test_added_keys_come_after_the_events_own() -> None:
    out, _ = install({logs.LEVEL_ENV: "debug"})
    logs.get_logger().info("Device exposed", zeta=1, alpha=2)
    (record,) = records(out)
    assert list(record) == ["ts", "level", "msg", "zeta", "alpha", "caller"]


def test_json_record_has_ts_level_msg_and_event_keys() -> None:
    out, _ = install({})
    logs.get_logger().warning("Device state changed", device="rbln3", err=OSError("boom"))
    (record,) = records(out)
    assert list(record)[:3] == ["ts", "level", "msg"]
    assert record["level"] == "warn"
    assert record["msg"] == "Device state changed"
    assert record["device"] == "rbln3"
    assert record["err"] == "boom"
    assert record["ts"].endswith("Z")
    assert datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).tzinfo is not None
    assert "." in record["ts"]  # fractional seconds
    assert "caller" not in record


@pytest.mark.parametrize(
    ("level", "shown"),
    [("error", {"error"}), ("warning", {"error", "warn"}), ("warn", {"error", "warn"}),
     ("info", {"error", "warn", "info"}), ("debug", {"error", "warn", "info", "debug"}),
     ("DEBUG", {"error", "warn", "info", "debug"})],
)  # fmt: skip
def test_level_gate(level: str, shown: set[str]) -> None:
    out, _ = install({logs.LEVEL_ENV: level})
    log = logs.get_logger()
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert {r["level"] for r in records(out)} == shown


def test_caller_is_added_at_debug() -> None:
    out, _ = install({logs.LEVEL_ENV: "debug"})
    logs.get_logger().info("hello")
    (record,) = records(out)
    assert record["caller"].startswith("test_logs.py:")


@pytest.mark.parametrize(
    ("env", "variable"),
    [({logs.LEVEL_ENV: "loud"}, logs.LEVEL_ENV), ({logs.FORMAT_ENV: "xml"}, logs.FORMAT_ENV)],
)
def test_invalid_values_fall_back_with_a_warning(env: dict[str, str], variable: str) -> None:
    out, settings = install(env)
    (record,) = records(out)  # parses as JSON: the fallback format is json
    assert record["level"] == "warn"
    assert record["msg"] == f"Invalid {variable}, using default"
    assert record["fallback"] in ("info", "json")
    assert settings.level_name == "info" and settings.format == "json"
    logs.get_logger().debug("hidden")
    assert len(records(out)) == 1


def test_text_format_is_logfmt() -> None:
    out, _ = install({logs.FORMAT_ENV: "text"})
    logs.get_logger().info("Device exposed", device="rbln0")
    line = written(out).strip()
    assert line.startswith("ts=")
    assert "level=info" in line and 'msg="Device exposed"' in line and "device=rbln0" in line


def test_grpc_records_are_bridged_with_component_and_info_demoted() -> None:
    out, _ = install({logs.LEVEL_ENV: "debug"})
    logging.getLogger("grpc._cython").info("channel idle")
    logging.getLogger("grpc").warning("bad thing %s", "x")
    first, second = records(out)
    assert first["component"] == "grpc" and first["level"] == "debug"
    assert second["component"] == "grpc" and second["level"] == "warn"
    assert second["msg"] == "bad thing x"


def test_grpc_info_is_hidden_at_info_level() -> None:
    out, _ = install({})
    logging.getLogger("grpc").info("chatty")
    assert records(out) == []


def test_otel_errors_never_rise_above_warn_and_repeats_are_folded() -> None:
    out, _ = install({})
    otel = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    for _ in range(50):
        otel.error("Failed to export span batch, error code: UNAVAILABLE")
    otel.warning("another problem")
    got = records(out)
    assert [r["level"] for r in got] == ["warn", "warn"]
    assert all(r["component"] == "otel" for r in got)
    assert got[0]["msg"] == "OpenTelemetry SDK error"
    assert "UNAVAILABLE" in got[0]["err"]
    assert got[1]["err"] == "another problem"


def test_closed_stdout_never_raises() -> None:
    out = io.StringIO()
    logs.install({}, stream=out)
    out.close()
    logs.get_logger().error("still fine")
    assert logs.flush(5.0)


def test_exc_info_becomes_a_traceback_field() -> None:
    out, _ = install({})
    try:
        raise RuntimeError("kaput")
    except RuntimeError as exc:
        logs.get_logger().error("Unexpected internal error; exiting", err=exc, exc_info=True)
    (record,) = records(out)
    assert record["err"] == "kaput"
    assert "Traceback" in record["exception"] and "exc_info" not in record
