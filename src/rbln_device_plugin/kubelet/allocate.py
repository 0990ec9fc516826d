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

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, NoReturn

import grpc

from rbln_device_plugin.api.v1beta1 import api_pb2
from rbln_device_plugin.config import Config
from rbln_device_plugin.core.requests import (
    SHOWN_ID_CHARS,
    SHOWN_IDS,
    AllocationError,
    Snapshot,
    shown_id,
)
from rbln_device_plugin.host import devnodes, rsd, smi
from rbln_device_plugin.host.hostio import Call, HostBatch, Slot, Stalled
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


def _failure_class(exc: BaseException) -> str:
    """The metrics' result class of a container's failure after validation."""
    if isinstance(exc, devnodes.DeviceNodeMissing | devnodes.NotADeviceNode):
        return m.ALLOCATE_DEVICE_NODE
    if isinstance(exc, rsd.RsdLockTimeout):
        return m.ALLOCATE_RSD_LOCK
    if isinstance(exc, rsd.RsdError):  # incl. rbln-smi not found
        return m.ALLOCATE_RSD_GROUP
    return m.ALLOCATE_INTERNAL


@dataclass(frozen=True, slots=True)
class Prepared:
    """What preparing the containers came to: the response (the containers done so far
    when ``error`` ended the call); ``rescan_wanted`` when the node's devices changed
    since the last scan."""

    response: api_pb2.AllocateResponse
    error: Exception | None = None
    rescan_wanted: bool = False


@dataclass(frozen=True, slots=True)
class FirstLook:
    """The first round of the containers' host checks, run in the same off-loop batch as
    the final status reads (``batch``): what sits at each requested device's node (None:
    usable), the rbln-smi to run (or why there is none), and per container the RSD lock
    file opened ahead (``rsd.open_lock_file_ahead``; a container takes its own when its
    turn comes, ``close`` drops the ones never taken)."""

    batch: HostBatch
    node_kinds: Mapping[Path, Slot[str | None]]
    rbln_smi: Slot[Path | smi.SmiNotFound]
    lock_files: Sequence[Slot[rsd.OpenedLockFile | OSError]]

    @classmethod
    def build(cls, config: Config, distinct: Sequence[str], containers: int) -> FirstLook:
        """The calls for the distinct requested IDs: the device nodes, the rbln-smi
        lookup, then one RSD lock file opened per container."""
        accept_files = config.test_file_device_nodes
        batch = HostBatch()
        kinds = {}
        for device_id in distinct:
            path = config.dev_root / device_id
            look = partial(devnodes.node_kind, path, accept_files)
            kinds[path] = batch.add(Call(str(path), look))
        found = batch.add(Call(_SMI_LOOKUP, partial(_lookup, config.rbln_smi)))
        lock_path = config.rsd_lock_path
        locks = [
            batch.add(Call(str(lock_path), partial(rsd.open_lock_file_ahead, lock_path)))
            for _ in range(containers)
        ]
        return cls(batch, kinds, found, locks)

    def lock_file(self, container: int) -> rsd.LockFileAhead | None:
        if container < len(self.lock_files):
            return self.lock_files[container].result()
        return None

    def close(self) -> None:
        for slot in self.lock_files:
            try:
                ahead = slot.result()
            except RuntimeError:  # the batch never ran: nothing was opened
                return
            if isinstance(ahead, rsd.OpenedLockFile):
                ahead.close()


