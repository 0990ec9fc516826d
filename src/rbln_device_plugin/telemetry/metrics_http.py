"""The Prometheus endpoint: a minimal HTTP/1.x server on the event loop.

Each connection is a coroutine, never a thread, so a scraper that opens many connections
and sends or reads nothing costs a socket each and nothing else: a request head must
arrive within ``REQUEST_TIMEOUT_S`` and the answer must be taken within
``WRITE_TIMEOUT_S``, else the connection is dropped. At most ``MAX_CONNECTIONS`` are
open; a new one beyond that evicts the oldest connection still waiting for its request
head, so idle sockets can never lock a real scraper out. The exposition is rendered in a
worker thread (one render at a time; concurrent scrapes share it), so the loop that
serves the kubelet and the health probe only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Final

from rbln_device_plugin.telemetry.exposition import CONTENT_TYPE
from rbln_device_plugin.telemetry.logs import get_logger

REQUEST_TIMEOUT_S: Final = 10.0
WRITE_TIMEOUT_S: Final = 10.0
MAX_CONNECTIONS: Final = 32
MAX_HEAD_BYTES: Final = 8 * 1024
PATHS: Final = ("/metrics", "/")

log = get_logger()


class MetricsEndpointError(RuntimeError):
    """The endpoint could not listen (typically: the port is taken)."""


class MetricsEndpoint:
    def __init__(self, port: int, render: Callable[[], str], host: str | None = None) -> None:
        self._requested_port = port
        self._host = host  # None: every interface, IPv6 and IPv4 on one socket
        self._render = render
        self._server: asyncio.Server | None = None
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # insertion order = age
        self._open: set[asyncio.StreamWriter] = set()
        self._pending: asyncio.Future[str] | None = None
        self.port: int | None = None

    async def start(self) -> None:
        try:
            listener = _listen(self._host, self._requested_port)
            server = await asyncio.start_server(self._serve, sock=listener, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            raise MetricsEndpointError(
                f"cannot listen on port {self._requested_port} for metrics "
                f"(port in use? set --metrics-port / METRICS_PORT): {exc}"
            ) from None
        self._server = server
        self.port = int(server.sockets[0].getsockname()[1])
        log.info("Started metrics endpoint", port=self.port, paths=PATHS)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._open):
            writer.transport.abort()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            if not self._waiting:
                writer.transport.abort()  # every slot is busy answering: shed this one
                return
            oldest = next(iter(self._waiting))
            self._waiting.pop(oldest)
            oldest.transport.abort()
        self._open.add(writer)
        self._waiting[writer] = None
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            self._waiting.pop(writer, None)
            status, body = await self._answer(head)
            writer.write(_response(status, body, head.startswith(b"HEAD ")))
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await writer.drain()
            writer.close()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):  # fmt: skip
            writer.transport.abort()  # a slow or silent peer: drop it, unsent bytes too
        finally:
            self._waiting.pop(writer, None)
            self._open.discard(writer)

    async def _answer(self, head: bytes) -> tuple[str, bytes]:
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", b"only GET and HEAD\n"
        if path not in PATHS:
            return "404 Not Found", b"metrics are at /metrics\n"
        try:
            return "200 OK", (await self._shared_render()).encode()
        except Exception as exc:
            log.warning("Cannot render metrics", err=exc, exc_info=True)
            return "500 Internal Server Error", b"cannot render metrics\n"

    async def _shared_render(self) -> str:
        """One render in a worker thread; scrapes that arrive meanwhile get its result."""
        pending = self._pending
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self._render))
            self._pending = pending
            pending.add_done_callback(self._render_done)
        return await asyncio.shield(pending)

    def _render_done(self, _: asyncio.Future[str]) -> None:
        self._pending = None


def _listen(host: str | None, port: int) -> socket.socket:
    """One listening socket: dual-stack on every interface unless a host is given, so a
    single port (also when 0 picks one) serves IPv4 and IPv6 scrapers alike."""
    if host is None and socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:  # IPv6 disabled in the kernel: IPv4 only
            pass
        else:
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                return _bind(sock, "::", port)
            except OSError:
                sock.close()
                raise
    family = socket.AF_INET6 if host is not None and ":" in host else socket.AF_INET
    return _bind(socket.socket(family, socket.SOCK_STREAM), host or "0.0.0.0", port)


def _bind(sock: socket.socket, host: str, port: int) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _response(status: str, body: bytes, head_only: bool) -> bytes:
    content_type = CONTENT_TYPE if status.startswith("200") else "text/plain; charset=utf-8"
    header = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return header.encode("latin-1") + (b"" if head_only else body)
