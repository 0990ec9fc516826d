"""What OTLP tracing and OTLP metrics share: the endpoint grammar, the resource every
export names, and the bounded shutdown of an OpenTelemetry provider."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from rbln_device_plugin import __version__
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import set_result_threadsafe

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

SERVICE_NAME: Final = "rbln-device-plugin"
SHUTDOWN_TIMEOUT_S: Final = 5.0
EXPORT_TIMEOUT_S: Final = 5.0

log = get_logger()


class EndpointError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Endpoint:
    target: str  # what the exporter is given
    insecure: bool


# The grammar the chart's values check accepts, so the chart and the daemon agree on
# every endpoint: a host name or bracketed IPv6 address, a port 1-65535 written without
# leading zeros (required without a scheme), and an optional "/" after a URL's authority.
_HOST: Final = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[-A-Za-z0-9._]*[A-Za-z0-9])?)"
_PORT: Final = (
    r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
)
_URL: Final = re.compile(rf"(https?|grpcs?)://{_HOST}(?::{_PORT})?/?")
_HOST_PORT: Final = re.compile(rf"{_HOST}:{_PORT}")


def parse_endpoint(raw: str) -> Endpoint:
    """``host:port`` is an insecure connection; a URL uses its scheme (https = TLS)."""
    text = raw.strip()
    url = _URL.fullmatch(text)
    if url is not None:
        return Endpoint(text, insecure=url.group(1) in ("http", "grpc"))
    if _HOST_PORT.fullmatch(text) is not None:
        return Endpoint(text, insecure=True)
    if "://" in text:
        raise EndpointError(
            f"expected http(s):// or grpc(s):// with a host, an optional port 1-65535 and "
            f"no path, got {raw!r}"
        )
    raise EndpointError(f"expected host:port (port 1-65535) or a URL, got {raw!r}")


async def close_bounded(close: Callable[[], object], thread: str, work: str, loss: str) -> None:
    """Run an OpenTelemetry provider's shutdown (its last flush) for at most
    SHUTDOWN_TIMEOUT_S; its errors are warn records, never the daemon's.

    On a daemon thread, not the default executor: asyncio.run would wait for an executor
    thread stuck on an unreachable collector, and so would the process exit.
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def run() -> None:
        try:
            close()
        except Exception as exc:
            log.warning("OpenTelemetry SDK error", component="otel", err=exc)
        finally:
            set_result_threadsafe(loop, done, None)

    threading.Thread(target=run, name=thread, daemon=True).start()
    try:
        await asyncio.wait_for(done, SHUTDOWN_TIMEOUT_S)
    except TimeoutError:
        log.warning(
            "OpenTelemetry SDK error", component="otel",
            err=f"{work} did not finish within {SHUTDOWN_TIMEOUT_S:g}s; {loss}",
        )  # fmt: skip


def otel_resource(node_name: str) -> Resource:
    """What every trace and metric export says about its source (one node's plugin)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create(
        {"service.name": SERVICE_NAME, "service.version": __version__, "k8s.node.name": node_name}
    )
