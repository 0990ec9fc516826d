"""The recorder with metrics on: OpenTelemetry instruments, and the ways out.

Loaded only when a metrics port or OTLP metrics are configured. One ``MeterProvider``
feeds up to two readers: a pull reader rendered as Prometheus text on request (see
``metrics_http``) and a periodic OTLP/gRPC push to the tracing collector. Both see the
same instruments, so a scrape and a push carry the same data points.

Collection runs on other threads (the push thread, the endpoint's render thread), so
the observable instruments read only immutable snapshots that the event loop swaps in:
each resource's device mapping (replaced, never edited, by every scan) and the log
sink's drop counter. Pushing is best effort like tracing: an unreachable collector costs
a queued export on the push thread and rate-limited warn records, never a wait here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Final

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader

from rbln_device_plugin import __version__
from rbln_device_plugin.config import Config
from rbln_device_plugin.durations import format_duration
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.telemetry import exposition, logs, otlp
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.exposition import ZeroHistogram
from rbln_device_plugin.telemetry.metrics import NOOP, OK, Metrics, status_label
from rbln_device_plugin.telemetry.metrics_http import MetricsEndpoint, MetricsEndpointError

PREFIX: Final = "rbln_device_plugin"
SHUTDOWN_TIMEOUT_S: Final = 5.0
# Seconds: from a fast sysfs read to the 5 s lock budget and the 10 s rbln-smi limit.
DURATION_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

log = logs.get_logger()


class OtelMetrics(Metrics):
    enabled = True

    def __init__(
        self,
        provider: MeterProvider,
        pull: InMemoryMetricReader | None,
        mode: str = m.MODES[0],
    ) -> None:
        self._provider = provider
        self._mode = mode
        self._prepared_claims = 0
        self._withheld: Mapping[str, int] = {}
        self._pull = pull
        self._render_lock = threading.Lock()
        self._tables: dict[str, Mapping[str, Entry]] = {}
        self._cdi_state: str | None = None  # None until the first check
        self._state = m.STATE_WAITING_FOR_KUBELET_DIR
        self._stopped = False
        self.endpoint: MetricsEndpoint | None = None
        meter = provider.get_meter(PREFIX, __version__)
        histograms: dict[str, tuple[str, str]] = {}

        def counter(name: str, unit: str, description: str) -> Any:
            return meter.create_counter(f"{PREFIX}.{name}", unit, description)

        def histogram(name: str, description: str) -> Any:
            histograms[name] = (f"{PREFIX}.{name}", description)
            return meter.create_histogram(
                f"{PREFIX}.{name}", "s", description,
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )  # fmt: skip

        def zero(name: str, **attributes: str) -> ZeroHistogram:
            full, description = histograms[name]
            return ZeroHistogram(full, "s", description, DURATION_BUCKETS, attributes)

        self._zero = zero

        self._allocations = counter(
            "allocate.requests", "{request}", "Allocate calls answered, by resource and result"
        )
        self._allocate_seconds = histogram("allocate.duration", "Time to answer an Allocate call")
        self._preferred = counter(
            "preferred_allocation.requests",
            "{request}",
            "GetPreferredAllocation container requests answered, by resource and result",
        )
        self._preferred_seconds = histogram(
            "preferred_allocation.duration", "Time to answer one preferred-allocation request"
        )
        self._capped = counter(
            "preferred_allocation.capped",
            "{search}",
            "Preferred-allocation searches that reached the safety cap",
        )
        self._smi_calls = counter(
            "rbln_smi.calls", "{call}", "rbln-smi runs, by subcommand and result"
        )
        self._smi_seconds = histogram("rbln_smi.duration", "Time of one rbln-smi run")
        self._lock_wait = histogram("rsd_lock.wait", "Time waiting for the RSD lock file")
        self._scan_seconds = histogram(
            "scan.duration", "Time of one inventory scan, plugin updates included"
        )
        self._discovery_failures = counter(
            "discovery.failures", "{scan}", "Scans whose discovery failed (zero devices reported)"
        )
        self._appeared = counter(
            "devices.appeared", "{device}", "Devices that entered a resource's advertised set"
        )
        self._disappeared = counter(
            "devices.disappeared", "{device}", "Devices that left a resource's advertised set"
        )
        self._registrations = counter(
            "kubelet.registrations",
            "{registration}",
            "Register calls to the kubelet, by resource and result",
        )
        self._restarts = counter(
            "kubelet.restarts", "{restart}", "Kubelet restarts seen (a new kubelet.sock)"
        )
        self._streams = meter.create_up_down_counter(
            f"{PREFIX}.list_and_watch.streams", "{stream}",
            "ListAndWatch streams open, by resource")  # fmt: skip
        self._stalls = counter(
            "host_reads.stalled",
            "{read}",
            "Host reads that outlived their wait (a stuck sysfs or /dev file)",
        )
        self._dra_claims = counter(
            "dra.claims", "{claim}",
            "DRA claims answered, by operation (prepare, unprepare) and result",
        )  # fmt: skip
        self._dra_prepare_seconds = histogram(
            "dra.prepare.duration", "Time to prepare one DRA claim"
        )
        self._slice_writes = counter(
            "dra.resourceslice.writes", "{request}",
            "ResourceSlice creates, updates and deletes sent to the API server, by result",
        )  # fmt: skip
        self._pod_resources_reads = counter(
            "pod_resources.reads", "{read}",
            "Lists of the kubelet's PodResources API (a node switched between the modes), "
            "by result")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.devices.withheld", [self._observe_withheld], "{device}",
            "Devices kept back, by resource, because pods of the other kubelet API hold them "
            "or might")  # fmt: skip
        self._health_streams = meter.create_up_down_counter(
            f"{PREFIX}.dra.health.streams", "{stream}",
            "DRA device-health streams (NodeWatchResources) open, by service version")  # fmt: skip
        self._taints = counter(
            "dra.device_taints", "{taint}",
            "Device taints applied to or removed from the ResourceSlices",
        )  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.mode", [self._observe_mode], "",
            "1 for the kubelet API this instance serves (device-plugin or dra), 0 for the "
            "other")  # fmt: skip
        meter.create_observable_counter(
            f"{PREFIX}.log.records_dropped", [self._observe_dropped], "{record}",
            "Log records dropped because stdout was blocked")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.devices", [self._observe_counts], "{device}",
            "Advertised devices, by resource and health")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.device.status", [self._observe_status], "",
            "1 for each advertised device, labelled with its current status")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.device.healthy", [self._observe_healthy], "",
            "1 when the device is Healthy, 0 when Unhealthy")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.cdi.spec", [self._observe_cdi], "",
            "1 for the CDI spec check's current state: present, missing or unknown "
            "(the daemon cannot tell)")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.build.info", [self._observe_build], "",
            "Always 1; the plugin's version as a label")  # fmt: skip
        meter.create_observable_gauge(
            f"{PREFIX}.instance.state", [self._observe_state], "",
            "1 for what this instance does now (waiting for the kubelet directory, "
            "waiting for the instance lock, serving), 0 for the others")  # fmt: skip

        # Every series known in advance starts at 0, so the first event is an increase in
        # PromQL: counters through the SDK (the OTLP push carries them too), histograms of
        # the success class in the exposition only (a histogram has no zero data point).
        for unlabelled in (self._discovery_failures, self._restarts, self._stalls):
            unlabelled.add(0)
        for result in m.POD_RESOURCES_RESULTS:
            self._pod_resources_reads.add(0, {"result": result})
        for subcommand in m.SMI_SUBCOMMANDS:
            for result in m.SMI_RESULTS:
                self._smi_calls.add(0, {"subcommand": subcommand, "result": result})
        self._node_zeros = (
            *(zero("rbln_smi.duration", subcommand=sub, result=OK) for sub in m.SMI_SUBCOMMANDS),
            *(zero("rsd_lock.wait", result=result) for result in m.LOCK_RESULTS),
            *(zero("scan.duration", result=result) for result in m.SCAN_RESULTS),
        )
        self._resource_zeros: dict[str, tuple[ZeroHistogram, ...]] = {}
        if mode == "dra":
            meter.create_observable_gauge(
                f"{PREFIX}.dra.prepared_claims", [self._observe_prepared], "{claim}",
                "DRA claims prepared on this node (the checkpoint's)")  # fmt: skip
            for operation, results in (
                (m.DRA_PREPARE, m.DRA_PREPARE_RESULTS),
                (m.DRA_UNPREPARE, m.DRA_UNPREPARE_RESULTS),
            ):
                for result in results:
                    self._dra_claims.add(0, {"operation": operation, "result": result})
            for verb in m.SLICE_VERBS:
                for result in m.SLICE_RESULTS:
                    self._slice_writes.add(0, {"verb": verb, "result": result})
            for service in m.HEALTH_SERVICES:
                self._health_streams.add(0, {"service": service})
            for change in m.TAINT_CHANGES:
                self._taints.add(0, {"change": change})
            self._node_zeros = (*self._node_zeros, zero("dra.prepare.duration", result=OK))

    # ------------------------------------------------------------- events (event loop)
    def allocation(self, resource: str, result: str, seconds: float) -> None:
        labels = {"resource": resource, "result": result}
        self._allocations.add(1, labels)
        self._allocate_seconds.record(seconds, labels)

    def preferred_allocation(
        self, resource: str, result: str, seconds: float, *, capped: bool = False
    ) -> None:
        labels = {"resource": resource, "result": result}
        self._preferred.add(1, labels)
        self._preferred_seconds.record(seconds, labels)
        if capped:
            self._capped.add(1, {"resource": resource})

    def rbln_smi_call(self, subcommand: str, result: str, seconds: float) -> None:
        labels = {"subcommand": subcommand, "result": result}
        self._smi_calls.add(1, labels)
        self._smi_seconds.record(seconds, labels)

    def rsd_lock_wait(self, result: str, seconds: float) -> None:
        self._lock_wait.record(seconds, {"result": result})

    def scan(self, result: str, seconds: float) -> None:
        self._scan_seconds.record(seconds, {"result": result})
        if result != OK:
            self._discovery_failures.add(1)

    def inventory_changes(self, resource: str, appeared: int, disappeared: int) -> None:
        if appeared:
            self._appeared.add(appeared, {"resource": resource})
        if disappeared:
            self._disappeared.add(disappeared, {"resource": resource})

    def devices(self, resource: str, entries: Mapping[str, Entry] | None) -> None:
        if entries is not None and resource not in self._tables:
            self._resource_started(resource)
        # Copy on write: a collecting thread holds the old mapping, never a changing one.
        tables = {name: known for name, known in self._tables.items() if name != resource}
        if entries is not None:
            tables[resource] = entries
        self._tables = tables

    def _resource_started(self, resource: str) -> None:
        """The resource's known series at 0 (adding 0 keeps a restarted plugin's counts).

        They stay when the plugin stops, as counters do: the stop is when
        ``devices_disappeared`` counts, and a series gone at that moment would hide the
        rise from ``increase()``. At most one set per resource, so the count stays bounded.
        """
        labels = {"resource": resource}
        for result in m.ALLOCATE_RESULTS:
            self._allocations.add(0, {**labels, "result": result})
        for result in m.PREFERRED_RESULTS:
            self._preferred.add(0, {**labels, "result": result})
        for result in m.REGISTRATION_RESULTS:
            self._registrations.add(0, {**labels, "result": result})
        for per_resource in (self._capped, self._appeared, self._disappeared, self._streams):
            per_resource.add(0, labels)
        if resource not in self._resource_zeros:  # copy on write, as for the tables
            self._resource_zeros = {**self._resource_zeros, resource: (
                self._zero("allocate.duration", resource=resource, result=OK),
                self._zero("preferred_allocation.duration", resource=resource, result=OK),
            )}  # fmt: skip

    def registration(self, resource: str, result: str) -> None:
        self._registrations.add(1, {"resource": resource, "result": result})

    def kubelet_restart(self) -> None:
        self._restarts.add(1)

    def stream_opened(self, resource: str) -> None:
        self._streams.add(1, {"resource": resource})

    def stream_closed(self, resource: str) -> None:
        self._streams.add(-1, {"resource": resource})

    def host_read_stalled(self) -> None:
        self._stalls.add(1)

    def cdi_spec(self, state: str) -> None:
        self._cdi_state = state  # a str swap: collection threads read either value

    def instance_state(self, state: str) -> None:
        self._state = state

    def dra_claim(self, operation: str, result: str, seconds: float) -> None:
        self._dra_claims.add(1, {"operation": operation, "result": result})
        if operation == m.DRA_PREPARE:
            self._dra_prepare_seconds.record(seconds, {"result": result})

    def dra_prepared_claims(self, count: int) -> None:
        self._prepared_claims = count

    def dra_slice_write(self, verb: str, result: str) -> None:
        self._slice_writes.add(1, {"verb": verb, "result": result})

    def pod_resources_read(self, result: str) -> None:
        self._pod_resources_reads.add(1, {"result": result})

    def withheld_devices(self, counts: Mapping[str, int]) -> None:
        self._withheld = dict(counts)  # swapped whole: collection threads read either

    def dra_health_stream(self, service: str, opened: bool) -> None:
        self._health_streams.add(1 if opened else -1, {"service": service})

    def dra_taints(self, change: str, count: int) -> None:
        if count:
            self._taints.add(count, {"change": change})

    # ------------------------------------------------------------- collection (any thread)
    def _snapshot(self) -> list[tuple[str, Mapping[str, Entry]]]:
        return list(self._tables.items())  # the loop replaces the dict, never edits it

    def _observe_counts(self, _: CallbackOptions) -> Iterable[Observation]:
        for resource, entries in self._snapshot():
            healthy = sum(1 for entry in entries.values() if entry.healthy)
            yield Observation(healthy, {"resource": resource, "health": "Healthy"})
            yield Observation(len(entries) - healthy, {"resource": resource,
                                                       "health": "Unhealthy"})  # fmt: skip

    def _observe_status(self, _: CallbackOptions) -> Iterable[Observation]:
        for resource, entries in self._snapshot():
            for entry in entries.values():
                status = status_label(entry.verdict.status)
                yield Observation(1, {**_device_labels(resource, entry), "status": status})

    def _observe_healthy(self, _: CallbackOptions) -> Iterable[Observation]:
        for resource, entries in self._snapshot():
            for entry in entries.values():
                yield Observation(int(entry.healthy), _device_labels(resource, entry))

    def _observe_dropped(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(logs.dropped_total())

    def _observe_cdi(self, _: CallbackOptions) -> Iterable[Observation]:
        current = self._cdi_state
        for state in m.CDI_SPEC_STATES:
            yield Observation(int(state == current), {"state": state})

    def _observe_build(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(1, {"version": __version__})

    def _observe_mode(self, _: CallbackOptions) -> Iterable[Observation]:
        for mode in m.MODES:
            yield Observation(int(mode == self._mode), {"mode": mode})

    def _observe_withheld(self, _: CallbackOptions) -> Iterable[Observation]:
        withheld = self._withheld
        for resource, _entries in self._snapshot():
            yield Observation(withheld.get(resource, 0), {"resource": resource})

    def _observe_prepared(self, _: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._prepared_claims)

    def _observe_state(self, _: CallbackOptions) -> Iterable[Observation]:
        now = self._state
        for state in m.INSTANCE_STATES:
            yield Observation(int(state == now), {"state": state})

    def render(self) -> str:
        """The Prometheus exposition of everything recorded so far (thread-safe)."""
        assert self._pull is not None
        zeros = [*self._node_zeros]
        for resource_zeros in self._resource_zeros.values():
            zeros.extend(resource_zeros)
        with self._render_lock:
            return exposition.render(self._pull.get_metrics_data(), zeros)

    # ------------------------------------------------------------- lifecycle
    async def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.endpoint is not None:
            await self.endpoint.stop()
        provider = self._provider
        await otlp.close_bounded(
            lambda: provider.shutdown(timeout_millis=SHUTDOWN_TIMEOUT_S * 1000),
            "otel-metrics-shutdown", "metrics flush", "dropped",
        )  # fmt: skip


def _device_labels(resource: str, entry: Entry) -> dict[str, str]:
    device = entry.device
    return {
        "resource": resource,
        "device": device.name,
        "pci_bus_id": device.bus_id,
        "numa_node": str(device.numa) if device.numa is not None else "unknown",
    }


def _otlp_reader(config: Config) -> MetricReader:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    endpoint = otlp.parse_endpoint(config.otlp_endpoint)
    exporter = OTLPMetricExporter(
        endpoint=endpoint.target, insecure=endpoint.insecure, timeout=otlp.EXPORT_TIMEOUT_S
    )
    log.info(
        "OTLP metrics enabled",
        endpoint=endpoint.target, insecure=endpoint.insecure,
        exportInterval=format_duration(config.metrics_export_interval),
    )  # fmt: skip
    return PeriodicExportingMetricReader(
        exporter,
        export_interval_millis=config.metrics_export_interval * 1000,
        export_timeout_millis=otlp.EXPORT_TIMEOUT_S * 1000,
    )


async def start(config: Config) -> Metrics:
    readers: list[MetricReader] = []
    pull = InMemoryMetricReader() if config.metrics_endpoint_enabled else None
    if pull is not None:
        readers.append(pull)
    pushing = False
    if config.metrics_otlp:
        try:
            readers.append(_otlp_reader(config))
            pushing = True
        except otlp.EndpointError as exc:
            # As tracing does: an unusable collector costs the push, never the endpoint.
            log.warning(
                "OTLP metrics setup failed; continuing without OTLP metrics",
                endpoint=config.otlp_endpoint, setting=config.origin("otlp_endpoint"), err=exc,
            )  # fmt: skip
    resource = otlp.otel_resource(config.node_name)
    # No atexit hook: an unreachable collector would hold the exiting process for seconds.
    provider = MeterProvider(
        resource=resource,
        metric_readers=readers,
        shutdown_on_exit=False,
        # No exemplars: no spans to link them to, and the filter costs on every measurement.
        exemplar_filter=AlwaysOffExemplarFilter(),
    )
    recorder = OtelMetrics(provider, pull, config.mode)
    if pull is not None:
        endpoint = MetricsEndpoint(config.metrics_port, recorder.render)
        try:
            await endpoint.start()
        except MetricsEndpointError as exc:
            log.error("Cannot start metrics endpoint; continuing without it", err=exc)
        else:
            recorder.endpoint = endpoint
    if recorder.endpoint is None and not pushing:
        await recorder.shutdown()  # no way out is left: record nothing at all
        return NOOP
    return recorder
