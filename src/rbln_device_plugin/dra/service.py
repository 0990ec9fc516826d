"""The DRAPlugin service, v1 and v1beta1, over the preparer: the two versions differ only
in the package name on the wire and v1's ``share_id`` (never set here: NPUs are not
shared between claims).

Every claim of a request gets an entry in the answer, as the kubelet requires
(``pkg/kubelet/cm/dra/manager.go`` fails the pod on a missing one); a claim that cannot be
prepared carries its error there and the call itself succeeds. Claims of one call are
prepared one after another: the RSD groups are made one at a time anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from rbln_device_plugin.api.dra.v1 import api_pb2 as v1
from rbln_device_plugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from rbln_device_plugin.api.dra.v1beta1 import api_pb2 as v1beta1
from rbln_device_plugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from rbln_device_plugin.dra.claims import ClaimRef
from rbln_device_plugin.dra.prepare import Preparer


def _refs(claims: Iterable[v1.Claim | v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


async def _prepared(preparer: Preparer, request: Any, response: Any) -> Any:
    """NodePrepareResources into ``response`` (the same message in either version)."""
    for ref in _refs(request.claims):
        outcome = await preparer.prepare(ref)
        answer = response.claims[ref.uid]
        answer.error = outcome.error
        for d in outcome.devices:
            answer.devices.add(
                request_names=[d.request], pool_name=d.pool, device_name=d.device,
                cdi_device_ids=d.cdi_device_ids,
            )  # fmt: skip
    return response


async def _unprepared(preparer: Preparer, request: Any, response: Any) -> Any:
    """NodeUnprepareResources into ``response`` (the same message in either version)."""
    for ref in _refs(request.claims):
        response.claims[ref.uid].error = (await preparer.unprepare(ref)).error
    return response


class DraPluginV1(v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> v1.NodePrepareResourcesResponse:
        answer: v1.NodePrepareResourcesResponse = await _prepared(
            self._preparer, request, v1.NodePrepareResourcesResponse()
        )
        return answer

    async def NodeUnprepareResources(
        self,
        request: v1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v1.NodeUnprepareResourcesResponse:
        answer: v1.NodeUnprepareResourcesResponse = await _unprepared(
            self._preparer, request, v1.NodeUnprepareResourcesResponse()
        )
        return answer


class DraPluginV1beta1(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self,
        request: v1beta1.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v1beta1.NodePrepareResourcesResponse:
        answer: v1beta1.NodePrepareResourcesResponse = await _prepared(
            self._preparer, request, v1beta1.NodePrepareResourcesResponse()
        )
        return answer

    async def NodeUnprepareResources(
        self,
        request: v1beta1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        answer: v1beta1.NodeUnprepareResourcesResponse = await _unprepared(
            self._preparer, request, v1beta1.NodeUnprepareResourcesResponse()
        )
        return answer
