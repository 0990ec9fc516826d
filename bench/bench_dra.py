"""The dra mode's figures: the daemon process in ``--mode=dra`` against a simulated node
and a real kube-apiserver 1.37.2 (``tests/kubeapi.py``), driven as the kubelet drives it
(``tests/dra_kubelet.py``).

- NodePrepareResources and NodeUnprepareResources of one claim (1 and 4 NPUs), next to
  two floors taken in the same run: one trivial gRPC round trip to the same daemon
  (``GetInfo`` on its registration socket) and one GET of the claim from the API server
  (the one read a prepare makes);
- resident memory of the daemon in each mode after the same scans of the same node,
  next to an idle Python process;
- API server requests per scan on an unchanged node: ``apiserver_request_total`` for
  ``resourceslices`` from the API server's own ``/metrics``, before and after a window of
  scans (0 expected), beside the daemon's ``dra_resourceslice_writes_total``.

Skipped, with the reason printed, when the API server binaries are not built (``make
e2e`` builds them). Run: ``python -m bench.bench_dra [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node as KubeNode
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from prometheus_client.parser import text_string_to_metric_families

from rbln_device_plugin.api.pluginregistration.v1 import api_pb2 as reg
from rbln_device_plugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from rbln_device_plugin.dra import names
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.processes import stop_process
from tests import kubeapi
from tests.dra_kubelet import KubeletSide
from tests.test_dra_mode import NODE, allocate

from . import cli
from .bench_daemon import node_with_daemon, recorded_smi_ms, rss_mib, timed_smi, wrapper_cost_ms
from .kubecounts import metrics_text

Row = dict[str, Any]
LAYOUT = "atom-max-8"  # 32 whole NPUs


def _ms(samples: Sequence[float]) -> str:
    return f"median of {len(samples)}; p90 {sorted(samples)[int(0.9 * (len(samples) - 1))]:.2f} ms"


def apiserver_slice_requests(server: kubeapi.ApiServer) -> dict[str, float]:
    """``apiserver_request_total`` for ResourceSlices, summed by verb."""
    text = metrics_text(server)
    by_verb: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("resource") == "resourceslices":
                verb = sample.labels.get("verb", "?")
                by_verb[verb] = by_verb.get(verb, 0.0) + sample.value
    return by_verb


def daemon_metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


@contextlib.asynccontextmanager
async def dra_daemon(
    server: kubeapi.ApiServer, interval: str, metrics_port: int, timed: bool = False
) -> AsyncIterator[tuple[SimNode, subprocess.Popen[bytes], Path]]:
    """The daemon process in dra mode on a fresh simulated node; with ``timed``, its
    rbln-smi records the wall time of each call (``bench_daemon.timed_smi``)."""
    root = short_tempdir("rbln-bench-dra-")
    node = materialize(preset(LAYOUT), root / "node")
    if timed:
        timed_smi(node)
    registry, plugins = root / "plugins_registry", root / "plugins"
    registry.mkdir()
    plugins.mkdir()
    args = [
        *node.daemon_args(interval), "--mode=dra", "--node-name", NODE,
        "--kubeconfig", str(server.kubeconfig), "--metrics-port", str(metrics_port),
        "--kubelet-plugins-registry-path", str(registry),
        "--kubelet-plugins-path", str(plugins),
        "--kubelet-pod-resources-socket=",  # no kubelet here: nothing held the other way
    ]  # fmt: skip
    env = {**os.environ, "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "warning"}
    log = root / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rbln_device_plugin", *args],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        yield node, proc, registry / names.REGISTRATION_SOCKET
    except Exception as exc:
        raise RuntimeError(f"{exc}; the daemon said:\n{log.read_text()[-3000:]}") from exc
    finally:
        stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)


async def wait_until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def published(api: AsyncClient) -> bool:
    found = api.list(ResourceSlice, fields={"spec.nodeName": NODE})
    return bool([s async for s in found])


async def prepare_figures(
    server: kubeapi.ApiServer, api: AsyncClient, runs: int
) -> tuple[list[Row], float]:
    """Prepare/unprepare latency next to the two floors, and the daemon's RSS (MiB) after."""
    rows: list[Row] = []
    async with dra_daemon(server, "1h", kubeapi.free_port(), timed=True) as (
        node,
        proc,
        registration,
    ):
        timings = node.root / "smi-ns"
        wrapper_ms = wrapper_cost_ms(node.smi_path, timings)

        async def registered() -> bool:
            return registration.exists()

        await wait_until(registered, "the registration socket")
        await wait_until(lambda: published(api), "the node's slices")
        kubelet = KubeletSide(registration)
        await kubelet.register()
        try:
            floor_rpc: list[float] = []
            async with grpc.aio.insecure_channel(f"unix:{registration}") as channel:
                stub = reg_grpc.RegistrationStub(channel)
                for _ in range(runs):
                    began = time.perf_counter()
                    await stub.GetInfo(reg.InfoRequest(), timeout=5)
                    floor_rpc.append((time.perf_counter() - began) * 1000)
            rows.append(_row("floor: one gRPC round trip (GetInfo)", floor_rpc))
            for size in (1, 4):
                devices = [f"rbln{k}" for k in range(size)]
                ref = await allocate(api, f"bench-{size}", devices)
                floor_get: list[float] = []
                prepare: list[float] = []
                own: list[float] = []
                unprepare: list[float] = []
                for _ in range(runs):
                    began = time.perf_counter()
                    await api.get(ResourceClaim, ref.name, namespace=ref.namespace)
                    floor_get.append((time.perf_counter() - began) * 1000)
                    timings.write_text("")
                    began = time.perf_counter()
                    answer = (await kubelet.prepare(ref))[ref.uid]
                    prepare.append((time.perf_counter() - began) * 1000)
                    calls = len(timings.read_text().splitlines())
                    inside = recorded_smi_ms(timings) + calls * wrapper_ms
                    own.append(prepare[-1] - inside)
                    if answer.error:
                        raise RuntimeError(f"prepare failed: {answer.error}")
                    began = time.perf_counter()
                    errors = await kubelet.unprepare(ref)
                    unprepare.append((time.perf_counter() - began) * 1000)
                    if any(errors.values()):
                        raise RuntimeError(f"unprepare failed: {errors}")
                rows.append(_row(f"floor: GET of the claim ({size} NPU)", floor_get))
                rows.append(_row(f"NodePrepareResources, {size} NPU", prepare, floor_rpc))
                rows.append(_row(f"  of which outside rbln-smi, {size} NPU", own, floor_rpc))
                rows.append(_row(f"NodeUnprepareResources, {size} NPU", unprepare, floor_rpc))
        finally:
            await kubelet.close()
        return rows, rss_mib(proc.pid)


