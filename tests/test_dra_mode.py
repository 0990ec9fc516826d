"""The daemon in dra mode, in-process, against a real 1.37.2 API server and a simulated
node: the same scan loop and core as the device-plugin mode, the DRA kubelet plugin on
real unix sockets (driven as the kubelet drives it: ``dra_kubelet``), ResourceSlices
published from the scans, claims read from the API server and prepared with the RSD
sequence and a CDI spec."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models import resource_v1 as rm
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node as KubeNode
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice
from lightkube.types import PatchType
from structlog.testing import capture_logs

from rbln_device_plugin import options
from rbln_device_plugin.dra import names
from rbln_device_plugin.dra.claims import ClaimRef
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.runtime import daemon as runtime
from rbln_device_plugin.runtime import otherholds
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from . import kubeapi, podresources_server
from .dra_kubelet import KubeletSide
from .inprocess import DaemonRecords, daemon_on, until
from .metrics_helpers import metrics_port, scrape, value

NODE = "node-dra"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeapi.ApiServer]:
    if kubeapi.missing() is not None:
        pytest.skip(str(kubeapi.missing()))
    with kubeapi.running_apiserver(tmp_path_factory.mktemp("apiserver")) as running:
        yield running


@pytest.fixture
async def api(server: kubeapi.ApiServer) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(server.kubeconfig))
    with contextlib.suppress(ApiError):  # the module's tests share the node
        await client.create(KubeNode(metadata=ObjectMeta(name=NODE)))
    for piece in await node_slices(client):  # each test starts with none published
        await client.delete(ResourceSlice, piece.metadata.name)
    try:
        yield client
    finally:
        await client.close()


@dataclass
class DraNode:
    sim: SimNode
    root: Path
    kubeconfig: Path
    # The kubelet's PodResources socket (a stand-in's); "": not read (a node that only
    # ever ran dra mode).
    pod_resources: str = ""

    @property
    def registry(self) -> Path:
        return self.root / "kubelet" / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "kubelet" / "plugins"

    def args(self) -> list[str]:
        return [
            "--mode=dra",
            "--node-name", NODE,
            "--kubeconfig", str(self.kubeconfig),
            "--kubelet-plugins-registry-path", str(self.registry),
            "--kubelet-plugins-path", str(self.plugins),
            f"--kubelet-pod-resources-socket={self.pod_resources}",
        ]  # fmt: skip


@pytest.fixture
def node(server: kubeapi.ApiServer) -> Iterator[DraNode]:
    root = short_tempdir()
    sim = materialize(preset("rebel-sriov"), root / "node")
    dra = DraNode(sim, root, server.kubeconfig)
    dra.registry.mkdir(parents=True)  # the kubelet's, made by the kubelet
    dra.plugins.mkdir(parents=True)
    try:
        yield dra
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def node_slices(api: AsyncClient) -> list[Any]:
    found = api.list(
        ResourceSlice, fields={"spec.nodeName": NODE, "spec.driver": names.DRIVER_NAME}
    )
    return [s async for s in found]


async def published(api: AsyncClient) -> dict[str, dict[str, Any]]:
    """Device name -> its attributes (plain JSON), over the node's slices."""
    out: dict[str, dict[str, Any]] = {}
    for piece in await node_slices(api):
        for device in piece.spec.devices or []:
            out[device.name] = device.to_dict().get("attributes", {})
    return out


