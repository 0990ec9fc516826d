"""What metrics cost (issue 24), each figure next to a floor taken in the same run.

- idle CPU at the default 5 s scan interval and resident memory after registration, 64
  devices, with metrics off, with the Prometheus endpoint (scraped every 15 s, as a
  Prometheus would), and with OTLP push (every 15 s to a local receiver; the default is
  60 s), each against the idle two-server floor process of ``bench_lean`` measured over
  the same window;
- one scrape of the 64-device endpoint over loopback HTTP, against a request the same
  endpoint answers without rendering (404), and its size;
- a trivial unary call on the plugin socket while scrapes run back to back, against the
  same call with nobody scraping: what a scrape takes from the event loop.

Run: ``python -m bench.bench_metrics [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin_sim.layout import generate

from . import cli
from .bench_daemon import fast_smi, node_with_daemon, rss_mib
from .bench_lean import FloorProcess, cpu_percent, row

NPU = "rebellions.ai/npu"
SCRAPE_EVERY_S = 15.0
Row = dict[str, Any]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@contextlib.asynccontextmanager
async def otlp_sink() -> AsyncIterator[int]:
    """A real OTLP/gRPC metrics receiver that accepts and drops every export."""
    from opentelemetry.proto.collector.metrics.v1 import (
        metrics_service_pb2,
        metrics_service_pb2_grpc,
    )

    class Sink(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
        async def Export(self, request: Any, context: Any) -> Any:
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.aio.server()
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


async def scrape_every(port: int, period: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await http_get(port, "/metrics")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)


async def idle_rows(window: float) -> list[Row]:
    rows: list[Row] = []
    layout = generate(16, 4, 2, name="metrics-64")
    async with otlp_sink() as sink_port:
        port = free_port()
        variants: list[tuple[str, Sequence[str]]] = [
            ("metrics off", []),
            ("Prometheus endpoint, scraped every 15 s", ["--metrics-port", str(port)]),
            ("OTLP push every 15 s", ["--otlp-endpoint", f"127.0.0.1:{sink_port}",
                                      "--metrics-otlp",
                                      "--metrics-export-interval", "15s"]),
        ]  # fmt: skip
        for label, args in variants:
            async with node_with_daemon(layout, "5s", fast_smi, args) as (node, kubelet, proc, _):
                await kubelet.wait_for(NPU, lambda v: len(v.devices) == 64, 30)
                stop = asyncio.Event()
                scraper = None
                if "--metrics-port" in args:
                    await _wait_for_endpoint(port)
                    scraper = asyncio.create_task(scrape_every(port, SCRAPE_EVERY_S, stop))
                floor = FloorProcess(node.root)
                try:
                    await asyncio.sleep(1)
                    daemon_rss, floor_rss = rss_mib(proc.pid), rss_mib(floor.proc.pid)
                    daemon_cpu, floor_cpu = await cpu_percent([proc.pid, floor.proc.pid], window)
                finally:
                    stop.set()
                    if scraper is not None:
                        await scraper
                    floor.stop()
            rows.append(metric_row(f"resident memory after registration, {label}",
                                   daemon_rss, "MiB", floor_rss, "MiB"))  # fmt: skip
            rows.append(metric_row(f"daemon CPU, 5s scans, {window:g} s window, {label}",
                                   daemon_cpu, "%", floor_cpu, "%"))  # fmt: skip
    return rows


async def _wait_for_endpoint(port: int) -> None:
    for _ in range(200):
        with contextlib.suppress(OSError):
            await http_get(port, "/nothing")
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"metrics endpoint on {port} never answered")


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


async def scrape_rows(scrapes: int) -> list[Row]:
    port = free_port()
    layout = generate(16, 4, 2, name="metrics-scrape")
    args = ["--metrics-port", str(port)]
    async with node_with_daemon(layout, "5s", fast_smi, args) as (node, kubelet, _, _):
        await kubelet.wait_for(NPU, lambda v: len(v.devices) == 64, 30)
        await _wait_for_endpoint(port)
        await kubelet.allocate(NPU, [["rbln0"]])  # histograms with data in them
        await http_get(port, "/metrics")
        scrape_ms, floor_ms, size, series = [], [], 0, 0
        for _ in range(scrapes):
            began = time.perf_counter()
            status, body = await http_get(port, "/metrics")
            scrape_ms.append((time.perf_counter() - began) * 1000)
            assert status == 200
            size = len(body)
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            began = time.perf_counter()
            await http_get(port, "/nothing")
            floor_ms.append((time.perf_counter() - began) * 1000)
        median, p99 = _stats(scrape_ms)
        floor, _ = _stats(floor_ms)
        rows = [metric_row("one scrape, 64 devices, loopback HTTP", median, "ms", floor, "ms",
                           f"p99 {p99:.2f} ms; {size / 1024:.0f} KiB, {series} series; "
                           "floor: a 404 from the same endpoint")]  # fmt: skip
        rows += await loop_rows(node, port, scrapes)
    return rows


async def loop_rows(node: Any, port: int, calls: int) -> list[Row]:
    """GetDevicePluginOptions while 4 clients scrape back to back, against nobody scraping."""
    target = f"unix:{node.kubelet_dir / socket_name(NPU)}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)

        async def timed() -> list[float]:
            out = []
            for _ in range(calls):
                began = time.perf_counter()
                await stub.GetDevicePluginOptions(api_pb2.Empty())
                out.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(0.002)
            return out

        quiet, _ = _stats(await timed())
        stop = asyncio.Event()
        scrapers = [asyncio.create_task(scrape_every(port, 0, stop)) for _ in range(4)]
        try:
            busy, busy_p99 = _stats(await timed())
        finally:
            stop.set()
            await asyncio.gather(*scrapers)
    note = f"p99 {busy_p99:.2f} ms; floor: the same call, nobody scraping"
    label = "unary call on the plugin socket while 4 clients scrape nonstop"
    return [metric_row(label, busy, "ms", quiet, "ms", note)]


def metric_row(
    metric: str, value: float, unit: str, floor: float | None = None, floor_unit: str = "",
    extra: str = "",
) -> Row:  # fmt: skip
    out = row(metric, value, unit, floor, floor_unit, extra)
    out["area"] = "metrics"
    return out


async def main_async(quick: bool) -> list[Row]:
    rows = await scrape_rows(50 if quick else 200)
    rows += await idle_rows(15 if quick else 40)
    return rows


def run(quick: bool = False) -> list[Row]:
    return asyncio.run(main_async(quick))


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__)):
        print(f"{r['metric']:<72} {r['value']:>9.3f} {r['unit']:<5} {r['note']}")
