"""grpc.health.v1 service on a TCP port: what the chart's probes and operators ask.

Four service names, each with one meaning (any other name answers NOT_FOUND):

- ``liveness``: the process is alive and making progress. SERVING from the moment the
  server starts, also while a second instance waits for the instance lock (waiting is
  what it should do); NOT_SERVING only while a device scan has run longer than
  ``--scan-stall-limit`` (see ``ScanWatchdog``), and while the instance lock's directory
  cannot be made (waiting for that cannot end by itself, see ``instancelock``). A
  daemon whose event loop is blocked cannot answer at all, which the probe counts as a
  failure too. The chart's liveness probe asks this: failures restart the container.
- ``readiness``: this instance serves the kubelet. SERVING once it holds the instance
  lock and its first scan has completed; NOT_SERVING before that, while waiting for
  another instance, and during shutdown. The chart's readiness probe asks this:
  failures only mark the pod not ready.
- ``registered``: every resource this instance offers is registered with the kubelet
  (which dials back and opens its stream inside the registration, so each answers).
  NOT_SERVING until that is first true, and during shutdown; it stays SERVING across a
  later kubelet restart. The chart's readiness probe asks this in its surge mode, where
  a node's old pod is removed once the new one is ready: the new one has to serve the
  kubelet by then.
- ``""`` (the server as a whole): the same as ``readiness``. It kept this meaning from
  the versions before ``readiness`` existed, when ``liveness`` meant it too.
"""

from __future__ import annotations

from typing import Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from rbln_device_plugin.telemetry.logs import get_logger

LIVENESS: Final = "liveness"
READINESS: Final = "readiness"
REGISTERED: Final = "registered"
OVERALL: Final = ""
SERVICES: Final = (OVERALL, LIVENESS, READINESS, REGISTERED)

log = get_logger()


class HealthcheckError(RuntimeError):
    """The health service could not start (typically: the port is taken)."""


def _status(serving: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    return (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )


class HealthService:
    def __init__(self, port: int, host: str = "[::]") -> None:
        self._requested_port = port
        self._host = host
        self._servicer = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    async def start(self) -> None:
        await self._servicer.set(LIVENESS, _status(True))
        await self.set_ready(False)
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

    async def set_ready(self, ready: bool) -> None:
        """``readiness`` and ``""``: whether this instance serves the kubelet now; not
        ready ends ``registered`` too."""
        for service in (OVERALL, READINESS):
            await self._servicer.set(service, _status(ready))
        if not ready:
            await self.set_registered(False)

    async def set_registered(self, registered: bool) -> None:
        """``registered``: every resource was registered with the kubelet."""
        await self._servicer.set(REGISTERED, _status(registered))

    async def set_alive(self, alive: bool) -> None:
        """``liveness``: whether the process makes progress."""
        await self._servicer.set(LIVENESS, _status(alive))

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is None:
            return
        await self._servicer.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
