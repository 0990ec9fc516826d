"""A real Prometheus (Debian's package) scraping the real daemon on the simulated node.

It scrapes every 0.5 s. The test waits until Prometheus has stored the 0 samples of the
labelled series before it makes anything happen (a fault made earlier would hide what
this is about: a counter that first appears at 1 shows no ``increase()``), then faults a
device, has an Allocate of it refused, and evaluates every PromQL query of docs/metrics.md
through the HTTP API. The alerts of ``deployments/prometheus/rules.yaml``
(with their ``for:`` windows shortened, as the chart's ``forOverride`` does) are loaded
too: "an NPU is unhealthy" and "allocations are failing" must reach ``firing``.
``promtool check metrics`` must find nothing to say about a scrape of each preset.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin_sim.layout import PRESETS

from .metrics_helpers import http_get, metrics_port
from .prometheus_server import RULES, binary, prometheus, promtool
from .simnode import rejected, running

NPU = "rebellions.ai/npu"
METRICS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
P = "rbln_device_plugin_"
Result = list[dict[str, Any]]


def readme_queries() -> list[str]:
    """The PromQL queries of docs/metrics.md, comments left out."""
    section = METRICS_PAGE.read_text()
    queries: list[str] = []
    for block in re.findall(r"```promql\n(.*?)```", section, flags=re.S):
        current: list[str] = []
        for line in [*block.splitlines(), ""]:
            if line.strip() and not line.lstrip().startswith("#"):
                current.append(line.strip())
            elif current:
                queries.append(" ".join(current))
                current = []
    return queries


def labels(result: Result) -> list[dict[str, str]]:
    return [{k: v for k, v in item["metric"].items() if k not in ("instance", "job", "__name__")}
            for item in result]  # fmt: skip


def one(result: Result) -> tuple[dict[str, str], float]:
    assert len(result) == 1, result
    return labels(result)[0], float(result[0]["value"][1])


def shortened_rules(tmp: Path) -> Path:
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest.mark.slow  # a Prometheus server and a daemon, about 15 s
async def test_prometheus_answers_the_readmes_queries_and_fires_the_alerts(
    tmp_path: Path,
) -> None:
    binary("prometheus")
    async with running("rebel-4", extra_args=["--metrics-port", "0"], level="info") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        port = await metrics_port(h.daemon)
        with prometheus(tmp_path, port, [shortened_rules(tmp_path)]) as prom:
            # The 0 samples are stored before anything happens.
            for promql in (
                f'{P}allocate_requests_total{{result="{m.ALLOCATE_UNHEALTHY}"}} == 0',
                f'{P}kubelet_registrations_total{{result="failed"}} == 0',
                f'{P}rbln_smi_calls_total{{subcommand="group_create",result="error"}} == 0',
                f'{P}preferred_allocation_requests_total{{result="fallback"}} == 0',
                f'{P}allocate_duration_seconds_count{{result="ok"}} == 0',
            ):
                await prom.wait_for(promql, lambda r: len(r) == 1)
            assert await prom.query(f"{P}device_healthy == 0") == []

            h.node.set_status("rbln1", 4)  # FAULT
            await h.kubelet.wait_for(NPU, lambda v: v.health("rbln1") == "Unhealthy")
            message = await rejected(h, NPU, [["rbln1"]])
            assert "unhealthy devices requested" in message
            await h.kubelet.allocate(NPU, [["rbln0"]])

            rbln1 = h.node.layout.device("rbln1")
            faulted = {"resource": NPU, "device": "rbln1", "pci_bus_id": rbln1.bus_id,
                       "numa_node": str(rbln1.numa), "node": "node-a"}  # fmt: skip

            def unhealthy(result: Result) -> None:
                assert labels(result) == [faulted]

            def not_ready(result: Result) -> None:
                assert labels(result) == [{**faulted, "status": "FAULT"}]

            def failing(result: Result) -> None:
                got, increase = one(result)
                assert got == {"node": "node-a", "resource": NPU, "result": "unhealthy_device"}
                assert increase > 0

            def latency(result: Result) -> None:
                got, p99 = one(result)
                assert got == {"node": "node-a", "resource": NPU}
                assert 0 < p99 <= 10

            def waiting(result: Result) -> None:
                assert result == []

            expected: list[Callable[[Result], None]] = [
                unhealthy, not_ready, failing, latency, waiting,
            ]  # fmt: skip
            queries = readme_queries()
            assert len(queries) == len(expected), queries
            for promql, check in zip(queries, expected, strict=True):
                result = await prom.wait_for(promql, lambda r, c=check: _holds(c, r))
                check(result)

            firing = await _wait_firing(prom, {"RblnNpuUnhealthy", "RblnAllocationsFailing"})
            assert firing["RblnNpuUnhealthy"]["labels"]["device"] == "rbln1"
            assert firing["RblnNpuUnhealthy"]["labels"]["severity"] == "warning"
            assert firing["RblnAllocationsFailing"]["labels"]["result"] == "unhealthy_device"
            assert "rbln1" in firing["RblnNpuUnhealthy"]["annotations"]["summary"]
            # The daemon registered and scans: those alerts stay quiet.
            assert not {
                "RblnPluginNotRegistered",
                "RblnScanStuck",
                "RblnPluginWaiting",
                "RblnCdiSpecMissing",
            } & {a["labels"]["alertname"] for a in await prom.alerts()}


def _holds(check: Callable[[Result], None], result: Result) -> bool:
    try:
        check(result)
    except AssertionError:
        return False
    return True


async def _wait_firing(prom: Any, names: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        alerts = await prom.alerts()
        firing = {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}
        if names <= set(firing):
            return firing
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"alerts never fired: {alerts}\n{prom.tail()}")
        await asyncio.sleep(0.25)


@pytest.mark.parametrize("layout", sorted(PRESETS))
async def test_promtool_finds_nothing_to_say_about_a_scrape(layout: str) -> None:
    binary("promtool")
    async with running(layout, extra_args=["--metrics-port", "0"], level="info") as h:
        port = await metrics_port(h.daemon)
        await h.daemon.await_log("Registered device plugin with kubelet", timeout=30)
        status, _, body = await http_get(port)
        assert status == 200
    assert "rbln_device_plugin_device_status" in body
    done = await asyncio.to_thread(promtool, "check", "metrics", stdin=body)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )
