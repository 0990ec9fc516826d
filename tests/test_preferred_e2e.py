"""The README's preferred-allocation table, row by row, through the real gRPC server.

Each row runs the daemon's runtime in-process against the simulated ``readme-example``
node (a node of its own where the row changes SIDs, NUMA nodes or PCI data; the rows on
the unchanged tree share one daemon: a preferred answer changes nothing) and asks
through the kubelet stub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
import pytest_asyncio

from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin_sim.layout import Layout, SimDevice, preset

from .inprocess import InProcess, running

NPU = "rebellions.ai/npu"
ALL = [f"rbln{i}" for i in range(7)]
MAX_PREFERRED_CONTAINERS = 8  # per GetPreferredAllocation call, as docs/allocation.md says

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def _shared_readme() -> AsyncIterator[InProcess]:
    async with running("readme-example", interval="1h") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 7)
        yield h


@pytest.fixture
def readme_node(_shared_readme: InProcess) -> InProcess:
    return _shared_readme.for_test()


def readme(**changes: dict[str, object]) -> Layout:
    """The README tree with per-device field changes, e.g. rbln4={"sid": ...}."""
    base = preset("readme-example")
    devices = tuple(
        dataclasses.replace(d, **changes[d.name]) if d.name in changes else d  # type: ignore[arg-type]
        for d in base.devices
    )
    return Layout(base.name, devices)


async def ask(
    layout: Layout, available: Sequence[str], must: Sequence[str], size: int
) -> list[str]:
    async with running(layout, interval="1h") as h:
        count = len(layout.devices)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == count)
        return await ask_on(h, available, must, size)


async def ask_on(
    h: InProcess, available: Sequence[str], must: Sequence[str], size: int
) -> list[str]:
    answer = await h.kubelet.preferred(NPU, available, must, size)
    (selected,) = await h.daemon.await_log("Selected preferred allocation", level="debug")
    assert selected["deviceIDs"] == answer
    return answer


async def test_choose_2_takes_the_closest_pair(readme_node: InProcess) -> None:
    assert await ask_on(readme_node, ALL, [], 2) == ["rbln0", "rbln2"]


async def test_shared_sid_beats_a_shorter_pci_path() -> None:
    layout = readme(rbln4={"sid": preset("readme-example").device("rbln0").sid})
    assert await ask(layout, ["rbln0", "rbln2", "rbln4"], [], 2) == ["rbln0", "rbln4"]


async def test_same_numa_beats_a_shorter_pci_path() -> None:
    layout = readme(rbln2={"numa": "1"})
    assert await ask(layout, ["rbln0", "rbln1", "rbln2"], ["rbln0"], 2) == ["rbln0", "rbln1"]


async def test_subsets_within_one_sid_are_compared() -> None:
    sid = "0000000022509999"
    layout = readme(rbln0={"sid": sid}, rbln1={"sid": sid}, rbln2={"sid": sid})
    assert await ask(layout, ["rbln0", "rbln1", "rbln2"], [], 2) == ["rbln0", "rbln2"]


async def test_required_device_without_pci_data_is_kept(readme_node: InProcess) -> None:
    assert await ask_on(readme_node, ALL, ["rbln6"], 3) == ["rbln6", "rbln0", "rbln2"]


async def test_one_pci_root_beats_an_unmeasured_inter_root_path(readme_node: InProcess) -> None:
    answer = await ask_on(readme_node, ["rbln0", "rbln4", "rbln5"], ["rbln0"], 2)
    assert answer == ["rbln0", "rbln4"]


async def test_all_metadata_missing_falls_back_to_id_order() -> None:
    blank = {"sid": "", "numa": "-1", "pci_path": None}
    layout = readme(**{name: blank for name in ALL})
    assert await ask(layout, ALL, [], 2) == ["rbln0", "rbln1"]


def _card_device(index: int, card: int, numa: int) -> SimDevice:
    bus = 0x10 + index
    root = f"pci0000:{numa * 0x80:02x}"
    port = f"0000:{numa * 0x80:02x}:{card + 1:02x}.0"
    bdf = f"0000:{bus:02x}:00.0"
    return SimDevice(
        name=f"rbln{index}", npu=index, product="RBLN-CA25", bus_id=bdf,
        sid=f"{22500000 + card:016d}", numa=str(numa), pci_path=(root, port, bdf),
    )  # fmt: skip


async def test_four_devices_on_three_local_cards_beat_two_cards_across_numa() -> None:
    # rbln0-1: card 0 (NUMA 0); rbln2-3: card 1 (NUMA 1); rbln4: card 2, rbln5: card 3 (NUMA 0).
    # rbln0-3 is the smallest ID set and uses only two cards, but spans two NUMA nodes.
    placement = [(0, 0), (0, 0), (1, 1), (1, 1), (2, 0), (3, 0)]
    devices = tuple(_card_device(i, card, numa) for i, (card, numa) in enumerate(placement))
    layout = Layout("numa-first", devices)
    ids = [d.name for d in devices]
    assert await ask(layout, ids, [], 4) == ["rbln0", "rbln1", "rbln4", "rbln5"]


async def test_bad_requests_fall_back_to_the_kubelet_with_a_warning(
    readme_node: InProcess,
) -> None:
    h = readme_node
    assert await h.kubelet.preferred(NPU, ["rbln0", "rbln99"], [], 1) == []
    assert await h.kubelet.preferred(NPU, ["rbln0", "rbln1"], [], 3) == []
    assert await h.kubelet.preferred(NPU, ["rbln0", "rbln1"], ["rbln2"], 1) == []
    assert await h.kubelet.preferred(NPU, ["rbln0"], [], -1) == []
    warnings = await h.daemon.await_log("Preferred allocation fallback to kubelet", count=4)
    assert all(w["level"] == "warn" and w["reason"] for w in warnings)
    assert [w["allocationSize"] for w in warnings] == [1, 3, 1, -1]
    # Shortcuts: exactly the must-include devices; exactly everything available.
    assert await h.kubelet.preferred(NPU, ALL, ["rbln5", "rbln3"], 2) == ["rbln5", "rbln3"]
    assert await h.kubelet.preferred(NPU, ["rbln4", "rbln1"], [], 2) == ["rbln1", "rbln4"]


async def _call(h: InProcess, containers: int) -> api_pb2.PreferredAllocationResponse:
    """One GetPreferredAllocation with ``containers`` container requests (choose 2 of all),
    straight on the plugin's socket: the kubelet stub, like the kubelet, sends one."""
    target = f"unix:{h.config.kubelet_dir / socket_name(NPU)}"
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ALL, allocation_size=2)
            for _ in range(containers)
        ]
    )
    async with grpc.aio.insecure_channel(target) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        return await stub.GetPreferredAllocation(request, timeout=60)


