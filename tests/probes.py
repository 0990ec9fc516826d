"""The daemon's gRPC health services, asked as the kubelet's probes ask them."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .daemon_process import DaemonProcess


async def health_port(daemon: DaemonProcess) -> int:
    (record,) = await daemon.await_log("Started healthcheck service")
    return int(str(record["address"]).rsplit(":", 1)[1])


async def health(port: int, service: str = "liveness") -> str:
    """One Check of ``service``: its status name, or the gRPC code when the call fails
    (NOT_FOUND for a service that does not exist)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
