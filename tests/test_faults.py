"""Reliability under faults: the real daemon against a simulated node that misbehaves.

Each test ends by checking what an operator would notice: the daemon is alive (or exited
0 when asked to), the kubelet sees the right devices and health, the kubelet directory
holds exactly one socket per live resource, the RSD lock is free, and descriptors, asyncio
tasks and ListAndWatch streams are back to their idle baseline.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

import grpc
import pytest

from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin_sim.kubelet import ResourceView
from rbln_device_plugin_sim.node import SimNode
from rbln_device_plugin_sim.state import Fault

from .fault_helpers import (
    NPU,
    VF1,
    VF4,
    FaultHarness,
    SmiCall,
    allocate_direct,
    assert_settles,
    expected_entries,
    expected_sockets,
    groups_are_consistent,
    launch,
    lock_is_free,
    next_reconcile,
    no_crash_records,
    pid_alive,
    smi_calls,
    take_baseline,
    trace_smi,
    wait_until,
)

# Every test takes an idle baseline over several scans and waits for the daemon to
# settle back to it: seconds each.
pytestmark = pytest.mark.slow

SRIOV_COUNTS = {NPU: 2, VF1: 1, VF4: 4}
DISCOVERY_FAILED = "Device discovery failed; reporting zero devices until it recovers"
REGISTRATION_FAILED = "Device plugin registration failed; retrying next scan"
# Not in the README's catalogue: named here only to allow it as an expected error.
SERVER_FAILED = "Cannot start device plugin server; retrying next scan"
KUBELET_DIR_MISSING = "Kubelet device-plugin directory does not exist; waiting for the kubelet"
KUBELET_DIR_FOUND = "Kubelet device-plugin directory exists now; continuing"
CALL_GUARD_S = 20.0  # far beyond any legitimate Allocate (5 s lock + 10 s group change)
# The README promises exit within 5 s of SIGTERM; twice that leaves room for a loaded
# machine and still fails a shutdown that waits for a call held for as long as the test.
SHUTDOWN_GUARD_S = 10.0
ALLOCATION_FAILED = "Container allocation failed"


def device_count(count: int, generation: int = 1) -> Callable[[ResourceView], bool]:
    return lambda v: v.generation >= generation and v.messages > 0 and len(v.devices) == count


async def registered(h: FaultHarness, counts: dict[str, int]) -> None:
    for resource, count in counts.items():
        await h.kubelet.wait_for(resource, device_count(count), 15)


def sent(h: FaultHarness, resource: str = NPU) -> int:
    """ListAndWatch messages the kubelet received on the resource's current stream."""
    view = h.kubelet.view(resource)
    assert view is not None, f"{resource} is not registered"
    return view.messages


def groups(h: FaultHarness) -> dict[str, list[str]]:
    return {g: sorted(n) for g, n in h.node.groups().items() if g != "0"}