def _row(metric: str, samples: list[float], floor: list[float] | None = None) -> Row:
    median = statistics.median(samples)
    note = _ms(samples)
    if floor:
        note += f"; {median / statistics.median(floor):.0f}x the gRPC floor"
    return {"area": "dra", "metric": metric, "value": median, "unit": "ms", "note": note}


async def writes_per_scan(
    server: kubeapi.ApiServer, api: AsyncClient, window_s: float
) -> tuple[list[Row], float]:
    """Requests per scan on an unchanged node, and the daemon's RSS (MiB) after the window."""
    port = kubeapi.free_port()
    async with dra_daemon(server, "100ms", port) as (_, proc, _):
        await wait_until(lambda: published(api), "the node's slices")
        await asyncio.sleep(1.0)  # the watch is set up; first writes are done
        scans_before = daemon_metric(port, "rbln_device_plugin_scan_duration_seconds_count")
        writes_before = daemon_metric(port, "rbln_device_plugin_dra_resourceslice_writes_total")
        requests_before = apiserver_slice_requests(server)
        await asyncio.sleep(window_s)
        requests_after = apiserver_slice_requests(server)
        scans = daemon_metric(port, "rbln_device_plugin_scan_duration_seconds_count") - scans_before
        writes = daemon_metric(port, "rbln_device_plugin_dra_resourceslice_writes_total")
        rss = rss_mib(proc.pid)
    sent = {
        verb: requests_after.get(verb, 0.0) - requests_before.get(verb, 0.0)
        for verb in requests_after
    }
    total = sum(sent.values())
    detail = ", ".join(f"{v} {int(n)}" for v, n in sorted(sent.items()) if n) or "none"
    note = (
        f"{int(total)} ResourceSlice requests over {int(scans)} scans ({detail}); "
        f"the daemon's own slice writes: {int(writes - writes_before)}"
    )
    row = {"area": "dra", "metric": "API server requests per scan, unchanged node",
           "value": total / max(scans, 1), "unit": "req", "note": note}  # fmt: skip
    return [row], rss


async def device_plugin_rss(window_s: float) -> float:
    """The same node in device-plugin mode after the same window: RSS (MiB)."""
    async with node_with_daemon(preset(LAYOUT), "100ms") as (_, kubelet, proc, _):
        await kubelet.wait_for("rebellions.ai/npu", lambda v: v.messages > 0, 30)
        await asyncio.sleep(1.0 + window_s)
        return rss_mib(proc.pid)


def idle_python_rss() -> float:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(1.0)
        return rss_mib(proc.pid)
    finally:
        stop_process(proc)


async def measure(quick: bool) -> list[Row]:
    runs, window = (10, 3.0) if quick else (50, 20.0)
    state = Path(tempfile.mkdtemp(prefix="rbln-bench-apiserver-"))
    try:
        with kubeapi.running_apiserver(state) as server:
            api = AsyncClient(KubeConfig.from_file(server.kubeconfig))
            try:
                with contextlib.suppress(ApiError):
                    await api.create(KubeNode(metadata=ObjectMeta(name=NODE)))
                rows, rss_prepared = await prepare_figures(server, api, runs)
                for piece in [s async for s in api.list(ResourceSlice)]:
                    await api.delete(ResourceSlice, piece.metadata.name)
                scan_rows, rss_dra = await writes_per_scan(server, api, window)
                rows += scan_rows
            finally:
                await api.close()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    rss_device_plugin = await device_plugin_rss(window)
    floor = idle_python_rss()
    for metric, value, note in (
        ("floor: RSS of an idle python process", floor, "python -c 'import time; time.sleep(60)'"),
        ("RSS, device-plugin mode", rss_device_plugin, f"{LAYOUT}, after {window:.0f} s of scans"),
        ("RSS, dra mode", rss_dra, f"{LAYOUT}, after {window:.0f} s of scans"),
        ("RSS, dra mode after the prepares", rss_prepared, f"{2 * runs} prepares/unprepares"),
    ):
        suffix = "" if metric.startswith("floor") else f"; {value - floor:+.1f} MiB over the floor"
        rows.append({"area": "dra", "metric": metric, "value": value, "unit": "MiB",
                     "note": note + suffix})  # fmt: skip
    return rows


def run(quick: bool = False) -> list[Row]:
    reason = kubeapi.missing()
    if reason is not None:
        return [{"area": "dra", "metric": "skipped", "value": 0.0, "unit": "", "note": reason}]
    return asyncio.run(measure(quick))


def main(argv: Sequence[str] | None = None) -> int:
    rows = run(cli.quick(__doc__, argv))
    width = max(len(r["metric"]) for r in rows)
    for r in rows:
        print(f"{r['metric']:<{width}} {r['value']:>9.2f} {r['unit']:<4} {r['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
