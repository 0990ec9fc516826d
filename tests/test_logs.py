"""The structured log stream: fields, levels, formats, fallbacks, the stdlib bridge."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def parse_logfmt(line: str) -> dict[str, str]:
    """go-logfmt's reading of one line: bare values end at a space, quoted ones unescape.

    A bare value containing '=' or '"' is an error there, and is one here.
    """
    out: dict[str, str] = {}
    i = 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        key_end = line.index("=", i)
        key = line[i:key_end]
        assert key and all(ch > " " and ch not in '"=' for ch in key), key
        i = key_end + 1
        if line[i : i + 1] == '"':
            j = i + 1
            while line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            out[key] = json.loads(line[i : j + 1])  # JSON's escapes mean what Go's do
            i = j + 1
        else:
            j = line.find(" ", i)
            j = len(line) if j < 0 else j
            value = line[i:j]
            assert '"' not in value and "=" not in value, f"bare value {value!r} in {line!r}"
            out[key] = value
            i = j
    return out


def test_text_format_prints_nested_values_as_json_and_none_as_empty() -> None:
    out, _ = install({logs.FORMAT_ENV: "text"})
    logs.get_logger().info(
        "Starting rbln-device-plugin",
        config={"cdiRoot": "/var/run/cdi", "healthcheckPort": -1, "rblnSmi": None},
        services=("", "liveness"), ok=True, signal=None,
    )  # fmt: skip
    line = written(out).strip()
    assert "'" not in line, line  # no Python repr anywhere
    fields = parse_logfmt(line)
    assert json.loads(fields["config"]) == {
        "cdiRoot": "/var/run/cdi", "healthcheckPort": -1, "rblnSmi": None,
    }  # fmt: skip
    assert json.loads(fields["services"]) == ["", "liveness"]
    assert fields["ok"] == "true" and fields["signal"] == ""
    assert fields["msg"] == "Starting rbln-device-plugin"


_SCALAR = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=30),
    st.integers(),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    values=st.dictionaries(
        st.from_regex(r"[a-zA-Z][a-zA-Z0-9]{0,8}", fullmatch=True).filter(
            lambda k: k not in ("ts", "level", "msg", "event")
        ),
        st.one_of(
            _SCALAR,
            st.lists(_SCALAR, max_size=3),
            st.dictionaries(st.text(max_size=5), _SCALAR, max_size=3),
        ),
        max_size=4,
    ),
    message=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40),
)
def test_every_text_record_reads_back_exactly_with_a_logfmt_reader(
    values: dict[str, Any], message: str
) -> None:
    out, _ = install({logs.FORMAT_ENV: "text"})
    logs.get_logger().warning(message, **values)
    lines = written(out).removesuffix("\n").split("\n")
    assert len(lines) == 1, lines  # a newline in a value never splits the record
    assert lines[0].isprintable(), lines  # nor any other character a terminal acts on
    fields = parse_logfmt(lines[0])
    assert fields["msg"] == message
    for key, value in values.items():
        if isinstance(value, bool):
            assert fields[key] == ("true" if value else "false")
        elif isinstance(value, list | dict):
            assert json.loads(fields[key]) == value
        else:
            assert fields[key] == str(value)


def test_grpc_loop_notices_are_dropped_and_other_debug_records_kept() -> None:
    out, _ = install({logs.LEVEL_ENV: "debug"})
    cygrpc = logging.getLogger("grpc._cython.cygrpc")
    cygrpc.debug("[_cygrpc] Loaded running loop: id(loop)=%s", 140264098924688)
    cygrpc.debug("Using AsyncIOEngine.POLLER as I/O engine")
    (record,) = records(out)
    assert record["msg"] == "Using AsyncIOEngine.POLLER as I/O engine"


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
