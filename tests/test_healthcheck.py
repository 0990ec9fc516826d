"""The grpc.health.v1 service through a real gRPC client."""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rbln_device_plugin.runtime.healthcheck import HealthcheckError, HealthService

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def check(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(response.status)


async def test_alive_from_the_start_ready_only_when_told() -> None:
    service = HealthService(0)
    await service.start()
    try:
        assert service.port
        assert await check(service.port, "liveness") == SERVING
        assert await check(service.port, "readiness") == NOT_SERVING
        assert await check(service.port, "") == NOT_SERVING
        await service.set_ready(True)
        assert await check(service.port, "readiness") == SERVING
        assert await check(service.port, "") == SERVING
        await service.set_alive(False)  # a stuck scan: not alive, still the one serving
        assert await check(service.port, "liveness") == NOT_SERVING
        assert await check(service.port, "readiness") == SERVING
        await service.set_ready(False)
        assert await check(service.port, "readiness") == NOT_SERVING
        assert await check(service.port, "") == NOT_SERVING
    finally:
        await service.stop()


async def test_unknown_service_is_not_found() -> None:
    service = HealthService(0)
    await service.start()
    try:
        assert service.port
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(service.port, "ready")
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await service.stop()


async def test_port_in_use_is_a_clear_error() -> None:
    holder = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    holder.bind(("::", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        service = HealthService(port)
        with pytest.raises(HealthcheckError) as caught:
            await service.start()
        assert str(port) in str(caught.value)
        assert "HEALTHCHECK_PORT" in str(caught.value)
    finally:
        holder.close()


async def test_a_second_health_service_cannot_share_the_port() -> None:
    first = HealthService(0)
    await first.start()
    try:
        assert first.port
        with pytest.raises(HealthcheckError):
            await HealthService(first.port).start()
    finally:
        await first.stop()
