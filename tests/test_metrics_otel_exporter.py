"""The exposition against OpenTelemetry's own Prometheus exporter (a dev dependency only):
the same instruments, fed the same events, read by both; metric names, types, units and
label names must agree, and so must every sample they both have.

The daemon does not ship that exporter: it registers with prometheus_client's global
registry and serves through prometheus_client's thread-per-request server, neither of
which the daemon wants (see the README's Metrics section).
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from rbln_device_plugin.telemetry import otlp
from rbln_device_plugin.telemetry.otel_metrics import OtelMetrics

from .metrics_helpers import parse
from .test_metrics_e2e import _empty_histogram_series
from .test_metrics_recorder import every_event

exporter = pytest.importorskip("opentelemetry.exporter.prometheus")

Families = dict[str, tuple[str, frozenset[str]]]


def families(text: str) -> Families:
    out: Families = {}
    for family in text_string_to_metric_families(text):
        names = {k for sample in family.samples for k in sample.labels if k != "le"}
        out[family.name] = (family.type, frozenset(names))
    return out


@pytest.fixture
def both() -> tuple[str, str, str]:
    """(our exposition, theirs in the text format, theirs in OpenMetrics with units)."""
    registry = CollectorRegistry()
    theirs = exporter.PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    ours = InMemoryMetricReader()
    provider = MeterProvider(resource=otlp.otel_resource("node-a"),
                             metric_readers=[ours, theirs], shutdown_on_exit=False)  # fmt: skip
    recorder = OtelMetrics(provider, ours)
    every_event(recorder)
    try:
        # Ours first: an observable callback yields the same values to both collections.
        text = recorder.render()
        return (
            text,
            generate_latest(registry).decode(),
            openmetrics.generate_latest(registry).decode(),
        )
    finally:
        provider.shutdown()


def test_names_types_and_label_names_match_opentelemetrys_exporter(
    both: tuple[str, str, str],
) -> None:
    ours, theirs, _ = both
    assert families(ours) == families(theirs)


def test_units_match_opentelemetrys_exporter(both: tuple[str, str, str]) -> None:
    ours, _, theirs_om = both
    ours_names = set(families(ours))
    # An OpenMetrics info family is named without its _info (target_info is "target").
    units: dict[str, Any] = {
        f.name + ("_info" if f.type == "info" else ""): f.unit
        for f in openmetrics_families(theirs_om)
    }
    assert units["rbln_device_plugin_allocate_duration_seconds"] == "seconds"
    for name, unit in units.items():
        # OpenMetrics names a counter family without _total; the 0.0.4 parser does too.
        assert name in ours_names, name
        if unit:
            assert name.endswith(f"_{unit}"), (name, unit)


def test_every_sample_both_have_is_the_same(both: tuple[str, str, str]) -> None:
    ours, theirs, _ = both
    mine, other = parse(ours), parse(theirs)
    # Ours has the histograms at 0 that the SDK has no data point for; nothing else more.
    zeros = _empty_histogram_series(mine)
    assert zeros and not zeros & set(other)
    assert {k: v for k, v in mine.items() if k not in zeros} == other
