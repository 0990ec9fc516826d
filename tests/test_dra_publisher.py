"""The ResourceSlice publisher against a real 1.37.2 API server (tests/kubeapi.py): the
server ends up holding exactly the wanted slices, an unchanged scan sends no request at
all (counted on the wire, by a transport under lightkube's client), changes and
restarts move the pool's generation forward, and a server that is away or says no is
logged once and caught up with later, never raised to the scan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice
from structlog.testing import capture_logs

from rbln_device_plugin.dra import publisher as pub
from rbln_device_plugin.dra import slices
from rbln_device_plugin.dra import taints as taints_mod
from rbln_device_plugin.dra.publisher import SlicePublisher
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.health import Health, Verdict
from rbln_device_plugin.model.inventory import Device
from rbln_device_plugin.telemetry import metrics as m

from . import kubeapi
from .dra_scan import scanned

pytestmark = [
    pytest.mark.apiserver,
    pytest.mark.skipif(kubeapi.missing() is not None, reason=str(kubeapi.missing())),
]

DRIVER = "npu.rebellions.ai"
NPU = "rebellions.ai/npu"
READY = Verdict(Health.HEALTHY, "READY")
# The verbs the chart's RBAC grants (resourceslices get/list/watch/create/update/delete,
# nodes get), as HTTP methods on each path.
ALLOWED = {
    ("GET", "nodes"),
    ("GET", "resourceslices"),
    ("POST", "resourceslices"),
    ("PUT", "resourceslices"),
    ("DELETE", "resourceslices"),
}


class Wire(httpx2.AsyncBaseTransport):
    """lightkube's transport, counting every request; ``down`` sends them to a port where
    nothing listens (a real refused connection), as when the API server is away."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(verify=False)
        self.requests: list[tuple[str, str]] = []
        self.down = False
        self.hang = False  # accept the request and never answer
        self.answer: Callable[[httpx2.Request], httpx2.Response] | None = None
        self._dead_port = kubeapi.free_port()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        parts = request.url.path.rstrip("/").split("/")
        # .../resourceslices[/name] or /api/v1/nodes/name: the resource's plural
        plural = parts[-1] if parts[-1] in ("resourceslices", "nodes") else parts[-2]
        self.requests.append((request.method, plural))
        if self.answer is not None:
            return self.answer(request)
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            request.url = request.url.copy_with(port=self._dead_port)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeapi.ApiServer]:
    with kubeapi.running_apiserver(tmp_path_factory.mktemp("apiserver")) as running:
        yield running


@dataclass
class Api:
    """The test's own view of the server (an admin client, not counted)."""

    client: AsyncClient
    server: kubeapi.ApiServer

    async def node(self, name: str) -> str:
        made = await self.client.create(Node(metadata=ObjectMeta(name=name)))
        assert made.metadata is not None and made.metadata.uid is not None
        return made.metadata.uid

    async def slices(self, node: str) -> list[Any]:
        fields = {"spec.nodeName": node, "spec.driver": DRIVER}
        found = [s async for s in self.client.list(ResourceSlice, fields=fields)]
        return sorted(found, key=lambda s: s.metadata.name)

    async def devices(self, node: str) -> dict[str, dict[str, Any]]:
        return {d.name: d.attributes for s in await self.slices(node) for d in s.spec.devices or []}

    async def generations(self, node: str) -> set[tuple[int, int]]:
        return {
            (s.spec.pool.generation, s.spec.pool.resourceSliceCount)
            for s in await self.slices(node)
        }

    def publisher(self, node: str) -> tuple[SlicePublisher, Wire]:
        wire = Wire()
        client = AsyncClient(KubeConfig.from_file(Path(self.server.kubeconfig)), transport=wire)
        return SlicePublisher(client, node), wire


@pytest.fixture
async def api(server: kubeapi.ApiServer) -> AsyncIterator[Api]:
    client = AsyncClient(KubeConfig.from_file(Path(server.kubeconfig)))
    try:
        yield Api(client, server)
    finally:
        await client.close()


