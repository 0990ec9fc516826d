"""API requests of the dra mode's ResourceSlices at cluster scale: ``--nodes`` simulated
nodes (``bench/fleet.py``: the daemon's publisher and health history per node, one
client and one watch each) in one process against a real kube-apiserver 1.37.2
(``tests/kubeapi.py``), through a simulated hour of 5 s scans and a fleet-wide upgrade.

- a steady node: writes per node per hour after its first publish (0 expected);
- a flapping node (a tenth of the fleet): one device FAULT for a minute every
  ``--flap-minutes``, an UNREADABLE read inside one fault and one on a healthy device:
  writes per flap, per blip and per node-hour, under the health history's rules;
- the bound: one node whose device changes status at every scan;
- a fleet-wide upgrade: every node's daemon restarts (a new history, publisher, client
  and watch; the flapping nodes hold a fault): writes and reads per node.

Counts come from each node's client (on the wire) and the publishers' write counters;
``apiserver_request_total`` from the server's ``/metrics`` is shown beside them. The
floors: one GET of a slice, taken in the same run. Run: ``python -m bench.bench_dra_scale
[--quick] [--nodes N] [--flap-minutes K]``.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog.testing

from rbln_device_plugin.model.health import StatusReading
from tests import kubeapi

from . import cli
from .fleet import (
    CONCURRENCY,
    FAULT,
    READY,
    SCAN_INTERVAL_S,
    UNREADABLE,
    Fleet,
    SimNode,
    scanned_template,
)
from .kubecounts import apiserver_counts, delta, floor_get_ms, shown, taint_times
from .rows import floor_row

Row = dict[str, Any]
LAYOUT = "atom-max-8"  # 32 whole NPUs: one slice per node
HOUR_SCANS = 720  # an hour of scans at the default 5 s interval
HOLD_SCANS = 12  # a flap's fault lasts a minute
CLUSTER = 5000  # the cluster the figures are extrapolated to
AREA = "dra-scale"


@dataclass(frozen=True)
class Event:
    device: str
    reading: StatusReading
    kind: str  # the tally the scan's writes go to


def flap_events(scan: int, period: int, fault_dev: str, blip_dev: str) -> list[Event]:
    """A flapping node's status changes at ``scan``: ``fault_dev`` FAULT for
    ``HOLD_SCANS`` every ``period`` scans (the first fault with one UNREADABLE read in its
    middle), and one UNREADABLE read of the healthy ``blip_dev`` in the second half-hour."""
    phase, middle = scan % period, HOLD_SCANS // 2
    blip = (HOUR_SCANS // 2 // period) * period + HOLD_SCANS + (period - HOLD_SCANS) // 2
    events = {
        0: [Event(fault_dev, FAULT, "flap")],
        HOLD_SCANS: [Event(fault_dev, READY, "flap")],
    }.get(phase, [])
    if scan == middle:
        events = [Event(fault_dev, UNREADABLE, "unreadable in a fault")]
    elif scan == middle + 1:
        events = [Event(fault_dev, FAULT, "unreadable in a fault")]
    elif scan in (blip, blip + 1):
        events = [Event(blip_dev, UNREADABLE if scan == blip else READY, "unreadable, healthy")]
    return events


async def timed_scans(node: SimNode, device: str, runs: int) -> tuple[list[float], list[float]]:
    """One node's scan (history and publish) timed alone: unchanged, and changing
    ``device`` at every scan (one write each)."""
    steady, changing = [], []
    for i in range(runs):
        began = time.perf_counter()
        await node.scan()
        steady.append((time.perf_counter() - began) * 1000)
        node.status[device] = FAULT if i % 2 == 0 else READY
        began = time.perf_counter()
        await node.scan()
        changing.append((time.perf_counter() - began) * 1000)
        await node.settle()
    node.status[device] = READY
    await node.scan()
    await node.settle()
    return steady, changing


@dataclass
class Hour:
    """What a simulated hour of the fleet's scans sent and wrote."""

    flapping: int
    steady_writes: int = 0  # over every steady node
    bound_writes: int = 0
    tally: Counter[str] = field(default_factory=Counter)  # flapping writes by event kind
    events: Counter[str] = field(default_factory=Counter)  # scans with an event, by kind
    sent: Counter[str] = field(default_factory=Counter)
    seen: Counter[str] = field(default_factory=Counter)  # by the API server
    seconds: float = 0.0

    def per_event(self, kind: str) -> float:
        """Writes per event of ``kind`` (each is two scans: the change and its undoing)."""
        return self.tally[kind] / max(self.events[kind] // 2 * self.flapping, 1)


async def simulated_hour(
    server: kubeapi.ApiServer, fleet: Fleet, period: int, fault_dev: str, blip_dev: str
) -> Hour:
    """Node 0 changes ``fault_dev`` at every scan (the bound), the next tenth flap
    (``flap_events``), the rest are steady."""
    bound, flapping = fleet.nodes[0], fleet.nodes[1 : 1 + max(1, len(fleet.nodes) // 10)]
    steady = fleet.nodes[1 + len(flapping) :]
    hour = Hour(len(flapping))
    before = {node.name: node.writes() for node in fleet.nodes}
    sent, seen = fleet.requests(), apiserver_counts(server)[0]
    began = time.monotonic()
    for scan in range(HOUR_SCANS):
        kinds = {}
        for node in flapping:
            for event in flap_events(scan, period, fault_dev, blip_dev):
                node.status[event.device] = event.reading
                kinds[node.name] = event.kind
        bound.status[fault_dev] = FAULT if scan % 2 == 0 else READY
        writes = {node.name: node.writes() for node in flapping}
        await fleet.tick()
        for node in flapping:
            hour.tally[kinds.get(node.name, "quiet scans")] += node.writes() - writes[node.name]
        hour.events.update(set(kinds.values()))
    hour.seconds = time.monotonic() - began
    hour.sent = delta(fleet.requests(), sent)
    hour.seen = delta(apiserver_counts(server)[0], seen)
    hour.steady_writes = sum(node.writes() - before[node.name] for node in steady)
    hour.bound_writes = bound.writes() - before[bound.name]
    return hour


@dataclass
class Upgrade:
    writes: int
    sent: Counter[str]
    seen: Counter[str]
    watches: int  # slice watches open on the server after it
    times_kept: bool  # a held fault's taint kept its timeAdded
    repairs: int  # the watches' "changed on the server"
    seconds: float


async def upgrade(server: kubeapi.ApiServer, fleet: Fleet, fault_dev: str) -> Upgrade:
    """Every node's daemon restarts, the flapping ones holding a fault of ``fault_dev``."""
    flapping = fleet.nodes[1 : 1 + max(1, len(fleet.nodes) // 10)]
    fleet.nodes[0].status[fault_dev] = READY
    for node in flapping:
        node.status[fault_dev] = FAULT
    await fleet.tick()
    held = await taint_times(server.kubeconfig, flapping[0].name)
    sent, seen = fleet.requests(), apiserver_counts(server)[0]
    writes = sum(node.writes() for node in fleet.nodes)
    repairs = sum(node.changed for node in fleet.nodes)
    began = time.monotonic()
    await fleet.restart_all()
    seconds = time.monotonic() - began
    seen_after, watches = apiserver_counts(server)
    return Upgrade(
        writes=sum(node.writes() for node in fleet.nodes) - writes,
        sent=delta(fleet.requests(), sent),
        seen=delta(seen_after, seen),
        watches=watches,
        times_kept=await taint_times(server.kubeconfig, flapping[0].name) == held != [],
        repairs=sum(node.changed for node in fleet.nodes) - repairs,
        seconds=seconds,
    )


async def measure(nodes: int, flap_minutes: int, quick: bool) -> list[Row]:
    period = flap_minutes * 60 // int(SCAN_INTERVAL_S)
    state = Path(tempfile.mkdtemp(prefix="rbln-bench-scale-"))
    try:
        with kubeapi.running_apiserver(state / "apiserver") as server:
            template = await scanned_template(LAYOUT)
            names = [d.name for devices in template.values() for d in devices]
            fault_dev, blip_dev = names[6 % len(names)], names[1 % len(names)]
            fleet = Fleet(server.kubeconfig, template, nodes, "scale-node-")
            try:
                began = time.monotonic()
                await fleet.start()
                start_s, first = time.monotonic() - began, fleet.requests()
                hour = await simulated_hour(server, fleet, period, fault_dev, blip_dev)
                slice_name = f"{fleet.nodes[0].name}-npu.rebellions.ai-0"
                floor = await floor_get_ms(server.kubeconfig, slice_name, 50)
                quiet, changing = await timed_scans(
                    fleet.nodes[-1], fault_dev, 20 if quick else 100
                )
                up = await upgrade(server, fleet, fault_dev)
            finally:
                await fleet.close()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return rows_of(nodes, flap_minutes, start_s, first, hour, floor, quiet, changing, up)


def rows_of(
    nodes: int, flap_minutes: int, start_s: float, first: Counter[str], hour: Hour,
    floor: list[float], quiet: list[float], changing: list[float], up: Upgrade,
) -> list[Row]:  # fmt: skip
    get_ms = statistics.median(floor)
    steady = nodes - 1 - hour.flapping
    flapping_hour = sum(hour.tally.values()) / hour.flapping
    per_upgrade = sum(up.sent.values()) / nodes

    def row(metric: str, value: float, unit: str, note: str, floor: float | None = None,
            floor_unit: str | None = None) -> Row:  # fmt: skip
        return floor_row(AREA, metric, value, unit, floor, note, floor_unit=floor_unit)

    return [
        row("floor: one GET of a slice", get_ms, "ms", f"median of {len(floor)}"),
        row(f"start: {nodes} nodes' first publish and watch", start_s, "s", f"sent {shown(first)}"),
        row(
            "steady node: writes per node-hour",
            hour.steady_writes / max(steady, 1),
            "writes",
            f"{steady} nodes x {HOUR_SCANS} scans; all {nodes} nodes' hour ({hour.seconds:.1f} s) "
            f"sent {shown(hour.sent)}; the API server saw {shown(hour.seen)}",
        ),
        row(
            "flapping node: writes per flap (FAULT, READY)",
            hour.per_event("flap"),
            "writes",
            f"{hour.events['flap'] // 2} flaps on each of {hour.flapping} nodes",
            2.0,
            "writes",
        ),
        row(
            "flapping node: writes per UNREADABLE read in a fault",
            hour.per_event("unreadable in a fault"),
            "writes",
            "the taint's value FAULT, UNREADABLE, FAULT",
        ),
        row(
            "flapping node: writes per UNREADABLE read, healthy",
            hour.per_event("unreadable, healthy"),
            "writes",
            "the status attribute READY, UNREADABLE, READY",
        ),
        row(
            "flapping node: writes per node-hour",
            flapping_hour,
            "writes",
            f"a flap every {flap_minutes} min; quiet scans wrote {hour.tally['quiet scans']}; "
            f"{CLUSTER} nodes, 1 in 10 flapping: {flapping_hour * CLUSTER / 10:.0f} writes/h",
        ),
        row(
            "bound: a device changing at every scan, writes per node-hour",
            hour.bound_writes,
            "writes",
            "one write per changed scan",
            float(HOUR_SCANS),
            "scans",
        ),
        row(
            "publish of an unchanged scan",
            statistics.median(quiet),
            "ms",
            f"median of {len(quiet)}; no request",
            get_ms,
        ),
        row(
            "publish of a scan with one device changed",
            statistics.median(changing),
            "ms",
            f"median of {len(changing)}; one PUT",
            get_ms,
        ),
        row(
            "upgrade: writes per node",
            up.writes / nodes,
            "writes",
            f"{nodes} restarts, {hour.flapping} holding a fault (its timeAdded kept: "
            f"{up.times_kept}); watch repairs {up.repairs}",
        ),
        row(
            "upgrade: requests per node",
            per_upgrade,
            "req",
            f"sent {shown(up.sent)}; the API server saw {shown(up.seen)} (it counts a watch "
            f"when it ends: the old lives'); slice watches open "
            f"{up.watches}; {CLUSTER} nodes: {per_upgrade * CLUSTER:.0f} reads",
            2.0,
            "req (LIST+WATCH)",
        ),
        row(
            f"upgrade: {nodes} restarts, wall time",
            up.seconds,
            "s",
            f"{up.seconds / nodes * 1000:.1f} ms per node, {CONCURRENCY} at once",
        ),
    ]


def run(quick: bool = False, nodes: int | None = None, flap_minutes: int = 10) -> list[Row]:
    reason = kubeapi.missing()
    if reason is not None:
        return [{"area": AREA, "metric": "skipped", "value": 0.0, "unit": "", "note": reason}]
    count = nodes if nodes is not None else (20 if quick else 200)
    with structlog.testing.capture_logs():  # the publishers' records stay off the table
        return asyncio.run(measure(count, flap_minutes, quick))


def main(argv: Sequence[str] | None = None) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--nodes", type=int, default=None, help="simulated nodes (200; 20 with --quick)")
    p.add_argument("--flap-minutes", type=int, default=10, help="a flap every K minutes (10)")
    args = p.parse_args(argv)
    if args.nodes is not None and args.nodes < 3:
        p.error("--nodes: at least 3 (the bound, a flapping node and a steady one)")
    if args.flap_minutes < 2:
        p.error("--flap-minutes: at least 2 (a flap's fault lasts a minute)")
    rows = run(args.quick, args.nodes, args.flap_minutes)
    width = max(len(r["metric"]) for r in rows)
    for r in rows:
        print(f"{r['metric']:<{width}} {r['value']:>9.2f} {r['unit']:<6} {r['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