async def rejected(h: FaultHarness, resource: str, ids: list[str]) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(h.kubelet.allocate(resource, [ids]), CALL_GUARD_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    return caught.value.details() or ""


# ---------------------------------------------------------------- a. kubelet restart storm
async def restart_storm(restarts: int) -> None:
    async with launch("rebel-sriov", interval="1s") as h:
        await registered(h, SRIOV_COUNTS)
        base = await take_baseline(h, list(SRIOV_COUNTS))
        stop = asyncio.Event()
        outcomes: Counter[str] = Counter()
        details: list[str] = []

        async def allocate_in_a_loop(resource: str, ids: list[str]) -> None:
            while not stop.is_set():
                try:
                    # A hang fails the test through the guard's TimeoutError.
                    await asyncio.wait_for(h.kubelet.allocate(resource, [ids]), CALL_GUARD_S)
                    outcomes["ok"] += 1
                except grpc.aio.AioRpcError as exc:
                    outcomes[exc.code().name] += 1
                    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        details.append(exc.details() or "")
                except LookupError:  # the stub has no plugin for it between restarts
                    outcomes["unregistered"] += 1
                except asyncio.CancelledError:
                    # The stub closed its channel to the old plugin under the call.
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise
                    outcomes["channel closed"] += 1
                await asyncio.sleep(0.05)

        workers = [
            asyncio.create_task(allocate_in_a_loop(VF4, ["rbln0-0", "rbln0-1"])),
            asyncio.create_task(allocate_in_a_loop(VF1, ["rbln1-0"])),
            asyncio.create_task(allocate_in_a_loop(NPU, ["rbln2"])),
        ]
        try:
            for generation in range(2, restarts + 2):
                await h.kubelet.restart()
                for resource, count in SRIOV_COUNTS.items():
                    await h.kubelet.wait_for(resource, device_count(count, generation))
                # Some allocation succeeds against this instance before the next restart.
                served = outcomes["ok"]
                await wait_until(lambda s=served: outcomes["ok"] > s, 30, "an allocation")
        finally:
            stop.set()
            await asyncio.gather(*workers)

        assert outcomes["ok"] >= restarts, outcomes
        # Failures are the plugin going away under a call, never a broken allocation.
        assert not details, details
        for resource, count in SRIOV_COUNTS.items():
            view = h.kubelet.view(resource)
            assert view is not None and len(view.devices) == count
            assert view.count("Healthy") == count and view.ended is None
            response = await h.kubelet.allocate(resource, [[view.ids[0]]])
            assert len(response.container_responses) == 1
        groups_are_consistent(h.node)
        await assert_settles(h, base, list(SRIOV_COUNTS))
        # An allocation cut off by a restart is the plugin going away, logged as a failure.
        no_crash_records(h.daemon, [ALLOCATION_FAILED])


async def test_kubelet_restarts_while_allocations_run() -> None:
    await restart_storm(10)


@pytest.mark.soak
async def test_kubelet_restarts_a_hundred_times_while_allocations_run() -> None:
    await restart_storm(100)


# ---------------------------------------------------------------- b. rbln-smi faults
async def test_scans_slower_than_the_interval_never_overlap_and_recover() -> None:
    calls_log = None

    def wrap(node: SimNode) -> None:
        nonlocal calls_log
        calls_log = trace_smi(node)

    async with launch("rebel-4", interval="200ms", before_start=wrap) as h:
        assert calls_log is not None
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        h.node.inject_fault(Fault("slow", commands=("list",), delay=1.0, remaining=3))
        await wait_until(lambda: not h.node.store.read().faults)

        def scans() -> list[SmiCall]:
            return [c for c in smi_calls(calls_log) if c.args == "-j" and c.end is not None]

        # Three slow scans, then a normal one again: one that started after the last
        # slow one ended and has finished too.
        def slow() -> list[SmiCall]:
            return [c for c in scans() if c.end is not None and c.end - c.start >= 1.0]

        await wait_until(
            lambda: len(slow()) >= 3 and scans()[-1].start > (slow()[-1].end or 0),
            30,
            "a normal scan after the slow ones",
        )
        await assert_settles(h, base, [NPU])
        assert len(slow()) >= 3  # the three injected delays (never fewer)
        for earlier, later in itertools.pairwise(scans()):
            assert earlier.end is not None and later.start >= earlier.end, (earlier, later)
        view = h.kubelet.view(NPU)
        assert view is not None
        # Slow is not failed: the kubelet saw neither a gap nor a re-registration.
        assert (view.generation, view.messages, view.count("Healthy")) == (1, 1, 4)
        no_crash_records(h.daemon)  # no discovery failure, nor any other error


@pytest.mark.parametrize("mode", ["error", "garbage"])
async def test_one_failed_scan_heals_by_itself(mode: str) -> None:
    async with launch("rebel-4", interval="300ms") as h:
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        h.node.inject_fault(Fault(mode, commands=("list",), remaining=1))
        await h.daemon.await_log(DISCOVERY_FAILED)
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and len(v.devices) == 4)
        assert view.count("Healthy") == 4
        await assert_settles(h, base, [NPU])
        failures = h.daemon.find(DISCOVERY_FAILED)
        assert len(failures) == 1
        assert not h.node.store.read().faults
        no_crash_records(h.daemon, [DISCOVERY_FAILED])


