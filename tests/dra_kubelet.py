"""The kubelet's side of a DRA kubelet plugin, step by step as its own code does it
(k8s.io/kubernetes@v1.37.2): ``pkg/kubelet/pluginmanager/operationexecutor/
operation_generator.go`` (dial the registration socket, GetInfo within 1 s, a handler for
the type, the endpoint defaulting to the socket, NotifyRegistrationStatus within 5 s),
``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` (the service is the first of the
plugin's list the kubelet knows; the plugin is dialled at ``unix:`` + endpoint) and
``pkg/kubelet/cm/dra/manager.go`` (each requested claim must have an entry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rbln_device_plugin.api.dra.v1 import api_pb2 as v1
from rbln_device_plugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from rbln_device_plugin.api.dra.v1beta1 import api_pb2 as v1beta1
from rbln_device_plugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from rbln_device_plugin.api.drahealth.v1 import api_pb2 as health_v1
from rbln_device_plugin.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from rbln_device_plugin.api.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from rbln_device_plugin.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from rbln_device_plugin.api.pluginregistration.v1 import api_pb2 as reg
from rbln_device_plugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from rbln_device_plugin.dra.claims import ClaimRef

# The kubelet's lists (dra_plugin.go): services it knows, in its order.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
KUBELET_HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@dataclass
class KubeletSide:
    """What the kubelet does with a plugin's registration socket, then its endpoint."""

    socket: Path
    info: reg.PluginInfo | None = None
    service: str = ""
    channel: grpc.aio.Channel | None = None
    # The health services this kubelet knows (1.37: both; a kubelet of 1.34-1.36 only
    # v1alpha1), and the one it chose ("" when the plugin announces none of them).
    health_services: tuple[str, ...] = KUBELET_HEALTH_SERVICES
    health_service: str = ""

    async def register(self) -> None:
        async with grpc.aio.insecure_channel(f"unix:{self.socket}") as channel:
            client = reg_grpc.RegistrationStub(channel)
            info = await client.GetInfo(reg.InfoRequest(), timeout=1)
            assert info.type == "DRAPlugin"  # the handler registered for DRA plugins
            endpoint = info.endpoint or str(self.socket)
            chosen = [s for s in info.supported_versions if s in KUBELET_SERVICES]
            assert chosen, info.supported_versions
            self.info, self.service = info, chosen[0]
            # pickHealthService: the kubelet's list in its order, the first the plugin has.
            picked = [s for s in self.health_services if s in info.supported_versions]
            self.health_service = picked[0] if picked else ""
            self.channel = grpc.aio.insecure_channel(f"unix:{endpoint}")
            await client.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=5
            )

    async def prepare(self, *refs: ClaimRef) -> dict[str, Any]:
        assert self.channel is not None
        if self.service == "v1.DRAPlugin":
            answer = await v1_grpc.DRAPluginStub(self.channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[_claim(v1, r) for r in refs]), timeout=45
            )
        else:
            answer = await v1beta1_grpc.DRAPluginStub(self.channel).NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(claims=[_claim(v1beta1, r) for r in refs]),
                timeout=45,
            )
        return {uid: answer.claims[uid] for uid in answer.claims}

    async def unprepare(self, *refs: ClaimRef) -> dict[str, str]:
        assert self.channel is not None
        answer = await v1_grpc.DRAPluginStub(self.channel).NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(claims=[_claim(v1, r) for r in refs]), timeout=45
        )
        return {uid: answer.claims[uid].error for uid in answer.claims}

    def watch_health(self) -> Any:
        """NodeWatchResources on the negotiated health service (the stream's call object:
        ``read()`` each message, ``cancel()`` to end it)."""
        assert self.channel is not None and self.health_service, self.info
        if self.health_service == "v1.DRAResourceHealth":
            stub: Any = health_v1_grpc.DRAResourceHealthStub(self.channel)
            return stub.NodeWatchResources(health_v1.NodeWatchResourcesRequest())
        stub = health_v1alpha1_grpc.DRAResourceHealthStub(self.channel)
        return stub.NodeWatchResources(health_v1alpha1.NodeWatchResourcesRequest())

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()


def _claim(api: Any, ref: ClaimRef) -> Any:
    return api.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)
