"""What a real OTLP/gRPC collector service does with an export, shared by the trace and the
metrics receivers (each adds its signal's servicer and response from opentelemetry-proto)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc


class ExportKeeper:
    """Keeps every export request; a hanging collector holds each call until the exporter
    gives up and cancels it."""

    response: Callable[[], Any]

    def __init__(self, hang: bool = False) -> None:
        self.requests: list[Any] = []
        self.hang = hang
        self.changed = asyncio.Event()
        self.calls = 0
        # Export calls that have arrived and not ended.
        self.in_flight: set[int] = set()

    async def Export(self, request: Any, context: Any) -> Any:
        call, self.calls = self.calls, self.calls + 1
        if self.hang:
            self.in_flight.add(call)
            self.changed.set()
            try:
                await asyncio.sleep(3600)
            finally:
                self.in_flight.discard(call)
                self.changed.set()
        self.requests.append(request)
        self.changed.set()
        return self.response()

    async def wait_for(self, condition: Callable[[], bool], timeout: float) -> None:
        """Wait until ``condition`` holds; it is checked whenever an export arrives or ends."""
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    async def wait_in_flight(self, newer_than: int = -1, timeout: float = 30.0) -> set[int]:
        """The calls stuck in this (hanging) collector that arrived after call number
        ``newer_than``, once there is one."""

        def fresh() -> set[int]:
            return {call for call in self.in_flight if call > newer_than}

        await self.wait_for(lambda: bool(fresh()), timeout)
        return fresh()


@asynccontextmanager
async def serving(
    servicer: ExportKeeper, add_to_server: Callable[[Any, grpc.aio.Server], None]
) -> AsyncIterator[int]:
    """Serve ``servicer`` on a free local port; yields the port."""
    server = grpc.aio.server()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)