async def eventually(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {value!r}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def dra_daemon(node: DraNode, interval: str = "300ms") -> AsyncIterator[DaemonRecords]:
    async with daemon_on(node.sim, interval, node.args()) as records:
        yield records


async def advertised(sim: SimNode) -> dict[str, str]:
    """Device -> resource, as the core's scan offers them (the device-plugin mode's
    inventory): whole PFs and VFs, never a PF that hosts VFs."""
    hostio = HostIO()
    try:
        found = await Scanner(
            sysfs_root=sim.sysfs_root, smi_path=sim.smi_path, hostio=hostio
        ).scan()
    finally:
        hostio.close()
    return {d.name: resource for resource, devices in found.resources.items() for d in devices}


async def allocate(api: AsyncClient, name: str, devices: list[str]) -> ClaimRef:
    """A claim allocated as the scheduler allocates (its status subresource)."""
    claim = ResourceClaim(
        metadata=ObjectMeta(name=name, namespace="default"),
        spec=rm.ResourceClaimSpec(
            devices=rm.DeviceClaim(
                requests=[
                    rm.DeviceRequest(
                        name="npus",
                        exactly=rm.ExactDeviceRequest(
                            deviceClassName="npu.rebellions.ai", count=len(devices)
                        ),
                    )
                ]
            )
        ),
    )
    made = await api.create(claim)
    results = [
        rm.DeviceRequestAllocationResult(
            request="npus", driver=names.DRIVER_NAME, pool=NODE, device=device
        )
        for device in devices
    ]
    status = rm.ResourceClaimStatus(
        allocation=rm.AllocationResult(devices=rm.DeviceAllocationResult(results=results))
    )
    await api.patch(
        ResourceClaimStatus, name, {"status": status.to_dict()},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip
    assert made.metadata is not None and made.metadata.uid is not None
    return ClaimRef("default", name, made.metadata.uid)


async def test_dra_mode_publishes_the_nodes_devices_and_prepares_a_claim(
    node: DraNode, api: AsyncClient
) -> None:
    async with dra_daemon(node) as records:
        registration = node.registry / names.REGISTRATION_SOCKET
        await until(registration.is_socket, "the registration socket")
        assert not any(node.sim.kubelet_dir.glob("*.sock"))  # no device-plugin socket
        kubelet = KubeletSide(registration)
        try:
            await kubelet.register()
            assert kubelet.service == "v1.DRAPlugin"
            devices = await eventually(lambda: published(api), "the node's ResourceSlices")
            offered = await advertised(node.sim)
            assert set(devices) == set(offered)
            assert {n: a["deviceType"]["string"] for n, a in devices.items()} == {
                n: r.removeprefix("rebellions.ai/") for n, r in offered.items()
            }
            assert "rbln0" not in devices  # hosts four VFs
            await records.await_log("DRA plugin registered with the kubelet")

            ref = await allocate(api, "two-npus", ["rbln2", "rbln3"])
            answer = (await kubelet.prepare(ref))[ref.uid]
            assert answer.error == ""
            ids = {i for d in answer.devices for i in d.cdi_device_ids}
            assert names.cdi_device_id(ref.uid, "rbln2") in ids
            spec = node.sim.cdi_root / names.spec_file_name(ref.uid)
            assert spec.is_file()
            assert (await kubelet.unprepare(ref)) == {ref.uid: ""}
            assert not spec.exists()
        finally:
            await kubelet.close()
    # Stopped: both sockets are gone, the slices stay (the kubelet wipes them when the
    # plugin stays away; a restart republishes the same).
    assert not registration.exists()
    assert not (node.plugins / names.DRIVER_NAME / names.SERVICE_SOCKET).exists()


async def test_a_fault_is_republished_and_an_unchanged_node_is_not(
    node: DraNode, api: AsyncClient
) -> None:
    async with dra_daemon(node, interval="200ms") as records:
        await eventually(lambda: published(api), "the node's ResourceSlices")
        first = await node_slices(api)
        scans = len(records.find("Reconciled device inventory"))
        await until(
            lambda: len(records.find("Reconciled device inventory")) >= scans + 5, "five scans"
        )
        again = await node_slices(api)
        # Nothing changed on the node: nothing was written (same objects, same versions).
        assert [s.metadata.resourceVersion for s in again] == [
            s.metadata.resourceVersion for s in first
        ]
        node.sim.set_status("rbln2", 4)  # FAULT

        async def faulted() -> bool:
            attributes = (await published(api)).get("rbln2", {})
            return attributes.get("healthy") == {"bool": False}

        await eventually(faulted, "rbln2 published as unhealthy")
        after = await node_slices(api)
        generation = {s.spec.pool.generation for s in after}
        assert len(generation) == 1 and generation != {s.spec.pool.generation for s in first}


async def test_dra_mode_without_a_reachable_configuration_says_so(node: DraNode) -> None:
    args = [*node.sim.daemon_args("1s"), *node.args()]
    args[args.index("--kubeconfig") + 1] = str(node.root / "no-such-kubeconfig")
    config = options.parse(args, {})
    with capture_logs() as logs:
        code = await runtime.serve(config, asyncio.Event())
    assert code == options.EXIT_FAILURE
    refusal = [r for r in logs if r["event"] == "Cannot configure the API server client"]
    assert refusal and "no-such-kubeconfig" in str(refusal[0]["err"]), logs
    assert not any((node.registry).iterdir())  # nothing was served


async def test_slices_deleted_behind_its_back_are_published_again_at_once(
    node: DraNode, api: AsyncClient
) -> None:
    """As a starting kubelet deletes its node's slices: the watch sees it, the next scan
    (woken at once, not at its schedule) writes them again."""
    async with dra_daemon(node, interval="1h") as records:
        before = await eventually(lambda: published(api), "the node's ResourceSlices")
        for piece in await node_slices(api):
            await api.delete(ResourceSlice, piece.metadata.name)
        await records.await_log("ResourceSlices changed on the API server; publishing again")
        again = await eventually(lambda: published(api), "the slices published again")
        assert again == before


async def test_dra_metrics_say_the_mode_and_count_slice_writes_and_claims(
    node: DraNode, api: AsyncClient
) -> None:
    async with daemon_on(node.sim, "300ms", [*node.args(), "--metrics-port", "0"]) as records:
        await eventually(lambda: published(api), "the node's ResourceSlices")
        kubelet = KubeletSide(node.registry / names.REGISTRATION_SOCKET)
        try:
            await kubelet.register()
            ref = await allocate(api, "metrics-claim", ["rbln3"])
            assert (await kubelet.prepare(ref))[ref.uid].error == ""
            watch = kubelet.watch_health()  # the kubelet's health stream, held open
            await asyncio.wait_for(watch.read(), 10)
            node.sim.set_status("rbln2", 4)  # FAULT: tainted in the slice
            await records.await_log("Device tainted in the ResourceSlices", device="rbln2")
            samples = await scrape(await metrics_port(records))
            watch.cancel()
        finally:
            await kubelet.close()
    assert value(samples, "mode", mode="dra") == 1
    assert value(samples, "mode", mode="device-plugin") == 0
    assert (value(samples, "dra_resourceslice_writes_total", verb="create", result="ok") or 0) >= 1
    assert value(samples, "dra_resourceslice_writes_total", verb="update", result="failed") == 0
    assert value(samples, "dra_claims_total", operation="prepare", result="ok") == 1
    assert value(samples, "dra_claims_total", operation="prepare", result="claim") == 0
    assert value(samples, "dra_prepared_claims") == 1
    assert value(samples, "dra_prepare_duration_seconds_count", result="ok") == 1
    assert value(samples, "dra_health_streams", service="v1") == 1
    assert value(samples, "dra_health_streams", service="v1alpha1") == 0
    assert value(samples, "dra_device_taints_total", change="applied") == 1
    assert value(samples, "dra_device_taints_total", change="removed") == 0


async def test_the_daemon_process_in_dra_mode_speaks_tls_to_the_api_server(
    node: DraNode, api: AsyncClient
) -> None:
    """The installed entry point, not the in-process runtime: the process keeps modules
    it never uses out of memory (processtweaks), and dra mode needs TLS."""
    env = {**os.environ, "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info"}
    log = node.root / "daemon.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "rbln_device_plugin", *node.sim.daemon_args("1s"),
             *node.args()],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        devices = await eventually(lambda: published(api), "the node's ResourceSlices", 30)
        assert set(devices) == set(await advertised(node.sim))
    finally:
        process.terminate()
        code = process.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]


