"""A real Prometheus server (Debian's ``prometheus`` package) and its ``promtool``, for
the tests: found on PATH or in /usr/bin, started on loopback with a temporary TSDB, asked
through its HTTP API. ``.ci/run`` and ``make test`` install the package; a test skips
with the reason where it is missing."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rbln_device_plugin_sim.processes import stop_process

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deployments" / "prometheus" / "rules.yaml"
RULES_TEST = REPO / "deployments" / "prometheus" / "rules.test.yaml"
MISSING = "Debian's prometheus package is not installed (make test installs it as root)"


def binary(name: str) -> str:
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
    )
    if found is None:
        pytest.skip(f"{name}: {MISSING}")
    return found


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], input=stdin, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Prometheus:
    def __init__(self, port: int, proc: subprocess.Popen[str], log: Path) -> None:
        self.port = port
        self.proc = proc
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, promql: str) -> list[dict[str, Any]]:
        data = await asyncio.to_thread(self.api, "query", query=promql)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    async def wait_for(
        self, promql: str, ready: Any = bool, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Evaluate ``promql`` until ``ready(result)``; fail with the last result."""
        deadline = time.monotonic() + timeout
        while True:
            result = await self.query(promql)
            if ready(result):
                return result
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{promql!r} never got there: {result}\n{self.tail()}")
            await asyncio.sleep(0.25)

    async def alerts(self) -> list[dict[str, Any]]:
        return list((await asyncio.to_thread(self.api, "alerts"))["alerts"])

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextmanager
def prometheus(
    tmp: Path, target_port: int, rule_files: Sequence[Path] = (), interval: str = "500ms"
) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1, scraping 127.0.0.1:target_port every ``interval``."""
    exe = binary("prometheus")
    port = _free_port()
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{
            "job_name": "rbln-device-plugin",
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"],
                                "labels": {"node": "node-a"}}],
        }],
    }))  # fmt: skip
    log = tmp / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
    server = Prometheus(port, proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Prometheus did not start:\n{server.tail()}")
            time.sleep(0.1)
        yield server
    finally:
        stop_process(proc)
