"""The chosen Kubernetes client (lightkube, docs/dra.md) against a real 1.37.2 API server:
it writes ResourceSlices and reads ResourceClaims of ``resource.k8s.io/v1`` with typed
models, selects slices by node and driver as the kubelet does, and watches them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models import resource_v1 as rm
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.resource_v1 import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceSlice,
)
from lightkube.types import PatchType

from . import kubeapi

pytestmark = [
    pytest.mark.apiserver,
    pytest.mark.skipif(kubeapi.missing() is not None, reason=str(kubeapi.missing())),
]

DRIVER = "npu.rebellions.ai"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeapi.ApiServer]:
    with kubeapi.running_apiserver(tmp_path_factory.mktemp("apiserver")) as running:
        yield running


@pytest.fixture
async def client(server: kubeapi.ApiServer) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(Path(server.kubeconfig)))
    try:
        yield client
    finally:
        await client.close()


def a_slice(name: str, node: str, devices: list[str], generation: int = 1) -> ResourceSlice:
    return ResourceSlice(
        metadata=ObjectMeta(name=name),
        spec=rm.ResourceSliceSpec(
            driver=DRIVER,
            nodeName=node,
            pool=rm.ResourcePool(name=node, generation=generation, resourceSliceCount=1),
            devices=[
                rm.Device(
                    name=device,
                    attributes={
                        "productName": rm.DeviceAttribute(string="RBLN-CA25"),
                        "numaNode": rm.DeviceAttribute(int=0),
                    },
                )
                for device in devices
            ],
        ),
    )


async def test_resource_slices_are_written_and_selected_by_node_and_driver(
    client: AsyncClient,
) -> None:
    await client.create(a_slice("node-a-npu", "node-a", ["rbln0", "rbln1"]))
    await client.create(a_slice("node-b-npu", "node-b", ["rbln0"]))
    # The kubelet wipes a node's slices by these two field selectors (dra_plugin_manager.go).
    found = [
        s
        async for s in client.list(
            ResourceSlice, fields={"spec.nodeName": "node-a", "spec.driver": DRIVER}
        )
    ]
    assert [s.metadata.name for s in found] == ["node-a-npu"]
    spec = found[0].spec
    assert [d.name for d in spec.devices] == ["rbln0", "rbln1"]
    # Map-valued fields (attributes, capacity) come back as plain dicts in lightkube's
    # models (docs/dra.md): the values are the API's JSON.
    assert spec.devices[0].attributes == {
        "productName": {"string": "RBLN-CA25"},
        "numaNode": {"int": 0},
    }
    # Republishing: the pool's generation goes up on a replace.
    current = await client.get(ResourceSlice, "node-a-npu")
    assert current.spec is not None
    current.spec.pool.generation = 2
    current.spec.devices = current.spec.devices[:1]
    replaced = await client.replace(current)
    assert replaced.spec.pool.generation == 2
    assert [d.name for d in replaced.spec.devices] == ["rbln0"]


async def allocated_claim(client: AsyncClient, name: str) -> ResourceClaim:
    """A claim for 2 NPUs, allocated as the scheduler allocates (its status subresource)."""
    with contextlib.suppress(ApiError):  # one class for the module's claims
        await client.create(
            DeviceClass(
                metadata=ObjectMeta(name="npu.rebellions.ai"),
                spec=rm.DeviceClassSpec(
                    selectors=[
                        rm.DeviceSelector(
                            cel=rm.CELDeviceSelector(expression=f"device.driver == '{DRIVER}'")
                        )
                    ]
                ),
            )
        )
    claim = ResourceClaim(
        metadata=ObjectMeta(name=name, namespace="default"),
        spec=rm.ResourceClaimSpec(
            devices=rm.DeviceClaim(
                requests=[
                    rm.DeviceRequest(
                        name="npus",
                        exactly=rm.ExactDeviceRequest(deviceClassName="npu.rebellions.ai", count=2),
                    )
                ]
            )
        ),
    )
    made = await client.create(claim)
    status = rm.ResourceClaimStatus(
        allocation=rm.AllocationResult(
            devices=rm.DeviceAllocationResult(
                results=[
                    rm.DeviceRequestAllocationResult(
                        request="npus", driver=DRIVER, pool="node-a", device=device
                    )
                    for device in ("rbln0", "rbln1")
                ]
            )
        )
    )
    await client.patch(
        ResourceClaimStatus, name, {"status": status.to_dict()},
        namespace="default", patch_type=PatchType.MERGE,
    )  # fmt: skip
    return made


async def test_a_claims_allocation_is_read_back_typed(client: AsyncClient) -> None:
    made = await allocated_claim(client, "two-npus")
    read = await client.get(ResourceClaim, "two-npus", namespace="default")
    assert read.metadata.uid == made.metadata.uid
    assert read.status is not None and read.status.allocation is not None
    results = read.status.allocation.devices.results
    assert [(r.request, r.driver, r.pool, r.device) for r in results] == [
        ("npus", DRIVER, "node-a", "rbln0"),
        ("npus", DRIVER, "node-a", "rbln1"),
    ]


async def test_slices_are_watched(client: AsyncClient) -> None:
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for event, item in client.watch(ResourceSlice, fields={"spec.nodeName": "node-w"}):
            seen.append((event, item.metadata.name))
            if event == "DELETED":
                return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.5)  # the watch's request is open before the writes
    await client.create(a_slice("node-w-npu", "node-w", ["rbln0"]))
    await client.delete(ResourceSlice, "node-w-npu")
    await asyncio.wait_for(watcher, 30)
    assert seen == [("ADDED", "node-w-npu"), ("DELETED", "node-w-npu")]


async def test_the_dra_front_end_reads_a_claims_allocation_from_the_api_server(
    client: AsyncClient,
) -> None:
    # The plugin's own reader (dra.apiclaims) and the pure mapping (dra.claims); a claim
    # that is not there names the server's answer.
    from rbln_device_plugin.dra.apiclaims import ApiClaims
    from rbln_device_plugin.dra.claims import ClaimProblem, ClaimRef, allocated_devices

    claim = await allocated_claim(client, "for-the-plugin")
    assert claim.metadata is not None and claim.metadata.uid is not None
    ref = ClaimRef("default", "for-the-plugin", claim.metadata.uid)
    reader = ApiClaims(client)
    found = allocated_devices(await reader.get(ref), ref, DRIVER, "node-a")
    assert [(a.request, a.pool, a.device) for a in found] == [
        ("npus", "node-a", "rbln0"), ("npus", "node-a", "rbln1"),
    ]  # fmt: skip
    with pytest.raises(ClaimProblem, match="default/absent from the API server: 404 NotFound"):
        await reader.get(ClaimRef("default", "absent", "x"))
