"""Metrics through the real daemon on the simulated node: the Prometheus endpoint, parsed
with Prometheus' own text parser, and the OTLP push into a real OTLP/gRPC receiver.

Each event an operator alerts on moves the series that should move: a fault, an
Allocate refusal, a stalled host read, a kubelet restart, a discovery failure.
"""

from __future__ import annotations

import asyncio

from rbln_device_plugin_sim.state import Fault

from .fault_helpers import launch
from .inprocess import running
from .metrics_helpers import (
    P,
    Samples,
    metrics_port,
    metrics_receiver,
    otlp_samples,
    scrape,
    scrape_until,
    total,
    value,
)
from .simnode import rejected
from .test_stalls import STALLED, make_fifo, release_fifo

NPU = "rebellions.ai/npu"
ON = ["--metrics-port", "0"]


def device(samples: Samples, name: str, **labels: str) -> float | None:
    return value(samples, name, **labels)


async def test_a_fault_moves_the_device_and_resource_gauges() -> None:
    async with running("rebel-4", extra_args=ON, level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        rbln1 = h.node.layout.device("rbln1")
        ident = {"resource": NPU, "device": "rbln1", "pci_bus_id": rbln1.bus_id,
                 "numa_node": str(rbln1.numa)}  # fmt: skip
        before = await scrape_until(
            port, lambda s: value(s, "devices", resource=NPU, health="Healthy") == 4
        )
        assert value(before, "devices", resource=NPU, health="Unhealthy") == 0
        assert value(before, "device_healthy", **ident) == 1
        assert value(before, "device_status", **ident, status="READY") == 1
        assert value(before, "build_info", version=_version()) == 1

        h.node.set_status("rbln1", 4)  # FAULT
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln1") == "Unhealthy")
        after = await scrape_until(
            port, lambda s: value(s, "devices", resource=NPU, health="Unhealthy") == 1
        )
        assert value(after, "devices", resource=NPU, health="Healthy") == 3
        assert value(after, "device_healthy", **ident) == 0
        assert value(after, "device_status", **ident, status="FAULT") == 1
        # One status series per device: the READY one is gone, not left at 1.
        assert value(after, "device_status", **ident, status="READY") is None
        assert total(after, "device_status", resource=NPU) == 4

        h.node.set_status("rbln1", 77)  # any other code is UNKNOWN, never a new label value
        await scrape_until(port, lambda s: value(s, "device_status", **ident,
                                                 status="UNKNOWN") == 1)  # fmt: skip


async def test_allocate_results_are_counted_by_class() -> None:
    async with running("rebel-4", extra_args=ON, level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        await h.kubelet.allocate(NPU, [["rbln0"]])
        await rejected(h, NPU, [["ghost"]])
        h.node.set_status("rbln2", 4)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln2") == "Unhealthy")
        message = await rejected(h, NPU, [["rbln2"]])
        assert "unhealthy devices requested" in message
        h.node.inject_fault(Fault("error", commands=("group-create",)))
        await rejected(h, NPU, [["rbln3"]])
        samples = await scrape(port)

        def calls(result: str) -> float | None:
            return value(samples, "allocate_requests_total", resource=NPU, result=result)

        assert calls("ok") == 1
        assert calls("invalid_request") == 1
        assert calls("unhealthy_device") == 1
        assert calls("rsd_group") == 1
        assert total(samples, "allocate_requests_total") == 4
        # Each call is in the duration histogram of its class.
        for result in ("ok", "invalid_request", "unhealthy_device", "rsd_group"):
            assert value(samples, "allocate_duration_seconds_count", resource=NPU,
                         result=result) == 1  # fmt: skip
        assert value(samples, "rbln_smi_calls_total", subcommand="group_create",
                     result="error") == 1  # fmt: skip
        assert total(samples, "rsd_lock_wait_seconds_count", result="ok") == 2


async def test_preferred_allocation_counts_answers_and_fallbacks() -> None:
    async with running("atom-max-8", extra_args=ON, level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        port = await metrics_port(h.daemon)
        ids = [f"rbln{i}" for i in range(32)]
        assert len(await h.kubelet.preferred(NPU, ids, [], 4)) == 4
        assert await h.kubelet.preferred(NPU, ids[:2], [], 3) == []  # more than available
        samples = await scrape(port)
        assert value(samples, "preferred_allocation_requests_total", resource=NPU,
                     result="ok") == 1  # fmt: skip
        assert value(samples, "preferred_allocation_requests_total", resource=NPU,
                     result="fallback") == 1  # fmt: skip
        assert total(samples, "preferred_allocation_duration_seconds_count") == 2
        assert total(samples, "preferred_allocation_capped_total") == 0


async def test_a_stalled_read_is_counted_once() -> None:
    async with launch("rebel-4", extra_args=ON) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        before = await scrape(port)
        assert value(before, "host_reads_stalled_total") == 0
        status = h.node.status_path("rbln3")
        make_fifo(status)
        try:
            await h.daemon.await_log(STALLED, path=str(status))
            samples = await scrape_until(port, lambda s: value(s, "host_reads_stalled_total") == 1)
            assert value(samples, "devices", resource=NPU, health="Healthy") == 4
            # More scans with the read still stuck: still one stall.
            scans = value(samples, "scan_duration_seconds_count", result="ok") or 0
            later = await scrape_until(
                port, lambda s: (value(s, "scan_duration_seconds_count", result="ok") or 0)
                >= scans + 3,
            )  # fmt: skip
            assert value(later, "host_reads_stalled_total") == 1
            ident = {"resource": NPU, "device": "rbln3",
                     "pci_bus_id": h.node.layout.device("rbln3").bus_id,
                     "numa_node": str(h.node.layout.device("rbln3").numa)}  # fmt: skip
            assert value(later, "device_status", **ident, status="UNREADABLE") == 1
        finally:
            release_fifo(status)


async def test_a_kubelet_restart_moves_restarts_registrations_and_streams() -> None:
    async with running("rebel-4", extra_args=ON, level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        first = await scrape_until(
            port, lambda s: value(s, "list_and_watch_streams", resource=NPU) == 1
        )
        assert value(first, "kubelet_restarts_total") == 0
        assert value(first, "kubelet_registrations_total", resource=NPU, result="ok") == 1
        await h.kubelet.restart()
        await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and len(v.devices) == 4)
        after = await scrape_until(
            port,
            lambda s: (
                value(s, "kubelet_registrations_total", resource=NPU, result="ok") == 2
                and value(s, "list_and_watch_streams", resource=NPU) == 1
            ),
        )
        assert value(after, "kubelet_restarts_total") == 1
        # A restart re-creates the plugins, but the kubelet was offered the same devices.
        assert total(after, "devices_appeared_total") == 0
        assert total(after, "devices_disappeared_total") == 0


async def test_discovery_failures_and_inventory_changes_are_counted() -> None:
    async with running("rebel-4", extra_args=ON, level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        h.node.remove_device("rbln3")
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 3)
        samples = await scrape_until(
            port, lambda s: value(s, "devices_disappeared_total", resource=NPU) == 1
        )
        assert value(samples, "discovery_failures_total") == 0
        h.node.inject_fault(Fault("error", commands=("list",)))
        failed = await scrape_until(
            port, lambda s: (value(s, "discovery_failures_total") or 0) >= 1
        )
        assert total(failed, "rbln_smi_calls_total", subcommand="list", result="error") >= 1
        assert total(failed, "scan_duration_seconds_count", result="discovery_failed") >= 1
        # Zero devices while discovery fails: the resource's series go with its plugin.
        gone = await scrape_until(
            port, lambda s: value(s, "devices_disappeared_total", resource=NPU) == 4
        )
        await h.daemon.await_log("Stopped device plugin for absent resource", resourceName=NPU)
        gone = await scrape(port)
        # The stopped resource has no device series at all (not series at 0).
        assert value(gone, "devices", resource=NPU, health="Healthy") is None
        assert total(gone, "device_status") == 0
        assert value(gone, "devices_disappeared_total", resource=NPU) == 4


async def test_the_otlp_receiver_gets_the_same_data_points_as_the_scrape() -> None:
    async with (
        metrics_receiver() as (receiver, port),
        running(
            "rebel-4", interval="1h", level="info",
            extra_args=[*ON, "--otlp-endpoint", f"127.0.0.1:{port}", "--metrics-otlp",
                        "--metrics-export-interval", "1s", "--node-name", "node-a"],
        ) as h,
    ):  # fmt: skip
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        scrape_port = await metrics_port(h.daemon)
        (enabled,) = await h.daemon.await_log("OTLP metrics enabled")
        assert enabled["endpoint"] == f"127.0.0.1:{port}"
        await h.kubelet.allocate(NPU, [["rbln0", "rbln1"]])
        await rejected(h, NPU, [["ghost"]])
        # The scan interval is an hour: nothing changes between the scrape and the next push.
        scraped = await scrape_until(
            scrape_port, lambda s: total(s, "allocate_requests_total") == 2
        )
        pushed, resource = otlp_samples(await receiver.next_export())
        # The scrape has two things more: target_info (the resource, sent beside the
        # points in OTLP) and the histograms at 0 that have no data point in the SDK yet.
        target = {k: v for k, v in scraped.items() if k[0] == "target_info"}
        assert target == {
            (
                "target_info",
                tuple(sorted((key.replace(".", "_"), str(val)) for key, val in resource.items())),
            ): 1.0
        }
        empty = _empty_histogram_series(scraped)
        assert empty and not empty & set(pushed)
        assert pushed == {k: v for k, v in scraped.items() if k not in empty and k not in target}
        assert resource["service.name"] == "rbln-device-plugin"
        assert resource["k8s.node.name"] == "node-a"
        assert any(name == P + "device_status" for name, _ in pushed)


async def test_http_answers_only_metrics() -> None:
    from .metrics_helpers import http_get

    async with running("rebel-4", extra_args=ON, level="info") as h:
        port = await metrics_port(h.daemon)
        status, _, _ = await http_get(port, "/nothing")
        assert status == 404
        status, _, body = await http_get(port, "/metrics?x=1")
        assert status == 200 and "rbln_device_plugin_build_info" in body
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 405")
        writer.close()


def _empty_histogram_series(samples: Samples) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The _bucket, _sum and _count samples of each histogram series whose _count is 0."""
    empty = {
        (name.removesuffix("_count"), labels)
        for (name, labels), v in samples.items()
        if name.endswith("_count") and v == 0
    }
    out = set()
    for name, labels in samples:
        base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        if (base, tuple(pair for pair in labels if pair[0] != "le")) in empty:
            out.add((name, labels))
    return out


def _version() -> str:
    from rbln_device_plugin import __version__

    return __version__