@pytest.mark.parametrize(
    ("fault", "expected"),
    [(Fault("error", commands=("group-create",), remaining=1), "creating group"),
     (Fault("error", commands=("group-delete",), remaining=1), "destroying groups"),
     (Fault("garbage", commands=("list-groups",), remaining=1), "json"),
     (Fault("slow", commands=("list-groups",), delay=1.5, remaining=1), None)],
)  # fmt: skip
async def test_one_failed_rbln_smi_call_during_allocate_heals_by_itself(
    fault: Fault, expected: str | None
) -> None:
    async with launch("rebel-4") as h:
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        await h.kubelet.allocate(NPU, [["rbln0"]])  # a group the next call must replace
        h.node.inject_fault(fault)
        if expected is None:
            await asyncio.wait_for(h.kubelet.allocate(NPU, [["rbln0", "rbln1"]]), CALL_GUARD_S)
        else:
            message = await rejected(h, NPU, ["rbln0", "rbln1"])
            assert expected in message.lower(), message
            assert lock_is_free(h.node.rsd_lock_path)
            response = await h.kubelet.allocate(NPU, [["rbln0", "rbln1"]])
            assert len(response.container_responses) == 1
        assert groups(h) == {next(iter(groups(h))): ["rbln0", "rbln1"]}
        groups_are_consistent(h.node)
        await assert_settles(h, base, [NPU])
        no_crash_records(h.daemon, [ALLOCATION_FAILED] if expected else [])


# ---------------------------------------------------------------- c. status files
async def test_flapping_unreadable_and_deleted_status_files() -> None:
    async with launch("rebel-4", interval="200ms") as h:
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        changed = "Device state changed"

        async def step(value: int | str | None, health: str, status: str | None) -> None:
            """Set rbln1's status; wait until a scan saw it and the kubelet shows ``health``."""
            before = len(h.daemon.find(changed, device="rbln1", status=status))
            h.node.set_status("rbln1", value)
            if status is not None:
                await h.daemon.await_log(changed, device="rbln1", status=status, count=before + 1)
            else:  # neither health nor shown status changes: nothing is logged
                await next_reconcile(h.daemon)
                await next_reconcile(h.daemon)
            view = await h.kubelet.wait_for(NPU, lambda v: v.health("rbln1") == health)
            assert view.count("Healthy") == 3 + (health == "Healthy"), view

        await step(4, "Unhealthy", "FAULT")
        await step(0, "Healthy", "READY")
        await step(1, "Unhealthy", "BUSY")
        messages = sent(h)
        await step(4, "Unhealthy", "FAULT")
        # An unreadable status after FAULT stays Unhealthy; so does a deleted file.
        await step("garbage", "Unhealthy", "UNREADABLE (last read FAULT)")
        await step(None, "Unhealthy", None)
        # BUSY -> FAULT -> unreadable -> deleted changed nothing the kubelet sees.
        assert sent(h) == messages
        await step(0, "Healthy", "READY")
        # Without an unresolved fault, unreadable is Healthy.
        await step(None, "Healthy", "UNREADABLE")
        await step("garbage", "Healthy", None)
        await step(5, "Unhealthy", "FINISH")
        await step(0, "Healthy", "READY")

        # Flips faster than the scan interval: whatever the scans caught in between,
        # the final value decides once it settles.
        for _ in range(8):
            for value in (4, 1, 0):
                h.node.set_status("rbln2", value)
                h.node.set_status("rbln3", 4 - value)
                await asyncio.sleep(0.03)
        h.node.set_status("rbln3", 4)
        await next_reconcile(h.daemon)
        view = await h.kubelet.wait_for(
            NPU, lambda v: v.health("rbln2") == "Healthy" and v.health("rbln3") == "Unhealthy"
        )
        assert view.health("rbln0") == "Healthy" and view.health("rbln1") == "Healthy"
        await assert_settles(h, base, [NPU])
        no_crash_records(h.daemon)


