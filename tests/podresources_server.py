"""A stand-in for the kubelet's PodResources API v1 on a unix socket, answering ``List`` as
``pkg/kubelet/apis/podresources/server_v1.go`` of 1.37.2 does: the active pods only (a
test removes a pod that ended), per container one ``ContainerDevices`` per device-plugin
resource with its device IDs, and per DRA claim one ``DynamicResource`` whose
``ClaimResource`` entries carry the CDI device IDs, driver, pool and device name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rbln_device_plugin.api.podresources.v1 import api_pb2 as pr
from rbln_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc


@dataclass
class FakePod:
    namespace: str
    name: str
    # container -> [(resource name, [device IDs])]
    devices: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)
    # container -> [(claim name, [(driver, pool, device)])]
    claims: dict[str, list[tuple[str, list[tuple[str, str, str]]]]] = field(default_factory=dict)


class PodResourcesStandIn(pr_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.active: list[FakePod] = []
        self.lists = 0

    async def List(self, request: Any, context: Any) -> pr.ListPodResourcesResponse:
        self.lists += 1
        answer = pr.ListPodResourcesResponse()
        for pod in self.active:
            out = answer.pod_resources.add(name=pod.name, namespace=pod.namespace)
            for container in sorted(set(pod.devices) | set(pod.claims)):
                c = out.containers.add(name=container)
                for resource, ids in pod.devices.get(container, []):
                    c.devices.add(resource_name=resource, device_ids=ids)
                for claim, devices in pod.claims.get(container, []):
                    d = c.dynamic_resources.add(claim_name=claim, claim_namespace=pod.namespace)
                    for driver, pool, device in devices:
                        d.claim_resources.add(
                            cdi_devices=[pr.CDIDevice(name=f"k8s.{driver}/npu={claim}-{device}")],
                            driver_name=driver, pool_name=pool, device_name=device,
                        )  # fmt: skip
        return answer


@asynccontextmanager
async def serving(socket: Path) -> AsyncIterator[PodResourcesStandIn]:
    server = grpc.aio.server()
    stand_in = PodResourcesStandIn()
    pr_grpc.add_PodResourcesListerServicer_to_server(stand_in, server)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    try:
        yield stand_in
    finally:
        await server.stop(None)
        socket.unlink(missing_ok=True)
