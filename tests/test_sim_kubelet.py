"""The kubelet stub against a tiny real DevicePlugin server, over real unix sockets."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin_sim.kubelet import KubeletStub, ResourceView
from rbln_device_plugin_sim.node import short_tempdir

RESOURCE = "rebellions.ai/npu"
ENDPOINT = "rbln-device-plugin-rebellions-ai-npu.sock"


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """Just enough of a device plugin to drive the stub."""

    def __init__(self) -> None:
        self.lists: asyncio.Queue[list[api_pb2.Device] | None] = asyncio.Queue()
        self.options_calls = 0
        self.open_streams = 0
        self.cancelled_streams = 0

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: object
    ) -> api_pb2.DevicePluginOptions:
        self.options_calls += 1
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: object
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.open_streams += 1
        try:
            while (devices := await self.lists.get()) is not None:
                yield api_pb2.ListAndWatchResponse(devices=devices)
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        finally:
            self.open_streams -= 1

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: object
    ) -> api_pb2.PreferredAllocationResponse:
        req = request.container_requests[0]
        rest = [d for d in sorted(req.available_deviceIDs) if d not in req.must_include_deviceIDs]
        chosen = [*req.must_include_deviceIDs, *rest][: req.allocation_size]
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen)]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        if any("bad" in i for c in request.container_requests for i in c.devices_ids):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown device")
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    devices=[
                        api_pb2.DeviceSpec(container_path=f"/dev/{i}", host_path=f"/dev/{i}")
                        for i in c.devices_ids
                    ]
                )
                for c in request.container_requests
            ]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: object
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def devices(*health: str) -> list[api_pb2.Device]:
    return [api_pb2.Device(ID=f"rbln{i}", health=h) for i, h in enumerate(health)]


@pytest.fixture
def directory() -> Iterator[Path]:
    path = short_tempdir("rbln-k-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(directory: Path) -> AsyncIterator[KubeletStub]:
    stub = KubeletStub(directory, options_timeout=1.0)
    await stub.start()
    yield stub
    await stub.stop()


@pytest.fixture
async def plugin(directory: Path) -> AsyncIterator[FakePlugin]:
    servicer = FakePlugin()
    server = aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{directory / ENDPOINT}")
    await server.start()
    yield servicer
    for _ in range(4):  # release any stream still waiting, then stop
        servicer.lists.put_nowait(None)
    await server.stop(0)


async def register(
    directory: Path,
    *,
    version: str = "v1beta1",
    endpoint: str = ENDPOINT,
    resource: str = RESOURCE,
    preferred: bool = True,
) -> None:
    async with aio.insecure_channel(f"unix:{directory / 'kubelet.sock'}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(
                version=version,
                endpoint=endpoint,
                resource_name=resource,
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=preferred),
            ),
            timeout=5,
        )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"version": "v1alpha"}, "unsupported API version"),
        ({"resource": "npu"}, "invalid resource name"),
        ({"resource": "kubernetes.io/npu"}, "invalid resource name"),
        ({"resource": "Rebellions.ai/npu"}, "invalid resource name"),
        ({"resource": "rebellions.ai/npu/vf4"}, "invalid resource name"),
        ({"endpoint": "../elsewhere.sock"}, "invalid endpoint"),
        ({"endpoint": ""}, "invalid endpoint"),
        ({"endpoint": "nobody-listens.sock"}, "GetDevicePluginOptions"),
    ],
)
async def test_bad_registrations_are_refused(
    kubelet: KubeletStub, directory: Path, changes: dict[str, str], reason: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await register(directory, **changes)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in (info.value.details() or "")
    assert kubelet.resources() == []
    assert [(r.accepted, reason in r.error) for r in kubelet.registrations] == [(False, True)]


async def test_good_registration_asks_options_first_then_watches(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    await register(directory)
    assert plugin.options_calls == 1  # before Register answered
    assert kubelet.registrations[0].accepted and kubelet.registrations[0].preferred_allocation
    plugin.lists.put_nowait(devices("Healthy", "Healthy"))
    view = await kubelet.wait_for(RESOURCE, lambda v: v.messages == 1, timeout=5)
    assert view.ids == ["rbln0", "rbln1"] and view.count("Healthy") == 2
    plugin.lists.put_nowait(devices("Healthy", "Unhealthy"))
    view = await kubelet.wait_for(RESOURCE, lambda v: v.health("rbln1") == "Unhealthy", 5)
    assert (view.messages, view.endpoint, view.ended) == (2, ENDPOINT, None)


async def test_options_come_from_the_plugin_not_the_request(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    # The kubelet ignores RegisterRequest.options; GetDevicePluginOptions decides.
    await register(directory, preferred=False)
    assert kubelet.registrations[0].preferred_allocation


async def test_preferred_and_allocate_reach_the_plugin(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    await register(directory)
    chosen = await kubelet.preferred(RESOURCE, ["rbln3", "rbln1", "rbln2"], ["rbln3"], 2)
    assert chosen == ["rbln3", "rbln1"]
    response = await kubelet.allocate(RESOURCE, [["rbln1"], ["rbln2", "rbln3"]])
    assert [[d.host_path for d in c.devices] for c in response.container_responses] == [
        ["/dev/rbln1"],
        ["/dev/rbln2", "/dev/rbln3"],
    ]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await kubelet.allocate(RESOURCE, [["bad0"]])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(LookupError):
        await kubelet.preferred("rebellions.ai/npu-vf4", [], [], 1)


async def test_reregistration_while_the_stream_is_open_is_refused(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    # As ManagerImpl.PluginConnected (1.37): one client per resource and socket.
    await register(directory)
    await kubelet.wait_for(RESOURCE, lambda v: True, timeout=5)
    await _until(lambda: plugin.open_streams == 1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await register(directory)
    assert "device plugin already connected" in (info.value.details() or "")
    assert [r.accepted for r in kubelet.registrations] == [True, False]
    plugin.lists.put_nowait(devices("Healthy"))  # the first stream still serves
    view = await kubelet.wait_for(RESOURCE, lambda v: v.messages == 1, timeout=5)
    assert (view.generation, plugin.cancelled_streams) == (1, 0)
    plugin.lists.put_nowait(None)  # the plugin ends its stream
    view = await kubelet.wait_for(RESOURCE, lambda v: v.ended is not None, timeout=5)
    assert kubelet.stream_ended(RESOURCE) == "stream closed by the plugin"
    assert view.ids == ["rbln0"]  # the last list stays visible
    await register(directory)  # once it ended, registering again is accepted
    view = await kubelet.wait_for(RESOURCE, lambda v: v.generation == 2, timeout=5)
    assert view.ended is None


async def test_reregistration_from_another_endpoint_replaces_the_stream(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    await register(directory)
    await _until(lambda: plugin.open_streams == 1)
    server = aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{directory / 'other.sock'}")
    await server.start()
    try:
        await register(directory, endpoint="other.sock")
        await _until(lambda: plugin.cancelled_streams == 1 and plugin.open_streams == 1)
        view = await kubelet.wait_for(RESOURCE, lambda v: v.generation == 2, timeout=5)
        assert view.endpoint == "other.sock"
    finally:
        plugin.lists.put_nowait(None)
        await server.stop(0)


async def test_drop_stream_ends_the_plugins_stream(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    await register(directory)
    plugin.lists.put_nowait(devices("Healthy"))
    await kubelet.wait_for(RESOURCE, lambda v: v.messages == 1, timeout=5)
    await kubelet.drop_stream(RESOURCE)
    assert kubelet.stream_ended(RESOURCE) == "dropped by the kubelet"
    await _until(lambda: plugin.cancelled_streams == 1 and plugin.open_streams == 0)
    await register(directory)  # registering again opens a fresh stream
    view = await kubelet.wait_for(RESOURCE, lambda v: v.generation == 2 and v.ended is None, 5)
    assert view.messages == 0


async def test_restart_recreates_kubelet_sock_and_deletes_sockets(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    await register(directory)
    await kubelet.wait_for(RESOURCE, lambda v: True, timeout=5)
    (directory / "kubelet_internal_checkpoint").write_text("{}")
    before = os.stat(directory / "kubelet.sock").st_ino
    await kubelet.restart()
    assert os.stat(directory / "kubelet.sock").st_ino != before
    assert not (directory / ENDPOINT).exists()  # the plugin's socket went too
    assert (directory / "kubelet_internal_checkpoint").exists()  # other files stay
    assert kubelet.resources() == [] and kubelet.restarts == 1
    await _until(lambda: plugin.open_streams == 0)
    # The new socket serves: a plugin on a fresh socket registers again.
    server = aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{directory / ENDPOINT}")
    await server.start()
    try:
        await register(directory)
        plugin.lists.put_nowait(devices("Healthy"))
        view: ResourceView = await kubelet.wait_for(RESOURCE, lambda v: v.messages == 1, 5)
        assert view.generation == 2
    finally:
        plugin.lists.put_nowait(None)
        await server.stop(0)


async def test_die_leaves_the_same_kubelet_sock_refusing_connections(
    kubelet: KubeletStub, plugin: FakePlugin, directory: Path
) -> None:
    """What a kubelet process that exited leaves, as on the real node: its socket file,
    unchanged, with nobody listening; the plugin's stream ends; ``start`` recovers."""
    await register(directory)
    await kubelet.wait_for(RESOURCE, lambda v: True, timeout=5)
    before = os.stat(directory / "kubelet.sock").st_ino
    await kubelet.die()
    assert os.stat(directory / "kubelet.sock").st_ino == before
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(ConnectionRefusedError):
        probe.connect(str(directory / "kubelet.sock"))
    probe.close()
    await _until(lambda: plugin.open_streams == 0)
    assert kubelet.resources() == []
    await kubelet.start()
    assert not (directory / ENDPOINT).exists()  # the next kubelet cleaned up
    served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    served.connect(str(directory / "kubelet.sock"))  # a new socket that serves
    served.close()


async def test_wait_for_times_out_with_a_readable_error(kubelet: KubeletStub) -> None:
    with pytest.raises(TimeoutError, match=r"rebellions\.ai/npu"):
        await kubelet.wait_for(RESOURCE, timeout=0.2)


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Poll the fake plugin's counters (it has no events to wait on)."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
