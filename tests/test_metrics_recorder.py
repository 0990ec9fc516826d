"""The recorder with metrics on, in process: every event lands in its series, snapshots
stay consistent while collection runs on another thread, and docs/metrics.md's table lists
exactly the metrics there are, with their types and labels."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from rbln_device_plugin.model.devicetable import DeviceTable
from rbln_device_plugin.model.health import StatusReading
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.otel_metrics import OtelMetrics

from .metrics_helpers import parse, total, value

METRICS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
NPU = "rebellions.ai/npu"


def device(index: int, numa: int | None = 0) -> Device:
    return Device(f"rbln{index}", "RBLN-CA25", "1250", f"0000:{index + 1:02x}:00.0", numa, "",
                  None, None)  # fmt: skip


def table(codes: dict[int, int | None], numa: int | None = 0) -> DeviceTable:
    devices = [device(i, numa) for i in codes]
    readings = {f"rbln{i}": StatusReading(code) for i, code in codes.items()}
    out = DeviceTable()
    out.apply_scan(devices, readings)
    return out


@pytest.fixture
def recorder() -> OtelMetrics:
    return new_recorder("device-plugin")


def new_recorder(mode: str) -> OtelMetrics:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    return OtelMetrics(provider, reader, mode)


def every_event(recorder: OtelMetrics) -> None:
    recorder.allocation(NPU, m.OK, 0.2)
    recorder.preferred_allocation(NPU, m.OK, 0.001, capped=True)
    recorder.rbln_smi_call("list", m.OK, 0.05)
    recorder.rsd_lock_wait(m.OK, 0.0001)
    recorder.scan(m.OK, 0.003)
    recorder.inventory_changes(NPU, 1, 1)
    recorder.devices(NPU, table({0: 0, 1: 4}).entries)
    recorder.registration(NPU, m.OK)
    recorder.kubelet_restart()
    recorder.stream_opened(NPU)
    recorder.host_read_stalled()
    recorder.cdi_spec("missing")
    recorder.dra_claim(m.DRA_PREPARE, m.OK, 0.01)
    recorder.dra_prepared_claims(1)
    recorder.dra_slice_write("create", m.OK)


def test_each_event_moves_its_series(recorder: OtelMetrics) -> None:
    every_event(recorder)
    recorder.scan(m.SCAN_DISCOVERY_FAILED, 5.0)
    recorder.stream_opened(NPU)
    recorder.stream_closed(NPU)
    recorder.inventory_changes(NPU, 0, 0)  # no change adds nothing
    s = parse(recorder.render())
    assert value(s, "allocate_requests_total", resource=NPU, result="ok") == 1
    assert value(s, "preferred_allocation_capped_total", resource=NPU) == 1
    assert value(s, "scan_duration_seconds_count", result="discovery_failed") == 1
    assert value(s, "discovery_failures_total") == 1
    assert value(s, "devices_appeared_total", resource=NPU) == 1
    assert value(s, "list_and_watch_streams", resource=NPU) == 1
    assert value(s, "kubelet_restarts_total") == 1
    assert value(s, "host_reads_stalled_total") == 1
    assert [value(s, "cdi_spec", state=k) for k in m.CDI_SPEC_STATES] == [0, 1, 0]
    assert value(s, "devices", resource=NPU, health="Unhealthy") == 1
    ident = {"resource": NPU, "device": "rbln1", "pci_bus_id": "0000:02:00.0", "numa_node": "0"}
    assert value(s, "device_status", **ident, status="FAULT") == 1
    assert value(s, "device_healthy", **ident) == 0


def test_a_stopped_resource_and_unknown_numa(recorder: OtelMetrics) -> None:
    recorder.devices(NPU, table({0: None}, numa=None).entries)  # unreadable: Healthy
    s = parse(recorder.render())
    ident = {"resource": NPU, "device": "rbln0", "pci_bus_id": "0000:01:00.0",
             "numa_node": "unknown"}  # fmt: skip
    assert value(s, "device_status", **ident, status="UNREADABLE") == 1
    assert value(s, "device_healthy", **ident) == 1
    recorder.devices(NPU, None)
    s = parse(recorder.render())
    assert total(s, "device_status") == 0 and total(s, "devices") == 0


def test_collection_on_another_thread_sees_whole_scans(recorder: OtelMetrics) -> None:
    """The endpoint and the OTLP push collect off the event loop while scans swap tables:
    every series family shows one whole scan (two families may show adjacent scans)."""
    tables = [table(dict.fromkeys(range(n), 0)).entries for n in (8, 64)]
    stop = threading.Event()
    seen: list[tuple[float, float]] = []

    def scrape() -> None:
        while not stop.is_set():
            s = parse(recorder.render())
            seen.append((total(s, "devices", resource=NPU), total(s, "device_status")))

    worker = threading.Thread(target=scrape)
    worker.start()
    try:
        for round_ in range(3000):
            recorder.devices(NPU, tables[round_ % 2])
    finally:
        stop.set()
        worker.join()
    assert seen and {count for pair in seen for count in pair} <= {0, 8, 64}


def readme_table() -> dict[str, tuple[str, frozenset[str]]]:
    """The metrics page's table: name -> (type, label names)."""
    section = METRICS_PAGE.read_text().split("\n## What is reported\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(rbln_device_plugin_\w+)` \| (\w+) \| [^|]+ \| ([^|]+) \|", section,
                      flags=re.M)  # fmt: skip
    return {name: (kind, frozenset(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def test_the_readme_lists_exactly_the_metrics_with_type_and_labels() -> None:
    # The dra mode's recorder: it has every series of the other mode and the dra_* ones.
    recorder = new_recorder("dra")
    every_event(recorder)
    exposed = {}
    for family in text_string_to_metric_families(recorder.render()):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for sample in family.samples for k in sample.labels if k != "le"}
        exposed[name] = (family.type, frozenset(labels))
    # target_info carries the resource's attributes, whatever OTEL_RESOURCE_ATTRIBUTES adds:
    # the README names it in a sentence, not in the table.
    assert exposed.pop("target_info")[0] == "gauge"
    assert readme_table() == exposed


def test_the_dra_mode_adds_the_stated_series_at_0() -> None:
    stated = re.search(r"\*\*(\d+) series more\*\*", METRICS_PAGE.read_text())
    assert stated, "docs/metrics.md states what the dra mode adds"
    device_plugin = parse(new_recorder("device-plugin").render())
    dra = parse(new_recorder("dra").render())
    assert set(device_plugin) <= set(dra)
    added = set(dra) - set(device_plugin)
    assert {name for name, _ in added} >= {f"rbln_device_plugin_dra_{n}" for n in (
        "claims_total", "resourceslice_writes_total", "prepared_claims",
        "prepare_duration_seconds_count")}  # fmt: skip
    assert all(dra[key] == 0 for key in added)
    assert len(added) == int(stated.group(1))