def used(wire: Wire) -> set[tuple[str, str]]:
    return set(wire.requests)


def many(count: int) -> dict[str, dict[str, Entry]]:
    return {
        NPU: {
            f"rbln{i}": Entry(
                Device(
                    f"rbln{i}",
                    "RBLN-CA25",
                    "1250",
                    f"0000:{i // 32:02x}:{i % 32:02x}.0",
                    i % 2,
                    "0000000022502229",
                    None,
                    None,
                ),
                READY,
            )
            for i in range(count)
        }
    }


async def test_the_first_publish_creates_and_an_unchanged_scan_sends_nothing(api: Api) -> None:
    uid = await api.node("node-first")
    publisher, wire = api.publisher("node-first")
    async with scanned("atom-max-8") as node:
        entries = node.entries()
        with capture_logs() as logs:
            await publisher.publish(entries)
        [made] = await api.slices("node-first")
        assert made.metadata.name == "node-first-npu.rebellions.ai-0"
        assert [(o.kind, o.name, o.uid) for o in made.metadata.ownerReferences] == [
            ("Node", "node-first", uid)
        ]
        assert made.spec.pool.name == "node-first" and made.spec.nodeName == "node-first"
        assert (made.spec.pool.generation, made.spec.pool.resourceSliceCount) == (1, 1)
        assert sorted(d.name for d in made.spec.devices) == sorted(entries[NPU])
        assert publisher.writes == {"create": 1, "update": 0, "delete": 0}
        [record] = [r for r in logs if r["event"] == pub.PUBLISHED_MSG]
        assert (record["generation"], record["created"], record["deviceCount"]) == (1, 1, 32)
        assert used(wire) <= ALLOWED

        wire.requests.clear()
        await publisher.publish(entries)
        await publisher.publish(await node.scan())  # a real scan that finds nothing new
        assert wire.requests == []
        assert await api.generations("node-first") == {(1, 1)}
    await publisher.close()


async def test_a_fault_and_a_vanished_device_are_republished_at_the_next_generation(
    api: Api,
) -> None:
    await api.node("node-fault")
    publisher, wire = api.publisher("node-fault")
    async with scanned("atom-max-8") as node:
        await publisher.publish(node.entries())
        wire.requests.clear()
        node.sim.set_status("rbln6", 4)
        await publisher.publish(await node.scan())
        assert wire.requests == [("PUT", "resourceslices")]
        found = await api.devices("node-fault")
        assert found["rbln6"]["healthy"] == {"bool": False}
        assert found["rbln6"]["status"] == {"string": "FAULT"}
        assert found["rbln5"]["healthy"] == {"bool": True}
        assert await api.generations("node-fault") == {(2, 1)}

        node.sim.remove_device("rbln7")
        await publisher.publish(await node.scan())
        found = await api.devices("node-fault")
        assert "rbln7" not in found and len(found) == 31
        assert await api.generations("node-fault") == {(3, 1)}
        assert publisher.generation == 3
        assert used(wire) <= ALLOWED
    await publisher.close()


async def test_65_devices_make_two_slices_and_shrinking_deletes_the_extra_one(api: Api) -> None:
    await api.node("node-big")
    publisher, wire = api.publisher("node-big")
    await publisher.publish(many(65))
    listed = await api.slices("node-big")
    assert [(s.metadata.name, len(s.spec.devices)) for s in listed] == [
        ("node-big-npu.rebellions.ai-0", 64),
        ("node-big-npu.rebellions.ai-1", 1),
    ]
    assert await api.generations("node-big") == {(1, 2)}
    await publisher.publish(many(5))
    listed = await api.slices("node-big")
    assert [(s.metadata.name, len(s.spec.devices)) for s in listed] == [
        ("node-big-npu.rebellions.ai-0", 5)
    ]
    assert await api.generations("node-big") == {(2, 1)}
    assert publisher.writes == {"create": 2, "update": 1, "delete": 1}
    assert used(wire) <= ALLOWED
    await publisher.close()


