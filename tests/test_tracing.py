"""Allocation traces through a real OTLP/gRPC receiver; tracing stays best effort."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from rbln_device_plugin.kubelet.allocate import MAX_UNWORKED_CONTAINER_SPANS
from rbln_device_plugin.telemetry.otlp import EndpointError, parse_endpoint
from rbln_device_plugin_sim.state import Fault

from .otlp_receiver import ExportKeeper, serving
from .simnode import running

NPU = "rebellions.ai/npu"
ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR
# The README: exit within 5 s of SIGTERM, and tracing gets its own 5 s flush bound. A
# shutdown past both has hung on the collector; a loaded machine needs some room too.
SHUTDOWN_GUARD_S = 15.0


class Receiver(ExportKeeper, trace_service_pb2_grpc.TraceServiceServicer):
    response = trace_service_pb2.ExportTraceServiceResponse

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope.spans)
        return out

    async def wait_spans(self, count: int, timeout: float = 10) -> list[tuple[dict[str, Any], Any]]:
        await self.wait_for(lambda: len(self.spans()) >= count, timeout)
        return self.spans()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


def attrs(span: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@asynccontextmanager
async def receiver(hang: bool = False) -> AsyncIterator[tuple[Receiver, int]]:
    servicer = Receiver(hang)
    async with serving(servicer, trace_service_pb2_grpc.add_TraceServiceServicer_to_server) as port:
        yield servicer, port


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("raw", "target", "insecure"),
    [("collector:4317", "collector:4317", True),
     ("10.0.0.1:4317", "10.0.0.1:4317", True),
     ("https://collector:4317", "https://collector:4317", False),
     ("http://collector:4317", "http://collector:4317", True)],
)  # fmt: skip
def test_endpoint_forms(raw: str, target: str, insecure: bool) -> None:
    endpoint = parse_endpoint(raw)
    assert (endpoint.target, endpoint.insecure) == (target, insecure)


@pytest.mark.parametrize("raw", ["collector", "http://", "ftp://x:1", "host:99999", "a b:1", ":1"])
def test_malformed_endpoints_are_rejected(raw: str) -> None:
    with pytest.raises(EndpointError):
        parse_endpoint(raw)


async def test_allocate_spans_reach_the_collector_with_attributes_and_resource() -> None:
    async with (
        receiver() as (collector, port),
        running(
            "atom-max-8", extra_args=["--otlp-endpoint", f"127.0.0.1:{port}",
                                      "--node-name", "node-a"]
        ) as h,
    ):  # fmt: skip
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        (enabled,) = await h.daemon.await_log("Distributed tracing enabled")
        assert enabled["endpoint"] == f"127.0.0.1:{port}"
        await h.kubelet.allocate(NPU, [["rbln1", "rbln0"], ["rbln4"]])
        spans = await collector.wait_spans(3)
        by_name: dict[str, list[Any]] = {}
        for resource, span in spans:
            assert resource["service.name"] == "rbln-device-plugin"
            assert resource["k8s.node.name"] == "node-a"
            assert resource["service.version"]
            by_name.setdefault(span.name, []).append(span)
        (parent,) = by_name["Allocate"]
        children = by_name["allocateContainer"]
        assert len(children) == 2
        assert all(c.parent_span_id == parent.span_id for c in children)
        assert all(c.trace_id == parent.trace_id for c in children)
        first = attrs(children[0])
        assert first["rbln.resource_name"] == NPU
        assert first["rbln.device.ids"] == ["rbln1", "rbln0"]
        assert first["rbln.device.count"] == 2
        layout = h.node.layout
        assert first["rbln.device.bus_ids"] == sorted(
            [layout.device("rbln0").bus_id, layout.device("rbln1").bus_id]
        )
        assert first["rbln.rsd.host_path"].startswith(str(h.node.dev_root / "rsd"))
        assert parent.status.code != ERROR


def _exception_messages(span: Any) -> list[str]:
    return [
        str(attrs(event).get("exception.message", ""))
        for event in span.events
        if event.name == "exception"
    ]


async def test_failed_allocations_produce_error_spans() -> None:
    async with (
        receiver() as (collector, port),
        running("rebel-4", extra_args=["--otlp-endpoint", f"127.0.0.1:{port}"]) as h,
    ):
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.inject_fault(Fault("error", commands=("group-create",)))
        with pytest.raises(grpc.aio.AioRpcError):
            await h.kubelet.allocate(NPU, [["rbln0"], ["rbln2", "rbln3"]])
        spans = await collector.wait_spans(3)
        (parent,) = [span for _, span in spans if span.name == "Allocate"]
        failed, skipped = [span for _, span in spans if span.name == "allocateContainer"]
        assert parent.status.code == ERROR and _exception_messages(parent)
        assert failed.parent_span_id == skipped.parent_span_id == parent.span_id
        assert attrs(failed)["rbln.device.ids"] == ["rbln0"]
        assert failed.status.code == ERROR
        assert any("injected failure" in m for m in _exception_messages(failed))
        # The second container never reached the host: still traced, as not attempted.
        assert attrs(skipped)["rbln.device.ids"] == ["rbln2", "rbln3"]
        assert attrs(skipped)["rbln.device.bus_ids"] == sorted(
            h.node.layout.device(name).bus_id for name in ("rbln2", "rbln3")
        )
        assert skipped.status.code == ERROR
        assert "not attempted: container 0 failed" in skipped.status.message
        assert "rbln.rsd.host_path" not in attrs(skipped)


async def test_rejected_requests_trace_every_container() -> None:
    async with (
        receiver() as (collector, port),
        running("rebel-4", extra_args=["--otlp-endpoint", f"127.0.0.1:{port}"]) as h,
    ):
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln1", 4)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln1") == "Unhealthy")
        requests = {
            "unknown": [["ghost"]],
            "empty": [["rbln0"], []],
            "unhealthy": [["rbln2"], ["rbln0", "rbln1"]],
        }
        for containers in requests.values():
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await h.kubelet.allocate(NPU, containers)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        spans = [span for _, span in await collector.wait_spans(3 + 5)]
        parents = [span for span in spans if span.name == "Allocate"]
        assert len(parents) == 3
        bus = {name: h.node.layout.device(name).bus_id for name in ("rbln0", "rbln1", "rbln2")}
        traces: dict[str, list[dict[str, Any]]] = {}
        for (label, containers), parent in zip(
            requests.items(), sorted(parents, key=lambda p: p.start_time_unix_nano), strict=True
        ):
            assert parent.status.code == ERROR, label
            (rejection,) = _exception_messages(parent)
            children = sorted(
                (s for s in spans if s.parent_span_id == parent.span_id),
                key=lambda s: s.start_time_unix_nano,
            )
            assert [c.name for c in children] == ["allocateContainer"] * len(containers), label
            for child, ids in zip(children, containers, strict=True):
                assert child.trace_id == parent.trace_id
                assert child.status.code == ERROR, label
                assert _exception_messages(child) == [rejection], label
                assert attrs(child)["rbln.resource_name"] == NPU
                assert attrs(child).get("rbln.device.ids", []) == ids
                assert attrs(child)["rbln.device.count"] == len(ids)
                assert "rbln.rsd.host_path" not in attrs(child)
            traces[label] = [attrs(child) for child in children]
        assert "rbln.device.bus_ids" not in traces["unknown"][0]  # ghost has no bus ID
        assert traces["empty"][0]["rbln.device.bus_ids"] == [bus["rbln0"]]
        assert "rbln.device.bus_ids" not in traces["empty"][1]
        assert traces["unhealthy"][1]["rbln.device.bus_ids"] == sorted([bus["rbln0"], bus["rbln1"]])
        assert traces["unhealthy"][0]["rbln.device.bus_ids"] == [bus["rbln2"]]


async def test_malformed_endpoint_keeps_allocations_working() -> None:
    async with running("rebel-4", extra_args=["--otlp-endpoint", "http://"]) as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        (failed,) = await h.daemon.await_log(
            "Tracing setup failed; continuing without distributed tracing"
        )
        assert failed["level"] == "warn" and failed["err"]
        response = await h.kubelet.allocate(NPU, [["rbln0"]])
        assert response.container_responses[0].devices[0].container_path == "/dev/rsd0"
        code = await asyncio.to_thread(h.daemon.stop, timeout=SHUTDOWN_GUARD_S)
        assert code == 0


@pytest.mark.slow  # the exporter's 5 s limit runs out during the test and at shutdown
@pytest.mark.parametrize("mode", ["unreachable", "hanging"])
async def test_broken_collector_never_delays_allocations_or_shutdown(mode: str) -> None:
    async with receiver(hang=True) as (collector, hanging_port):
        port = free_port() if mode == "unreachable" else hanging_port
        async with running("rebel-4", extra_args=["--otlp-endpoint", f"127.0.0.1:{port}"]) as h:
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            await h.kubelet.allocate(NPU, [["rbln0"]])  # spans to export
            if mode == "hanging":
                # An export of those spans is now stuck in the collector. An allocation
                # answers while it stays stuck: it never waits for the exporter (which
                # gives up on a call only after 5 s).
                stuck = await collector.wait_in_flight()
                response = await h.kubelet.allocate(NPU, [["rbln1"]])
                assert len(response.container_responses) == 1
                assert stuck & collector.in_flight, "the allocation waited for the export"
            for index in range(4):
                response = await h.kubelet.allocate(NPU, [[f"rbln{index}"]])
                assert len(response.container_responses) == 1
            durations = [r["durationMs"] for r in h.daemon.find("Completed container allocation")]
            print(f"{mode} collector: allocation durations (ms): {durations}")
            code = await asyncio.to_thread(h.daemon.stop, timeout=SHUTDOWN_GUARD_S)
            assert code == 0
            otel = [r for r in h.daemon.records if r.get("component") == "otel"]
            assert all(r["level"] in ("warn", "debug") for r in otel)
            assert len([r for r in otel if r["level"] == "warn"]) <= 5


async def test_disabled_tracing_logs_once_and_starts_no_exporter() -> None:
    async with running("rebel-4", level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        records = await h.daemon.await_log(
            "Distributed tracing disabled; no OTLP endpoint configured"
        )
        assert len(records) == 1
        threads = await asyncio.to_thread(_thread_names, h.daemon.proc.pid)
        assert not any("OtelBatch" in name or "otel" in name.lower() for name in threads)


async def test_traces_switched_off_leave_the_endpoint_to_metrics() -> None:
    """OTEL_TRACES_EXPORTER=none: the collector gets metrics and not one span, even from
    the flush at shutdown."""
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

    from .metrics_helpers import MetricsReceiver, otlp_samples, total

    traces, metrics = Receiver(), MetricsReceiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(traces, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(metrics, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with running(
            "rebel-4", level="info", env={"OTEL_TRACES_EXPORTER": "none"},
            extra_args=["--otlp-endpoint", f"127.0.0.1:{port}", "--metrics-otlp",
                        "--metrics-export-interval", "1s"],
        ) as h:  # fmt: skip
            (off,) = await h.daemon.await_log("Distributed tracing disabled; traces switched off")
            assert off["setting"] == (
                "OTEL_TRACES_EXPORTER (environment; the flag is --otel-traces-exporter)"
            )
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            await h.kubelet.allocate(NPU, [["rbln0"]])
            await h.daemon.await_log("Completed container allocation")

            def counted() -> bool:
                return any(
                    total(otlp_samples(r)[0], "allocate_requests_total") == 1
                    for r in metrics.requests
                )

            await metrics.wait_for(counted, 30)
            assert await asyncio.to_thread(h.daemon.stop, timeout=SHUTDOWN_GUARD_S) == 0
        assert traces.calls == 0 and traces.requests == []
    finally:
        await server.stop(0)


def _thread_names(pid: int) -> list[str]:
    import os

    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as comm:
            names.append(comm.read().strip())
    return names


async def test_a_flood_of_rejected_containers_gets_a_bounded_number_of_spans() -> None:
    async with (
        receiver() as (collector, port),
        running("rebel-4", extra_args=["--otlp-endpoint", f"127.0.0.1:{port}"]) as h,
    ):
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        with pytest.raises(grpc.aio.AioRpcError):
            await h.kubelet.allocate(NPU, [[]] * 5000)
        # A marker: one more allocation, one Allocate and one allocateContainer span. Spans
        # are exported in the order they ended, so once the marker's parent has arrived,
        # every span of the flood has too.
        await h.kubelet.allocate(NPU, [["rbln0"]])

        def marker_arrived() -> bool:
            return any(
                s.name == "Allocate" and s.status.code != ERROR for _, s in collector.spans()
            )

        while not marker_arrived():
            await collector.wait_spans(len(collector.spans()) + 1)
        names = [span.name for _, span in collector.spans()]
        assert names.count("Allocate") == 2
        assert names.count("allocateContainer") == MAX_UNWORKED_CONTAINER_SPANS + 1
