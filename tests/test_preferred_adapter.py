"""The gRPC-facing adapter: allocator reuse, inline small requests, cap and fallback records."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from bench.layouts import node_64_half_unreadable
from rbln_device_plugin.api.v1beta1 import api_pb2
from rbln_device_plugin.kubelet import preferred
from rbln_device_plugin.model.devicetable import DeviceTable
from rbln_device_plugin.model.health import StatusReading
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin_sim.layout import SimDevice


def device(sim: SimDevice) -> Device:
    return Device(
        sim.name, sim.product, sim.pci_dev, sim.bus_id, int(sim.numa), sim.sid, None, sim.pci_path
    )


DEVICES = [device(d) for d in node_64_half_unreadable().devices]
IDS = [d.name for d in DEVICES]


def readings(devices: list[Device], code: int) -> dict[str, StatusReading]:
    return {d.name: StatusReading(code) for d in devices}


def table(devices: list[Device]) -> DeviceTable:
    t = DeviceTable()
    t.apply_scan(devices, readings(devices, 0))
    return t


def request(
    available: list[str], must: list[str], size: int
) -> api_pb2.ContainerPreferredAllocationRequest:
    return api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
    )


def test_the_allocator_is_reused_until_the_devices_change() -> None:
    t = table(DEVICES)
    first = preferred.topology_for(t)
    t.apply_scan(DEVICES, readings(DEVICES, 1))  # health changed, devices did not
    assert preferred.topology_for(t) is first
    moved = [dataclasses.replace(DEVICES[0], numa=1), *DEVICES[1:]]
    t.apply_scan(moved, readings(moved, 0))
    rebuilt = preferred.topology_for(t)
    assert rebuilt is not first and rebuilt.candidates["rbln0"].numa == 1


def _threads(monkeypatch: pytest.MonkeyPatch) -> list[Callable[..., Any]]:
    handed: list[Callable[..., Any]] = []
    real = preferred.in_thread

    async def spy(func: Callable[..., Any], name: str) -> Any:
        handed.append(func)
        return await real(func, name)

    # A thread of its own (never asyncio's default executor, joined without a bound).
    monkeypatch.setattr(preferred, "in_thread", spy)
    return handed


async def test_small_requests_stay_on_the_loop_large_ones_go_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed = _threads(monkeypatch)
    t = table(DEVICES)
    for size in (1, 2, 4, 60, 63, 64):
        assert len(await preferred.choose("r", t, request(IDS, [], size))) == size
    assert handed == []
    assert len(await preferred.choose("r", t, request(IDS, [], 32))) == 32
    assert len(handed) == 1


async def test_a_capped_search_answers_in_full_and_warns() -> None:
    with capture_logs() as logs:
        ids = await preferred.choose(
            "rebellions.ai/npu", table(DEVICES), request(IDS, ["rbln7"], 40), cap=1
        )
    assert len(set(ids)) == 40 and ids[0] == "rbln7"
    (warn,) = [e for e in logs if e["log_level"] == "warning"]
    assert warn["event"] == "Preferred allocation search reached its cap"
    assert (warn["cap"], warn["allocationSize"]) == (1, 40)
    assert set(warn["score"]) == {
        "unknown_numa", "numa_nodes", "share_groups", "unreadable_paths",
        "cross_root_pairs", "max_distance", "distance_sum",
    }  # fmt: skip
    (debug,) = [e for e in logs if e["event"] == "Selected preferred allocation"]
    assert debug["deviceIDs"] == ids


async def test_an_uncapped_search_logs_no_warning() -> None:
    with capture_logs() as logs:
        ids = await preferred.choose("r", table(DEVICES), request(IDS, [], 40))
    assert len(ids) == 40
    assert [e for e in logs if e["log_level"] == "warning"] == []


async def test_an_invalid_request_falls_back_with_a_warning() -> None:
    with capture_logs() as logs:
        assert await preferred.choose("r", table(DEVICES), request(IDS, ["gpu0"], 2)) == []
    (warn,) = logs
    assert warn["event"] == "Preferred allocation fallback to kubelet"
    assert "'gpu0' is not available" in warn["reason"]
