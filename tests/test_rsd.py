"""RSD group recreation against the simulator's rbln-smi (a real executable, real flock).

The simulator refuses what the real tool refuses (a device already in a group, an
existing group id, ...), so a recreation that skipped a step fails here as on a node.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin.host.devnodes import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    DeviceNodeMissing,
    NotADeviceNode,
    node_kind,
    wait_for_nodes,
)
from rbln_device_plugin.host.hostio import Call, HostIO, Stalled
from rbln_device_plugin.host.rsd import (
    LOCK_RETRY_S,
    LOCK_TIMEOUT_S,
    GroupEntry,
    RenumberedDuringCreate,
    RsdError,
    RsdGroup,
    RsdHost,
    RsdTimings,
    groups_to_destroy,
    next_group_id,
    recreate_rsd_group,
    rsd_lock,
)
from rbln_device_plugin_sim.layout import Layout, SimDevice
from rbln_device_plugin_sim.node import materialize
from rbln_device_plugin_sim.state import Fault

from .fault_helpers import smi_calls, trace_smi, wait_until

T = TypeVar("T")

# Bus IDs with hex letters, so an upper-case request can be told from a lower-case one.
BUS = [f"0000:{0x0A + i:02x}:00.0" for i in range(4)]


class RsdNode:
    """Four devices (npu i = rbln<i> = BUS[i]) on a simulated node, groups set up first."""

    def __init__(self, root: Path, groups: list[str] | None = None) -> None:
        devices = tuple(
            SimDevice(f"rbln{i}", i, "RBLN-CA25", bus, pci_path=("pci0000:00", bus))
            for i, bus in enumerate(BUS)
        )
        self.sim = materialize(Layout("rsd-test", devices), root / "node")
        self.dev = self.sim.dev_root
        self.lock = self.sim.root / "run" / "nested" / "rsd.lock"
        wanted: dict[str, list[int]] = {}
        for npu, gid in enumerate(groups or []):
            if gid != "0":
                wanted.setdefault(gid, []).append(npu)
        for gid, npus in wanted.items():  # through the tool itself, as a node would get them
            self.smi("group", "-c", gid, "-a", ",".join(map(str, npus)))
        self.calls_log = trace_smi(self.sim)  # from here on every call is recorded

    def smi(self, *args: str) -> None:
        done = subprocess.run([str(self.sim.smi_path), *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    def fault(self, fault: Fault) -> None:
        self.sim.inject_fault(fault)

    def groups(self) -> list[str]:
        by_name = {r["device"]: str(r["group_id"]) for r in self.sim.store.read().devices}
        return [by_name[f"rbln{i}"] for i in range(4)]

    def calls(self) -> list[str]:
        return [c.args for c in smi_calls(self.calls_log)]

    def no_node(self) -> None:
        """The driver creates group nodes somewhere the daemon does not look."""
        elsewhere = self.sim.root / "elsewhere"
        elsewhere.mkdir()
        with self.sim.store.transaction() as state:
            state.dev_root = str(elsewhere)

    async def recreate(
        self,
        bus_ids: list[str],
        hostio: HostIO | None = None,
        timings: RsdTimings | None = None,
        **kw: Any,
    ) -> RsdGroup:
        """``recreate_rsd_group`` here, through ``hostio`` or a HostIO of its own."""
        io = hostio or HostIO()
        timings = timings or RsdTimings()
        host = RsdHost(io, self.lock, self.dev, accept_file_nodes=True, timings=timings)
        try:
            return await recreate_rsd_group(host, self.sim.smi_path, bus_ids, **kw)
        finally:
            if hostio is None:
                io.close()


class InLoopHostIO(HostIO):
    """Runs each host call on the event loop itself, for the fake-time tests below.

    looptime fast-forwards the loop's clock whenever the loop has nothing ready, and counts
    work on other threads as taking no loop time: behind the real HostIO's thread hop the
    fake clock would race ahead and expire budgets early. The calls here are local file
    operations of microseconds (open, stat), so running them in place keeps every step of
    the budget on the loop's clock. The real HostIO is what every other test uses.
    """

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    async def map(self, calls: Sequence[Call[T]]) -> list[T | Stalled]:
        self.batches += 1
        return [call.run() for call in calls]


@pytest.fixture
def node(short_tmp: Path) -> RsdNode:
    return RsdNode(short_tmp)


def lock_is_free(path: Path) -> bool:
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


# --------------------------------------------------------------------- pure helpers
def test_groups_to_destroy_ignores_default_and_other_devices() -> None:
    entries = [
        GroupEntry("a", 0, "0"),
        GroupEntry("b", 1, "2"),
        GroupEntry("c", 2, "10"),
        GroupEntry("d", 3, "5"),
    ]
    assert groups_to_destroy(entries, ["a", "b", "c"]) == ["2", "10"]


def test_next_group_id_is_the_smallest_unused() -> None:
    assert next_group_id([GroupEntry("a", 0, "0")]) == 1
    assert (
        next_group_id([GroupEntry("a", 0, "1"), GroupEntry("b", 1, "3"), GroupEntry("c", 2, "2")])
        == 4
    )
    assert next_group_id([GroupEntry("a", 0, "2")]) == 1
    with pytest.raises(RsdError, match="non-numeric group_id 'x1'"):
        next_group_id([GroupEntry("a", 0, "x1")])


# --------------------------------------------------------------------- happy paths
async def test_fresh_group_for_sorted_bus_ids(node: RsdNode) -> None:
    with capture_logs() as logs:
        group = await node.recreate([BUS[2], BUS[0].upper()])
    assert group == RsdGroup(1, node.dev / "rsd1", (BUS[0], BUS[2]))
    # The new group is read back: it holds what was asked for.
    assert node.calls() == ["-g -j", "group -c 1 -a 0,2", "-g -j"]
    assert node.groups() == ["1", "0", "1", "0"]
    (record,) = [e for e in logs if e["event"] == "Recreated RSD group"]
    assert record["log_level"] == "debug"
    assert record["groupId"] == 1 and record["busIDs"] == [BUS[0], BUS[2]]
    assert record["hostRsdPath"] == str(node.dev / "rsd1")
    # Three rbln-smi runs (each a Python start-up) happened inside the measured time.
    calls = smi_calls(node.calls_log)
    spent = sum((c.end or c.start) - c.start for c in calls) * 1000
    assert record["durationMs"] >= spent


async def test_existing_groups_of_the_devices_are_destroyed_first(short_tmp: Path) -> None:
    node = RsdNode(short_tmp, ["1", "1", "2", "3"])
    group = await node.recreate([BUS[0], BUS[2]])
    assert node.calls()[:2] == ["-g -j", "group -d 1,2"]
    # After the destroy, only group 3 is in use, so 1 is free again.
    assert group.group_id == 1
    assert node.groups() == ["1", "0", "1", "3"]


async def test_new_id_skips_groups_used_by_other_devices(short_tmp: Path) -> None:
    node = RsdNode(short_tmp, ["0", "1", "2", "0"])
    group = await node.recreate([BUS[3]])
    assert group.group_id == 3
    assert node.groups() == ["0", "1", "2", "3"]


async def test_lock_file_is_created_0644_with_parents(node: RsdNode) -> None:
    old = os.umask(0o077)
    try:
        await node.recreate([BUS[0]])
    finally:
        os.umask(old)
    assert stat.S_IMODE(node.lock.stat().st_mode) == 0o644
    assert lock_is_free(node.lock)


# --------------------------------------------------------------------- failures
async def test_request_errors_touch_nothing(node: RsdNode) -> None:
    with pytest.raises(RsdError, match="no bus IDs"):
        await node.recreate([])
    with pytest.raises(RsdError, match="invalid bus IDs"):
        await node.recreate(["../../etc/passwd"])
    assert node.calls() == []


async def test_unlisted_bus_id_is_an_error(node: RsdNode) -> None:
    with pytest.raises(RsdError, match=r"does not list bus ID 0000:99:00\.0"):
        await node.recreate([BUS[0], "0000:99:00.0"])
    assert lock_is_free(node.lock)
    assert "group -c" not in " ".join(node.calls())


async def test_non_numeric_group_id_is_an_error(node: RsdNode) -> None:
    with node.sim.store.transaction() as state:  # no real tool prints this; a broken one
        state.devices[3]["group_id"] = "abc"
    with pytest.raises(RsdError, match="non-numeric"):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


@pytest.mark.parametrize(
    ("cmd", "step"), [("list-groups", "listing RSD groups"), ("group-create", "creating group 1")]
)
async def test_failing_command_names_the_step_and_releases_the_lock(
    node: RsdNode, cmd: str, step: str
) -> None:
    node.fault(Fault("error", (cmd,), exit_code=7, message=f"{cmd} failed"))
    with pytest.raises(RsdError, match=f"{step}: .*exited with code 7 .*{cmd} failed"):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


async def test_failing_destroy_names_the_groups(short_tmp: Path) -> None:
    node = RsdNode(short_tmp, ["4", "0", "0", "0"])
    node.fault(Fault("error", ("group-delete",), exit_code=2))
    with pytest.raises(RsdError, match="destroying groups 4: "):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


async def test_garbage_listing_is_an_error(node: RsdNode) -> None:
    node.fault(Fault("garbage", ("list-groups",)))
    with pytest.raises(RsdError, match="invalid JSON"):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


# --------------------------------------------------------------------- the read-back
async def _while_group_create_is_held(node: RsdNode, change: Any) -> asyncio.Task[RsdGroup]:
    """Start a recreation of rbln0 (BUS[0]) whose ``group -c`` waits until ``change`` ran."""
    node.fault(Fault("hold", ("group-create",), remaining=1))
    task = asyncio.create_task(node.recreate([BUS[0]], expected={"rbln0": BUS[0]}))
    try:
        await wait_until(lambda: bool(node.sim.held()), 30, "the held group-create")
        change()
    finally:
        node.sim.release_held()
    return task


def _swap_npus(node: RsdNode) -> None:
    """rbln-smi's npu numbers of rbln0 and rbln1 trade places; names and buses stay."""
    with node.sim.store.transaction() as state:
        first, second = (r for r in state.devices if r["device"] in ("rbln0", "rbln1"))
        first["npu"], second["npu"] = second["npu"], first["npu"]


