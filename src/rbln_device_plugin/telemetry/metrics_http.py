"""The Prometheus endpoint: HTTP/1.1 by ``h11`` on the event loop's own server.

``h11`` (the state machine under uvicorn and httpcore) parses each request and frames
each answer; this module only moves bytes and decides. Each connection is a coroutine,
never a thread, so a scraper that opens many connections and sends or reads nothing
costs a socket each and nothing else: a request head must arrive within
``REQUEST_TIMEOUT_S`` and the answer must be taken within ``WRITE_TIMEOUT_S``, else the
connection is dropped. At most ``MAX_CONNECTIONS`` are open; a new one beyond that evicts
the oldest connection still waiting for its request head, so idle sockets can never lock
a real scraper out. The exposition is rendered on the endpoint's own daemon thread (one
render at a time; concurrent scrapes share it; never joined, so a stuck render cannot
hold the exit), so the loop that serves the kubelet and the health probe only moves bytes.

What the RFCs give: bare LF line ends are accepted and empty lines before the request
line ignored (RFC 9112 section 2.2), a head over ``MAX_HEAD_BYTES`` (those empty lines
included) gets ``431`` (RFC 6585), anything ``h11`` cannot parse ``400`` (a missing
``Host`` too, RFC 9112 section 3.2), an HTTP version whose major number is not 1 ``505``
(as Go's net/http answers ``HTTP/0.9`` and ``HTTP/2.0``; ``HTTP/1.x`` is served), a method
of RFC 9110 other than GET and HEAD ``405`` with ``Allow``, a method nobody defined
``501``; ``HEAD`` gets GET's headers only.

A taken port is not fatal: :meth:`MetricsEndpoint.start` then binds again every
``RETRY_S`` in the background (one warn record; ``Started metrics endpoint`` when it
works), as a second instance with ``hostNetwork`` would want once the first has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import queue
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Final

import h11

from rbln_device_plugin import aiotasks
from rbln_device_plugin.telemetry.exposition import CONTENT_TYPE
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import call_soon_threadsafe

REQUEST_TIMEOUT_S: Final = 10.0
WRITE_TIMEOUT_S: Final = 10.0
RENDER_TIMEOUT_S: Final = 10.0
RETRY_S: Final = 5.0
MAX_CONNECTIONS: Final = 32
MAX_HEAD_BYTES: Final = 8 * 1024
BACKLOG: Final = 128
READ_CHUNK: Final = 4096
PATHS: Final = ("/metrics", "/")
ALLOWED: Final = (b"GET", b"HEAD")
# Methods RFC 9110 (and RFC 5789's PATCH) define: a known method not allowed here is 405.
KNOWN_METHODS: Final = frozenset(
    {b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"}
)

log = get_logger()


class MetricsEndpointError(RuntimeError):
    """The endpoint could not listen, for a reason other than a taken port."""


Answer = tuple[int, bytes, list[tuple[str, str]]]


class MetricsEndpoint:
    def __init__(self, port: int, render: Callable[[], str], host: str | None = None) -> None:
        self._requested_port = port
        self._host = host  # None: every interface, IPv6 and IPv4 on one socket
        self._renderer = _RenderThread(render)
        self._server: asyncio.Server | None = None
        self._retry: asyncio.Task[None] | None = None
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # insertion order = age
        self._open: set[asyncio.StreamWriter] = set()
        self._pending: asyncio.Future[str] | None = None
        self.port: int | None = None
        self.listening = asyncio.Event()

    async def start(self) -> None:
        """Listen now, or (port taken) keep trying in the background; other errors raise."""
        try:
            await self._listen()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise MetricsEndpointError(
                    f"cannot listen on port {self._requested_port} for metrics: {exc}"
                ) from None
            log.warning(
                "Metrics port in use; retrying in the background",
                port=self._requested_port, retryEvery=f"{RETRY_S:g}s", err=exc,
            )  # fmt: skip
            self._retry = asyncio.create_task(self._keep_trying(), name="metrics-listen")

    async def _listen(self) -> None:
        listener = _listen(self._host, self._requested_port)
        try:
            server = await asyncio.start_server(self._serve, sock=listener, backlog=BACKLOG)
        except BaseException:
            listener.close()
            raise
        self._server = server
        self.port = int(server.sockets[0].getsockname()[1])
        self.listening.set()
        log.info("Started metrics endpoint", port=self.port, paths=PATHS)

    async def _keep_trying(self) -> None:
        while True:
            await asyncio.sleep(RETRY_S)
            try:
                await self._listen()
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    log.error("Cannot start metrics endpoint; giving up", err=exc)
                    return

    async def stop(self) -> None:
        retry, self._retry = self._retry, None
        if retry is not None:
            await aiotasks.cancel_and_wait(retry, title="metrics endpoint")
        self._renderer.close()
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
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            request: h11.Request | None = None
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    request = await _read_request(conn, reader)
            except h11.RemoteProtocolError as exc:
                answer = _plain(exc.error_status_hint, f"{exc}\n")
            else:
                if request is None:
                    raise ConnectionError("closed before sending a request")
            self._waiting.pop(writer, None)
            if request is not None:
                answer = await self._answer(request)
            head_only = request is not None and request.method == b"HEAD"
            writer.write(_response(conn, answer, head_only))
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await writer.drain()
            writer.close()
        except (TimeoutError, ConnectionError, h11.ProtocolError):
            writer.transport.abort()  # a slow or silent peer: drop it, unsent bytes too
        finally:
            self._waiting.pop(writer, None)
            self._open.discard(writer)

    async def _answer(self, request: h11.Request) -> Answer:
        if not supported_version(bytes(request.http_version)):
            return _plain(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "unsupported protocol version\n")
        method = bytes(request.method)
        if method not in ALLOWED:
            if method in KNOWN_METHODS:
                status, allow = HTTPStatus.METHOD_NOT_ALLOWED, [("Allow", "GET, HEAD")]
                return status, b"only GET and HEAD\n", allow
            return _plain(HTTPStatus.NOT_IMPLEMENTED, "only GET and HEAD\n")
        path = bytes(request.target).partition(b"?")[0].decode("latin-1")
        if path not in PATHS:
            return _plain(HTTPStatus.NOT_FOUND, "metrics are at /metrics\n")
        try:
            text = await asyncio.wait_for(self._shared_render(), RENDER_TIMEOUT_S)
        except TimeoutError:
            log.warning("Metrics render did not finish in time", timeoutSeconds=RENDER_TIMEOUT_S)
            return _plain(HTTPStatus.SERVICE_UNAVAILABLE, "metrics render timed out\n")
        except Exception as exc:
            log.warning("Cannot render metrics", err=exc, exc_info=True)
            return _plain(HTTPStatus.INTERNAL_SERVER_ERROR, "cannot render metrics\n")
        return HTTPStatus.OK, text.encode(), [("Content-Type", CONTENT_TYPE)]

    async def _shared_render(self) -> str:
        """One render on the render thread; scrapes that arrive meanwhile get its result."""
        pending = self._pending
        if pending is None:
            pending = self._renderer.submit()
            self._pending = pending
            pending.add_done_callback(self._render_done)
        return await aiotasks.run_to_end(pending)

    def _render_done(self, done: asyncio.Future[str]) -> None:
        self._pending = None
        if not done.cancelled():
            done.exception()  # retrieved: a failed render is logged by each waiting scrape


def supported_version(http_version: bytes) -> bool:
    """HTTP/1.x, the only major version served (``h11`` gives ``b"<digit>.<digit>"``)."""
    return http_version.startswith(b"1.")


class LeadingEmptyLines:
    """Drops the empty lines (CRLF or a bare LF) before a request line, as RFC 9112
    section 2.2 asks a server to (``h11`` refuses them), and passes everything from the
    request line's first byte on. A CR that ends one read waits for the next one."""

    def __init__(self) -> None:
        self._started = False
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        if self._started:
            return data
        data, self._pending = self._pending + data, b""
        at = 0
        while True:
            if data[at : at + 1] == b"\n":
                at += 1
            elif data[at : at + 2] == b"\r\n":
                at += 2
            else:
                break
        rest = data[at:]
        if rest == b"\r":  # maybe the first half of an empty line
            self._pending = rest
            return b""
        self._started = bool(rest)
        return rest


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
    """The request head (a body, if any, is never read: the answer closes); None on EOF.

    ``h11`` refuses an incomplete head over its limit, but one that arrives whole in a
    single read it would take; and it never sees the empty lines dropped before the
    request line. So the head is read up to one byte past the limit, those lines
    included, and a head not complete by then gets the 431.
    """
    fed = 0
    empty_lines = LeadingEmptyLines()
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is h11.NEED_DATA:
            if fed > MAX_HEAD_BYTES:
                raise h11.RemoteProtocolError("request head too large", 431)
            data = await reader.read(min(READ_CHUNK, MAX_HEAD_BYTES + 1 - fed))
            fed += len(data)
            if not data:
                conn.receive_data(b"")  # the peer's EOF
            elif rest := empty_lines.feed(data):
                conn.receive_data(rest)  # never b"" here: to h11 that means EOF
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None
        raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}", 400)


