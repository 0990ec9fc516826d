"""The DRAResourceHealth service, v1 and v1alpha1: each scan's complete device list to
every NodeWatchResources stream.

The kubelet (``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``, 1.37.2) opens the
stream when the plugin announced ``v1.DRAResourceHealth`` or
``v1alpha1.DRAResourceHealth`` in its registration (the first of its own list, v1 first,
that the plugin announces), keeps it open for as long as the plugin is registered, and
opens it again 5 s after it ends. Each message replaces the driver's whole list; a device
not reported within its ``health_check_timeout_seconds`` reads as Unknown, so every scan
re-sends the complete list, changed or not (``HealthFeed.publish``). A stream that reads
slowly gets the newest list when it reads again, never a backlog. At stop the streams end
(EOF): the kubelet then forgets the driver's health until the plugin is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from rbln_device_plugin.api.drahealth.v1 import api_pb2 as v1
from rbln_device_plugin.api.drahealth.v1 import api_pb2_grpc as v1_grpc
from rbln_device_plugin.api.drahealth.v1alpha1 import api_pb2 as v1alpha1
from rbln_device_plugin.api.drahealth.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from rbln_device_plugin.dra import health
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

_HEALTH_CODES = {health.UNKNOWN: 0, health.HEALTHY: 1, health.UNHEALTHY: 2}  # both versions

OPENED_MSG = "DRA health stream opened"
CLOSED_MSG = "DRA health stream ended"


class HealthFeed:
    """The newest complete report and its version, which every ``publish`` raises."""

    def __init__(self, timeout_s: int) -> None:
        self.timeout_s = timeout_s
        self._report: tuple[health.DeviceHealth, ...] = ()
        self._at = 0  # Unix seconds of the scan behind the report
        self._version = 0  # 0: nothing published yet
        self._closed = False
        self._changed = asyncio.Condition()
        self.streams = 0

    @property
    def closed(self) -> bool:
        return self._closed

    async def publish(self, report: Sequence[health.DeviceHealth], at: float | None = None) -> None:
        """One scan's list: sent to every stream, even when it says what the last did."""
        self._report = tuple(report)
        self._at = int(time.time() if at is None else at)
        self._version += 1
        async with self._changed:
            self._changed.notify_all()

    async def close(self) -> None:
        self._closed = True
        async with self._changed:
            self._changed.notify_all()

    async def next(self, sent: int) -> tuple[int, tuple[health.DeviceHealth, ...], int] | None:
        """The newest report once its version is above ``sent``; None once closed."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or self._version > sent)
        if self._closed:
            return None
        return self._version, self._report, self._at

    async def stream(self, api: Any, service: str, metrics: m.Metrics) -> AsyncIterator[Any]:
        """The messages of one NodeWatchResources stream in ``api`` (v1 or v1alpha1)."""
        self.streams += 1
        metrics.dra_health_stream(service, True)
        log.info(OPENED_MSG, service=service, streamCount=self.streams)
        sent = 0
        try:
            while (news := await self.next(sent)) is not None:
                sent, devices, at = news
                yield _response(api, devices, at, self.timeout_s)
        finally:
            self.streams -= 1
            metrics.dra_health_stream(service, False)
            log.info(CLOSED_MSG, service=service, streamCount=self.streams)


def _response(api: Any, devices: Sequence[health.DeviceHealth], at: int, timeout_s: int) -> Any:
    response = api.NodeWatchResourcesResponse()
    for d in devices:
        response.devices.add(
            device=api.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
            health=_HEALTH_CODES[d.health], last_updated_time=at,
            health_check_timeout_seconds=timeout_s, message=d.message,
        )  # fmt: skip
    return response


class HealthV1(v1_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: HealthFeed, metrics: m.Metrics = m.NOOP) -> None:
        self._feed, self._metrics = feed, metrics

    async def NodeWatchResources(
        self, request: v1.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[v1.NodeWatchResourcesResponse]:
        async for response in self._feed.stream(v1, "v1", self._metrics):
            yield response


class HealthV1alpha1(v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: HealthFeed, metrics: m.Metrics = m.NOOP) -> None:
        self._feed, self._metrics = feed, metrics

    async def NodeWatchResources(
        self,
        request: v1alpha1.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[v1alpha1.NodeWatchResourcesResponse]:
        async for response in self._feed.stream(v1alpha1, "v1alpha1", self._metrics):
            yield response
