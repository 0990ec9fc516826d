"""The DRA kubelet plugin's two sockets: the service endpoint (DRAPlugin and
DRAResourceHealth), then the registration.

Start order matters to the kubelet: once the registration socket appears under
``plugins_registry/`` the plugin watcher calls ``GetInfo`` and may call the endpoint right
away, so the endpoint (``plugins/<driver>/dra.sock``) serves first. Stop is the reverse:
the registration socket goes first (the watcher deregisters the plugin on its removal),
then the endpoint. Each socket's place is cleared as the device plugin clears its own
(``host.pluginsocket``: a directory there is refused, anything else removed as the entry
itself), each is created 0600, and each is removed at stop only while it is still ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final, TypeVar

import grpc

from rbln_device_plugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from rbln_device_plugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from rbln_device_plugin.api.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from rbln_device_plugin.api.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from rbln_device_plugin.api.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from rbln_device_plugin.dra import health, names
from rbln_device_plugin.dra.healthstream import HealthFeed, HealthV1, HealthV1alpha1
from rbln_device_plugin.dra.prepare import Preparer
from rbln_device_plugin.dra.registration import RegistrationServicer
from rbln_device_plugin.dra.service import DraPluginV1, DraPluginV1beta1
from rbln_device_plugin.host import paths, pluginsocket
from rbln_device_plugin.host.hostio import HostIO, Stalled
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin.telemetry.logs import get_logger

log = get_logger()
T = TypeVar("T")

STOP_GRACE_S: Final = 2.0
# A unix socket path is at most 107 bytes (sun_path less its NUL): checked before the bind,
# whose own failure says little.
MAX_SOCKET_PATH: Final = 107


@dataclass
class _Served:
    path: Path
    server: grpc.aio.Server
    identity: paths.FileIdentity | None = None


@dataclass
class DraPlugin:
    preparer: Preparer
    registry_dir: Path  # <kubelet root>/plugins_registry
    plugin_dir: Path  # <kubelet root>/plugins/<driver>
    hostio: HostIO
    # Each scan's device health, streamed to the kubelet (DRAResourceHealth).
    feed: HealthFeed = field(default_factory=lambda: HealthFeed(health.MIN_TIMEOUT_S))
    metrics: m.Metrics = m.NOOP
    registration: RegistrationServicer = field(init=False)
    _served: list[_Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.registration = RegistrationServicer(names.DRIVER_NAME, self.endpoint)

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / names.SERVICE_SOCKET

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / names.REGISTRATION_SOCKET

    async def start(self) -> None:
        """Read the checkpoint, serve the endpoint, then announce it to the plugin watcher."""
        for path in (self.endpoint, self.registration_socket):
            if len(str(path).encode()) > MAX_SOCKET_PATH:
                raise pluginsocket.SocketPathError(
                    f"{path} is longer than {MAX_SOCKET_PATH} bytes: no unix socket fits"
                )
        await self.preparer.start()  # creates plugin_dir
        service = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(DraPluginV1(self.preparer), service)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraPluginV1beta1(self.preparer), service)
        health_v1_grpc.add_DRAResourceHealthServicer_to_server(
            HealthV1(self.feed, self.metrics), service
        )
        health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            HealthV1alpha1(self.feed, self.metrics), service
        )
        await self._serve(self.endpoint, service)
        registrar = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(self.registration, registrar)
        await self._serve(self.registration_socket, registrar)
        log.info(
            "DRA plugin serving",
            driver=names.DRIVER_NAME, endpoint=str(self.endpoint),
            registrationSocket=str(self.registration_socket),
        )  # fmt: skip

    async def _serve(self, path: Path, server: grpc.aio.Server) -> None:
        cleared = await self._host(path, pluginsocket.clear, "clear the place of")
        if cleared.removed not in (None, "socket"):
            log.warning(
                "Removed a foreign entry where the DRA plugin's socket belongs",
                socketPath=str(path), kind=cleared.removed, linkTarget=cleared.link_target,
            )  # fmt: skip
        served = _Served(path, server)
        self._served.append(served)  # a stop from here on removes what is bound
        with paths.umask(0o177):
            if server.add_insecure_port(f"unix:{path}") == 0:
                raise RuntimeError(f"cannot listen on {path}")
        served.identity = await self._host(path, pluginsocket.bound_identity, "check")
        await server.start()

    async def stop(self) -> None:
        """Registration socket first (the watcher deregisters), then the endpoint. The
        health streams end first, cleanly: the servers' grace is not spent on them."""
        await self.feed.close()
        while self._served:
            served = self._served.pop()
            await served.server.stop(STOP_GRACE_S)
            removal = partial(pluginsocket.remove_if_ours, served.path, served.identity)
            outcome = await self.hostio.call(str(served.path), removal)
            if isinstance(outcome, Stalled):
                log.warning(
                    "Cannot remove the DRA plugin's socket in time; it stays",
                    socketPath=str(served.path), err=str(outcome),
                )  # fmt: skip

    async def _host(
        self, path: Path, run: Callable[[Path], T | pluginsocket.SocketPathError], doing: str
    ) -> T:
        outcome = await self.hostio.call(str(path), partial(run, path))
        if isinstance(outcome, Stalled):
            raise pluginsocket.SocketPathError(f"cannot {doing} {path}: {outcome}")
        if isinstance(outcome, pluginsocket.SocketPathError):
            raise outcome
        return outcome
