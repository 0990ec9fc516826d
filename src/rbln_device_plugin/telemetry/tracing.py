"""OpenTelemetry tracing of allocations; strictly best effort.

With no endpoint the tracer is a no-op: no exporter, no provider, no threads. A broken
endpoint or exporter logs one warning and the daemon runs on without tracing. An
unreachable collector only produces (rate-limited) warn records: spans are queued by a
batch processor thread and never delay an allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from rbln_device_plugin import __version__
from rbln_device_plugin.config import Config
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.waits import set_result_threadsafe

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

TRACER_NAME: Final = "rbln-device-plugin"
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


AttributeValue = str | bool | int | float | Sequence[str]


class Span(Protocol):
    """The part of an OpenTelemetry span the daemon uses."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def record_exception(self, exception: BaseException) -> None: ...

    def set_status(self, status: Any, description: str | None = None) -> None: ...


class Tracer(Protocol):
    """The part of an OpenTelemetry tracer the daemon uses.

    The daemon's own no-op tracer stands in when tracing is off, so the OpenTelemetry
    packages are not even imported then (they cost memory on every node, forever).
    """

    def start_as_current_span(
        self,
        name: str,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> AbstractContextManager[Span]: ...


class NoopSpan:
    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass

    def record_exception(self, exception: BaseException) -> None:
        pass

    def set_status(self, status: Any, description: str | None = None) -> None:
        pass


_NOOP_SPAN: Final = NoopSpan()


class NoopTracer:
    @contextlib.contextmanager
    def _span(self) -> Iterator[Span]:
        yield _NOOP_SPAN

    def start_as_current_span(
        self,
        name: str,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> AbstractContextManager[Span]:
        return self._span()


def mark_error(span: Span, description: str) -> None:
    """Set a span's status to Error (a no-op span stays untouched, nothing is imported)."""
    if isinstance(span, NoopSpan):
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


class Tracing:
    """The daemon's tracer and, when enabled, the provider behind it."""

    def __init__(self, tracer: Tracer, provider: object | None = None) -> None:
        self.tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    async def shutdown(self) -> None:
        """Flush pending spans, bounded; never blocks the event loop."""
        provider = self._provider
        if provider is None:
            return
        self._provider = None
        await close_bounded(provider.shutdown, "otel-shutdown", "span flush", "spans dropped")  # type: ignore[attr-defined]


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


def disabled() -> Tracing:
    return Tracing(NoopTracer())


def setup(config: Config) -> Tracing:
    if not config.otlp_endpoint:
        log.info("Distributed tracing disabled; no OTLP endpoint configured")
        return disabled()
    if not config.tracing_enabled:
        log.info(
            "Distributed tracing disabled; traces switched off",
            setting=config.origin("traces_exporter"), endpoint=config.otlp_endpoint,
        )  # fmt: skip
        return disabled()
    try:
        endpoint = parse_endpoint(config.otlp_endpoint)
        tracing = _build(endpoint, config.node_name)
    except Exception as exc:
        log.warning(
            "Tracing setup failed; continuing without distributed tracing",
            endpoint=config.otlp_endpoint, setting=config.origin("otlp_endpoint"), err=exc,
        )  # fmt: skip
        return disabled()
    log.info(
        "Distributed tracing enabled",
        endpoint=endpoint.target, insecure=endpoint.insecure, nodeName=config.node_name,
    )  # fmt: skip
    return tracing


def otel_resource(node_name: str) -> Resource:
    """What every trace and metric export says about its source (one node's plugin)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create(
        {"service.name": SERVICE_NAME, "service.version": __version__, "k8s.node.name": node_name}
    )


def _build(endpoint: Endpoint, node_name: str) -> Tracing:
    # Imported only when enabled: keeps a tracing-free daemon free of exporter machinery.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = otel_resource(node_name)
    exporter = OTLPSpanExporter(
        endpoint=endpoint.target, insecure=endpoint.insecure, timeout=EXPORT_TIMEOUT_S
    )
    # No atexit hook: an unreachable collector would hold the exiting process for seconds.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            schedule_delay_millis=1000,
            export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000),
        )
    )
    return Tracing(cast(Tracer, provider.get_tracer(TRACER_NAME, __version__)), provider)