class Allocator:
    """Prepares containers from a checked snapshot: device nodes, RSD group, response."""

    def __init__(self, resource: str, services: SharedServices) -> None:
        self._resource = resource
        self._config = services.config
        self._tracer = services.tracer
        self._hostio = services.hostio
        self._metrics = services.metrics
        self._rsd_queue = services.rsd_queue
        # Where and how this node's RSD groups change: the same for every allocation.
        self._rsd_host = rsd.RsdHost(
            services.hostio,
            services.config.rsd_lock_path,
            services.config.dev_root,
            accept_file_nodes=services.config.test_file_device_nodes,
            metrics=services.metrics,
        )

    def look_ahead(self, distinct: Sequence[str], containers: int) -> FirstLook:
        """The containers' first host checks for a validated request, as calls for the
        status reads' batch (see ``DeviceState.final_check``): they only stat paths and
        open the RSD lock file (creating it when missing), lock nothing, create no
        group, and run only once the request passed validation."""
        return FirstLook.build(self._config, distinct, containers)

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
                binary = await self._nodes_and_rbln_smi(node_paths, first)
                group = await self._recreate_group(binary, devices, lock_file)
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
                result=_failure_class(exc),
                rescan_wanted=True,
            )
        return AllocationError(
            f"{self._resource}: {', '.join(ids)}: {exc}",
            logged=True,
            result=_failure_class(exc),
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

    async def _nodes_and_rbln_smi(self, node_paths: Sequence[Path], first: FirstLook) -> Path:
        """Wait for the device nodes, then find rbln-smi.

        The first round of both is ``first`` (taken beside the status reads). Only when a
        node is not there yet (or is something else) does the usual polling wait follow.
        """
        accept_files = self._config.test_file_device_nodes
        kinds = [first.node_kinds[p].result() for p in node_paths]
        found = first.rbln_smi.result()
        if any(kind is not None for kind in kinds):
            await devnodes.wait_for_nodes(node_paths, self._hostio, accept_files=accept_files)
        # Not finding rbln-smi is a discovery error to the scan; here it fails the group.
        if isinstance(found, smi.SmiNotFound):
            raise rsd.RsdError(str(found)) from found
        if isinstance(found, Stalled):
            raise rsd.RsdError(f"looking for rbln-smi: {found}")
        return found

    async def _recreate_group(
        self, binary: Path, devices: Sequence[Device], lock_file: rsd.LockFileAhead | None
    ) -> rsd.RsdGroup:
        """Recreate the RSD group within one 5 s lock budget.

        This daemon's own allocations queue in arrival order (no 100 ms polling races
        between them); the time spent in that queue counts against the same budget as
        the file lock, so no allocation waits longer than the lock policy allows.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(rsd.LOCK_TIMEOUT_S):
                await self._rsd_queue.acquire()
        except TimeoutError:
            raise self._lock_timeout("queued behind this daemon's earlier allocations") from None
        queued = loop.time() - started
        try:
            return await rsd.recreate_rsd_group(
                self._rsd_host,
                binary,
                [d.bus_id for d in devices],
                expected={d.name: d.bus_id for d in devices},
                lock_timeout=max(rsd.LOCK_RETRY_S, rsd.LOCK_TIMEOUT_S - queued),
                opened_lock=lock_file,
            )
        except rsd.RsdLockTimeout as exc:
            # The file lock had what the queue left of the budget: the allocation waited
            # the whole budget, and says so (not the remainder the file lock was given).
            queue_part = (
                f"{queued:.1f} s of it queued behind this daemon's earlier allocations"
                if queued >= _SHOWN_QUEUE_S
                else None
            )
            raise self._lock_timeout(queue_part) from exc
        finally:
            self._rsd_queue.release()

    def _lock_timeout(self, queue_part: str | None) -> rsd.RsdLockTimeout:
        """The whole 5 s budget ran out; ``queue_part`` says how much went in the queue."""
        note = f" ({queue_part})" if queue_part else ""
        return rsd.RsdLockTimeout(
            f"timed out after {rsd.LOCK_TIMEOUT_S:g} s waiting for the RSD lock "
            f"{self._rsd_host.lock_path}{note}"
        )


# A queue wait shorter than this is not worth naming in a lock timeout's message.
_SHOWN_QUEUE_S: Final = 0.05


_SMI_LOOKUP: Final = "rbln-smi lookup"


def _lookup(configured: Path | None) -> Path | smi.SmiNotFound:
    try:
        return smi.locate_rbln_smi(configured)
    except smi.SmiNotFound as exc:
        return exc


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
