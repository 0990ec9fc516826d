"""OpenTelemetry tracing of allocations; strictly best effort.

With no endpoint the tracer is a no-op: no exporter, no provider, no threads. A broken
endpoint or exporter logs one warning and the daemon runs on without tracing. An
unreachable collector only produces (rate-limited) warn records: spans are queued by a
batch processor thread and never delay an allocation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol, cast

from rbln_device_plugin import __version__
from rbln_device_plugin.config import Config
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.otlp import (
    EXPORT_TIMEOUT_S,
    Endpoint,
    close_bounded,
    otel_resource,
    parse_endpoint,
)

TRACER_NAME: Final = "rbln-device-plugin"

log = get_logger()


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
