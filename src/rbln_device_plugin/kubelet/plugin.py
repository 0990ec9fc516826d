"""One kubelet DevicePlugin per resource name: its socket, its registration, its parts.

The plugin serves on its own unix socket before it registers (the kubelet dials back
inside Register) and owns its registration: whether it is registered, and the one
registration task that may be running. The device state (``devicestate``) lives exactly
as long as the plugin; its health history is handed in, so it can outlive the instance
(a kubelet restart replaces every plugin but keeps each resource's history). The gRPC
service itself is the ``servicer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Final

import grpc

from rbln_device_plugin.api import API_VERSION, KUBELET_SOCKET
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.host import paths
from rbln_device_plugin.kubelet.devicestate import DeviceState
from rbln_device_plugin.kubelet.servicer import DevicePluginServicer, load_deferred, plugin_options
from rbln_device_plugin.kubelet.services import SharedServices
from rbln_device_plugin.model.devicetable import Change
from rbln_device_plugin.model.health import HealthHistory
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.resources import socket_name

REGISTER_TIMEOUT_S: Final = 10.0
STOP_GRACE_S: Final = 0.5


class RegistrationError(RuntimeError):
    pass


class ResourcePlugin:
    def __init__(
        self,
        resource: str,
        services: SharedServices,
        history: HealthHistory | None = None,
        on_stream_lost: Callable[[ResourcePlugin], None] = lambda _: None,
    ) -> None:
        config = services.config
        self.resource = resource
        self.socket_path = config.kubelet_dir / socket_name(resource)
        self.kubelet_socket = config.kubelet_dir / KUBELET_SOCKET
        self.state = DeviceState(
            resource, config.sysfs_root, services.hostio, history, services.metrics
        )
        self.servicer = DevicePluginServicer(self.state, services, lambda: on_stream_lost(self))
        self._server: grpc.aio.Server | None = None
        self._socket_identity: paths.FileIdentity | None = None
        self._registered = False
        self._registration: asyncio.Task[None] | None = None

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
        """
        if not self.socket_path.parent.is_dir():
            raise RuntimeError(f"the kubelet directory {self.socket_path.parent} does not exist")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
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

    async def stop(self) -> None:
        await self.state.close()
        if self._registration is not None:
            self._registration.cancel()
            await asyncio.gather(self._registration, return_exceptions=True)
            self._registration = None
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
            self._server = None
        if self.socket_intact():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._socket_identity = None

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
            async with grpc.aio.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
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

    def register_in_background(self, outcome: Callable[[RegistrationError | None], None]) -> None:
        """Register in a task of its own unless registered or registering already.

        ``outcome`` hears how the attempt ended (None: registered) before the next
        attempt may start.
        """
        if self._registered or self._registration is not None:
            return
        self._registration = asyncio.create_task(
            self._register_once(outcome), name=f"register {self.resource}"
        )

    async def _register_once(self, outcome: Callable[[RegistrationError | None], None]) -> None:
        try:
            try:
                await self.register()
            except RegistrationError as exc:
                outcome(exc)
            else:
                outcome(None)
                load_deferred()
        finally:
            self._registration = None

    def registration_lost(self) -> None:
        """The kubelet's stream ended on its own: the next sync registers again."""
        self._registered = False

    def announce(self, failed_attempts: int = 0) -> None:
        self.state.announce(self.socket_path, failed_attempts)