# ---------------------------------------------------------------- d. inventory changes
async def test_devices_added_removed_and_repartitioned_between_scans() -> None:
    async with launch("rebel-4", interval="300ms") as h:
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        stopped = "Stopped device plugin for absent resource"

        device = h.node.layout.device("rbln3")
        h.node.remove_device("rbln3")
        await h.kubelet.wait_for(NPU, lambda v: v.ids == ["rbln0", "rbln1", "rbln2"])
        h.node.add_device(device)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)

        h.node.repartition("rbln0", 4)  # vf-4: the PF is no longer advertised itself
        vf4 = await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)
        assert vf4.ids == ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"]
        await h.kubelet.wait_for(NPU, lambda v: v.ids == ["rbln1", "rbln2", "rbln3"])
        assert h.sockets() == expected_sockets([NPU, VF4])
        response = await h.kubelet.allocate(VF4, [["rbln0-2", "rbln0-1"]])
        assert response.container_responses[0].devices[0].container_path == "/dev/rsd0"

        h.node.repartition("rbln0", 1)  # vf-1: the vf-4 plugin goes away
        await h.daemon.await_log(stopped, resourceName=VF4)
        vf1 = await h.kubelet.wait_for(VF1, lambda v: v.ids == ["rbln0-0"])
        assert vf1.health("rbln0-0") == "Healthy"
        assert h.kubelet.stream_ended(VF4) is not None
        assert h.sockets() == expected_sockets([NPU, VF1])

        h.node.repartition("rbln0", 0)  # back to a plain PF
        await h.daemon.await_log(stopped, resourceName=VF1)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        assert h.sockets() == expected_sockets([NPU])

        for name in ("rbln0", "rbln1", "rbln2", "rbln3"):
            h.node.remove_device(name)
        await h.daemon.await_log(stopped, resourceName=NPU)
        assert h.sockets() == ["kubelet.sock"]
        h.node.add_device(device)
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation == 2 and v.ids == ["rbln3"])
        assert view.count("Healthy") == 1
        await assert_settles(h, base, [NPU])
        no_crash_records(h.daemon)


# ---------------------------------------------------------------- e. kubelet directory
async def test_kubelet_directory_renamed_away_and_back() -> None:
    async with launch("rebel-4", interval="300ms") as h:
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        kdir = h.node.kubelet_dir
        away = kdir.with_name("kubelet.away")
        kdir.rename(away)
        socket_path = str(kdir / socket_name(NPU))
        # The plugin's socket is gone (a warn naming it), so the plugin starts again ...
        await h.daemon.await_log(None, level="warn", resourceName=NPU, socketPath=socket_path)
        # ... and the daemon waits for the kubelet's directory, without creating it.
        (missing,) = await h.daemon.await_log(KUBELET_DIR_MISSING)
        assert missing["level"] == "warn" and missing["path"] == str(kdir)
        await next_reconcile(h.daemon)
        assert not kdir.exists()  # waited for, never created
        away.rename(kdir)
        await h.daemon.await_log(KUBELET_DIR_FOUND, path=str(kdir))
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation >= 2 and v.messages > 0)
        assert view.count("Healthy") == 4
        await assert_settles(h, base, [NPU])
        assert h.entries() == expected_entries([NPU])
        assert len(h.daemon.find(KUBELET_DIR_MISSING)) == 1
        no_crash_records(h.daemon, [REGISTRATION_FAILED])


async def test_kubelet_directory_deleted_then_kubelet_comes_back() -> None:
    async with launch("rebel-4", interval="300ms") as h:
        await registered(h, {NPU: 4})
        base = await take_baseline(h, [NPU])
        await h.kubelet.stop()
        shutil.rmtree(h.node.kubelet_dir)
        await h.daemon.await_log(KUBELET_DIR_MISSING)
        await next_reconcile(h.daemon)
        await next_reconcile(h.daemon)
        assert h.daemon.proc.poll() is None
        assert not h.node.kubelet_dir.exists()
        await h.kubelet.start()
        view = await h.kubelet.wait_for(NPU, lambda v: v.generation >= 2 and v.messages > 0)
        assert view.count("Healthy") == 4
        await assert_settles(h, base, [NPU])
        assert h.entries() == expected_entries([NPU])
        assert len(h.daemon.find(KUBELET_DIR_MISSING)) == 1
        no_crash_records(h.daemon, [REGISTRATION_FAILED])


