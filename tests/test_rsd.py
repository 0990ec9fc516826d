"""RSD group recreation against a stateful fake rbln-smi (a real executable, real flock)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from rbln_device_plugin.host.devnodes import (
    DeviceNodeMissing,
    NotADeviceNode,
    node_kind,
    wait_for_nodes,
)
from rbln_device_plugin.host.hostio import HostIO
from rbln_device_plugin.host.rsd import (
    GroupEntry,
    RsdError,
    RsdGroup,
    groups_to_destroy,
    next_group_id,
    recreate_rsd_group,
    rsd_lock,
)

# The fake keeps its devices in state.json and mimics the three commands used here.
# Faults: state["fail"][cmd] = exit code, state["hang"][cmd] = seconds, state["no_node"],
# state["garbage"][cmd]. cmd is "list", "destroy" or "create".
FAKE = r"""
import fcntl, json, os, sys, time
state_path, dev_root, calls = sys.argv[1], sys.argv[2], sys.argv[3]
args = sys.argv[4:]
with open(state_path + ".lock", "a") as guard:
    fcntl.flock(guard, fcntl.LOCK_EX)  # the fake's own consistency, not the plugin's lock
    state = json.load(open(state_path))
    cmd = {"-g": "list", "-d": "destroy", "-c": "create"}[args[0] if args[0] == "-g" else args[1]]
    open(calls, "a").write(" ".join(args) + "\n")
    if cmd in state.get("hang", {}):
        time.sleep(state["hang"][cmd])
    if cmd in state.get("fail", {}):
        print(f"{cmd} failed", file=sys.stderr)
        sys.exit(state["fail"][cmd])
    if cmd in state.get("garbage", {}):
        print("not json")
        sys.exit(0)
    devices = state["devices"]
    if cmd == "list":
        out = [{"npu": d["npu"], "name": "RBLN-CA25", "device": f"rbln{d['npu']}",
                "group_id": d["group"], "pci": {"bus_id": d["bus"], "numa_node": "0"}}
               for d in devices]
        print(json.dumps({"KMD_version": "1", "devices": out}))
    elif cmd == "destroy":
        for gid in args[2].split(","):
            for d in devices:
                if d["group"] == gid:
                    d["group"] = "0"
            try:
                os.unlink(os.path.join(dev_root, "rsd" + gid))
            except FileNotFoundError:
                pass
    else:
        gid, npus = args[2], [int(n) for n in args[4].split(",")]
        for d in devices:
            if d["npu"] in npus:
                d["group"] = gid
        if not state.get("no_node"):
            open(os.path.join(dev_root, "rsd" + gid), "w").close()
    json.dump(state, open(state_path, "w"))
