"""grpc.health.v1 service on a TCP port, probed by the kubelet's liveness check.

Services "" and "liveness" exist; any other name answers NOT_FOUND. Both report
NOT_SERVING until the daemon marks itself ready (after its first inventory scan).
"""

from __future__ import annotations

from typing import Final

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rbln_device_plugin.telemetry.logs import get_logger

SERVICES: Final = ("", "liveness")

log = get_logger()


class HealthcheckError(RuntimeError):
    """The health service could not start (typically: the port is taken)."""


class HealthService:
    def __init__(self, port: int, host: str = "[::]") -> None:
        self._requested_port = port
        self._host = host
        self._servicer = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    async def start(self) -> None:
        for service in SERVICES:
            await self._servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        # Without this, gRPC sets SO_REUSEPORT and a second daemon would silently share
        # the port instead of failing.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        address = f"{self._host}:{self._requested_port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            # gRPC's own hint points at GRPC_VERBOSITY; its detailed reason is already in
            # the log as a component=grpc record (see grpc_core_log).
            detail = str(exc).split("; set GRPC_VERBOSITY", 1)[0]
            raise HealthcheckError(
                f"cannot listen on {address} for the health service "
                f"(port in use? set --healthcheck-port / HEALTHCHECK_PORT): {detail}"
            ) from None
        if bound == 0:
            raise HealthcheckError(f"cannot listen on {address} for the health service")
        await server.start()
        self._server = server
        self.port = bound
        log.info("Started healthcheck service", address=f"{self._host}:{bound}", services=SERVICES)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in SERVICES:
            await self._servicer.set(service, status)

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is None:
            return
        await self._servicer.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
