"""Choosing the recorder at start: the no-op one, or the OpenTelemetry one (loaded only then).

Kept apart from ``metrics`` so that the recorder's interface never imports its
implementation, and a daemon with metrics off never imports the SDK.
"""

from __future__ import annotations

from rbln_device_plugin.config import Config
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.metrics import NOOP, Metrics

log = get_logger()


async def start(config: Config) -> Metrics:
    """The recorder for this configuration; a setup failure logs and records nothing."""
    if not config.metrics_enabled:
        log.info(
            "Metrics disabled; no metrics port or OTLP metrics configured",
            metricsPort=config.metrics_port,
        )  # fmt: skip
        return NOOP
    try:
        # Imported only when enabled: the SDK and exporters stay out of a lean daemon.
        from rbln_device_plugin.telemetry import otel_metrics

        return await otel_metrics.start(config)
    except Exception as exc:
        log.warning("Metrics setup failed; continuing without metrics", err=exc, exc_info=True)
        return NOOP
