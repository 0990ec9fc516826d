"""Allocate: per container an RSD group, device nodes and the CDI annotation.

The flow is one way. The resource's device state (``core.devicestate``) validates the
request and takes the final status check, running this allocator's first host calls
(``look_ahead``) in the same batch, and gives an immutable snapshot;
``Allocator.prepare`` builds the containers from it and returns what happened, a wanted
rescan included, for the servicer to act on.

Nothing touches the host before every requested ID matched the plugin's inventory, and
no RSD group is created before the final status check passed for every distinct device.
Errors after side effects began are reported as they are: there is no rollback.

The inventory is the last scan's. Under the RSD lock, the fresh ``rbln-smi -g -j``
listing must name every requested device at the bus ID that scan saw; otherwise (a
driver reload renumbered the devices) the allocation is refused and a rescan requested,
since the group would be built from one device's bus ID and ``/dev/<name>`` be another.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import grpc

from rbln_device_plugin.api.v1beta1 import api_pb2
from rbln_device_plugin.core.requests import (
    SHOWN_ID_CHARS,
    SHOWN_IDS,
    AllocationError,
    Snapshot,
    shown_id,
)
from rbln_device_plugin.core.rsdgroups import FirstLook, GroupMaker, failure_class
from rbln_device_plugin.host import rsd
from rbln_device_plugin.kubelet import cdi
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.shorten import middle_truncate
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.tracing import mark_error

CONTAINER_RSD_PATH: Final = "/dev/rsd0"
PERMISSIONS: Final = "rw"
_MAX_MESSAGE_BYTES: Final = 2048
# Containers that did no work (rejected request, or after an earlier container failed)
# get a child span each, up to this many per Allocate: no real pod comes near it, and it
# bounds the tracing cost of a hostile request with thousands of empty containers.
MAX_UNWORKED_CONTAINER_SPANS: Final = 256
_TRACED_IDS: Final = 256

log = get_logger()


@dataclass(frozen=True, slots=True)
class Prepared:
    """What preparing the containers came to: the response (the containers done so far
    when ``error`` ended the call); ``rescan_wanted`` when the node's devices changed
    since the last scan."""

    response: api_pb2.AllocateResponse
    error: Exception | None = None
    rescan_wanted: bool = False


class Allocator:
    """Prepares containers from a checked snapshot: device nodes, RSD group, response."""

    def __init__(self, resource: str, services: SharedServices) -> None:
        self._resource = resource
        self._config = services.config
        self._tracer = services.tracer
        self._hostio = services.hostio
        self._metrics = services.metrics
        # The RSD sequence the DRA front end runs too (core.rsdgroups).
        self._groups = GroupMaker(
            services.config, services.hostio, services.metrics, services.rsd_queue
        )

    def look_ahead(self, distinct: Sequence[str], containers: int) -> FirstLook:
        """The containers' first host checks for a validated request, as calls for the
        status reads' batch (see ``DeviceState.final_check``): they only stat paths and
        open the RSD lock file (creating it when missing), lock nothing, create no
        group, and run only once the request passed validation."""
        return self._groups.look_ahead(distinct, containers)

    async def prepare(
        self, requested: Sequence[Sequence[str]], snapshot: Snapshot, first: FirstLook
    ) -> Prepared:
        """Every container in order; the first failure ends the call (no rollback)."""
        response = api_pb2.AllocateResponse()
        try:
            for index, ids in enumerate(requested):
                lock_file = first.lock_file(index)
                try:
                    container = await self._container(ids, snapshot, first, lock_file)
                except Exception as exc:
                    self.unworked_spans(
                        requested[index + 1 :], snapshot, None,
                        f"not attempted: container {index} failed",
                    )  # fmt: skip
                    changed = isinstance(exc, AllocationError) and exc.rescan_wanted
                    return Prepared(response, exc, rescan_wanted=changed)
                response.container_responses.append(container)
            return Prepared(response)
        finally:
            first.close()  # the lock files of containers never attempted

    async def refuse(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        requested: Sequence[Sequence[str]],
        exc: Exception,
        started: float,
    ) -> NoReturn:
        """End a failed call: count it, log it (unless logged), abort it with a message."""
        failure = exc if isinstance(exc, AllocationError) else None
        result = failure.result if failure is not None else m.ALLOCATE_INTERNAL
        self._metrics.allocation(self._resource, result, time.monotonic() - started)
        if failure is None or not failure.logged:
            log.error(
                "Container allocation failed",
                resourceName=self._resource,
                deviceIDs=[i[:SHOWN_ID_CHARS] for c in requested for i in c][:SHOWN_IDS],
                err=exc,
                durationMs=_ms(started),
                exc_info=failure is None,  # a traceback only for the unexpected
            )
        message = str(exc) if failure is not None else f"{self._resource}: internal error: {exc}"
        # The message ends up in the pod's events: keep it short, the log has it all.
        bounded = middle_truncate(message.encode(), _MAX_MESSAGE_BYTES)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bounded)

    def _container_attributes(
        self, ids: Sequence[str], known: Mapping[str, Device]
    ) -> dict[str, Any]:
        """The allocateContainer attributes known before any host access."""
        # IDs here may be anything the client sent: bounded like the error message's.
        shown = [shown_id(i) for i in ids[:_TRACED_IDS]]
        attributes: dict[str, Any] = {
            "rbln.resource_name": self._resource,
            "rbln.device.ids": shown,
            "rbln.device.count": len(ids),
        }
        devices = [known[i] for i in ids if i in known]
        if ids and len(devices) == len(ids):  # a partial list would read as the whole
            attributes["rbln.device.bus_ids"] = sorted(d.bus_id for d in devices)
        return attributes

    def unworked_spans(
        self,
        requested: Sequence[Sequence[str]],
        known: Mapping[str, Device],
        failure: BaseException | None,
        description: str,
    ) -> None:
        """Error child spans for containers that never reached the host.

        ``failure`` (the rejection) is recorded on each; containers skipped because an
        earlier one failed carry only the Error status and its description.
        """
        for ids in requested[:MAX_UNWORKED_CONTAINER_SPANS]:
            with self._tracer.start_as_current_span(
                "allocateContainer",
                attributes=self._container_attributes(ids, known),
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                if failure is not None:
                    span.record_exception(failure)
                mark_error(span, description[:_MAX_MESSAGE_BYTES])

    async def _container(
        self,
        ids: Sequence[str],
        snapshot: Snapshot,
        first: FirstLook,
        lock_file: rsd.LockFileAhead | None,
    ) -> api_pb2.ContainerAllocateResponse:
        started = time.monotonic()
        devices = [snapshot[i] for i in ids]
        # The records pair each ID with its own address (reading them side by side must
        # not put rbln3 at rbln1's bus); the span attribute is sorted, as the spec's
        # tracing section lists it.
        fields: dict[str, Any] = {
            "resourceName": self._resource,
            "deviceIDs": list(ids),
            "busIDs": [d.bus_id for d in devices],
        }
        with self._tracer.start_as_current_span(
            "allocateContainer",
            attributes={
                "rbln.resource_name": self._resource,
                "rbln.device.ids": list(ids),
                "rbln.device.count": len(ids),
                "rbln.device.bus_ids": sorted(d.bus_id for d in devices),
            },
        ) as span:
            log.info("Starting container allocation", **fields)
            try:
                dev_root = self._config.dev_root
                node_paths = [dev_root / d.name for d in devices]
                binary = await self._groups.nodes_and_rbln_smi(node_paths, first)
                group = await self._groups.recreate(binary, devices, lock_file)
                span.set_attribute("rbln.rsd.host_path", str(group.host_path))
            except Exception as exc:
                # Raised inside the span: the span and its parent record it as an error.
                raise self._refusal(exc, ids, fields, started) from exc
        response = self._response(group.host_path, devices, node_paths)
        log.info(
            "Completed container allocation",
            **fields, hostRsdPath=str(group.host_path), durationMs=_ms(started),
        )  # fmt: skip
        return response

    def _refusal(
        self, exc: Exception, ids: Sequence[str], fields: dict[str, Any], started: float
    ) -> AllocationError:
        """The container's failure, logged: the error that ends the whole call."""
        if isinstance(exc, rsd.DeviceMappingChanged):
            created: dict[str, Any] = {}
            if isinstance(exc, rsd.RenumberedDuringCreate):  # what the read-back found
                created = {
                    "groupId": exc.group_id,
                    "groupBusIDs": exc.group_bus_ids,
                    "groupDestroyed": exc.destroyed,
                }
            log.error(
                "Device mapping changed since the last scan; allocation refused, rescanning",
                **fields, device=exc.device, snapshotBusID=exc.snapshot_bus_id,
                currentBusID=exc.current_bus_id, **created, durationMs=_ms(started),
            )  # fmt: skip
        # Also after the record above: the failure record every failed allocation logs,
        # so an alert keyed on it sees a renumbering's refusal too.
        log.error("Container allocation failed", **fields, err=exc, durationMs=_ms(started))
        if isinstance(exc, rsd.DeviceMappingChanged):
            return AllocationError(
                f"{self._resource}: {exc}",
                logged=True,
                result=failure_class(exc),
                rescan_wanted=True,
            )
        return AllocationError(
            f"{self._resource}: {', '.join(ids)}: {exc}",
            logged=True,
            result=failure_class(exc),
        )

    def _response(
        self, rsd_path: Path, devices: Sequence[Device], node_paths: Sequence[Path]
    ) -> api_pb2.ContainerAllocateResponse:
        response = cdi.container_response(self._config.cdi_mode)
        response.devices.add(
            container_path=CONTAINER_RSD_PATH, host_path=str(rsd_path), permissions=PERMISSIONS
        )
        for device, path in zip(devices, node_paths, strict=True):
            response.devices.add(
                container_path=f"/dev/{device.name}", host_path=str(path), permissions=PERMISSIONS
            )
        return response


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
