"""The DRA device-health stream (DRAResourceHealth v1 and v1alpha1) over real gRPC on the
plugin's unix socket, read as the 1.37.2 kubelet reads it, for every health transition
the device plugin's ListAndWatch tests cover (tests/test_faults.py,
tests/test_daemon_e2e.py, tests/test_records_e2e.py).

The session is the daemon's own (``DraSession``): each ``scan()`` is one pass of the scan
loop (discovery on the simulated node, the core's device states, then the stream and the
slice sink), so the stream's content comes from the same health history as ListAndWatch.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from rbln_device_plugin import options
from rbln_device_plugin.core.devices import NodeDevices
from rbln_device_plugin.dra import health, names
from rbln_device_plugin.dra.claims import ClaimProblem, ClaimRef
from rbln_device_plugin.dra.session import DraParts, DraSession
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.scan import Scanner
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.telemetry import metrics as m
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.state import Fault

from .dra_kubelet import KubeletSide
from .inprocess import until

NODE = "node-h"
HEALTH = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}  # the proto's enum, both versions


@dataclass
class Claims:
    table: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    async def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        if str(ref) not in self.table:
            raise ClaimProblem(f"reading ResourceClaim {ref}: 404 NotFound")
        return self.table[str(ref)]

    def allocate(self, ref: ClaimRef, devices: list[str]) -> None:
        results = [
            {"request": "npus", "driver": names.DRIVER_NAME, "pool": NODE, "device": d}
            for d in devices
        ]
        self.table[str(ref)] = {
            "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }


@dataclass
class Slices:
    """The slice sink: what each scan would publish (the API server is tested elsewhere)."""

    published: list[Mapping[str, Mapping[str, Entry]]] = field(default_factory=list)

    async def publish(self, entries: Mapping[str, Mapping[str, Entry]]) -> None:
        self.published.append(entries)

    def forget(self) -> None:
        pass

    async def watch(self, stop: asyncio.Event, changed: Any) -> None:
        await stop.wait()

    async def close(self) -> None:
        pass


@dataclass
class Scene:
    sim: SimNode
    session: DraSession
    found: NodeDevices
    kubelet: KubeletSide
    claims: Claims

    async def scan(self) -> None:
        await self.session.reconcile((await self.found.discover()).offered)


class Watch:
    """One NodeWatchResources stream as the kubelet holds it."""

    def __init__(self, call: Any) -> None:
        self.call = call

    async def next(self) -> dict[str, tuple[str, str]]:
        """The next message: device -> (health, message); checks what every entry carries."""
        response = await asyncio.wait_for(self.call.read(), 10)
        out: dict[str, tuple[str, str]] = {}
        for d in response.devices:
            assert d.device.pool_name == NODE
            assert d.health_check_timeout_seconds == 30  # three 5 s scans: the floor, 30 s
            assert d.last_updated_time > 0
            assert d.device.device_name not in out  # each device once: a complete list
            out[d.device.device_name] = (HEALTH[d.health], d.message)
        return out


@pytest.fixture
async def scene() -> AsyncIterator[Scene]:
    root = short_tempdir()
    sim = materialize(preset("rebel-4"), root / "sim")
    (root / "kubelet" / "plugins_registry").mkdir(parents=True)
    args = [
        *sim.daemon_args("5s"), "--mode=dra", "--node-name", NODE,
        "--kubelet-plugins-registry-path", str(root / "kubelet" / "plugins_registry"),
        "--kubelet-plugins-path", str(root / "kubelet" / "plugins"),
    ]  # fmt: skip
    config = options.parse(args, {})
    hostio = HostIO()
    scanner = Scanner(sysfs_root=config.sysfs_root, smi_path=config.rbln_smi, hostio=hostio)
    found = NodeDevices(config, scanner, hostio, m.NOOP)
    claims = Claims()
    session = DraSession(
        config, hostio, m.NOOP, asyncio.Lock(), found, asyncio.Event(),
        DraParts(claims, Slices()),
    )  # fmt: skip
    await session.begin()
    kubelet = KubeletSide(session.plugin.registration_socket)
    try:
        await kubelet.register()
        yield Scene(sim, session, found, kubelet, claims)
    finally:
        await kubelet.close()
        await session.stop_plugins()
        hostio.close()
        shutil.rmtree(root, ignore_errors=True)


READY = ("Healthy", "READY")


def test_the_timeout_is_three_scans_and_at_least_the_kubelets_default() -> None:
    assert health.timeout_seconds(5) == 30
    assert health.timeout_seconds(0.1) == 30
    assert health.timeout_seconds(20) == 60
    assert health.timeout_seconds(10.2) == 31


def test_a_message_is_kept_within_the_apis_1024_bytes_on_a_character_boundary() -> None:
    assert health.fit_message("FAULT") == "FAULT"
    exact = "x" * 1024
    assert health.fit_message(exact) == exact
    cut = health.fit_message("é" * 600)  # 1200 bytes
    assert len(cut.encode()) <= 1024 and cut.endswith("...") and "\ufffd" not in cut


async def test_the_plugin_announces_both_health_versions_and_the_kubelet_picks_v1(
    scene: Scene,
) -> None:
    assert scene.kubelet.info is not None
    assert list(scene.kubelet.info.supported_versions) == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth",
    ]  # fmt: skip
    assert scene.kubelet.health_service == "v1.DRAResourceHealth"
    assert scene.kubelet.service == "v1.DRAPlugin"  # the health names do not confuse it


@pytest.mark.parametrize("version", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"])
async def test_every_health_transition_reaches_the_stream_at_the_next_scan(
    scene: Scene, version: str
) -> None:
    if version != scene.kubelet.health_service:  # a kubelet that knows only v1alpha1
        await scene.kubelet.close()
        scene.kubelet = KubeletSide(scene.kubelet.socket, health_services=(version,))
        await scene.kubelet.register()
    assert scene.kubelet.health_service == version
    watch = Watch(scene.kubelet.watch_health())
    await scene.scan()
    first = await watch.next()
    assert first == {f"rbln{i}": READY for i in range(4)}

    steps: list[tuple[int | str | None, tuple[str, str]]] = [
        (4, ("Unhealthy", "FAULT")),
        (0, READY),
        (1, ("Unhealthy", "BUSY")),
        (4, ("Unhealthy", "FAULT")),
        # Sticky: an unreadable or deleted status after a fault stays Unhealthy.
        ("garbage", ("Unhealthy", "UNREADABLE (last read FAULT)")),
        (None, ("Unhealthy", "UNREADABLE (last read FAULT)")),
        (0, READY),  # only a READY read resolves it
        # Without an unresolved fault, an unreadable status is Healthy (compatibility).
        (None, ("Healthy", "UNREADABLE")),
        ("garbage", ("Healthy", "UNREADABLE")),
        (5, ("Unhealthy", "FINISH")),
        (2, ("Unhealthy", "PROBING")),
        (3, ("Unhealthy", "INIT")),
        (7, ("Unhealthy", "UNKNOWN(7)")),
        ("9" * 40, ("Unhealthy", "UNKNOWN(9999999999999999...40 digits)")),
        (0, READY),
    ]
    for value, expected in steps:
        scene.sim.set_status("rbln1", value)
        await scene.scan()
        got = await watch.next()
        assert got == {**first, "rbln1": expected}, value
    watch.call.cancel()


async def test_an_unchanged_scan_sends_the_complete_list_again(scene: Scene) -> None:
    watch = Watch(scene.kubelet.watch_health())
    await scene.scan()
    assert len(await watch.next()) == 4
    scene.sim.set_status("rbln2", 4)
    await scene.scan()
    faulted = await watch.next()
    for _ in range(3):
        await scene.scan()
        assert await watch.next() == faulted  # the kubelet's copy never goes stale
    assert faulted["rbln2"] == ("Unhealthy", "FAULT")
    watch.call.cancel()


async def test_a_device_faulted_when_first_seen_is_unhealthy_in_the_first_list(
    scene: Scene,
) -> None:
    scene.sim.set_status("rbln3", 4)
    await scene.scan()
    watch = Watch(scene.kubelet.watch_health())  # opened after the scan: gets it at once
    assert (await watch.next())["rbln3"] == ("Unhealthy", "FAULT")
    watch.call.cancel()


async def test_history_survives_a_disappearance_and_the_list_stays_complete(
    scene: Scene,
) -> None:
    watch = Watch(scene.kubelet.watch_health())
    scene.sim.set_status("rbln2", 4)
    await scene.scan()
    assert (await watch.next())["rbln2"] == ("Unhealthy", "FAULT")
    device = scene.sim.layout.device("rbln2")
    scene.sim.remove_device("rbln2")
    await scene.scan()
    assert set(await watch.next()) == {"rbln0", "rbln1", "rbln3"}  # no claim holds it
    scene.sim.add_device(device)
    scene.sim.set_status("rbln2", "garbage")
    await scene.scan()
    assert (await watch.next())["rbln2"] == ("Unhealthy", "UNREADABLE (last read FAULT)")
    scene.sim.set_status("rbln2", 0)
    await scene.scan()
    assert (await watch.next())["rbln2"] == READY
    watch.call.cancel()


async def test_a_held_device_gone_from_the_inventory_is_unknown_at_once(scene: Scene) -> None:
    await scene.scan()
    ref = ClaimRef("default", "held", "6f1c2a9e-3b8d-4e7a-9c51-2d0b7e4f8a13")
    scene.claims.allocate(ref, ["rbln1", "rbln2"])
    answer = await scene.kubelet.prepare(ref)
    assert answer[ref.uid].error == ""
    watch = Watch(scene.kubelet.watch_health())
    assert len(await watch.next()) == 4

    device = scene.sim.layout.device("rbln2")
    scene.sim.remove_device("rbln2")
    await scene.scan()
    got = await watch.next()
    assert got["rbln2"] == ("Unknown", health.NOT_OFFERED) and got["rbln1"] == READY

    # A discovery failure offers nothing: what the pods hold is Unknown, the rest absent.
    scene.sim.add_device(device)
    scene.sim.inject_fault(Fault("error", commands=("list",)))
    await scene.scan()
    assert await watch.next() == {
        "rbln1": ("Unknown", health.NOT_OFFERED), "rbln2": ("Unknown", health.NOT_OFFERED),
    }  # fmt: skip
    scene.sim.clear_faults()
    await scene.scan()
    assert await watch.next() == {f"rbln{i}": READY for i in range(4)}

    await scene.kubelet.unprepare(ref)
    scene.sim.remove_device("rbln2")
    await scene.scan()
    assert "rbln2" not in await watch.next()  # released: no longer anyone's business
    watch.call.cancel()


async def test_two_streams_get_the_same_lists_and_a_stop_ends_them_cleanly(
    scene: Scene,
) -> None:
    first, second = Watch(scene.kubelet.watch_health()), Watch(scene.kubelet.watch_health())
    scene.sim.set_status("rbln0", 4)
    await scene.scan()
    assert await first.next() == await second.next()
    await until(lambda: scene.session.open_streams == 2, "two open streams")
    await scene.session.feed.close()  # what the plugin's stop does first
    for watch in (first, second):
        assert await asyncio.wait_for(watch.call.read(), 5) is grpc.aio.EOF
        assert await watch.call.code() is grpc.StatusCode.OK  # an end, not an error
    await until(lambda: scene.session.open_streams == 0, "the streams' end")
