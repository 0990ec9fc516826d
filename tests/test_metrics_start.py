"""Metrics from the daemon's first moment, through the real daemon on the simulated node:
a waiting instance is visible (``instance_state``), a taken port costs one record and a
background retry, and every known labelled series exists at 0 once a plugin starts."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
from pathlib import Path

import pytest

from rbln_device_plugin.runtime.instancelock import LOCK_DIR, LOCK_NAME
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import materialize, short_tempdir

from .daemon_process import DaemonProcess
from .metrics_helpers import P, Samples, metrics_port, scrape, scrape_until, value
from .simnode import running
from .test_instance import held_by_us

NPU = "rebellions.ai/npu"
ON = ["--metrics-port", "0"]
METRICS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def state(samples: Samples) -> str | None:
    (current,) = [dict(k[1])["state"] for k, v in samples.items()
                  if k[0] == P + "instance_state" and v == 1]  # fmt: skip
    return current


async def test_a_waiting_instance_serves_metrics_and_says_what_it_waits_for() -> None:
    root = short_tempdir()
    node = materialize(preset("rebel-4"), root)
    kubelet_dir = node.kubelet_dir
    shutil.rmtree(kubelet_dir)  # not (yet) a node: the daemon waits for the directory
    daemon = DaemonProcess([*node.daemon_args("300ms"), *ON], level="info")
    try:
        port = await metrics_port(daemon)
        samples = await scrape(port)
        assert state(samples) == m.STATE_WAITING_FOR_KUBELET_DIR
        assert {dict(k[1])["state"] for k in samples if k[0] == P + "instance_state"} == set(
            m.INSTANCE_STATES
        )
        kubelet_dir.mkdir()
        with held_by_us(kubelet_dir / LOCK_DIR / LOCK_NAME):  # another instance serves
            await scrape_until(port, lambda s: state(s) == m.STATE_WAITING_FOR_LOCK)
            await asyncio.sleep(0.5)
            assert state(await scrape(port)) == m.STATE_WAITING_FOR_LOCK
        await scrape_until(port, lambda s: state(s) == m.STATE_SERVING)
    finally:
        code = await asyncio.to_thread(daemon.stop, timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    assert code == 0


@pytest.mark.slow  # waits out a 5 s retry
async def test_a_taken_port_is_one_record_and_a_retry_never_an_exit() -> None:
    holder = socket.socket(socket.AF_INET6)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    holder.bind(("::", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        async with running("rebel-4", extra_args=["--metrics-port", str(port)],
                           level="info") as h:  # fmt: skip
            (taken,) = await h.daemon.await_log("Metrics port in use; retrying in the background")
            assert taken["level"] == "warn" and taken["port"] == port
            await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)  # serves regardless
            await asyncio.sleep(6)  # past one retry: still one record, still running
            assert len(h.daemon.find("Metrics port in use; retrying in the background")) == 1
            assert h.daemon.proc.poll() is None
            holder.close()
            (started,) = await h.daemon.await_log("Started metrics endpoint", timeout=15)
            assert started["port"] == port
            assert value(await scrape(port), "build_info", version=_version()) == 1
    finally:
        holder.close()


def _readme_series_counts() -> tuple[int, int]:
    """The metrics page's stated counts: series per resource, and per node besides them."""
    text = METRICS_PAGE.read_text()
    per_resource = re.search(r"(\d+) series per resource", text)
    per_node = re.search(r"(\d+) series per node", text)
    assert per_resource and per_node, "docs/metrics.md states the series counts"
    return int(per_resource.group(1)), int(per_node.group(1))


async def test_every_known_series_exists_at_0_when_the_plugin_starts() -> None:
    async with running("rebel-4", extra_args=ON, level="info", interval="1h") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        samples = await scrape(port)
        for result in m.ALLOCATE_RESULTS:
            assert value(samples, "allocate_requests_total", resource=NPU, result=result) == 0
        for result in m.PREFERRED_RESULTS:
            assert value(samples, "preferred_allocation_requests_total", resource=NPU,
                         result=result) == 0  # fmt: skip
        assert value(samples, "kubelet_registrations_total", resource=NPU, result="failed") == 0
        assert value(samples, "kubelet_registrations_total", resource=NPU, result="ok") == 1
        for name in ("preferred_allocation_capped_total", "devices_appeared_total",
                     "devices_disappeared_total"):  # fmt: skip
            assert value(samples, name, resource=NPU) == 0
        for subcommand in m.SMI_SUBCOMMANDS:
            for result in m.SMI_RESULTS:
                got = value(samples, "rbln_smi_calls_total", subcommand=subcommand, result=result)
                assert got is not None and (got == 0 or (subcommand, result) == ("list", "ok"))
        # Histograms of the success class are there at 0 before their first observation.
        assert value(samples, "allocate_duration_seconds_count", resource=NPU, result="ok") == 0
        assert value(samples, "allocate_duration_seconds_bucket", resource=NPU, result="ok",
                     le="+Inf") == 0  # fmt: skip
        assert value(samples, "rsd_lock_wait_seconds_count", result="timeout") == 0
        assert value(samples, "scan_duration_seconds_count", result="discovery_failed") == 0
        # The stated counts: one resource, four devices, nothing else happened.
        per_resource, per_node = _readme_series_counts()
        resource_series = sum(1 for k in samples if dict(k[1]).get("resource") == NPU)
        device_series = 2 * 4  # device_healthy and device_status, one each per device
        assert resource_series - device_series == per_resource
        assert len(samples) - resource_series == per_node


def _version() -> str:
    from rbln_device_plugin import __version__

    return __version__


async def test_a_waiting_instance_stops_on_a_signal_with_its_endpoint() -> None:
    root = short_tempdir()
    node = materialize(preset("rebel-4"), root)
    shutil.rmtree(node.kubelet_dir)
    daemon = DaemonProcess([*node.daemon_args("300ms"), *ON], level="info")
    try:
        port = await metrics_port(daemon)
        assert state(await scrape(port)) == m.STATE_WAITING_FOR_KUBELET_DIR
        code = await asyncio.to_thread(daemon.stop, timeout=10)
    finally:
        daemon.kill()
        shutil.rmtree(root, ignore_errors=True)
    assert code == 0
    (done,) = daemon.find("Shutdown complete")
    assert done["signal"] == "SIGTERM"
    assert not [r for r in daemon.records if r.get("level") in ("error", "fatal")]
