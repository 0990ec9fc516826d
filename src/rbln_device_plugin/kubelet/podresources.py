"""A client of the kubelet's PodResources API (``podresources/v1``, ``List``) over its unix
socket: thin I/O that turns the answer into ``model.holds``' plain records.

The kubelet (``pkg/kubelet/apis/podresources/server_v1.go`` of 1.37.2) answers ``List``
with its active pods (terminal pods and pods whose containers are known to be stopped are
left out), per container the device-plugin devices it allocated (resource name, device
IDs) and the DRA claims' devices from its claim cache (driver, pool, device name; the
claim of a DRA extended resource included). It limits the API to 100 calls a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import grpc

from rbln_device_plugin.api.podresources.v1 import api_pb2 as pr
from rbln_device_plugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from rbln_device_plugin.kubelet.channels import kubelet_channel
from rbln_device_plugin.model.holds import ClaimUse, ContainerUse, PodUse

# One List on the node's own kubelet; a scan waits for it at most this long.
LIST_TIMEOUT_S: Final = 5.0


class PodResourcesError(Exception):
    """The kubelet's PodResources API did not answer; the message says why, in one line."""


def pods_from(response: pr.ListPodResourcesResponse) -> list[PodUse]:
    """The answer as plain records."""
    return [
        PodUse(
            pod.namespace,
            pod.name,
            tuple(
                ContainerUse(
                    container.name,
                    tuple((d.resource_name, tuple(d.device_ids)) for d in container.devices),
                    tuple(
                        ClaimUse(
                            claim.claim_namespace,
                            claim.claim_name,
                            tuple(
                                (r.driver_name, r.pool_name, r.device_name)
                                for r in claim.claim_resources
                            ),
                        )
                        for claim in container.dynamic_resources
                    ),
                )
                for container in pod.containers
            ),
        )
        for pod in response.pod_resources
    ]


async def list_pods(socket: Path, wait_s: float = LIST_TIMEOUT_S) -> list[PodUse]:
    """``List`` on the kubelet's socket; raises PodResourcesError (gRPC's own words: a
    missing socket reads "UNAVAILABLE: ... No such file or directory")."""
    try:
        async with kubelet_channel(socket) as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            response = await stub.List(pr.ListPodResourcesRequest(), timeout=wait_s)
    except grpc.aio.AioRpcError as exc:
        raise PodResourcesError(f"{exc.code().name}: {exc.details()}") from None
    return pods_from(response)
