"""The metrics endpoint's HTTP layer against the alternatives of issue 33, in process.

- one GET of a 28 KiB exposition (the 64-device node's size) from the h11 endpoint on
  the event loop, against the standard library's ``http.server`` (ThreadingHTTPServer,
  a thread per connection) serving the same bytes, measured in the same run;
- what importing each HTTP layer adds to the resident memory of a process that already
  has asyncio (as the daemon does): h11, ``http.server``, and ``prometheus_client``'s
  exposition server (what its ``start_http_server`` needs), against nothing imported.

Run: ``python -m bench.bench_http [--quick]``.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
import structlog.testing

from rbln_device_plugin.telemetry.metrics_http import MetricsEndpoint

from . import cli
from .bench_lean import row

BODY = ("# TYPE x gauge\n" + "".join(f'x{{device="rbln{i}"}} 1\n' for i in range(1300)))[
    : 28 * 1024
]
Row = dict[str, Any]


async def _get(port: int) -> float:
    began = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
    raw = await reader.read()
    writer.close()
    elapsed = (time.perf_counter() - began) * 1000
    assert raw.startswith(b"HTTP/1.") and b" 200 " in raw.split(b"\r\n", 1)[0], raw[:80]
    assert raw.endswith(BODY.encode()[-64:])
    return elapsed


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = BODY.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


async def latency_rows(requests: int) -> list[Row]:
    endpoint = MetricsEndpoint(0, lambda: BODY, host="127.0.0.1")
    await endpoint.start()
    stdlib = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    stdlib.daemon_threads = True
    thread = threading.Thread(target=stdlib.serve_forever, daemon=True)
    thread.start()
    try:
        assert endpoint.port is not None
        ours, theirs = [], []
        for _ in range(requests):  # interleaved: both see the same machine load
            ours.append(await _get(endpoint.port))
            theirs.append(await _get(stdlib.server_address[1]))
    finally:
        stdlib.shutdown()
        stdlib.server_close()
        await endpoint.stop()
    return [row("HTTP layer: one GET of 28 KiB, h11 endpoint on the event loop",
                statistics.median(ours), "ms", statistics.median(theirs), "ms",
                "floor: http.server (ThreadingHTTPServer) serving the same bytes")]  # fmt: skip


_PROBE = """
import asyncio, gc, sys
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
for name in sys.argv[1:]:
    __import__(name)
gc.collect(); print(rss())
"""


def _import_cost(*modules: str) -> float:
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        runs.append(float(out))
    return statistics.median(runs)


def memory_rows() -> list[Row]:
    floor = _import_cost()
    rows = []
    for label, modules in (
        ("h11 (this endpoint)", ("h11",)),
        ("http.server", ("http.server",)),
        ("prometheus_client's exposition server", ("prometheus_client.exposition",)),
    ):
        rss = _import_cost(*modules)
        rows.append(row(f"resident memory after importing {label}", rss, "MiB", floor, "MiB",
                        f"+{rss - floor:.2f} MiB; floor: the same process with asyncio "
                        "only"))  # fmt: skip
    return rows


def run(quick: bool = False) -> list[Row]:
    with structlog.testing.capture_logs():  # the endpoint's start record stays off the table
        rows = asyncio.run(latency_rows(100 if quick else 400))
    rows += memory_rows()
    for out in rows:
        out["area"] = "metrics"
    return rows


if __name__ == "__main__":
    for r in run(quick=cli.quick(__doc__)):
        print(f"{r['metric']:<72} {r['value']:>9.3f} {r['unit']:<5} {r['note']}")