# ---------------------------------------------------------------- f. stale socket files
async def test_stale_files_at_plugin_socket_paths_are_replaced() -> None:
    blocker = None

    def litter(node: SimNode) -> None:
        nonlocal blocker
        kdir = node.kubelet_dir
        # A crashed instance leaves its socket file behind: bound, nobody listening.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(str(kdir / socket_name(NPU)))
        (kdir / socket_name(VF4)).write_text("not a socket\n")
        blocker = kdir / socket_name(VF1)
        blocker.mkdir()  # cannot be replaced: that one plugin waits, the rest serve

    async with launch("rebel-sriov", before_start=litter) as h:
        await registered(h, {NPU: 2, VF4: 4})
        # An error naming the resource and the path it cannot take over.
        await h.daemon.await_log(None, level="error", resourceName=VF1, socketPath=str(blocker))
        assert h.kubelet.view(VF1) is None
        assert blocker is not None
        blocker.rmdir()
        await registered(h, SRIOV_COUNTS)
        base = await take_baseline(h, list(SRIOV_COUNTS))
        await assert_settles(h, base, list(SRIOV_COUNTS))
        assert h.entries() == expected_entries(SRIOV_COUNTS)
        response = await h.kubelet.allocate(NPU, [["rbln2"]])
        assert len(response.container_responses) == 1
        no_crash_records(h.daemon, [SERVER_FAILED])


