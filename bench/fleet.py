"""Many nodes' ResourceSlice publishers in one process, against one API server.

Each simulated node runs what the dra mode's scan runs after reading its devices: the
core's device table and health history (``model.devicetable``, one per resource, as the
core keeps them) and the daemon's own ``SlicePublisher`` with its own API client and its
watch of the node's slices. Only the reads are simulated: the devices come from one real
scan of a simulated node (the same ``Device`` values on every node), and each scan's status
readings come from the node's ``status`` map, which a scenario sets. ``Fleet.tick`` is one
scan of every node at simulated time, so an hour of 5 s scans takes seconds.

Every request a node's client sends is counted on the wire (``Wire``), by verb as the API
server names them (a GET of a collection is LIST, with ``watch=true`` WATCH), and the
publisher's own ``writes`` counter says what it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node as KubeNode

from rbln_device_plugin.dra.publisher import SlicePublisher
from rbln_device_plugin.dra.taints import TaintTimes
from rbln_device_plugin.model.devicetable import DeviceTable, Entry
from rbln_device_plugin.model.health import StatusReading
from rbln_device_plugin.model.inventory import Device
from tests.dra_scan import scanned

READY: Final = StatusReading(0)
FAULT: Final = StatusReading(4)
UNREADABLE: Final = StatusReading(None, "malformed status 'garbage'")
SCAN_INTERVAL_S: Final = 5.0  # the daemon's default --interval
# Publishes and restarts in flight at once: one process stands in for many machines.
CONCURRENCY: Final = 64

Template = Mapping[str, Sequence[Device]]  # resource -> its devices, as a scan offers them


async def scanned_template(layout: str) -> Template:
    """The devices one real scan of the simulated ``layout`` offers."""
    async with scanned(layout) as node:
        entries = node.entries()
    return {resource: [e.device for e in table.values()] for resource, table in entries.items()}


def request_kind(method: str, path: str, watch: bool) -> str:
    """``VERB plural`` as the API server's request metrics name it."""
    parts = path.rstrip("/").split("/")
    collection = parts[-1] in ("resourceslices", "nodes")
    plural = parts[-1] if collection else parts[-2]
    verb = method
    if method == "GET" and collection:
        verb = "WATCH" if watch else "LIST"
    return f"{verb} {plural}"


