"""The Prometheus exposition written from OpenTelemetry data, read back with Prometheus'
own parser; the naming rules; the bounded label values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from rbln_device_plugin.telemetry import exposition
from rbln_device_plugin.telemetry.metrics import smi_subcommand, status_label

from .metrics_helpers import parse


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [("rbln_device_plugin.allocate.duration", "s", "histogram",
      "rbln_device_plugin_allocate_duration_seconds"),
     ("rbln_device_plugin.allocate.requests", "{request}", "counter",
      "rbln_device_plugin_allocate_requests_total"),
     ("rbln_device_plugin.devices", "{device}", "gauge", "rbln_device_plugin_devices"),
     ("x.load", "1", "gauge", "x_load_ratio"),
     ("x.errors", "1", "counter", "x_errors_total"),
     ("x.wait_seconds", "s", "histogram", "x_wait_seconds"),  # no second unit word
     ("x.requests_total", "", "counter", "x_requests_total"),
     ("x.size", "By", "gauge", "x_size_bytes"),
     ("x-y/z", "", "gauge", "x_y_z"),
     ("9lives", "", "gauge", "_9lives")],
)  # fmt: skip
def test_names_follow_the_opentelemetry_prometheus_rules(
    name: str, unit: str, kind: str, expected: str
) -> None:
    assert exposition.metric_name(name, unit, kind) == expected


@pytest.mark.parametrize(
    ("args", "subcommand"),
    [(["-j"], "list"), (["-g", "-j"], "group_list"), (["group", "-c", "3", "-a", "0,1"],
     "group_create"), (["group", "-d", "1,2"], "group_destroy"), (["--topo"], "other"), ([],
     "other")],
)  # fmt: skip
def test_rbln_smi_subcommands_are_a_small_fixed_set(args: list[str], subcommand: str) -> None:
    assert smi_subcommand(args) == subcommand


@pytest.mark.parametrize(
    ("status", "label"),
    [("READY", "READY"), ("FAULT", "FAULT"), ("UNREADABLE", "UNREADABLE"),
     ("UNKNOWN(7)", "UNKNOWN"), ("UNKNOWN(-77777777777777777777...300 digits)", "UNKNOWN")],
)  # fmt: skip
def test_status_labels_are_bounded(status: str, label: str) -> None:
    assert status_label(status) == label


def _render(record: object) -> str:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    record(provider.get_meter("test"))  # type: ignore[operator]
    try:
        return exposition.render(reader.get_metrics_data())
    finally:
        provider.shutdown()


# Any text, with the characters the format gives meaning to drawn often.
label_text = st.text(
    st.one_of(
        st.sampled_from('"\\\nn{}=,# '),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    max_size=30,
)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)


@settings(max_examples=100, deadline=None)
@given(
    values=st.dictionaries(label_text, finite, min_size=1, max_size=5),
    amounts=st.lists(st.integers(0, 10**6), min_size=1, max_size=5),
)
def test_any_label_value_and_number_reads_back_through_the_prometheus_parser(
    values: dict[str, float], amounts: list[int]
) -> None:
    def record(meter: object) -> None:
        gauge = meter.create_gauge("t.level", "", "a gauge")  # type: ignore[attr-defined]
        for text, number in values.items():
            gauge.set(number, {"who": text})
        counter = meter.create_counter("t.events", "{event}", 'with "quotes" \\ and\nlines')  # type: ignore[attr-defined]
        for amount in amounts:
            counter.add(amount, {"kind": "a"})

    samples = parse(_render(record))
    for text, number in values.items():
        assert samples[("t_level", (("who", text),))] == pytest.approx(number)
    assert samples[("t_events_total", (("kind", "a"),))] == sum(amounts)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=40))
def test_histograms_are_cumulative_with_inf_equal_to_the_count(observed: list[float]) -> None:
    bounds = (0.001, 0.01, 0.1, 1.0, 10.0)

    def record(meter: object) -> None:
        histogram = meter.create_histogram(  # type: ignore[attr-defined]
            "t.wait", "s", "", explicit_bucket_boundaries_advisory=bounds
        )
        for seconds in observed:
            histogram.record(seconds, {"result": "ok"})

    samples = parse(_render(record))
    for bound in (*bounds, math.inf):
        le = "+Inf" if bound == math.inf else repr(bound)
        expected = sum(1 for v in observed if v <= bound)
        assert samples[("t_wait_seconds_bucket", (("le", le), ("result", "ok")))] == expected
    assert samples[("t_wait_seconds_count", (("result", "ok"),))] == len(observed)
    assert samples[("t_wait_seconds_sum", (("result", "ok"),))] == pytest.approx(sum(observed))


def test_nothing_recorded_renders_nothing() -> None:
    assert exposition.render(None) == ""
    assert _render(lambda meter: None) == ""
