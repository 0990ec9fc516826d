"""The API requests behind the scale figures (bench/bench_dra_scale.py), counted, not
timed: simulated nodes (bench/fleet.py: the daemon's publisher, health history and watch
per node) against a real 1.37.2 API server (tests/kubeapi.py). A steady node sends
nothing for an hour of scans after its first publish; a fault is one write and its
clearing one more; a restart of every node on an unchanged cluster writes nothing and
keeps a held taint's timeAdded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from bench.bench_dra_scale import HOUR_SCANS
from bench.fleet import FAULT, READY, UNREADABLE, Fleet, scanned_template
from bench.kubecounts import taint_times

from . import kubeapi

pytestmark = [
    pytest.mark.apiserver,
    pytest.mark.skipif(kubeapi.missing() is not None, reason=str(kubeapi.missing())),
]

# One life's start: the Node's UID, the publish's list and write, the watch's list and watch.
FIRST_LIFE = Counter(
    {"GET nodes": 1, "LIST resourceslices": 2, "POST resourceslices": 1, "WATCH resourceslices": 1}
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeapi.ApiServer]:
    with kubeapi.running_apiserver(tmp_path_factory.mktemp("apiserver")) as running:
        yield running


async def test_a_steady_node_sends_nothing_for_an_hour_after_its_first_publish(
    server: kubeapi.ApiServer,
) -> None:
    fleet = Fleet(server.kubeconfig, await scanned_template("atom-max-8"), 3, "steady-")
    try:
        await fleet.start()
        assert [node.requests() for node in fleet.nodes] == [FIRST_LIFE] * 3
        for _ in range(HOUR_SCANS):
            await fleet.tick()
        assert [node.requests() for node in fleet.nodes] == [FIRST_LIFE] * 3
        assert [node.writes() for node in fleet.nodes] == [1, 1, 1]
        assert [node.changed for node in fleet.nodes] == [0, 0, 0]
    finally:
        await fleet.close()


async def test_a_fault_is_one_write_and_its_clearing_one_more(server: kubeapi.ApiServer) -> None:
    fleet = Fleet(server.kubeconfig, await scanned_template("atom-max-8"), 2, "fault-")
    faulty, other = fleet.nodes
    try:
        await fleet.start()
        faulty.status["rbln6"] = FAULT
        await fleet.tick()
        assert (faulty.writes(), faulty.requests()["PUT resourceslices"]) == (2, 1)
        [(device, [(value, _)])] = await taint_times(server.kubeconfig, faulty.name)
        assert (device, value) == ("rbln6", "FAULT")

        # The fault stays until a READY read, and costs nothing while it stays, an
        # unreadable status included (the history keeps the device Unhealthy; only the
        # taint's value says UNREADABLE: one write, and one back).
        for _ in range(12):
            await fleet.tick()
        assert faulty.writes() == 2
        faulty.status["rbln6"] = UNREADABLE
        await fleet.tick()
        assert faulty.writes() == 3
        [(_, [(value, _)])] = await taint_times(server.kubeconfig, faulty.name)
        assert value == "UNREADABLE"

        faulty.status["rbln6"] = READY
        await fleet.tick()
        assert faulty.writes() == 4
        assert await taint_times(server.kubeconfig, faulty.name) == []
        for _ in range(12):
            await fleet.tick()
        assert faulty.writes() == 4
        assert faulty.requests() - FIRST_LIFE == Counter({"PUT resourceslices": 3})
        assert (other.requests(), other.writes()) == (FIRST_LIFE, 1)
        assert faulty.changed == other.changed == 0  # its own writes are not news to its watch
    finally:
        await fleet.close()


async def test_restarting_every_node_writes_nothing_and_keeps_the_taints_time(
    server: kubeapi.ApiServer,
) -> None:
    fleet = Fleet(server.kubeconfig, await scanned_template("atom-max-8"), 3, "upgrade-")
    try:
        await fleet.start()
        fleet.nodes[1].status["rbln3"] = FAULT
        await fleet.tick()
        held = await taint_times(server.kubeconfig, fleet.nodes[1].name)
        assert [d for d, _ in held] == ["rbln3"]
        before = [(node.requests(), node.writes()) for node in fleet.nodes]
        fleet.clock.advance(3600)  # the new lives' clock says later: the server's time stays

        await fleet.restart_all()
        after = [(node.requests(), node.writes()) for node in fleet.nodes]
        # Each new life reads (the Node, its slices twice, a watch) and writes nothing.
        reads = Counter({"GET nodes": 1, "LIST resourceslices": 2, "WATCH resourceslices": 1})
        assert [(r - r0, w - w0) for (r0, w0), (r, w) in zip(before, after, strict=True)] == [
            (reads, 0)
        ] * 3
        assert await taint_times(server.kubeconfig, fleet.nodes[1].name) == held
        assert [node.changed for node in fleet.nodes] == [0, 0, 0]

        # The new life's history still clears the fault at a READY read: one write.
        fleet.nodes[1].status["rbln3"] = READY
        await fleet.tick()
        assert [node.writes() - w for node, (_, w) in zip(fleet.nodes, after, strict=True)] == [
            0,
            1,
            0,
        ]
    finally:
        await fleet.close()