class EventLines(httpx2.AsyncByteStream):
    """A watch's response, counting the events (one JSON line each) that pass."""

    def __init__(self, inner: Any, wire: Wire) -> None:
        self._inner, self._wire = inner, wire

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._wire.events += chunk.count(b"\n")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class Wire(httpx2.AsyncBaseTransport):
    """A node's transport under lightkube's client: every request counted by kind, and
    the watch events received."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport(verify=False)
        self.counts: Counter[str] = Counter()
        self.events = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        watch = request.url.params.get("watch") in ("true", "1")
        self.counts[request_kind(request.method, request.url.path, watch)] += 1
        answer = await self._inner.handle_async_request(request)
        if not watch:
            return answer
        return httpx2.Response(
            answer.status_code, headers=answer.headers, extensions=answer.extensions,
            stream=EventLines(answer.stream, self),
        )  # fmt: skip

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Clock:
    """Simulated time: taints are stamped with it, one tick is one scan interval."""

    now: datetime = field(default_factory=lambda: datetime(2026, 12, 1, tzinfo=UTC))

    def advance(self, seconds: float = SCAN_INTERVAL_S) -> None:
        self.now += timedelta(seconds=seconds)


class SimNode:
    """One node's daemon life: device tables, publisher, client and watch."""

    def __init__(self, name: str, template: Template, kubeconfig: Path, clock: Clock) -> None:
        self.name = name
        self.template = template
        self.status: dict[str, StatusReading] = {
            d.name: READY for devices in template.values() for d in devices
        }
        self._kubeconfig = kubeconfig
        self._clock = clock
        self.changed = 0  # the watch's "changed on the server" calls
        # What the node's ended lives sent and wrote (each life has its own client).
        self._sent: Counter[str] = Counter()
        self._written = 0
        self._start_life()

    def _start_life(self) -> None:
        self.wire = Wire()
        client = AsyncClient(KubeConfig.from_file(self._kubeconfig), transport=self.wire)
        times = TaintTimes(lambda: self._clock.now)
        self.publisher = SlicePublisher(client, self.name, taint_times=times)
        self.tables = {resource: DeviceTable() for resource in self.template}
        self._stop = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._awaited = 0  # watch events this life's writes will bring

    def entries(self) -> dict[str, Mapping[str, Entry]]:
        return {resource: table.entries for resource, table in self.tables.items()}

    async def scan(self) -> None:
        """The scan loop's work once the devices are read: the history, then the slices."""
        for resource, devices in self.template.items():
            self.tables[resource].apply_scan(
                devices, {d.name: self.status[d.name] for d in devices}
            )
        before = sum(self.publisher.writes.values())
        await self.publisher.publish(self.entries())
        if self._watch is not None:
            self._awaited += sum(self.publisher.writes.values()) - before

    async def settle(self) -> None:
        """Until the watch received the events of this life's own writes: between two
        scans 5 s apart it has, and a compressed hour waits for it too, so that each
        scan of the hour meets the watch in the state real time leaves it in."""
        while self._watch is not None and self.wire.events < self._awaited:
            if self._watch.done():
                self._watch.result()
            await asyncio.sleep(0.001)
        for _ in range(3):  # the watch judges the event under the publish lock
            await asyncio.sleep(0)

    def _changed(self) -> None:
        self.changed += 1  # the publisher forgot what it wrote: the next scan lists

    async def start_watch(self) -> None:
        """The watch as the daemon runs it, back once its WATCH request is sent."""
        self._watch = asyncio.create_task(self.publisher.watch(self._stop, self._changed))
        while self.wire.counts["WATCH resourceslices"] == 0:
            if self._watch.done():
                self._watch.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """The process ends: the watch and the client go, the slices stay."""
        self._stop.set()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.publisher.close()
        self._sent.update(self.wire.counts)
        self._written += sum(self.publisher.writes.values())
        self.wire.counts.clear()
        self.publisher.writes = dict.fromkeys(self.publisher.writes, 0)

    async def restart(self) -> None:
        """A new process (an upgrade's new pod): a new history, publisher and client; its
        first scan, then its watch, as the daemon starts."""
        await self.stop()
        self._start_life()
        await self.scan()
        await self.start_watch()

    def requests(self) -> Counter[str]:
        """Every request of every life of this node so far."""
        return self._sent + self.wire.counts

    def writes(self) -> int:
        """The publisher's writes (create, update, delete) of every life so far."""
        return self._written + sum(self.publisher.writes.values())


async def bounded(calls: Iterable[Any]) -> None:
    """Await the coroutines, at most ``CONCURRENCY`` at once."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Any) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


class Fleet:
    """``count`` simulated nodes named ``<prefix><i>`` on one API server."""

    def __init__(self, kubeconfig: Path, template: Template, count: int, prefix: str) -> None:
        self.clock = Clock()
        self.kubeconfig = kubeconfig
        self.nodes = [
            SimNode(f"{prefix}{i}", template, kubeconfig, self.clock) for i in range(count)
        ]

    async def start(self) -> None:
        """Register the Nodes (as kubelets do), then each daemon's first scan and watch."""
        admin = AsyncClient(KubeConfig.from_file(self.kubeconfig))
        try:
            for node in self.nodes:
                with contextlib.suppress(ApiError):  # there already
                    await admin.create(KubeNode(metadata=ObjectMeta(name=node.name)))
        finally:
            await admin.close()
        await bounded(node.scan() for node in self.nodes)
        await bounded(node.start_watch() for node in self.nodes)

    async def tick(self) -> None:
        """One scan interval: every node scans once."""
        self.clock.advance()
        await bounded(node.scan() for node in self.nodes)
        await bounded(node.settle() for node in self.nodes)

    async def restart_all(self) -> None:
        await bounded(node.restart() for node in self.nodes)

    def requests(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for node in self.nodes:
            total.update(node.requests())
        return total

    async def close(self) -> None:
        await bounded(node.stop() for node in self.nodes)
