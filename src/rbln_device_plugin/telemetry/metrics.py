"""What the daemon counts for operators, and the recorder every component is handed.

Components call one method per event (an Allocate answered, an ``rbln-smi`` run, a scan)
on the recorder they were given at construction. With metrics off that recorder is
:class:`Metrics` itself, whose methods do nothing: the OpenTelemetry SDK, its exporters
and the HTTP endpoint are not even imported then (they cost memory on every node). With
either way out enabled, :func:`start` loads ``otel_metrics``, which records into the
OpenTelemetry metrics API and serves or pushes the result.

Labels stay bounded: resource names, result classes and subcommands are small fixed
sets; only the per-device gauges carry a device's name, bus ID and NUMA node, one series
per advertised device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from rbln_device_plugin.model.devicetable import Entry

# Result classes, shared by the call sites and the README's metric table.
OK: Final = "ok"
# Allocate refusals and failures, in the order a request meets them.
ALLOCATE_INVALID_REQUEST: Final = "invalid_request"  # refused before any host access
ALLOCATE_UNHEALTHY: Final = "unhealthy_device"
ALLOCATE_DEVICE_NODE: Final = "device_node"  # a device node missing or not a device
ALLOCATE_RSD_LOCK: Final = "rsd_lock_timeout"
ALLOCATE_RSD_GROUP: Final = "rsd_group"  # rbln-smi or the group's node failed
ALLOCATE_INTERNAL: Final = "internal_error"
PREFERRED_FALLBACK: Final = "fallback"  # an empty answer: the kubelet picks alone
PREFERRED_INTERNAL: Final = "internal_error"
SMI_ERROR: Final = "error"  # non-zero exit
SMI_TIMEOUT: Final = "timeout"
SMI_NOT_STARTED: Final = "not_started"
SMI_OUTPUT_TOO_LARGE: Final = "output_too_large"
SMI_CANCELLED: Final = "cancelled"
LOCK_TIMEOUT: Final = "timeout"
SCAN_DISCOVERY_FAILED: Final = "discovery_failed"
REGISTRATION_FAILED: Final = "failed"
# Whether a CDI spec defines every device the answers name (model.cdispec.CdiState).
CDI_SPEC_STATES: Final = ("present", "missing", "unknown")

# Every value each label can take, in the README's order: the series the daemon knows in
# advance, created at 0 so that the first event of each kind is already an increase.
ALLOCATE_RESULTS: Final = (
    OK, ALLOCATE_INVALID_REQUEST, ALLOCATE_UNHEALTHY, ALLOCATE_DEVICE_NODE,
    ALLOCATE_RSD_LOCK, ALLOCATE_RSD_GROUP, ALLOCATE_INTERNAL,
)  # fmt: skip
PREFERRED_RESULTS: Final = (OK, PREFERRED_FALLBACK, PREFERRED_INTERNAL)
REGISTRATION_RESULTS: Final = (OK, REGISTRATION_FAILED)
SMI_SUBCOMMANDS: Final = ("list", "group_list", "group_create", "group_destroy", "other")
SMI_RESULTS: Final = (OK, SMI_ERROR, SMI_TIMEOUT, SMI_NOT_STARTED, SMI_OUTPUT_TOO_LARGE,
                      SMI_CANCELLED)  # fmt: skip
LOCK_RESULTS: Final = (OK, LOCK_TIMEOUT)
SCAN_RESULTS: Final = (OK, SCAN_DISCOVERY_FAILED)

# What the instance is doing (the instance_state gauge: 1 for the current state, 0 else).
STATE_WAITING_FOR_KUBELET_DIR: Final = "waiting_for_kubelet_dir"
STATE_WAITING_FOR_LOCK: Final = "waiting_for_lock"
STATE_SERVING: Final = "serving"
# The instance lock's directory (that of --rsd-lock-path) cannot be made or opened.
STATE_LOCK_DIR_UNUSABLE: Final = "lock_dir_unusable"
# A hand-over (runtime.handover): serving beside the previous instance of this
# installation, which still runs; and a successor serves, this one leaves at its stop.
STATE_TAKING_OVER: Final = "taking_over"
STATE_HANDED_OVER: Final = "handed_over"
INSTANCE_STATES: Final = (
    STATE_WAITING_FOR_KUBELET_DIR, STATE_WAITING_FOR_LOCK, STATE_LOCK_DIR_UNUSABLE, STATE_SERVING,
    STATE_TAKING_OVER, STATE_HANDED_OVER,
)  # fmt: skip


# The DRA front end (dra mode): claims prepared and unprepared, and ResourceSlice writes.
DRA_PREPARE: Final = "prepare"
DRA_UNPREPARE: Final = "unprepare"
DRA_OPERATIONS: Final = (DRA_PREPARE, DRA_UNPREPARE)
DRA_CLAIM_PROBLEM: Final = "claim"  # unallocated, replaced, unreadable, another pool
DRA_FAILED: Final = "failed"  # an unprepare whose file work failed
DRA_PREPARE_RESULTS: Final = (*ALLOCATE_RESULTS, DRA_CLAIM_PROBLEM)
DRA_UNPREPARE_RESULTS: Final = (OK, DRA_FAILED)
SLICE_VERBS: Final = ("create", "update", "delete")
SLICE_RESULTS: Final = (OK, DRA_FAILED)
# The device-health stream's versions (dra-health v1, v1alpha1) and taint changes.
HEALTH_SERVICES: Final = ("v1", "v1alpha1")
TAINT_APPLIED: Final = "applied"
TAINT_REMOVED: Final = "removed"
TAINT_CHANGES: Final = (TAINT_APPLIED, TAINT_REMOVED)
MODES: Final = ("device-plugin", "dra")
# Reads of the kubelet's PodResources API (a node switched between the modes).
POD_RESOURCES_FAILED: Final = "failed"
POD_RESOURCES_RESULTS: Final = (OK, POD_RESOURCES_FAILED)


class Metrics:
    """The recorder with metrics off: every method is a no-op.

    ``otel_metrics.OtelMetrics`` overrides each method. The no-op calls cost a method
    call and nothing else; call sites check ``enabled`` only to skip work done just to
    build a measurement (counting changes, naming a subcommand).
    """

    enabled = False

    def allocation(self, resource: str, result: str, seconds: float) -> None:
        """One Allocate call answered (``result`` = OK or an ALLOCATE_* class)."""

    def preferred_allocation(
        self, resource: str, result: str, seconds: float, *, capped: bool = False
    ) -> None:
        """One container request of GetPreferredAllocation answered."""

    def rbln_smi_call(self, subcommand: str, result: str, seconds: float) -> None:
        """One ``rbln-smi`` run finished (spawn to reap)."""

    def rsd_lock_wait(self, result: str, seconds: float) -> None:
        """Time spent waiting for the node-wide RSD lock file."""

    def scan(self, result: str, seconds: float) -> None:
        """One reconcile pass: discovery plus every plugin's update."""

    def inventory_changes(self, resource: str, appeared: int, disappeared: int) -> None:
        """Devices that entered or left a resource's advertised set since the last scan."""

    def devices(self, resource: str, entries: Mapping[str, Entry] | None) -> None:
        """The resource's devices as last published (None: the resource plugin stopped).

        The first call for a resource is its plugin's start: the resource's known series
        appear at 0 then; its device series go at the stop.

        ``entries`` must not be mutated afterwards: collection reads it from another
        thread (``DeviceTable`` replaces its mapping on each scan, never edits it).
        """

    def registration(self, resource: str, result: str) -> None:
        """One Register call to the kubelet finished."""

    def kubelet_restart(self) -> None:
        """A new ``kubelet.sock`` was seen."""

    def stream_opened(self, resource: str) -> None:
        """A ListAndWatch stream opened on a resource plugin."""

    def stream_closed(self, resource: str) -> None:
        """A ListAndWatch stream ended."""

    def host_read_stalled(self) -> None:
        """A host read outlived its wait (the warn record ``Host access did not finish``)."""

    def cdi_spec(self, state: str) -> None:
        """The CDI spec check's outcome: one of CDI_SPEC_STATES."""

    def instance_state(self, state: str) -> None:
        """What the instance does now: one of INSTANCE_STATES."""

    def dra_claim(self, operation: str, result: str, seconds: float) -> None:
        """One claim of a NodePrepareResources or NodeUnprepareResources call answered."""

    def dra_prepared_claims(self, count: int) -> None:
        """Claims the checkpoint holds as prepared now."""

    def dra_slice_write(self, verb: str, result: str) -> None:
        """One ResourceSlice create, update or delete sent to the API server."""

    def pod_resources_read(self, result: str) -> None:
        """One List of the kubelet's PodResources API: one of POD_RESOURCES_RESULTS."""

    def withheld_devices(self, counts: Mapping[str, int]) -> None:
        """Per resource, the devices kept back now because the other kubelet API's pods
        hold them (or might: see ``runtime.otherholds``); the whole mapping each time."""

    def dra_health_stream(self, service: str, opened: bool) -> None:
        """A NodeWatchResources stream opened (True) or ended, by HEALTH_SERVICES version."""

    def dra_taints(self, change: str, count: int) -> None:
        """Device taints written to (TAINT_APPLIED) or taken off (TAINT_REMOVED) the
        ResourceSlices on the API server."""

    async def shutdown(self) -> None:
        """Stop the endpoint and flush the last push, bounded; never blocks the loop."""


NOOP: Final = Metrics()


def status_label(status: str) -> str:
    """A bounded status label: ``UNKNOWN(n)`` for any n is ``UNKNOWN``."""
    return "UNKNOWN" if status.startswith("UNKNOWN(") else status


_SMI_SUBCOMMANDS: Final[Mapping[tuple[str, ...], str]] = {
    ("-j",): "list",
    ("-g", "-j"): "group_list",
    ("group", "-c"): "group_create",
    ("group", "-d"): "group_destroy",
}


def smi_subcommand(args: Sequence[str]) -> str:
    """The bounded name of an ``rbln-smi`` invocation: list, group_list, group_create, ..."""
    whole = tuple(args)
    return _SMI_SUBCOMMANDS.get(whole) or _SMI_SUBCOMMANDS.get(whole[:2], "other")
