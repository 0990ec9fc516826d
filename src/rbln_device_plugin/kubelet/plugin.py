"""One kubelet DevicePlugin per resource name: its socket, its registration, its parts.

The plugin serves on its own unix socket before it registers (the kubelet dials back
inside Register) and owns its registration: whether it is registered, and the one
registration task that may be running. The device state (``core.devicestate``) is
opened by the core for this plugin and lives as long as it; its health history is the
core's, so it outlives the instance (a kubelet restart replaces every plugin but keeps
each resource's history). The gRPC service itself is the ``servicer``. How an attempt
ended, and a lost stream, go on the kubelet session's queue as events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import grpc

from rbln_device_plugin import aiotasks
from rbln_device_plugin.api import API_VERSION, KUBELET_SOCKET
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.core.devicestate import DeviceState
from rbln_device_plugin.host import paths, pluginsocket
from rbln_device_plugin.host.hostio import Stalled
from rbln_device_plugin.host.pluginsocket import SocketPathError
from rbln_device_plugin.kubelet.channels import kubelet_channel
from rbln_device_plugin.kubelet.events import (
    Events,
    PluginRef,
    RegistrationEnded,
    RegistrationError,
)
from rbln_device_plugin.kubelet.servicer import DevicePluginServicer, load_deferred, plugin_options
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.devicetable import Change, Entry
from rbln_device_plugin.model.inventory import Device, natural_key
from rbln_device_plugin.model.resources import socket_name
from rbln_device_plugin.telemetry.logs import get_logger

T = TypeVar("T")

REGISTER_TIMEOUT_S: Final = 10.0
STOP_GRACE_S: Final = 0.5
FOREIGN_REMOVED_MSG: Final = "Removed a foreign entry where the device plugin socket belongs"

log = get_logger()


class ResourcePlugin:
    def __init__(
        self, ref: PluginRef, services: SharedServices, state: DeviceState, events: Events
    ) -> None:
        config = services.config
        self.ref = ref
        self.resource = ref.resource
        self.socket_path = config.kubelet_dir / socket_name(ref.resource, services.instance_token)
        self.kubelet_socket = config.kubelet_dir / KUBELET_SOCKET
        self.state = state
        self.servicer = DevicePluginServicer(ref, state, services, events)
        self._events = events
        self._hostio = services.hostio
        self._server: grpc.aio.Server | None = None
        self._socket_identity: paths.FileIdentity | None = None
        self._bound_check: asyncio.Future[paths.FileIdentity] | None = None
        self._registered = False
        self._registration: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None

    @property
    def registered(self) -> bool:
        return self._registered

    @property
    def open_streams(self) -> int:
        return self.servicer.open_streams

    async def update(self, devices: Sequence[Device]) -> list[Change]:
        return await self.state.update(devices)

    # ----------------------------------------------------------------- socket
    async def start(self) -> None:
        """Serve on the plugin socket (replacing a stale one), readable by the owner only.

        The kubelet's directory must exist: the daemon waits for it, never creates it.
        What sits at the socket's name is handled by ``pluginsocket.clear`` (anything but a
        directory is removed as the entry itself; a directory is refused with
        :class:`SocketPathError`), off the event loop and bounded, like every host call.
        """
        cleared = await self._host(pluginsocket.clear, "clear the place of")
        if self._stopping is not None:  # stopped meanwhile: nothing may be bound after it
            raise RuntimeError(f"stopped before it could listen on {self.socket_path}")
        if cleared.removed not in (None, "socket"):  # a stale socket is a crash's normal trace
            log.warning(
                FOREIGN_REMOVED_MSG,
                socketPath=str(self.socket_path), kind=cleared.removed,
                linkTarget=cleared.link_target,
                hint="only that name was removed: nothing it pointed to or shared content "
                "with was followed, written or removed",
            )  # fmt: skip
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        # Recorded before any await: a stop that lands while this starts (a shutdown in
        # the middle of a scan) finds the server and its socket and removes both.
        self._server = server
        # Anyone who can connect can call Allocate and tear down a pod's RSD group: the
        # socket is created 0600 whatever the process umask (bind happens right here, on
        # the loop's thread, the only one that ever changes the umask).
        with paths.umask(0o177):
            bound = server.add_insecure_port(f"unix:{self.socket_path}")
        if bound == 0:
            raise RuntimeError(f"cannot listen on {self.socket_path}")
        # A stop that lands during this check still needs its answer to remove the
        # socket: it waits for the same task (see _stop_once).
        self._bound_check = asyncio.ensure_future(self._host(pluginsocket.bound_identity, "check"))
        self._socket_identity = await aiotasks.run_to_end(self._bound_check)
        await server.start()

    async def _host(self, run: Callable[[Path], T | SocketPathError], doing: str) -> T:
        """``run(socket_path)`` through the daemon's bounded host I/O; its refusal raised."""
        outcome = await self._hostio.call(str(self.socket_path), partial(run, self.socket_path))
        if isinstance(outcome, Stalled):
            raise SocketPathError(f"cannot {doing} {self.socket_path}: {outcome}")
        if isinstance(outcome, SocketPathError):
            raise outcome
        return outcome

    async def socket_intact(self) -> bool:
        """False when something deleted or replaced our socket file (a look that stalls
        is no evidence either way: True)."""
        identity = self._socket_identity
        if identity is None:
            return False
        now = await self._hostio.call(
            str(self.socket_path), partial(paths.file_identity, self.socket_path)
        )
        return isinstance(now, Stalled) or now == identity

    def begin_stop(self) -> asyncio.Task[None]:
        """Start stopping (once; later calls get the same task) without waiting for it."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_once())
        return self._stopping

    async def stop(self) -> None:
        """Stop serving and remove the socket. A cancelled caller does not cut the stop
        short: it runs to its end, and a later call waits for the same one."""
        await aiotasks.run_to_end(self.begin_stop())

    async def _stop_once(self) -> None:
        await self.state.close()
        if self._registration is not None:
            await aiotasks.cancel_and_wait(self._registration, title=f"stop {self.resource}")
            self._registration = None
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
            self._server = None
        if self._bound_check is not None:
            await aiotasks.settle_all([self._bound_check])
            check = self._bound_check
            if self._socket_identity is None and not check.cancelled() and not check.exception():
                self._socket_identity = check.result()
        identity, self._socket_identity = self._socket_identity, None
        if identity is not None:
            removal = partial(pluginsocket.remove_if_ours, self.socket_path, identity)
            outcome = await self._hostio.call(str(self.socket_path), removal)
            if isinstance(outcome, Stalled):
                log.warning(
                    "Cannot remove the device plugin socket in time; it stays",
                    socketPath=str(self.socket_path), err=str(outcome),
                )  # fmt: skip

    # ----------------------------------------------------------------- registration
    async def register(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource,
            options=plugin_options(),
        )
        self.servicer.expect_kubelet_stream(True)
        try:
            async with kubelet_channel(self.kubelet_socket) as channel:
                stub = api_pb2_grpc.RegistrationStub(channel)
                await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._registered = False
            self.servicer.expect_kubelet_stream(False)
            raise RegistrationError(
                f"kubelet at {self.kubelet_socket} refused or did not answer: "
                f"{exc.code().name}: {exc.details()}"
            ) from None
        self._registered = True

    def register_in_background(self, kubelet: paths.FileIdentity | None) -> None:
        """Register in a task of its own unless registered or registering already.

        ``kubelet`` is the kubelet.sock this attempt talks to. How the attempt ended goes
        on the session's queue, and is handled there, before the next attempt may start.
        """
        if self._registered or self._registration is not None:
            return
        self._registration = aiotasks.start(
            self._register_once(kubelet), name=f"register {self.resource}"
        )

    async def _register_once(self, kubelet: paths.FileIdentity | None) -> None:
        try:
            failure: RegistrationError | None = None
            try:
                await self.register()
            except RegistrationError as exc:
                failure = exc
            handled = asyncio.get_running_loop().create_future()
            self._events.put_nowait(RegistrationEnded(self.ref, kubelet, failure, handled))
            await handled
            if failure is None:
                load_deferred()
        finally:
            self._registration = None

    def registration_lost(self) -> None:
        """The kubelet's stream ended on its own: the next sync registers again."""
        self._registered = False

    def announce(self, failed_attempts: int = 0) -> None:
        """The narrative of a (re)registration: the plugin, then each device it exposes.

        ``failed_attempts``: registrations that failed before this one (said only if any).
        From here on, every change is logged as it happens.
        """
        counts = self.state.table.counts()
        after_failures = {"failedAttempts": failed_attempts} if failed_attempts else {}
        log.info(
            "Registered device plugin with kubelet",
            resourceName=self.resource, **counts.fields(), socketPath=str(self.socket_path),
            **after_failures,
        )  # fmt: skip
        entries = self.state.table.entries.values()
        for entry in sorted(entries, key=lambda e: natural_key(e.device.name)):
            _log_exposed(self.resource, entry)
        self.state.report_changes()


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