def _plain(status: int, text: str) -> Answer:
    return status, text.encode(), [("Content-Type", "text/plain; charset=utf-8")]


def _response(conn: h11.Connection, answer: Answer, head_only: bool) -> bytes:
    status, body, headers = answer
    phrase = HTTPStatus(status).phrase.encode()
    fields = [*headers, ("Content-Length", str(len(body))), ("Connection", "close")]
    out = conn.send(h11.Response(status_code=status, headers=fields, reason=phrase)) or b""
    if body and not head_only:
        out += conn.send(h11.Data(data=body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


class _RenderThread:
    """Renders on one daemon thread of the endpoint's own.

    Not the loop's default executor: ``asyncio.run`` joins that at exit without a bound,
    so one stuck render would hold the daemon's exit. This thread is never joined.
    """

    def __init__(self, render: Callable[[], str]) -> None:
        self._render = render
        self._jobs: queue.SimpleQueue[asyncio.Future[str] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="metrics-render", daemon=True)
            self._thread.start()
        self._jobs.put(future)
        return future

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _run(self) -> None:
        while (future := self._jobs.get()) is not None:
            loop = future.get_loop()
            try:
                text = self._render()
            except Exception as exc:
                call_soon_threadsafe(loop, _settle, future, None, exc)
            else:
                call_soon_threadsafe(loop, _settle, future, text, None)


def _settle(future: asyncio.Future[str], text: str | None, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(text or "")


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
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