async def test_a_restart_never_goes_back_and_removes_what_it_does_not_want(api: Api) -> None:
    await api.node("node-restart")
    first, _ = api.publisher("node-restart")
    for count in (65, 66, 67):
        await first.publish(many(count))
    await first.close()
    assert await api.generations("node-restart") == {(3, 2)}

    # A new life, same devices: the server already says it all; nothing is written.
    same, wire = api.publisher("node-restart")
    with capture_logs() as logs:
        await same.publish(many(67))
    assert sorted(wire.requests) == [("GET", "nodes"), ("GET", "resourceslices")]
    assert same.generation == 3 and same.writes == {"create": 0, "update": 0, "delete": 0}
    assert [r["event"] for r in logs] == [pub.CURRENT_MSG]
    wire.requests.clear()
    await same.publish(many(67))
    assert wire.requests == []
    await same.close()

    # Another new life with fewer devices: above the server's generation, and the slice
    # the last life needed and this one does not is gone.
    fewer, wire = api.publisher("node-restart")
    await fewer.publish(many(3))
    assert await api.generations("node-restart") == {(4, 1)}
    assert sorted(await api.devices("node-restart")) == ["rbln0", "rbln1", "rbln2"]
    assert used(wire) <= ALLOWED
    await fewer.close()


async def test_an_unreachable_api_server_is_logged_once_and_caught_up_with(api: Api) -> None:
    await api.node("node-away")
    publisher, wire = api.publisher("node-away")
    wire.down = True
    with capture_logs() as logs:
        await publisher.publish(many(2))  # never raises into the scan loop
        await publisher.publish(many(2))
        await publisher.publish(many(3))
    failed = [r for r in logs if r["event"] == pub.FAILED_MSG]
    assert [r["log_level"] for r in failed] == ["error", "debug", "debug"]
    assert "ConnectError" in failed[0]["err"] and failed[0]["node"] == "node-away"
    assert publisher.failures == 3
    assert await api.slices("node-away") == []

    wire.down = False
    with capture_logs() as logs:
        await publisher.publish(many(3))
    [record] = [r for r in logs if r["event"] == pub.PUBLISHED_MSG]
    assert record["failedAttempts"] == 3
    assert sorted(await api.devices("node-away")) == ["rbln0", "rbln1", "rbln2"]
    # Away in the middle of a change: the next publish looks again and finishes it.
    wire.down = True
    await publisher.publish(many(4))
    wire.down = False
    wire.requests.clear()
    await publisher.publish(many(4))
    assert ("GET", "resourceslices") in wire.requests  # looked first
    assert sorted(await api.devices("node-away")) == ["rbln0", "rbln1", "rbln2", "rbln3"]
    assert await api.generations("node-away") == {(3, 1)}  # the cut-short 2 is not reused
    await publisher.close()


def forbidden(request: httpx2.Request) -> httpx2.Response:
    """The API server's answer to a request RBAC does not allow."""
    status = {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
        "code": 403,
        "message": f'{request.url.path} is forbidden: User "system:serviceaccount:x:y" cannot '
        f"{request.method.lower()} it",
    }  # fmt: skip
    return httpx2.Response(403, json=status)


async def test_a_forbidden_write_names_the_servers_reason_and_is_retried(api: Api) -> None:
    await api.node("node-forbidden")
    publisher, wire = api.publisher("node-forbidden")
    wire.answer = forbidden
    with capture_logs() as logs:
        await publisher.publish(many(1))
        await publisher.publish(many(1))
    [record] = [r for r in logs if r["event"] == pub.FAILED_MSG and r["log_level"] == "error"]
    assert record["err"].startswith("403 Forbidden: "), record
    assert "system:serviceaccount:x:y" in record["err"]
    wire.answer = None
    await publisher.publish(many(1))
    assert sorted(await api.devices("node-forbidden")) == ["rbln0"]
    await publisher.close()