"""

BUS = [f"0000:{0x05 + i:02x}:00.0" for i in range(4)]


class FakeNode:
    def __init__(self, root: Path, groups: list[str] | None = None) -> None:
        self.root = root
        self.dev = root / "dev"
        self.dev.mkdir()
        self.state_path = root / "state.json"
        self.calls_path = root / "calls"
        self.lock = root / "run" / "nested" / "rsd.lock"
        script = root / "fake_smi.py"
        script.write_text(FAKE)
        self.smi = root / "rbln-smi"
        self.smi.write_text(
            f"#!/bin/sh\nexec {sys.executable} {script} {self.state_path} {self.dev} "
            f'{self.calls_path} "$@"\n'
        )
        self.smi.chmod(0o755)
        groups = groups or ["0"] * len(BUS)
        self.write(
            {
                "devices": [
                    {"npu": i, "bus": b, "group": g}
                    for i, (b, g) in enumerate(zip(BUS, groups, strict=True))
                ]
            }
        )

    def write(self, state: dict[str, Any]) -> None:
        self.state_path.write_text(json.dumps(state))

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())  # type: ignore[no-any-return]

    def fault(self, kind: str, cmd: str, value: Any = 1) -> None:
        state = self.state()
        state.setdefault(kind, {})[cmd] = value
        self.write(state)

    def groups(self) -> list[str]:
        return [d["group"] for d in self.state()["devices"]]

    def calls(self) -> list[str]:
        return self.calls_path.read_text().splitlines() if self.calls_path.exists() else []

    async def recreate(self, bus_ids: list[str], **kw: Any) -> RsdGroup:
        return await recreate_rsd_group(
            self.smi, bus_ids, HostIO(), lock_path=self.lock, dev_root=self.dev,
            accept_file_nodes=True, **kw,
        )  # fmt: skip


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path)


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
async def test_fresh_group_for_sorted_bus_ids(node: FakeNode) -> None:
    with capture_logs() as logs:
        group = await node.recreate([BUS[2], BUS[0].upper()])
    assert group == RsdGroup(1, node.dev / "rsd1")
    assert node.calls() == ["-g -j", "group -c 1 -a 0,2"]
    assert node.groups() == ["1", "0", "1", "0"]
    (record,) = [e for e in logs if e["event"] == "Recreated RSD group"]
    assert record["log_level"] == "debug"
    assert record["groupId"] == 1 and record["busIDs"] == [BUS[0], BUS[2]]
    assert record["hostRsdPath"] == str(node.dev / "rsd1") and record["durationMs"] >= 0


async def test_existing_groups_of_the_devices_are_destroyed_first(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, ["1", "1", "2", "3"])
    group = await node.recreate([BUS[0], BUS[2]])
    assert node.calls()[:2] == ["-g -j", "group -d 1,2"]
    # After the destroy, only group 3 is in use, so 1 is free again.
    assert group.group_id == 1
    assert node.groups() == ["1", "0", "1", "3"]


async def test_new_id_skips_groups_used_by_other_devices(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, ["0", "1", "2", "0"])
    group = await node.recreate([BUS[3]])
    assert group.group_id == 3
    assert node.groups() == ["0", "1", "2", "3"]


async def test_lock_file_is_created_0644_with_parents(node: FakeNode) -> None:
    old = os.umask(0o077)
    try:
        await node.recreate([BUS[0]])
    finally:
        os.umask(old)
    assert stat.S_IMODE(node.lock.stat().st_mode) == 0o644
    assert lock_is_free(node.lock)


# --------------------------------------------------------------------- failures
async def test_request_errors_touch_nothing(node: FakeNode) -> None:
    with pytest.raises(RsdError, match="no bus IDs"):
        await node.recreate([])
    with pytest.raises(RsdError, match="invalid bus IDs"):
        await node.recreate(["../../etc/passwd"])
    assert node.calls() == []


async def test_unlisted_bus_id_is_an_error(node: FakeNode) -> None:
    with pytest.raises(RsdError, match=r"does not list bus ID 0000:99:00\.0"):
        await node.recreate([BUS[0], "0000:99:00.0"])
    assert lock_is_free(node.lock)
    assert "group -c" not in " ".join(node.calls())


async def test_non_numeric_group_id_is_an_error(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, ["0", "0", "0", "abc"])
    with pytest.raises(RsdError, match="non-numeric"):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


@pytest.mark.parametrize(
    ("cmd", "step"), [("list", "listing RSD groups"), ("create", "creating group 1")]
)
async def test_failing_command_names_the_step_and_releases_the_lock(
    node: FakeNode, cmd: str, step: str
) -> None:
    node.fault("fail", cmd, 7)
    with pytest.raises(RsdError, match=f"{step}: .*exited with code 7 .*{cmd} failed"):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


async def test_failing_destroy_names_the_groups(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, ["4", "0", "0", "0"])
    node.fault("fail", "destroy", 2)
    with pytest.raises(RsdError, match="destroying groups 4: "):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


async def test_garbage_listing_is_an_error(node: FakeNode) -> None:
    node.fault("garbage", "list")
    with pytest.raises(RsdError, match="invalid JSON"):
        await node.recreate([BUS[0]])
    assert lock_is_free(node.lock)


async def test_hanging_command_times_out_and_releases_the_lock(node: FakeNode) -> None:
    node.fault("hang", "create", 60)
    started = time.monotonic()
    with pytest.raises(RsdError, match=r"creating group 1: .*timed out"):
        await node.recreate([BUS[0]], change_timeout=0.5)
    assert time.monotonic() - started < 5
    assert lock_is_free(node.lock)


async def test_missing_rsd_node_fails_after_polling(node: FakeNode) -> None:
    state = node.state()
    state["no_node"] = True
    node.write(state)
    with pytest.raises(RsdError, match=r"created group 1, but .*rsd1 did not appear within 0.3 s"):
        await node.recreate([BUS[0]], node_timeout=0.3)
    assert lock_is_free(node.lock)


async def test_cancellation_releases_the_lock(node: FakeNode) -> None:
    state = node.state()
    state["no_node"] = True
    node.write(state)
    task = asyncio.create_task(node.recreate([BUS[0]], node_timeout=30))
    for _ in range(300):
        if any(c.startswith("group -c") for c in node.calls()):
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lock_is_free(node.lock)


# --------------------------------------------------------------------- concurrency
async def test_concurrent_recreations_serialise_and_both_succeed(tmp_path: Path) -> None:
    node = FakeNode(tmp_path, ["1", "1", "0", "0"])
    first, second = await asyncio.gather(
        node.recreate([BUS[0], BUS[1]]), node.recreate([BUS[2], BUS[3]])
    )
    # Each recreation's commands form one contiguous block: nothing interleaves.
    blocks: list[list[str]] = [[]]
    for call in node.calls():
        blocks[-1].append(call)
        if call.startswith("group -c"):
            blocks.append([])
    assert blocks.pop() == []
    assert len(blocks) == 2
    for block in blocks:
        # list, create; or list, destroy, list, create
        assert block[0] == block[-2] == "-g -j" and len(block) in (2, 4), block
    assert {first.group_id, second.group_id} == {1, 2}
    groups = node.groups()
    assert groups[0] == groups[1] == str(first.group_id)
    assert groups[2] == groups[3] == str(second.group_id)
    assert first.host_path.exists() and second.host_path.exists()


async def test_lock_held_by_another_process_times_out_without_blocking_the_loop(
    node: FakeNode,
) -> None:
    node.lock.parent.mkdir(parents=True)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import fcntl, sys, time\n"
        f"f = open({str(node.lock)!r}, 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert (await asyncio.wait_for(holder.stdout.readline(), 10)).strip() == b"locked"
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        started = time.monotonic()
        with pytest.raises(
            RsdError, match=r"timed out after 5 s waiting for the RSD lock .*rsd.lock"
        ):
            await node.recreate([BUS[0]])  # default budget: 5 s
        elapsed = time.monotonic() - started
        ticking.cancel()
        assert 4.9 <= elapsed < 7
        assert ticks >= 20  # the loop kept running while we waited for the lock
        assert node.calls() == []
    finally:
        holder.kill()
        await holder.wait()
    assert lock_is_free(node.lock)


async def test_lock_waits_for_a_short_holder(tmp_path: Path) -> None:
    lock = tmp_path / "l"
    order: list[str] = []

    async def user(name: str, hold: float) -> None:
        async with rsd_lock(lock):
            order.append(f"{name}+")
            await asyncio.sleep(hold)
            order.append(f"{name}-")

    await asyncio.gather(user("a", 0.3), user("b", 0))
    assert order in (["a+", "a-", "b+", "b-"], ["b+", "b-", "a+", "a-"])


# --------------------------------------------------------------------- device nodes
async def test_wait_for_nodes_returns_once_nodes_appear(tmp_path: Path) -> None:
    target = tmp_path / "rsd3"
    asyncio.get_running_loop().call_later(0.2, target.touch)
    await wait_for_nodes([target], HostIO(), timeout=5, interval=0.05, accept_files=True)
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


async def test_wait_for_nodes_zero_timeout_checks_once(tmp_path: Path) -> None:
    (tmp_path / "x").touch()
    await wait_for_nodes([tmp_path / "x"], HostIO(), timeout=0, accept_files=True)
    with pytest.raises(DeviceNodeMissing):
        await wait_for_nodes([tmp_path / "y"], HostIO(), timeout=0, accept_files=True)


# --------------------------------------------------------------------- simulated node
async def test_recreate_against_the_simulated_node(short_tmp: Path) -> None:
    from rbln_device_plugin_sim.layout import preset
    from rbln_device_plugin_sim.node import materialize

    sim = materialize(preset("rebel-sriov"), short_tmp / "node")
    vfs = [d.bus_id for d in sim.layout.devices if d.name.startswith("rbln0-")]
    kwargs: dict[str, Any] = {
        "lock_path": sim.rsd_lock_path,
        "dev_root": sim.dev_root,
        "accept_file_nodes": True,
    }
    first = await recreate_rsd_group(sim.smi_path, vfs[:2], HostIO(), **kwargs)
    second = await recreate_rsd_group(sim.smi_path, vfs[2:], HostIO(), **kwargs)
    again = await recreate_rsd_group(sim.smi_path, vfs[:2], HostIO(), **kwargs)
    assert (first.group_id, second.group_id, again.group_id) == (1, 2, 1)
    groups = sim.groups()
    assert sorted(groups["1"]) == ["rbln0-0", "rbln0-1"]
    assert sorted(groups["2"]) == ["rbln0-2", "rbln0-3"]
    assert again.host_path == sim.dev_root / "rsd1" and again.host_path.exists()