async def test_a_group_holding_other_functions_is_destroyed_and_refused(node: RsdNode) -> None:
    # Only the npu numbers moved: every name is still at its bus, but the group made from
    # "npu 0" holds BUS[1]. The name check alone would hand it out.
    task = await _while_group_create_is_held(node, lambda: _swap_npus(node))
    with pytest.raises(RenumberedDuringCreate) as caught:
        await task
    exc = caught.value
    assert (exc.device, exc.snapshot_bus_id, exc.current_bus_id) == ("rbln0", BUS[0], BUS[1])
    assert exc.group_bus_ids == [BUS[1]] and exc.destroyed and exc.group_id == 1
    assert "renumbered while RSD group 1 was being created" in str(exc)
    assert "the group holds 0000:0b:00.0" in str(exc) and "destroyed again" in str(exc)
    assert node.calls()[-2:] == ["-g -j", "group -d 1"]
    assert node.groups() == ["0", "0", "0", "0"]
    assert not (node.dev / "rsd1").exists()
    assert lock_is_free(node.lock)


async def test_a_group_that_cannot_be_destroyed_again_says_so(node: RsdNode) -> None:
    def change() -> None:
        _swap_npus(node)
        node.fault(Fault("error", ("group-delete",), exit_code=3, message="busy"))

    task = await _while_group_create_is_held(node, change)
    with capture_logs() as logs, pytest.raises(RenumberedDuringCreate) as caught:
        await task
    assert not caught.value.destroyed
    assert "destroying the group failed too (destroying groups 1: " in str(caught.value)
    (record,) = [e for e in logs if e["event"] == "Cannot destroy a wrongly created RSD group"]
    assert record["log_level"] == "error" and record["groupId"] == 1
    assert lock_is_free(node.lock)