async def test_devices_device_plugin_pods_hold_are_published_once_those_pods_end(
    node: DraNode, api: AsyncClient
) -> None:
    """A node moved from the device-plugin mode: the kubelet's PodResources (a stand-in on
    a unix socket) lists two pods holding rbln2 and a vf-4 VF; they are not in the slices
    (nor can a claim for them be prepared) until those pods end."""
    socket = node.root / "pod-resources.sock"
    node.pod_resources = str(socket)
    fake = podresources_server.FakePod
    async with podresources_server.serving(socket) as kubelet_pr:
        # Listed before the daemon starts: its first scan's read finds them.
        kubelet_pr.active = [
            fake("ml", "a", devices={"c": [("rebellions.ai/npu", ["rbln2"])]}),
            fake("ml", "b", devices={"c": [("rebellions.ai/npu-vf4", ["rbln0-1"])]}),
        ]
        async with daemon_on(node.sim, "200ms", [*node.args(), "--metrics-port", "0"]) as records:
            await _held_then_released(node, api, records, kubelet_pr)


async def _held_then_released(
    node: DraNode, api: AsyncClient, records: DaemonRecords, kubelet_pr: Any
) -> None:
    offered = await advertised(node.sim)
    devices = await eventually(lambda: published(api), "the node's ResourceSlices")
    assert set(devices) == set(offered) - {"rbln2", "rbln0-1"}
    samples = await scrape(await metrics_port(records))
    assert value(samples, "devices_withheld", resource="rebellions.ai/npu") == 1
    kubelet = KubeletSide(node.registry / names.REGISTRATION_SOCKET)
    try:
        await kubelet.register()
        ref = await allocate(api, "held-npu", ["rbln2"])  # as a stale allocation would
        answer = (await kubelet.prepare(ref))[ref.uid]
        assert "rbln2 is not offered on this node now" in answer.error
    finally:
        await kubelet.close()
    kubelet_pr.active = []  # both pods ended

    async def all_published() -> bool:
        return set(await published(api)) == set(offered)

    await eventually(all_published, "the released devices published")
    released = {r["device"] for r in records.find(otherholds.RELEASED_MSG)}
    assert released == {"rbln2", "rbln0-1"}
    await records.await_log(otherholds.SETTLED_MSG)
