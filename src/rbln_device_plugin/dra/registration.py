"""The plugin watcher's side: what the kubelet asks on the registration socket.

The kubelet (``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go``)
dials the socket it found under ``plugins_registry/``, calls ``GetInfo`` (1 s), checks
the type and the announced services, connects to the endpoint, then calls
``NotifyRegistrationStatus`` (5 s) with the verdict. The endpoint must serve at once:
the kubelet may call it right after ``GetInfo``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from rbln_device_plugin.api import dra, drahealth, pluginregistration
from rbln_device_plugin.api.pluginregistration.v1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()

# v1 first: the kubelet takes the first entry of this list it knows, for the DRAPlugin
# service and, separately, for the optional DRAResourceHealth one (which a kubelet
# without it ignores: it matches its own list of DRAPlugin versions only).
SUPPORTED_SERVICES = (
    dra.DRA_PLUGIN_V1, dra.DRA_PLUGIN_V1BETA1,
    drahealth.DRA_RESOURCE_HEALTH_V1, drahealth.DRA_RESOURCE_HEALTH_V1ALPHA1,
)  # fmt: skip


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path) -> None:
        self._driver = driver
        self._endpoint = endpoint
        # Set by each NotifyRegistrationStatus: True registered, False refused.
        self.registered: bool | None = None
        self.error = ""
        self.notified = asyncio.Event()

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PluginInfo:
        return api_pb2.PluginInfo(
            type=pluginregistration.DRA_PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        self.error = request.error
        if request.plugin_registered:
            log.info("DRA plugin registered with the kubelet", driver=self._driver)
        else:
            log.error(
                "DRA plugin registration refused by the kubelet",
                driver=self._driver, err=request.error,
            )  # fmt: skip
        self.notified.set()
        return api_pb2.RegistrationStatusResponse()