# ---------------------------------------------------------------- g. RSD lock contention
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()  # hold until the test closes our stdin
"""


async def test_a_lock_timeout_after_queueing_names_the_whole_budget() -> None:
    """An allocation that queued behind this daemon's own for part of the 5 s budget, and
    then met a lock another process holds, waited 5 s: its message says 5 s and how much
    of it was queueing, not the remainder the file lock was given."""
    async with launch("rebel-sriov") as h:
        await registered(h, SRIOV_COUNTS)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(h.node.rsd_lock_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

        async def refused(resource: str, ids: list[str]) -> str:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await allocate_direct(h.node, resource, [ids], deadline=CALL_GUARD_S)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            return caught.value.details() or ""

        try:
            assert holder.stdout is not None
            assert await asyncio.to_thread(holder.stdout.readline) == "locked\n"
            first = asyncio.ensure_future(refused(NPU, ["rbln2"]))
            await asyncio.sleep(1.5)  # the second queues behind the first for ~3.5 s
            second = await refused(VF4, ["rbln0-0", "rbln0-1"])
            await first
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(5)
        assert f"timed out after 5 s waiting for the RSD lock {h.node.rsd_lock_path} (" in second
        assert "s of it queued behind this daemon's earlier allocations)" in second, second
        assert groups(h) == {}


async def test_allocates_racing_a_lock_held_by_another_process() -> None:
    async with launch("rebel-sriov") as h:
        await registered(h, SRIOV_COUNTS)
        base = await take_baseline(h, list(SRIOV_COUNTS))
        lock = h.node.rsd_lock_path

        async def lock_timeout(resource: str, ids: list[str]) -> str:
            # Our own deadline, far past the 5 s lock budget: an allocation that waited
            # longer than the policy allows shows up as a wrong answer, not a client timeout.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await allocate_direct(h.node, resource, [ids], deadline=CALL_GUARD_S)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            return caught.value.details() or ""

        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(lock)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert await asyncio.to_thread(holder.stdout.readline) == "locked\n"
            first, second = await asyncio.gather(
                lock_timeout(NPU, ["rbln2"]), lock_timeout(VF4, ["rbln0-0", "rbln0-1"])
            )
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(5)
        for message in (first, second):
            assert "timed out after 5 s waiting for the RSD lock" in message, message
            assert str(lock) in message
        assert groups(h) == {}
        a, b = await asyncio.gather(
            h.kubelet.allocate(NPU, [["rbln2"]]), h.kubelet.allocate(VF4, [["rbln0-0", "rbln0-1"]])
        )
        paths = {r.container_responses[0].devices[0].host_path for r in (a, b)}
        assert paths == {str(h.node.dev_root / "rsd1"), str(h.node.dev_root / "rsd2")}
        assert sorted(groups(h).values()) == [["rbln0-0", "rbln0-1"], ["rbln2"]]
        groups_are_consistent(h.node)
        await assert_settles(h, base, list(SRIOV_COUNTS))
        no_crash_records(h.daemon, [ALLOCATION_FAILED])


# ---------------------------------------------------------------- h. SIGTERM mid-Allocate
async def test_sigterm_during_an_allocate() -> None:
    async with launch("rebel-4") as h:
        await registered(h, {NPU: 4})
        h.node.inject_fault(Fault("hold", commands=("group-create",), remaining=1))
        call = asyncio.create_task(h.kubelet.allocate(NPU, [["rbln0", "rbln1"]]))
        # group-create is in flight, held until released (never, here).
        await wait_until(lambda: bool(h.node.held()), 30, "the group-create call")
        ((create_pid, command),) = h.node.held()
        assert command == "group-create"
        try:
            code = await asyncio.to_thread(h.daemon.stop, signal.SIGTERM, SHUTDOWN_GUARD_S)
            assert code == 0
            with pytest.raises(grpc.aio.AioRpcError):
                await asyncio.wait_for(call, CALL_GUARD_S)
            assert h.sockets() == ["kubelet.sock"]
            # The daemon took its rbln-smi child down with it: nothing changes groups
            # later. A held call never ends by itself, so an orphan would stay alive.
            await wait_until(
                lambda: not pid_alive(create_pid), 30, "rbln-smi to go with the daemon"
            )
            assert lock_is_free(h.node.rsd_lock_path)
        finally:
            h.node.release_held()  # an orphan (the failure above) ends as it would have
        assert groups(h) == {}  # the held create never ran
        groups_are_consistent(h.node)
        # FINDINGS (reported, not fixed here: shutdown is another change's scope).
        # Stopping the server cancels the in-flight Allocate after its grace period; gRPC
        # logs that cancellation as an error record, and the cancelled rbln-smi reap is
        # still pending when the loop closes, leaving asyncio tracebacks on stderr.
        cut_off = "Exception not handled by _handle_exceptions in servicer method"
        no_crash_records(
            h.daemon,
            [ALLOCATION_FAILED, f"{cut_off} [/v1beta1.DevicePlugin/Allocate]"],
            check_stderr=False,
        )
        assert h.daemon.find("Shutdown complete", signal="SIGTERM")


# ---------------------------------------------------------------- i. crash and restart
async def test_sigkilled_daemon_is_replaced_by_a_clean_instance() -> None:
    async with launch("rebel-sriov") as h:
        await registered(h, SRIOV_COUNTS)
        h.node.set_status("rbln2", 4)
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln2") == "Unhealthy")
        h.node.set_status("rbln2", "garbage")  # the old instance keeps it Unhealthy
        await h.daemon.await_log("Device state changed", status="UNREADABLE (last read FAULT)")

        h.daemon.proc.send_signal(signal.SIGKILL)
        h.daemon.proc.wait(5)
        assert h.sockets() == expected_sockets(SRIOV_COUNTS)  # left behind by the crash

        h.new_daemon()
        for resource, count in SRIOV_COUNTS.items():
            await h.kubelet.wait_for(resource, device_count(count, generation=2), 15)
        # A new instance starts with an empty history: unreadable is Healthy again.
        view = h.kubelet.view(NPU)
        assert view is not None and view.health("rbln2") == "Healthy"
        base = await take_baseline(h, list(SRIOV_COUNTS))
        await assert_settles(h, base, list(SRIOV_COUNTS))
        assert h.entries() == expected_entries(SRIOV_COUNTS)
        response = await h.kubelet.allocate(VF1, [["rbln1-0"]])
        assert len(response.container_responses) == 1
        no_crash_records(h.daemon)
