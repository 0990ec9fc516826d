"""The kubelet DevicePlugin service of one resource: it serves the device state.

ListAndWatch streams the state's published view; GetPreferredAllocation asks the
topology; Allocate runs one way: the state validates the request, the allocator builds
its first host calls, the state's final check runs them beside the status reads and
gives a snapshot, the allocator prepares the containers, and this servicer acts on the
outcome (the answer; a wanted rescan goes on the kubelet session's queue, as does the
end of the kubelet's stream).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from types import ModuleType
from typing import Any

import grpc

from rbln_device_plugin import processtweaks
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.core.devicestate import DeviceState
from rbln_device_plugin.core.requests import MAX_PREFERRED_CONTAINERS, preferred_request_problem
from rbln_device_plugin.kubelet.allocate import Allocator
from rbln_device_plugin.kubelet.events import Events, PluginRef, RescanWanted, StreamLost
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.devicetable import KubeletDevice
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()


def _preferred() -> ModuleType:
    """The preferred-allocation search (the topology package), imported on first use.

    Nothing before Register needs it; ``load_deferred`` imports it right after. That
    keeps 31-51 ms off the start to Register: the import's own time once the daemon's
    runtime is loaded (``python -c`` timing ``import rbln_device_plugin.kubelet.preferred``
    after ``runtime.daemon`` and ``kubelet.servicer``, five runs, 2026-12-03; ``-X
    importtime`` puts 29 ms of it in ``topology.request``). tests/test_processtweaks.py
    checks that the daemon's runtime still loads without it.
    """
    from rbln_device_plugin.kubelet import preferred

    return preferred


def load_deferred() -> None:
    """Import what only the kubelet's requests need (after Register: the start is
    shorter), then give the heap start-up freed back to the system."""
    _preferred()
    processtweaks.release_free_heap()


def plugin_options() -> api_pb2.DevicePluginOptions:
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self, ref: PluginRef, state: DeviceState, services: SharedServices, events: Events
    ) -> None:
        self.resource = state.resource
        self._ref = ref
        self._state = state
        self._allocator = Allocator(state.resource, services)
        self._tracer = services.tracer
        self._metrics = services.metrics
        self._events = events
        self._stepping_down = services.stepping_down
        self.open_streams = 0
        # The kubelet opens its ListAndWatch stream right after a registration: the first
        # stream opened after Register was sent is the kubelet's. Other clients' streams
        # (debugging, monitoring) get the same updates but never trigger re-registration.
        self._expecting_kubelet_stream = False
        self._kubelet_stream: object | None = None

    def expect_kubelet_stream(self, expected: bool) -> None:
        """Register was sent (True), or failed (False)."""
        self._expecting_kubelet_stream = expected

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.DevicePluginOptions:
        return plugin_options()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        self.open_streams += 1
        self._metrics.stream_opened(self.resource)
        token = object()
        if self._expecting_kubelet_stream:
            self._expecting_kubelet_stream = False
            self._kubelet_stream = token
        try:
            while not self._state.closed:
                news = await self._state.wait_for_view(sent)
                if news is None:
                    return
                sent, view = news
                yield _list_response(view)
                log.debug(
                    "Sent updated device list to kubelet",
                    resourceName=self.resource, deviceCount=len(view),
                )  # fmt: skip
        finally:
            self.open_streams -= 1
            self._metrics.stream_closed(self.resource)
            if not self._state.closed and self._kubelet_stream is token:
                # The kubelet never reopens a stream on its own: the session decides whether
                # this is a kubelet restart or a stream lost alone, and registers again.
                self._kubelet_stream = None
                self._events.put_nowait(StreamLost(self._ref))

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.PreferredAllocationResponse:
        problem = preferred_request_problem(self.resource, len(request.container_requests))
        if problem is not None:
            # Not the kubelet (it asks one container at a time): refuse the whole call
            # before any search, so its work stays that of a few searches.
            log.warning(
                "Preferred allocation request refused",
                resourceName=self.resource,
                containerCount=len(request.container_requests),
                maxContainers=MAX_PREFERRED_CONTAINERS,
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        response = api_pb2.PreferredAllocationResponse()
        for container in request.container_requests:
            ids = await _preferred().choose(
                self.resource, self._state.table, container, self._metrics
            )
            response.container_responses.add(deviceIDs=ids)
        return response

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocateResponse:
        if self._stepping_down.is_set():
            # Leaving: the kubelet's other endpoint for this resource (a successor's)
            # answers instead, and this one's stream ends in a moment.
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "this device plugin instance is shutting down"
            )
        started = time.monotonic()
        requested = [list(c.devices_ids) for c in request.container_requests]
        try:
            with self._tracer.start_as_current_span(
                "Allocate", attributes={"rbln.resource_name": self.resource}
            ):
                # Every container request gets its allocateContainer child, even when the
                # request is rejected before any container's turn.
                try:
                    checked = self._state.validate(requested)
                    # The containers' first host checks (device nodes, the rbln-smi
                    # lookup, the RSD lock file) run in the final status reads' batch:
                    # one thread hop for all of them.
                    first = self._allocator.look_ahead(checked.distinct, len(requested))
                except Exception as exc:
                    self._unworked(requested, exc)
                    raise
                try:
                    snapshot = await self._state.final_check(checked, first.batch)
                except Exception as exc:
                    first.close()
                    self._unworked(requested, exc)
                    raise
                prepared = await self._allocator.prepare(requested, snapshot, first)
                if prepared.rescan_wanted:
                    self._events.put_nowait(RescanWanted(self.resource))
                if prepared.error is not None:
                    raise prepared.error  # inside the span: it records the failure
                self._metrics.allocation(self.resource, m.OK, time.monotonic() - started)
                return prepared.response
        except Exception as exc:
            await self._allocator.refuse(context, requested, exc, started)

    def _unworked(self, requested: Sequence[Sequence[str]], exc: Exception) -> None:
        known = self._state.devices()
        self._allocator.unworked_spans(requested, known, exc, f"request rejected: {exc}")

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def _list_response(view: Sequence[KubeletDevice]) -> api_pb2.ListAndWatchResponse:
    response = api_pb2.ListAndWatchResponse()
    for device_id, health, numa in view:
        device = response.devices.add(ID=device_id, health=health)
        if numa is not None:
            device.topology.nodes.add(ID=numa)
    return response