def _searched(h: InProcess) -> int:
    """Container requests the daemon worked on: each ends in one of these records."""
    return len(h.daemon.find("Selected preferred allocation")) + len(
        h.daemon.find("Preferred allocation fallback to kubelet")
    )


async def test_a_call_with_thousands_of_container_requests_is_refused_before_any_search(
    readme_node: InProcess,
) -> None:
    h = readme_node
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _call(h, 2000)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        f"{NPU}: GetPreferredAllocation carries 2000 container requests; "
        f"at most {MAX_PREFERRED_CONTAINERS} per call (the kubelet sends one)"
    )
    (record,) = await h.daemon.await_log("Preferred allocation request refused")
    assert record["level"] == "warn" and record["containerCount"] == 2000
    # Up to the cap every container is answered, each with a search of its own.
    answer = await _call(h, MAX_PREFERRED_CONTAINERS)
    assert [list(c.deviceIDs) for c in answer.container_responses] == [
        ["rbln0", "rbln2"]
    ] * MAX_PREFERRED_CONTAINERS
    # Records come in order: these eight follow any the refused call could have written.
    await h.daemon.await_log("Selected preferred allocation", count=MAX_PREFERRED_CONTAINERS)
    assert _searched(h) == MAX_PREFERRED_CONTAINERS  # not one of the 2,000 searches ran
    assert await h.kubelet.preferred(NPU, ALL, [], 2) == ["rbln0", "rbln2"]
