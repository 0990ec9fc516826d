"""A kubelet stand-in speaking the real v1beta1 device-plugin API over unix sockets.

It behaves like the kubelet where a plugin can tell the difference (checked against the
kubelet's device manager, pkg/kubelet/cm/devicemanager, and against the real thing in
tests/test_kubelet_peer.py): it validates ``Register`` (API version, an extended
resource name), dials the plugin back and asks for its options before answering (those
options, not the ones in the request, decide whether it calls GetPreferredAllocation),
opens one ``ListAndWatch`` per resource and never reopens it, refuses a registration on
an endpoint whose stream is still open (1.37's "device plugin already connected"),
replaces the stream of a resource registering from another endpoint, and on every
``start()`` (``restart()`` included) cleans its directory as the kubelet's device
manager does before it listens on a new ``kubelet.sock``.

The cleanup is ``ManagerImpl.CleanupPluginDirectory`` (pkg/kubelet/cm/devicemanager/
manager.go), called from the registration server's ``Start`` (plugin/v1beta1/server.go)
after ``MkdirAll(dir, 0750)``. Which entries it deletes depends on the release:

- ``Cleanup.NON_DIRECTORIES`` (the default: the harsher rule, which a plugin must
  survive): every entry whose ``os.Lstat`` is not a directory, sockets, regular files
  and symlinks alike, except the checkpoint ``kubelet_internal_checkpoint``. Every
  release up to 1.30, 1.31.1 and later 1.31 patches (kubernetes#126976 put it back), and
  1.32.
- ``Cleanup.SOCKETS``: only entries whose ``os.Stat`` (following symlinks) is a socket,
  again sparing the checkpoint; an entry that cannot be stat'ed is left alone. 1.31.0
  (kubernetes#123819) and 1.33 on (kubernetes#130187); read in the 1.34.0 and 1.37.2
  sources.

Neither deletes a directory or anything inside one.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc
from grpc import aio

from rbln_device_plugin.api import API_VERSION, KUBELET_SOCKET
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc

OPTIONS_TIMEOUT_S: Final = 10.0
CALL_TIMEOUT_S: Final = 10.0
MAX_UNIX_PATH: Final = 107
CHECKPOINT: Final = "kubelet_internal_checkpoint"  # devicemanager's kubeletDeviceManagerCheckpoint


class Cleanup(enum.Enum):
    """Which entries a starting kubelet deletes from its device-plugin directory."""

    NON_DIRECTORIES = "non-directories"  # up to 1.30, 1.31.1+, 1.32
    SOCKETS = "sockets"  # 1.31.0, 1.33 and later


def clean_plugin_directory(directory: Path, rule: Cleanup) -> list[str]:
    """Delete what the kubelet's CleanupPluginDirectory deletes; return the names deleted."""
    deleted: list[str] = []
    for name in os.listdir(directory):
        if name == CHECKPOINT:
            continue
        path = directory / name
        try:
            # Lstat for the older rule (a symlink is no directory), Stat for the newer.
            info = os.lstat(path) if rule is Cleanup.NON_DIRECTORIES else os.stat(path)
        except OSError:
            continue  # the kubelet logs "Failed to stat file" and goes on
        if stat.S_ISDIR(info.st_mode):
            continue
        if rule is Cleanup.SOCKETS and not stat.S_ISSOCK(info.st_mode):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # os.RemoveAll of a non-directory
        deleted.append(name)
    return deleted


@dataclass(frozen=True, slots=True)
class Registration:
    """One Register call, accepted or not."""

    resource: str
    endpoint: str
    version: str
    # GetDevicePluginOptions' answer (what the kubelet acts on; False when not reached).
    preferred_allocation: bool
    accepted: bool
    error: str = ""
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class ResourceView:
    """What the stub knows about one registered resource right now."""

    resource: str
    endpoint: str
    generation: int  # how many times this resource has registered with the stub
    devices: tuple[api_pb2.Device, ...] = ()
    messages: int = 0  # ListAndWatch messages received on the current stream
    ended: str | None = None  # why the current stream ended; None while it is open

    @property
    def ids(self) -> list[str]:
        return [d.ID for d in self.devices]

    def health(self, device_id: str) -> str | None:
        return next((d.health for d in self.devices if device_id == d.ID), None)

    def count(self, health: str) -> int:
        return sum(1 for d in self.devices if d.health == health)