async def test_a_read_back_that_fails_refuses_and_destroys_the_unknown_group(
    node: RsdNode,
) -> None:
    change = partial(node.fault, Fault("error", ("list-groups",), message="no listing"))
    task = await _while_group_create_is_held(node, change)
    with pytest.raises(RsdError, match=r"created group 1, but reading back group 1: .*no listing"):
        await task
    assert node.calls()[-1] == "group -d 1"
    assert node.groups() == ["0", "0", "0", "0"]


async def test_hanging_command_times_out_and_releases_the_lock(node: RsdNode) -> None:
    # The fault hangs for an hour: a recreation that waited for it would hang the test.
    node.fault(Fault("hang", ("group-create",)))
    with pytest.raises(RsdError, match=r"creating group 1: .*timed out"):
        await node.recreate([BUS[0]], timings=RsdTimings(change=0.5))
    assert lock_is_free(node.lock)
    assert node.groups() == ["0"] * 4


async def test_missing_rsd_node_fails_after_polling(node: RsdNode) -> None:
    node.no_node()
    with pytest.raises(RsdError, match=r"created group 1, but .*rsd1 did not appear within 0.3 s"):
        await node.recreate([BUS[0]], timings=RsdTimings(node=0.3))
    assert lock_is_free(node.lock)


