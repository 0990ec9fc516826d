"""Metrics never cost the node its device plugin: a broken collector, a hostile scraper,
and a daemon with metrics off that loads nothing new."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from rbln_device_plugin import __version__

from .metrics_helpers import metrics_port, metrics_receiver, scrape, value
from .probes import health, health_port
from .simnode import running
from .test_tracing import free_port

NPU = "rebellions.ai/npu"
HEALTH = ["--healthcheck-port", "0"]


@pytest.mark.slow  # the exporter's 5 s limit runs out during the test and at shutdown
@pytest.mark.parametrize("mode", ["unreachable", "hanging"])
async def test_a_broken_collector_never_delays_allocations_or_the_probe(mode: str) -> None:
    async with metrics_receiver(hang=True) as (collector, hanging_port):
        port = free_port() if mode == "unreachable" else hanging_port
        args = [*HEALTH, "--metrics-port", "0", "--otlp-endpoint", f"127.0.0.1:{port}",
                "--metrics-otlp", "--metrics-export-interval", "1s"]  # fmt: skip
        async with running("rebel-4", extra_args=args, level="info") as h:
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            probe = await health_port(h.daemon)
            scrape_port = await metrics_port(h.daemon)
            if mode == "hanging":
                # An export that has just started to hang (the exporter gives up on it only
                # after its own 5 s timeout): an allocation and the probe answer while it
                # still hangs, so neither waited for it.
                stuck = await collector.wait_in_flight(newer_than=collector.calls - 1)
                response = await h.kubelet.allocate(NPU, [["rbln3"]])
                assert len(response.container_responses) == 1
                assert await health(probe) == "SERVING"
                assert stuck & collector.in_flight, "an answer waited for the export"
            for index in range(6 if mode == "unreachable" else 5):
                response = await h.kubelet.allocate(NPU, [[f"rbln{index % 4}"]])
                assert len(response.container_responses) == 1
                assert await health(probe) == "SERVING"
            samples = await scrape(scrape_port)
            assert value(samples, "allocate_requests_total", resource=NPU, result="ok") == 6
            # A hanging collector may still hold an export at exit: the daemon does not wait
            # for it beyond its flush bound (5 s), well inside the kubelet's patience.
            code = await asyncio.to_thread(h.daemon.stop, timeout=10)
            assert code == 0


def _idle(port: int, count: int) -> list[socket.socket]:
    """Connections that send nothing at all."""
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]


def _unread(port: int, count: int) -> list[socket.socket]:
    """Connections that ask for the metrics and never read the answer."""
    out = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        out.append(sock)
    return out


async def test_a_scraper_that_opens_many_connections_and_reads_nothing_blocks_nothing() -> None:
    async with running("atom-max-8", extra_args=[*HEALTH, "--metrics-port", "0"],
                       level="info") as h:  # fmt: skip
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        probe = await health_port(h.daemon)
        port = await metrics_port(h.daemon)
        await scrape(port)
        threads_before = len(os.listdir(f"/proc/{h.daemon.proc.pid}/task"))
        hostile = _idle(port, 200) + _unread(port, 40) + _idle(port, 200)
        try:
            # Everything the kubelet needs still answers while those sockets stay open.
            assert await health(probe) == "SERVING"
            response = await h.kubelet.allocate(NPU, [["rbln0", "rbln1"]])
            assert len(response.container_responses) == 1
            ids = [f"rbln{i}" for i in range(32)]
            assert len(await h.kubelet.preferred(NPU, ids, [], 4)) == 4
            # A real scraper still gets through: idle sockets are evicted, oldest first.
            samples = await scrape(port)
            assert value(samples, "allocate_requests_total", resource=NPU, result="ok") == 1
            # No thread per connection.
            threads_after = len(os.listdir(f"/proc/{h.daemon.proc.pid}/task"))
            assert threads_after <= threads_before + 2, (threads_before, threads_after)
        finally:
            for sock in hostile:
                sock.close()
        assert h.daemon.proc.poll() is None


_MODULES_HOOK = """
import atexit, json, os, sys
def _dump():
    with open(os.environ["RBLN_TEST_MODULES_OUT"], "w") as out:
        json.dump(sorted(sys.modules), out)
atexit.register(_dump)
"""
NEW_MODULES = ("opentelemetry", "rbln_device_plugin.telemetry.otel_metrics",
               "rbln_device_plugin.telemetry.metrics_http",
               "rbln_device_plugin.telemetry.exposition")  # fmt: skip


@pytest.mark.parametrize("metrics_on", [False, True])
async def test_with_metrics_off_the_daemon_loads_nothing_new(metrics_on: bool) -> None:
    site = Path(tempfile.mkdtemp(prefix="rbln-mods-", dir="/tmp"))
    (site / "sitecustomize.py").write_text(_MODULES_HOOK)
    out = site / "modules.json"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "RBLN_TEST_MODULES_OUT": str(out)}  # fmt: skip
    args = ["--metrics-port", "0"] if metrics_on else []
    try:
        async with running("rebel-4", extra_args=args, env=env, level="info") as h:
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
            await h.kubelet.allocate(NPU, [["rbln0"]])
            assert await asyncio.to_thread(h.daemon.stop) == 0
        loaded = json.loads(out.read_text())
    finally:
        shutil.rmtree(site, ignore_errors=True)
    assert "rbln_device_plugin.runtime.daemon" in loaded  # the hook saw the real daemon
    new = [m for m in loaded if m.startswith(NEW_MODULES)]
    if metrics_on:
        assert "rbln_device_plugin.telemetry.metrics_http" in new
    else:
        assert new == []
        (off,) = h.daemon.find("Metrics disabled; no metrics port or OTLP metrics configured")
        assert off["level"] == "info"


async def test_an_unusable_otlp_endpoint_costs_the_push_not_the_prometheus_endpoint() -> None:
    async with running(
        "rebel-4", level="info",
        extra_args=["--metrics-port", "0", "--metrics-otlp",
                    "--otlp-endpoint", "collector"],
    ) as h:  # fmt: skip
        (failed,) = await h.daemon.await_log(
            "OTLP metrics setup failed; continuing without OTLP metrics"
        )
        assert failed["level"] == "warn" and failed["endpoint"] == "collector"
        assert failed["setting"] == "--otlp-endpoint (command line)"
        port = await metrics_port(h.daemon)
        assert value(await scrape(port), "build_info", version=__version__) == 1
        assert h.daemon.find("OTLP metrics enabled") == []
