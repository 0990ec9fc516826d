"""Scraping the daemon's metrics endpoint and reading it with Prometheus' own parser, and a
real OTLP metrics receiver (the collector's gRPC service from opentelemetry-proto)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from prometheus_client.parser import text_string_to_metric_families

from .daemon_process import DaemonProcess
from .otlp_receiver import ExportKeeper, serving

# (sample name, sorted label pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
P = "rbln_device_plugin_"


async def http_get(port: int, path: str = "/metrics") -> tuple[int, dict[str, str], str]:
    """One HTTP/1.1 GET on 127.0.0.1:port: status, headers (lowercase), body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()  # the endpoint closes after each answer
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body.decode()


def parse(text: str) -> Samples:
    """Every sample of an exposition, through prometheus_client's text parser.

    That parser adds ``_total`` to counter samples that lack it, while Prometheus keeps
    names as written: the raw text is checked for it first.
    """
    for line in text.splitlines():
        if line.startswith("# TYPE ") and line.endswith(" counter"):
            name = line.split()[2]
            assert name.endswith("_total"), f"counter without _total: {line}"
            assert all(
                not sample.startswith(name.removesuffix("_total") + "{")
                and not sample.startswith(name.removesuffix("_total") + " ")
                for sample in text.splitlines()
            ), f"counter samples of {name} without _total"
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


async def scrape(port: int) -> Samples:
    status, headers, body = await http_get(port)
    assert status == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(body)


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one series ``name{labels}`` (exact label set), or None."""
    return samples.get((P + name, tuple(sorted(labels.items()))))


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over every series of ``name`` whose labels include ``labels``."""
    return sum(
        v
        for (sample, pairs), v in samples.items()
        if sample == P + name and set(labels.items()) <= set(pairs)
    )


async def scrape_until(
    port: int, ready: Callable[[Samples], bool], timeout: float = 15.0
) -> Samples:
    """Scrape until ``ready`` holds (the event reached the metrics) or fail with the last."""
    deadline = time.monotonic() + timeout
    while True:
        samples = await scrape(port)
        if ready(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never got there; last scrape: {sorted(samples)[:80]}")
        await asyncio.sleep(0.05)


async def metrics_port(daemon: DaemonProcess) -> int:
    (record,) = await daemon.await_log("Started metrics endpoint")
    return int(record["port"])


class MetricsReceiver(ExportKeeper, metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP/gRPC metrics collector endpoint that keeps every export request."""

    response = metrics_service_pb2.ExportMetricsServiceResponse

    async def next_export(self, timeout: float = 15.0) -> Any:
        seen = len(self.requests)
        await self.wait_for(lambda: len(self.requests) > seen, timeout)
        return self.requests[-1]


@asynccontextmanager
async def metrics_receiver(hang: bool = False) -> AsyncIterator[tuple[MetricsReceiver, int]]:
    servicer = MetricsReceiver(hang)
    add = metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server
    async with serving(servicer, add) as port:
        yield servicer, port


def otlp_samples(request: Any) -> tuple[Samples, dict[str, str]]:
    """An OTLP export as Prometheus samples, translated independently of the daemon's code
    for the units the daemon uses (``s`` -> ``_seconds``, annotations and "" add nothing),
    and the resource attributes."""
    samples: Samples = {}
    resource: dict[str, str] = {}
    for resource_metrics in request.resource_metrics:
        resource.update({a.key: a.value.string_value for a in resource_metrics.resource.attributes})
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                base = metric.name.replace(".", "_") + ("_seconds" if metric.unit == "s" else "")
                kind = metric.WhichOneof("data")
                if kind == "histogram":
                    for point in metric.histogram.data_points:
                        labels = _labels(point.attributes)
                        running = 0
                        bounds = [*point.explicit_bounds, float("inf")]
                        for bound, count in zip(bounds, point.bucket_counts, strict=True):
                            running += count
                            le = "+Inf" if bound == float("inf") else repr(float(bound))
                            key = tuple(sorted([*labels, ("le", le)]))
                            samples[(base + "_bucket", key)] = running
                        samples[(base + "_sum", tuple(sorted(labels)))] = point.sum
                        samples[(base + "_count", tuple(sorted(labels)))] = point.count
                    continue
                data = getattr(metric, kind)
                name = base + "_total" if kind == "sum" and data.is_monotonic else base
                for point in data.data_points:
                    number = point.as_int if point.HasField("as_int") else point.as_double
                    samples[(name, tuple(sorted(_labels(point.attributes))))] = number
    return samples, resource


def _labels(attributes: Any) -> list[tuple[str, str]]:
    out = []
    for attribute in attributes:
        kind = attribute.value.WhichOneof("value")
        out.append((attribute.key, str(getattr(attribute.value, kind))))
    return out