async def test_cancellation_releases_the_lock(node: RsdNode) -> None:
    node.no_node()
    task = asyncio.create_task(node.recreate([BUS[0]], timings=RsdTimings(node=60)))
    # The group exists; the recreation polls for a node that never comes: cancel it there.
    await wait_until(lambda: node.groups()[0] == "1", 30, "group 1 to be created")
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lock_is_free(node.lock)


# --------------------------------------------------------------------- concurrency
async def test_concurrent_recreations_serialise_and_both_succeed(short_tmp: Path) -> None:
    node = RsdNode(short_tmp, ["1", "1", "0", "0"])
    first, second = await asyncio.gather(
        node.recreate([BUS[0], BUS[1]]), node.recreate([BUS[2], BUS[3]])
    )
    # Each recreation's commands form one contiguous block: nothing interleaves.
    blocks: list[list[str]] = [[]]
    calls = node.calls()
    for index, call in enumerate(calls):
        blocks[-1].append(call)
        if index and calls[index - 1].startswith("group -c"):  # the read-back ends it
            blocks.append([])
    assert blocks.pop() == []
    assert len(blocks) == 2
    for block in blocks:
        # list, create, read back; or list, destroy, list, create, read back
        assert block[0] == block[-3] == block[-1] == "-g -j" and len(block) in (3, 5), block
    assert {first.group_id, second.group_id} == {1, 2}
    groups = node.groups()
    assert groups[0] == groups[1] == str(first.group_id)
    assert groups[2] == groups[3] == str(second.group_id)
    assert first.host_path.exists() and second.host_path.exists()


HOLDER = (
    "import fcntl, sys, time\n"
    "f = open(sys.argv[1], 'a')\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n"
)


