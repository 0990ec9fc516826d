"""One kubelet DevicePlugin server per resource name.

The plugin serves on its own unix socket before it registers (the kubelet dials back
inside Register), publishes the device list through ListAndWatch only when something
the kubelet sees changed, and owns its device table for exactly its own lifetime. The
health history is handed in, so it can outlive the instance (a kubelet restart replaces
every plugin but keeps each resource's history).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from functools import partial
from typing import Any, Final

import grpc

from rbln_device_plugin.api import API_VERSION, KUBELET_SOCKET
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.config import Config
from rbln_device_plugin.host import paths, sysfs
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.kubelet import preferred
from rbln_device_plugin.kubelet.allocate import Allocator
from rbln_device_plugin.model.devicetable import Change, DeviceTable, Entry, KubeletDevice
from rbln_device_plugin.model.health import HealthHistory, StatusReading, Verdict
from rbln_device_plugin.model.inventory import Device, natural_key
from rbln_device_plugin.resources import socket_name
from rbln_device_plugin.telemetry.logs import get_logger
from rbln_device_plugin.telemetry.metrics import NOOP, Metrics
from rbln_device_plugin.telemetry.tracing import Tracer

REGISTER_TIMEOUT_S: Final = 10.0
STOP_GRACE_S: Final = 0.5

log = get_logger()


class RegistrationError(RuntimeError):
    pass


class ResourcePlugin(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: str,
        config: Config,
        tracer: Tracer,
        on_stream_lost: Callable[[ResourcePlugin], None] = lambda _: None,
        rsd_local_lock: asyncio.Lock | None = None,
        hostio: HostIO | None = None,
        metrics: Metrics = NOOP,
        history: HealthHistory | None = None,
        request_rescan: Callable[[], None] = lambda: None,
    ) -> None:
        self.resource = resource
        self._metrics = metrics
        self.socket_path = config.kubelet_dir / socket_name(resource)
        self.kubelet_socket = config.kubelet_dir / KUBELET_SOCKET
        self._config = config
        self._hostio = hostio or HostIO()
        self.table = DeviceTable(history)
        # Held around each batch of status reads and the history update that applies it,
        # so scan and Allocate observations reach the history in the order they were read.
        self._observe_lock = asyncio.Lock()
        self._allocator = Allocator(
            resource,
            self.table,
            config,
            tracer,
            self.check_health,
            rsd_local_lock or asyncio.Lock(),
            self._hostio,
            metrics,
            request_rescan,
        )
        self._on_stream_lost = on_stream_lost
        self._server: grpc.aio.Server | None = None
        self._socket_identity: paths.FileIdentity | None = None
        self._published: tuple[KubeletDevice, ...] = ()
        self._version = 0
        self._changed = asyncio.Condition()
        self._stopping = False
        self.registered = False
        self.announced = False
        self.open_streams = 0
        # The kubelet opens its ListAndWatch stream right after a registration: the first
        # stream opened after Register was sent is the kubelet's. Other clients' streams
        # (debugging, monitoring) get the same updates but never trigger re-registration.
        self._expecting_kubelet_stream = False
        self._kubelet_stream: object | None = None
        self.registration: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Serve on the plugin socket (replacing a stale one), readable by the owner only.

        The kubelet's directory must exist: the daemon waits for it, never creates it.
        """
        if not self.socket_path.parent.is_dir():
            raise RuntimeError(f"the kubelet directory {self.socket_path.parent} does not exist")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        # Anyone who can connect can call Allocate and tear down a pod's RSD group: the
        # socket is created 0600 whatever the process umask (bind happens right here).
        with paths.umask(0o177):
            bound = server.add_insecure_port(f"unix:{self.socket_path}")
        if bound == 0:
            raise RuntimeError(f"cannot listen on {self.socket_path}")
        os.chmod(self.socket_path, 0o600)
        await server.start()
        self._server = server
        self._socket_identity = paths.file_identity(self.socket_path)

    def socket_intact(self) -> bool:
        """False when something deleted or replaced our socket file."""
        return (
            self._socket_identity is not None
            and paths.file_identity(self.socket_path) == self._socket_identity
        )

    async def register(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource,
            options=self._options(),
        )
        self._expecting_kubelet_stream = True
        try:
            async with grpc.aio.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
                stub = api_pb2_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.registered = False
            self._expecting_kubelet_stream = False
            raise RegistrationError(
                f"kubelet at {self.kubelet_socket} refused or did not answer: "
                f"{exc.code().name}: {exc.details()}"
            ) from None
        self.registered = True

    async def stop(self) -> None:
        self._stopping = True
        self._metrics.devices(self.resource, None)
        if self.registration is not None:
            self.registration.cancel()
            await asyncio.gather(self.registration, return_exceptions=True)
            self.registration = None
        async with self._changed:
            self._changed.notify_all()
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
            self._server = None
        if self.socket_intact():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._socket_identity = None

    # ----------------------------------------------------------------- inventory
    async def _read_statuses(self, devices: Iterable[Device]) -> dict[str, StatusReading]:
        """One off-loop batch of status reads; a read that hangs counts as unreadable."""
        root = self._config.sysfs_root
        readings = await sysfs.read_statuses(self._hostio, root, (d.name for d in devices))
        for name, reading in readings.items():
            if not reading.readable:
                log.debug(
                    "Cannot read device status",
                    resourceName=self.resource, device=name,
                    path=sysfs.status_path(root, name), err=reading.reason,
                )  # fmt: skip
        return readings

    async def check_health(self, device_ids: Sequence[str]) -> dict[str, Verdict]:
        """Allocate's final check: read each distinct device once, record it, judge it."""
        entries = self.table.entries
        async with self._observe_lock:
            devices = [entries[i].device for i in dict.fromkeys(device_ids)]
            readings = await self._read_statuses(devices)
            return self.table.final_check(readings)

    async def update(self, devices: Sequence[Device]) -> list[Change]:
        """Apply one scan's devices; log what changed; wake ListAndWatch if needed."""
        async with self._observe_lock:
            readings = await self._read_statuses(devices)
            changes = self.table.apply_scan(devices, readings)
        self._metrics.devices(self.resource, self.table.entries)
        if self.announced:
            self._log_changes(changes)
        view = self.table.kubelet_view()
        if view != self._published:
            self._published = view
            self._version += 1
            async with self._changed:
                self._changed.notify_all()
        return changes

    def _log_changes(self, changes: Sequence[Change]) -> None:
        # Keys in the logging catalogue's order: what, which device, its state (and what it
        # was), then the resource's resulting counts. Keyword order is record key order.
        counts = self.table.counts().fields()
        for change in changes:
            entry = change.entry
            identity: dict[str, Any] = {
                "resourceName": self.resource,
                "device": entry.device.name,
            }
            state: dict[str, Any] = {
                "health": entry.verdict.health.value,
                "status": entry.verdict.describe(),
            }
            if change.kind == "appeared":
                emit = log.info if entry.healthy else log.warning
                emit(
                    "Device appeared in inventory",
                    **identity, pciBusID=entry.device.bus_id, **state, **counts,
                )  # fmt: skip
            elif change.kind == "disappeared":
                log.warning("Device disappeared from inventory", **identity, **state, **counts)
            elif change.previous is not None:
                emit = log.info if entry.healthy else log.warning
                emit(
                    "Device state changed",
                    **identity,
                    **state,
                    previousHealth=change.previous.health.value,
                    previousStatus=change.previous.describe(),
                    **counts,
                )

    def announce(self, failed_attempts: int = 0) -> None:
        """The narrative of a (re)registration: the plugin, then each device it exposes.

        ``failed_attempts``: registrations that failed before this one (said only if any).
        """
        counts = self.table.counts()
        after_failures = {"failedAttempts": failed_attempts} if failed_attempts else {}
        log.info(
            "Registered device plugin with kubelet",
            resourceName=self.resource, **counts.fields(), socketPath=str(self.socket_path),
            **after_failures,
        )  # fmt: skip
        for entry in sorted(self.table.entries.values(), key=lambda e: natural_key(e.device.name)):
            _log_exposed(self.resource, entry)
        self.announced = True

    # ----------------------------------------------------------------- servicer
    def _options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.DevicePluginOptions:
        return self._options()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        self.open_streams += 1
        self._metrics.stream_opened(self.resource)
        token = object()
        if self._expecting_kubelet_stream:
            self._expecting_kubelet_stream = False
            self._kubelet_stream = token
        try:
            while not self._stopping:
                async with self._changed:
                    await self._changed.wait_for(partial(self._has_news, sent))
                if self._stopping:
                    return
                sent = self._version
                view = self._published
                yield _list_response(view)
                log.debug(
                    "Sent updated device list to kubelet",
                    resourceName=self.resource, deviceCount=len(view),
                )  # fmt: skip
        finally:
            self.open_streams -= 1
            self._metrics.stream_closed(self.resource)
            if not self._stopping and self._kubelet_stream is token:
                # The kubelet never reopens a stream on its own: the manager decides whether
                # this is a kubelet restart or a stream lost alone, and registers again.
                self._kubelet_stream = None
                self._on_stream_lost(self)

    def _has_news(self, sent: int) -> bool:
        return self._version != sent or self._stopping

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.PreferredAllocationResponse:
        response = api_pb2.PreferredAllocationResponse()
        for container in request.container_requests:
            ids = await preferred.choose(self.resource, self.table, container, self._metrics)
            response.container_responses.add(deviceIDs=ids)
        return response

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocateResponse:
        return await self._allocator.allocate(request, context)

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def _list_response(view: Sequence[KubeletDevice]) -> api_pb2.ListAndWatchResponse:
    response = api_pb2.ListAndWatchResponse()
    for device_id, health, numa in view:
        device = response.devices.add(ID=device_id, health=health)
        if numa is not None:
            device.topology.nodes.add(ID=numa)
    return response


def _log_exposed(resource: str, entry: Entry) -> None:
    device = entry.device
    emit = log.info if entry.healthy else log.warning
    emit(
        "Device exposed",
        resourceName=resource,
        device=device.name,
        product=device.product,
        pciDeviceID=device.pci_device_id,
        pciBusID=device.bus_id,
        numa=device.numa if device.numa is not None else "unknown",
        health=entry.verdict.health.value,
        status=entry.verdict.describe(),
    )