@dataclass(slots=True)
class _Plugin:
    view: ResourceView
    channel: aio.Channel
    stub: api_pb2_grpc.DevicePluginAsyncStub
    task: asyncio.Task[None] | None = None


class KubeletStub(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        directory: Path | str,
        *,
        options_timeout: float = OPTIONS_TIMEOUT_S,
        on_event: Callable[[str], None] | None = None,
        cleanup: Cleanup = Cleanup.NON_DIRECTORIES,
    ) -> None:
        self.directory = Path(directory)
        self.cleanup = cleanup
        self.deleted: list[str] = []  # every entry a start deleted, in order
        self.socket_path = self.directory / KUBELET_SOCKET
        if len(str(self.socket_path)) > MAX_UNIX_PATH:
            raise ValueError(f"socket path too long for unix sockets: {self.socket_path}")
        self.options_timeout = options_timeout
        self.registrations: list[Registration] = []
        self.restarts = 0
        self._on_event = on_event
        self._plugins: dict[str, _Plugin] = {}
        self._generations: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._server: aio.Server | None = None
        # A kubelet that accepts Register calls and never answers them (see ``go_silent``).
        self._answer = asyncio.Event()
        self._answer.set()
        self.silent_calls: list[Registration] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Like the kubelet's registration server starting: mkdir, clean up, listen."""
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.deleted += clean_plugin_directory(self.directory, self.cleanup)
        # The cleanup took a leftover kubelet.sock too; a fresh socket is what kubelet makes.
        self.socket_path.unlink(missing_ok=True)
        server = aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        await self._drop_plugins("kubelet stopped")
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    async def _stop_serving_parked(self, suffix: str) -> Path:
        """Stop the registration server with kubelet.sock moved outside the directory
        (gRPC unlinks its socket path on stop); where it was moved to."""
        parked = self.directory.parent / f".{self.directory.name}.{KUBELET_SOCKET}.{suffix}"
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.rename(parked)
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        return parked

    async def die(self) -> None:
        """Like the kubelet process exiting (a crash, or the first half of a service
        restart): every stream ends and ``kubelet.sock`` stays where it was, the same
        file, refusing connections, until ``start`` (the next kubelet) cleans up."""
        # A dying kubelet leaves its socket: it is put back once gRPC is done, same
        # inode, nobody listening.
        parked = await self._stop_serving_parked("dead")
        with contextlib.suppress(FileNotFoundError):
            parked.rename(self.socket_path)
        await self._drop_plugins("kubelet exited")
        self._event("kubelet exited: kubelet.sock left behind, refusing connections")
        await self._notify()

    async def restart(self) -> None:
        """Like a kubelet starting again: the directory is cleaned, kubelet.sock is new."""
        # The old socket's inode stays allocated until the new kubelet.sock exists: the
        # new file never reuses the inode number, and watchers comparing inodes see the
        # change. Registration goes before the streams, as when the kubelet process dies:
        # a plugin reacting to its stream ending cannot register with the old instance.
        parked = await self._stop_serving_parked("old")
        await self._drop_plugins("kubelet restarted")
        await self.start()
        parked.unlink(missing_ok=True)
        self.restarts += 1
        self._event(f"kubelet restarted: cleaned ({self.cleanup.value}), new kubelet.sock")
        await self._notify()

    async def __aenter__(self) -> KubeletStub:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ Registration

    def go_silent(self) -> None:
        """From now on, Register calls are received and left unanswered until ``speak``."""
        self._answer.clear()

    def speak(self) -> None:
        """Answer Register calls again (calls already waiting are handled normally)."""
        self._answer.set()

    async def Register(
        self, request: api_pb2.RegisterRequest, context: aio.ServicerContext[object, object]
    ) -> api_pb2.Empty:
        if not self._answer.is_set():
            self.silent_calls.append(
                Registration(
                    request.resource_name, request.endpoint, request.version,
                    request.options.get_preferred_allocation_available, accepted=False,
                    error="left unanswered",
                )
            )  # fmt: skip
            await self._notify()
            await self._answer.wait()
        problem = _validate(request)
        options: api_pb2.DevicePluginOptions | None = None
        if problem is None:
            problem, options = await self._check_plugin(request)
        if problem is None:
            problem = self._already_connected(request)
        accepted = problem is None
        self.registrations.append(
            Registration(
                resource=request.resource_name,
                endpoint=request.endpoint,
                version=request.version,
                preferred_allocation=options is not None
                and options.get_preferred_allocation_available,
                accepted=accepted,
                error=problem or "",
            )
        )
        if problem is not None:
            self._event(f"refused registration of {request.resource_name!r}: {problem}")
            await self._notify()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._attach(request)
        return api_pb2.Empty()

    async def _check_plugin(
        self, request: api_pb2.RegisterRequest
    ) -> tuple[str | None, api_pb2.DevicePluginOptions | None]:
        """Dial the plugin and ask for its options, as kubelet does before answering."""
        target = f"unix:{self.directory / request.endpoint}"
        try:
            async with aio.insecure_channel(target) as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                options = await stub.GetDevicePluginOptions(
                    api_pb2.Empty(), timeout=self.options_timeout
                )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, aio.AioRpcError) else None
            return f"GetDevicePluginOptions on {request.endpoint} failed: {code}", None
        return None, options

    def _already_connected(self, request: api_pb2.RegisterRequest) -> str | None:
        """The kubelet keeps one client per resource and socket until its stream ends.

        1.37's ManagerImpl.PluginConnected refuses a second one; older releases accept it
        and mark the resource unhealthy when the old stream ends later. Either way a
        plugin must not register again while its stream is open.
        """
        current = self._plugins.get(request.resource_name)
        if current is None or current.view.endpoint != request.endpoint:
            return None
        if current.view.ended is not None:
            return None
        return f"device plugin already connected: {self.directory / request.endpoint}"

    async def _attach(self, request: api_pb2.RegisterRequest) -> None:
        resource = request.resource_name
        old = self._plugins.pop(resource, None)
        if old is not None:
            await _close(old)
        generation = self._generations.get(resource, 0) + 1
        self._generations[resource] = generation
        channel = aio.insecure_channel(f"unix:{self.directory / request.endpoint}")
        plugin = _Plugin(
            view=ResourceView(resource, request.endpoint, generation),
            channel=channel,
            stub=api_pb2_grpc.DevicePluginStub(channel),
        )
        self._plugins[resource] = plugin
        plugin.task = asyncio.create_task(self._watch(plugin), name=f"ListAndWatch {resource}")
        self._event(f"registered {resource} (endpoint {request.endpoint})")
        await self._notify()

    async def _watch(self, plugin: _Plugin) -> None:
        # Yield first: Register's answer goes out before the stream is opened.
        await asyncio.sleep(0)
        reason = "stream closed by the plugin"
        try:
            async for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                view = plugin.view
                plugin.view = ResourceView(
                    view.resource,
                    view.endpoint,
                    view.generation,
                    tuple(response.devices),
                    view.messages + 1,
                )
                await self._notify()
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, aio.AioRpcError) else None
            reason = f"stream failed: {code}"
        v = plugin.view
        plugin.view = ResourceView(
            v.resource, v.endpoint, v.generation, v.devices, v.messages, reason
        )
        self._event(f"ListAndWatch for {v.resource} ended: {reason}")
        await self._notify()

    async def drop_stream(self, resource: str) -> None:
        """End the resource's ListAndWatch from the kubelet side (the plugin sees it close).

        The last view stays, marked ended, until the plugin registers again.
        """
        plugin = self._plugin(resource)
        await _close(plugin)
        v = plugin.view
        reason = "dropped by the kubelet"
        plugin.view = ResourceView(
            v.resource, v.endpoint, v.generation, v.devices, v.messages, reason
        )
        self._event(f"ListAndWatch for {resource} ended: {reason}")
        await self._notify()

    async def _drop_plugins(self, reason: str) -> None:
        plugins, self._plugins = self._plugins, {}
        for plugin in plugins.values():
            await _close(plugin)
        if plugins:
            self._event(f"dropped {len(plugins)} plugin stream(s): {reason}")
        await self._notify()

    # ------------------------------------------------------------------ observation

    def resources(self) -> list[str]:
        return sorted(self._plugins)

    def view(self, resource: str) -> ResourceView | None:
        plugin = self._plugins.get(resource)
        return plugin.view if plugin is not None else None

    def stream_ended(self, resource: str) -> str | None:
        view = self.view(resource)
        return view.ended if view is not None else None

    async def wait_for(
        self,
        resource: str,
        predicate: Callable[[ResourceView], bool] = lambda v: v.messages > 0,
        timeout: float = 10.0,  # noqa: ASYNC109 - part of the stub's test-facing API
    ) -> ResourceView:
        """Wait until the resource is registered and ``predicate`` holds for its view.

        Raises TimeoutError naming the resource and its last view.
        """

        def ready() -> bool:
            view = self.view(resource)
            return view is not None and predicate(view)

        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(ready)
        except TimeoutError:
            raise TimeoutError(
                f"{resource}: condition not met in {timeout:g}s (last: {self.view(resource)})"
            ) from None
        view = self.view(resource)
        assert view is not None
        return view

    async def wait_registrations(
        self,
        count: int,
        timeout: float = 10.0,  # noqa: ASYNC109 - test-facing API
    ) -> list[Registration]:
        """Wait until at least ``count`` Register calls (accepted or not) have arrived."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.registrations) >= count)
        return list(self.registrations)

    # ------------------------------------------------------------------ kubelet calls

    def _plugin(self, resource: str) -> _Plugin:
        plugin = self._plugins.get(resource)
        if plugin is None:
            raise LookupError(f"{resource} is not registered with the kubelet stub")
        return plugin

    async def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """One container's GetPreferredAllocation; grpc errors propagate."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = await self._plugin(resource).stub.GetPreferredAllocation(
            request, timeout=CALL_TIMEOUT_S
        )
        return list(response.container_responses[0].deviceIDs)

    async def allocate(
        self, resource: str, containers: Sequence[Sequence[str]]
    ) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers
            ]
        )
        return await self._plugin(resource).stub.Allocate(request, timeout=CALL_TIMEOUT_S)

    # ------------------------------------------------------------------ helpers

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _event(self, text: str) -> None:
        if self._on_event is not None:
            self._on_event(text)


def _validate(request: api_pb2.RegisterRequest) -> str | None:
    if request.version != API_VERSION:
        return f"unsupported API version {request.version!r}; expected {API_VERSION!r}"
    name = request.resource_name
    if not is_extended_resource_name(name):
        return f"invalid resource name {name!r}: expected an extended resource <domain>/<name>"
    endpoint = request.endpoint
    if not endpoint or "/" in endpoint or endpoint in (".", ".."):
        return f"invalid endpoint {endpoint!r}: expected a socket file name in the kubelet dir"
    return None


_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_QUALIFIED_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's check (IsExtendedResourceName, pkg/apis/core/v1/helper): a name with
    a domain outside kubernetes.io, not starting with "requests.", that is still a
    qualified name as the quota name "requests.<name>"."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".partition("/")
    return (
        "/" not in short
        and len(prefix) <= 253
        and _DNS_SUBDOMAIN.fullmatch(prefix) is not None
        and 0 < len(short) <= 63
        and _QUALIFIED_NAME.fullmatch(short) is not None
    )


async def _close(plugin: _Plugin) -> None:
    if plugin.task is not None and not plugin.task.done():
        plugin.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await plugin.task
    await plugin.channel.close()