@pytest.fixture
def lock_holder(node: RsdNode) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the RSD lock. A fixture: set up in real time, before the
    test's fake time begins (a real process, read through a real pipe)."""
    node.lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(node.lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.looptime  # the 5 s budget passes on the loop's fake clock, in milliseconds
async def test_lock_held_by_another_process_times_out_without_blocking_the_loop(
    node: RsdNode, lock_holder: subprocess.Popen[str]
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(node.recreate([BUS[0]], InLoopHostIO()))  # default: 5 s
    # The loop is free while the recreation waits: this coroutine runs again before
    # the budget can run out (the wait ends only on a timer, and the loop turns to
    # timers after every ready callback, this one included).
    await asyncio.sleep(0)
    assert not waiting.done()
    with pytest.raises(RsdError, match=r"timed out after 5 s waiting for the RSD lock .*rsd.lock"):
        await waiting
    elapsed = loop.time() - started
    # The budget is the behaviour: never given up early, nor later than the retry step
    # past it (every step of the wait is on this loop's clock).
    assert LOCK_TIMEOUT_S <= elapsed <= LOCK_TIMEOUT_S + LOCK_RETRY_S + 1e-3
    assert node.calls() == []
    lock_holder.kill()
    lock_holder.wait()
    assert lock_is_free(node.lock)


async def test_lock_waits_for_a_short_holder(tmp_path: Path, hostio: HostIO) -> None:
    lock = tmp_path / "l"
    order: list[str] = []

    async def user(name: str, hold: float) -> None:
        async with rsd_lock(lock, hostio=hostio):
            order.append(f"{name}+")
            await asyncio.sleep(hold)
            order.append(f"{name}-")

    await asyncio.gather(user("a", 0.3), user("b", 0))
    assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


# --------------------------------------------------------------------- device nodes
async def test_wait_for_nodes_returns_once_nodes_appear(tmp_path: Path) -> None:
    target = tmp_path / "rsd3"
    asyncio.get_running_loop().call_later(0.2, target.touch)
    await wait_for_nodes([target], HostIO(), timeout=30, interval=0.05, accept_files=True)
    assert target.exists()


async def test_a_regular_file_is_not_a_device_node_unless_the_test_setting_allows_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "rbln0").touch()
    # NotADeviceNode, not DeviceNodeMissing: refused at the first look, not waited out.
    with pytest.raises(NotADeviceNode, match="rbln0 is a regular file, not a device node"):
        await wait_for_nodes([tmp_path / "rbln0"], HostIO(), timeout=30)
    await wait_for_nodes([tmp_path / "rbln0"], HostIO(), timeout=0, accept_files=True)
    assert node_kind(Path("/dev/null")) is None  # a character device always counts


async def test_wait_for_nodes_names_the_missing_ones(tmp_path: Path) -> None:
    (tmp_path / "rbln0").touch()
    with pytest.raises(DeviceNodeMissing) as info:
        await wait_for_nodes(
            [tmp_path / "rbln0", tmp_path / "rbln1"],
            HostIO(),
            timeout=0.2,
            interval=0.05,
            accept_files=True,
        )
    assert info.value.missing == (tmp_path / "rbln1",)
    assert "rbln1 did not appear within 0.2 s" in str(info.value)


@pytest.mark.looptime  # the 5 s default passes on the loop's fake clock, in milliseconds
async def test_wait_for_nodes_polls_every_100_ms_for_5_s_by_default(tmp_path: Path) -> None:
    hostio = InLoopHostIO()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DeviceNodeMissing, match=r"rsd1 did not appear within 5 s"):
        await wait_for_nodes([tmp_path / "rsd1"], hostio, accept_files=True)
    assert loop.time() - started == pytest.approx(DEFAULT_TIMEOUT_S, abs=1e-3)
    # A look at 0, 0.1, ..., 5.0 s (a float rounding may add one more at the very end).
    looks = 1 + round(DEFAULT_TIMEOUT_S / DEFAULT_INTERVAL_S)
    assert looks <= hostio.batches <= looks + 1


async def test_wait_for_nodes_zero_timeout_checks_once(tmp_path: Path) -> None:
    (tmp_path / "x").touch()
    await wait_for_nodes([tmp_path / "x"], HostIO(), timeout=0, accept_files=True)
    with pytest.raises(DeviceNodeMissing):
        await wait_for_nodes([tmp_path / "y"], HostIO(), timeout=0, accept_files=True)


# --------------------------------------------------------------------- simulated node
async def test_recreate_against_the_simulated_node(short_tmp: Path, hostio: HostIO) -> None:
    from rbln_device_plugin_sim.layout import preset
    from rbln_device_plugin_sim.node import materialize

    sim = materialize(preset("rebel-sriov"), short_tmp / "node")
    vfs = [d.bus_id for d in sim.layout.devices if d.name.startswith("rbln0-")]
    host = RsdHost(hostio, sim.rsd_lock_path, sim.dev_root, accept_file_nodes=True)
    first = await recreate_rsd_group(host, sim.smi_path, vfs[:2])
    second = await recreate_rsd_group(host, sim.smi_path, vfs[2:])
    again = await recreate_rsd_group(host, sim.smi_path, vfs[:2])
    assert (first.group_id, second.group_id, again.group_id) == (1, 2, 1)
    groups = sim.groups()
    assert sorted(groups["1"]) == ["rbln0-0", "rbln0-1"]
    assert sorted(groups["2"]) == ["rbln0-2", "rbln0-3"]
    assert again.host_path == sim.dev_root / "rsd1" and again.host_path.exists()