async def test_a_server_that_never_answers_costs_one_bounded_publish(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await api.node("node-hung")
    publisher, wire = api.publisher("node-hung")
    monkeypatch.setattr(pub, "PUBLISH_TIMEOUT_S", 0.5)
    wire.hang = True
    with capture_logs() as logs:
        await publisher.publish(many(1))  # returns: the scan loop goes on
    [record] = [r for r in logs if r["event"] == pub.FAILED_MSG]
    assert record["err"] == "no answer within 0.5 s"
    wire.hang = False
    await publisher.publish(many(1))
    assert sorted(await api.devices("node-hung")) == ["rbln0"]
    await publisher.close()


async def test_a_node_the_server_does_not_know_is_a_logged_failure_until_it_exists(
    api: Api,
) -> None:
    publisher, _ = api.publisher("node-late")
    with capture_logs() as logs:
        await publisher.publish(many(1))
    [record] = [r for r in logs if r["event"] == pub.FAILED_MSG]
    assert record["err"].startswith("404 NotFound"), record
    await api.node("node-late")
    await publisher.publish(many(1))
    assert sorted(await api.devices("node-late")) == ["rbln0"]
    await publisher.close()


async def test_a_slice_changed_by_another_writer_is_read_again_and_replaced(api: Api) -> None:
    await api.node("node-conflict")
    publisher, wire = api.publisher("node-conflict")
    await publisher.publish(many(2))
    # Someone else writes the slice: its resourceVersion moves on.
    [theirs] = await api.slices("node-conflict")
    theirs.metadata.labels = {"touched": "yes"}
    await api.client.replace(theirs)
    wire.requests.clear()
    await publisher.publish(many(3))
    assert wire.requests == [
        ("PUT", "resourceslices"),  # 409 Conflict
        ("GET", "resourceslices"),
        ("PUT", "resourceslices"),
    ]
    assert sorted(await api.devices("node-conflict")) == ["rbln0", "rbln1", "rbln2"]
    assert publisher.failures == 0
    await publisher.close()


async def test_slices_wiped_behind_its_back_are_written_again(api: Api) -> None:
    await api.node("node-wiped")
    publisher, wire = api.publisher("node-wiped")
    await publisher.publish(many(2))
    for found in await api.slices("node-wiped"):  # as the kubelet wipes at deregistration
        await api.client.delete(ResourceSlice, found.metadata.name)
    # A change finds the slice gone (404 on the update) and creates it.
    await publisher.publish(many(3))
    assert sorted(await api.devices("node-wiped")) == ["rbln0", "rbln1", "rbln2"]
    for found in await api.slices("node-wiped"):
        await api.client.delete(ResourceSlice, found.metadata.name)
    # No change, but told the server may differ (the plugin registered again): it looks.
    publisher.forget()
    await publisher.publish(many(3))
    assert sorted(await api.devices("node-wiped")) == ["rbln0", "rbln1", "rbln2"]
    assert used(wire) <= ALLOWED
    await publisher.close()


async def test_remove_all_deletes_this_nodes_slices_only(api: Api) -> None:
    await api.node("node-rm")
    await api.node("node-keep")
    remover, _ = api.publisher("node-rm")
    keeper, _ = api.publisher("node-keep")
    await remover.publish(many(66))
    await keeper.publish(many(1))
    with capture_logs() as logs:
        assert await remover.remove_all()
    assert await api.slices("node-rm") == []
    assert len(await api.slices("node-keep")) == 1
    [record] = [r for r in logs if r["event"] == pub.REMOVED_MSG]
    assert record["count"] == 2
    # Publishing again after a removal writes the pool again, above the old generation.
    await remover.publish(many(1))
    assert await api.generations("node-rm") == {(2, 1)}
    await remover.close()
    await keeper.close()


async def test_publishes_of_one_publisher_do_not_interleave(api: Api) -> None:
    await api.node("node-race")
    publisher, _ = api.publisher("node-race")
    await asyncio.gather(*(publisher.publish(many(n)) for n in (1, 65, 2, 66)))
    assert await api.generations("node-race") == {(4, 2)}
    assert len(await api.devices("node-race")) == 66
    assert publisher.failures == 0
    await publisher.close()


def test_devices_left_out_are_logged_once_while_it_lasts() -> None:
    publisher = SlicePublisher(client=None, node="node-x")
    odd: Mapping[str, Mapping[str, Entry]] = {NPU: {**many(1)[NPU], "RBLN9": many(1)[NPU]["rbln0"]}}
    with capture_logs() as logs:
        for _ in range(3):
            publisher._log_omissions(slices.build_pool("node-x", odd).omissions)
    assert [(r["event"], r["log_level"], r["device"]) for r in logs] == [
        (pub.DEVICE_LEFT_OUT_MSG, "error", "RBLN9")
    ]


# ---------------------------------------------------------------- taints of unhealthy devices
class TaintCounts(m.Metrics):
    def __init__(self) -> None:
        self.taints = {m.TAINT_APPLIED: 0, m.TAINT_REMOVED: 0}

    def dra_taints(self, change: str, count: int) -> None:
        self.taints[change] += count


def clock(*stamps: str) -> taints_mod.TaintTimes:
    """Taint times from a fixed clock: each ``stamp`` call reads the next of ``stamps``."""
    times = iter(datetime.fromisoformat(t) for t in stamps)
    last: list[datetime] = []

    def now() -> datetime:
        last[:] = [next(times, last[0] if last else datetime(2026, 1, 1, tzinfo=UTC))]
        return last[0]

    return taints_mod.TaintTimes(now)


async def taints(api: Api, node: str) -> dict[str, list[dict[str, Any]]]:
    return {
        d.name: [t.to_dict() for t in d.taints]
        for s in await api.slices(node)
        for d in s.spec.devices or []
        if d.taints
    }


def taint(value: str, added: str, effect: str = "NoSchedule") -> list[dict[str, Any]]:
    return [{"key": "npu.rebellions.ai/unhealthy", "value": value, "effect": effect,
             "timeAdded": added}]  # fmt: skip


async def test_a_fault_is_tainted_until_a_ready_read_with_one_write_per_change(api: Api) -> None:
    await api.node("node-taint")
    counts = TaintCounts()
    wire = Wire()
    client = AsyncClient(KubeConfig.from_file(Path(api.server.kubeconfig)), transport=wire)
    publisher = SlicePublisher(
        client, "node-taint", counts,
        taint_times=clock("2026-12-01T10:00:00+00:00", "2026-12-01T10:05:00+00:00"),
    )  # fmt: skip
    async with scanned("atom-max-8") as node:
        await publisher.publish(node.entries())
        assert await taints(api, "node-taint") == {}
        wire.requests.clear()

        node.sim.set_status("rbln6", 4)
        with capture_logs() as logs:
            await publisher.publish(await node.scan())
        assert wire.requests == [("PUT", "resourceslices")]
        assert await taints(api, "node-taint") == {"rbln6": taint("FAULT", "2026-12-01T10:00:00Z")}
        [record] = [r for r in logs if r["event"] == taints_mod.TAINTED_MSG]
        assert (record["device"], record["value"], record["effect"], record["log_level"]) == (
            "rbln6", "FAULT", "NoSchedule", "warning",
        )  # fmt: skip
        assert counts.taints == {"applied": 1, "removed": 0}

        # Scans that find the same: nothing is sent, the taint's time never moves.
        wire.requests.clear()
        for _ in range(3):
            await publisher.publish(await node.scan())
        assert wire.requests == []

        # The history keeps an unreadable status Unhealthy: the value says UNREADABLE, the
        # taint keeps its time (no flap for the eviction's clock).
        node.sim.set_status("rbln6", "garbage")
        await publisher.publish(await node.scan())
        assert wire.requests == [("PUT", "resourceslices")]
        assert await taints(api, "node-taint") == {
            "rbln6": taint("UNREADABLE", "2026-12-01T10:00:00Z")
        }
        assert counts.taints == {"applied": 2, "removed": 0}  # a new value is a new taint

        node.sim.set_status("rbln6", 0)
        with capture_logs() as logs:
            await publisher.publish(await node.scan())
        assert await taints(api, "node-taint") == {}
        [record] = [r for r in logs if r["event"] == taints_mod.UNTAINTED_MSG]
        assert (record["device"], record["value"]) == ("rbln6", "UNREADABLE")
        assert counts.taints == {"applied": 2, "removed": 1}

        # A later fault is a new taint, with the time it was found.
        node.sim.set_status("rbln6", 4)
        await publisher.publish(await node.scan())
        assert await taints(api, "node-taint") == {"rbln6": taint("FAULT", "2026-12-01T10:05:00Z")}
        assert used(wire) <= ALLOWED
    await publisher.close()


async def test_a_restart_keeps_the_taints_times_and_writes_nothing(api: Api) -> None:
    await api.node("node-taint-restart")
    async with scanned("atom-max-8") as node:
        node.sim.set_status("rbln3", 4)
        entries = await node.scan()
        first, _ = api.publisher("node-taint-restart")
        first._times = clock("2026-12-01T10:00:00+00:00")
        await first.publish(entries)
        await first.close()

        # The next life's clock says later; the server's time is kept, nothing is written.
        counts = TaintCounts()
        wire = Wire()
        client = AsyncClient(KubeConfig.from_file(Path(api.server.kubeconfig)), transport=wire)
        later = SlicePublisher(client, "node-taint-restart", counts,
                               taint_times=clock("2026-12-01T11:00:00+00:00"))  # fmt: skip
        await later.publish(entries)
        assert sorted(wire.requests) == [("GET", "nodes"), ("GET", "resourceslices")]
        assert await taints(api, "node-taint-restart") == {
            "rbln3": taint("FAULT", "2026-12-01T10:00:00Z")
        }
        assert counts.taints == {"applied": 0, "removed": 0}  # it was there already
        node.sim.set_status("rbln3", 0)
        await later.publish(await node.scan())
        assert counts.taints == {"applied": 0, "removed": 1}
        await later.close()


async def test_no_execute_is_the_taints_effect_when_chosen(api: Api) -> None:
    await api.node("node-noexec")
    client = AsyncClient(KubeConfig.from_file(Path(api.server.kubeconfig)))
    publisher = SlicePublisher(
        client, "node-noexec", taint_effect=taints_mod.NO_EXECUTE,
        taint_times=clock("2026-12-01T10:00:00+00:00"),
    )  # fmt: skip
    async with scanned("atom-max-8") as node:
        node.sim.set_status("rbln0", 1)
        await publisher.publish(await node.scan())
    assert await taints(api, "node-noexec") == {
        "rbln0": taint("BUSY", "2026-12-01T10:00:00Z", "NoExecute")
    }
    await publisher.close()


async def test_the_late_event_of_its_own_earlier_write_is_not_news(api: Api) -> None:
    """Two publishes closer together than the watch delivers: the first write's event
    comes after the second write. It is this publisher's own, so the watch does not make it
    list the server again; a write by anyone else still does."""
    await api.node("node-echo")
    publisher, _ = api.publisher("node-echo")
    await publisher.publish(many(1))
    [first] = await api.slices("node-echo")
    await publisher.publish(many(2))
    assert not await publisher._changed_elsewhere("MODIFIED", first)
    [second] = await api.slices("node-echo")
    assert not await publisher._changed_elsewhere("MODIFIED", second)
    second.metadata.labels = {"touched": "yes"}
    theirs = await api.client.replace(second)
    assert await publisher._changed_elsewhere("MODIFIED", theirs)
    await publisher.close()
