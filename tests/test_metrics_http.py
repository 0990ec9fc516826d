"""The metrics endpoint's HTTP through raw sockets: each case with the status its RFC gives.

The endpoint runs on this test's event loop with a real listening socket; the requests
are bytes written by hand, as a broken client or a proxy would send them.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time

import pytest

from rbln_device_plugin.telemetry import metrics_http
from rbln_device_plugin.telemetry.exposition import CONTENT_TYPE
from rbln_device_plugin.telemetry.metrics_http import MetricsEndpoint

BODY = "# TYPE x gauge\nx 1\n"


async def exchange(
    port: int, raw: bytes, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw``, read until the endpoint closes: status, headers (lowercase), body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.fixture
async def endpoint() -> object:
    served = MetricsEndpoint(0, lambda: BODY, host="127.0.0.1")
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


def port_of(endpoint: object) -> int:
    assert isinstance(endpoint, MetricsEndpoint) and endpoint.port is not None
    return endpoint.port


async def test_a_get_is_answered_with_the_exposition(endpoint: object) -> None:
    status, headers, body = await exchange(
        port_of(endpoint), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status == 200
    assert headers["content-type"] == CONTENT_TYPE
    assert int(headers["content-length"]) == len(body) and body.decode() == BODY
    assert headers["connection"] == "close"


async def test_http_1_0_and_a_query_string_are_answered(endpoint: object) -> None:
    status, _, body = await exchange(port_of(endpoint), b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
    assert status == 200 and body.decode() == BODY


async def test_bare_lf_line_ends_are_accepted(endpoint: object) -> None:
    # RFC 9112 section 2.2: a recipient MAY recognize a single LF as a line terminator.
    status, _, body = await exchange(port_of(endpoint), b"GET /metrics HTTP/1.1\nHost: x\n\n")
    assert status == 200 and body.decode() == BODY


@pytest.mark.parametrize(
    "version", [b"HTTP/9.9", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/3.0"], ids=lambda v: v.decode()
)
async def test_an_http_version_other_than_1_x_gets_505(endpoint: object, version: bytes) -> None:
    # As Go's net/http: only major version 1 is served (RFC 9110 section 15.6.6).
    raw = b"GET /metrics " + version + b"\r\nHost: x\r\n\r\n"
    status, headers, body = await exchange(port_of(endpoint), raw)
    assert status == 505, body
    assert body == b"unsupported protocol version\n" and headers["connection"] == "close"


async def test_any_http_1_minor_version_is_served(endpoint: object) -> None:
    # Go's net/http serves HTTP/1.x whatever x is; so does the endpoint.
    status, _, body = await exchange(port_of(endpoint), b"GET /metrics HTTP/1.9\r\nHost: x\r\n\r\n")
    assert status == 200 and body.decode() == BODY


@pytest.mark.parametrize(
    "prefix", [b"\r\n", b"\n", b"\r\n\r\n\n", b"\r\n" * 100], ids=["crlf", "lf", "mixed", "100"]
)
async def test_empty_lines_before_the_request_line_are_ignored(
    endpoint: object, prefix: bytes
) -> None:
    # RFC 9112 section 2.2: a server SHOULD ignore at least one empty line before it.
    raw = prefix + b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    status, _, body = await exchange(port_of(endpoint), raw)
    assert status == 200 and body.decode() == BODY


async def test_empty_lines_split_across_reads_are_ignored(endpoint: object) -> None:
    # The CR of an empty line in one packet, its LF and the request in the next.
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(endpoint))
    try:
        writer.write(b"\r\n\r")
        await writer.drain()
        await asyncio.sleep(0.05)  # most likely two reads (a unit test pins every split)
        writer.write(b"\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(BODY.encode())


@pytest.mark.parametrize("cut", range(1, 8))
def test_empty_lines_are_dropped_wherever_the_reads_split_them(cut: int) -> None:
    raw = b"\r\n\n\r\nGET / HTTP/1.1\r\n"
    empty_lines = metrics_http.LeadingEmptyLines()
    assert empty_lines.feed(raw[:cut]) + empty_lines.feed(raw[cut:]) == b"GET / HTTP/1.1\r\n"
    assert empty_lines.feed(b"\r\n") == b"\r\n"  # after the request line: passed on


async def test_empty_lines_count_toward_the_head_limit(endpoint: object) -> None:
    # Ignored, not free: a flood of them is a head over 8 KiB like any other.
    status, _, _ = await exchange(port_of(endpoint), b"\r\n" * 5000)
    assert status == 431
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    status, _, _ = await exchange(port_of(endpoint), b"\r\n" * 4000 + request)  # 8,036 bytes
    assert status == 200
    status, _, _ = await exchange(port_of(endpoint), b"\r\n" * 4100 + request)  # 8,236 bytes
    assert status == 431


async def test_a_lone_cr_before_the_request_line_is_not_an_empty_line(endpoint: object) -> None:
    status, _, _ = await exchange(port_of(endpoint), b"\rGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 400


async def test_a_bare_lf_request_without_host_is_refused_at_once(endpoint: object) -> None:
    # Before: no answer until the 10 s request deadline. Now: 400 (RFC 9112 section 3.2).
    began = time.monotonic()
    status, _, _ = await exchange(port_of(endpoint), b"GET /metrics HTTP/1.1\n\n", timeout=3)
    assert status == 400
    assert time.monotonic() - began < 3


async def test_an_oversized_head_gets_431(endpoint: object) -> None:
    raw = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 9000 + b"\r\n\r\n"
    status, _, _ = await exchange(port_of(endpoint), raw)
    assert status == 431


async def test_an_oversized_head_still_arriving_gets_431(endpoint: object) -> None:
    # The head has not ended yet: the answer does not wait for the rest of it.
    raw = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 9000
    status, _, _ = await exchange(port_of(endpoint), raw, timeout=3)
    assert status == 431


@pytest.mark.parametrize(
    "raw",
    [b"garbage\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"GET /metrics\r\n\r\n",
     b"GET /metrics HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n"],
    ids=["words", "tls-hello", "no-version", "bad-header"],
)  # fmt: skip
async def test_garbage_gets_400(endpoint: object, raw: bytes) -> None:
    status, _, _ = await exchange(port_of(endpoint), raw)
    assert status == 400


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"])
async def test_a_known_method_other_than_get_and_head_gets_405_with_allow(
    endpoint: object, method: str
) -> None:
    raw = f"{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
    status, headers, _ = await exchange(port_of(endpoint), raw)
    assert status == 405
    assert headers["allow"] == "GET, HEAD"  # RFC 9110 section 15.5.6: MUST send Allow


@pytest.mark.parametrize("method", ["BREW", "get", "PROPFIND"])
async def test_an_unknown_method_gets_501(endpoint: object, method: str) -> None:
    # Methods are case-sensitive (RFC 9110 section 9.1): "get" is not GET.
    raw = f"{method} /metrics HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    status, _, _ = await exchange(port_of(endpoint), raw)
    assert status == 501


async def test_head_gets_the_headers_of_get_and_no_body(endpoint: object) -> None:
    port = port_of(endpoint)
    _, get_headers, _ = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and body == b""
    assert headers["content-length"] == get_headers["content-length"]
    assert headers["content-type"] == CONTENT_TYPE


async def test_another_path_gets_404(endpoint: object) -> None:
    status, _, body = await exchange(port_of(endpoint), b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404 and b"/metrics" in body


async def test_a_peer_that_closes_without_a_request_gets_nothing(endpoint: object) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(endpoint))
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed")
async def test_the_listen_backlog_is_the_one_asked_for(endpoint: object) -> None:
    port = port_of(endpoint)
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    (line,) = out.splitlines()
    assert int(line.split()[2]) == metrics_http.BACKLOG  # Send-Q of a listener: its backlog


async def test_renders_run_on_the_endpoints_own_thread_one_at_a_time() -> None:
    seen: list[str] = []
    running = threading.Semaphore(1)
    release = threading.Event()

    def render() -> str:
        assert running.acquire(blocking=False), "two renders at once"
        try:
            seen.append(threading.current_thread().name)
            release.wait(5)
            return BODY
        finally:
            running.release()

    served = MetricsEndpoint(0, render, host="127.0.0.1")
    await served.start()
    try:
        port = port_of(served)
        scrapes = [
            asyncio.create_task(exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
            for _ in range(5)
        ]
        await asyncio.sleep(0.3)
        release.set()
        answers = await asyncio.gather(*scrapes)
        assert all(status == 200 and body.decode() == BODY for status, _, body in answers)
        # Concurrent scrapes shared one render; none ran on asyncio's default executor.
        assert seen[0] == "metrics-render" and set(seen) == {"metrics-render"}
        assert len(seen) < 5
    finally:
        await served.stop()


async def test_a_failing_render_gets_500_and_the_next_scrape_renders_again() -> None:
    calls = []

    def render() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return BODY

    served = MetricsEndpoint(0, render, host="127.0.0.1")
    await served.start()
    try:
        raw = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        assert (await exchange(port_of(served), raw))[0] == 500
        assert (await exchange(port_of(served), raw))[0] == 200
    finally:
        await served.stop()


async def test_a_taken_port_is_retried_in_the_background(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_http, "RETRY_S", 0.1)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    served = MetricsEndpoint(port, lambda: BODY, host="127.0.0.1")
    try:
        await served.start()  # no exception: the endpoint keeps trying
        assert served.port is None and not served.listening.is_set()
        await asyncio.sleep(0.35)
        assert not served.listening.is_set()
        holder.close()
        await asyncio.wait_for(served.listening.wait(), 5)
        status, _, _ = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200
    finally:
        holder.close()
        await served.stop()
