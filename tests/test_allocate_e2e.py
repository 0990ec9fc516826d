"""Allocate end to end: final status check, RSD groups, device specs, CDI annotation."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from rbln_device_plugin_sim.state import Fault

from .fault_helpers import wait_until
from .inprocess import InProcess as Harness
from .inprocess import running
from .simnode import rejected

NPU = "rebellions.ai/npu"
VF4 = "rebellions.ai/npu-vf4"
VF1 = "rebellions.ai/npu-vf1"
ANNOTATION = {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}

# Every test on the module's loop: the shared daemon below serves the whole module.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def _shared_rebel4() -> AsyncIterator[Harness]:
    # No periodic scan: an rbln-smi fault a test injects meets only that test's requests.
    async with running("rebel-4", interval="1h") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        yield h


@pytest.fixture
def rebel4(_shared_rebel4: Harness) -> Harness:
    """One rebel-4 daemon for the tests that refuse requests or replace groups only.

    None of them faults a device's status (the health history would keep it), and each
    compares the groups before and after itself, never with a fixed set.
    """
    return _shared_rebel4.for_test()


def specs(response: object) -> list[tuple[str, str, str]]:
    return [
        (d.container_path, d.host_path, d.permissions)
        for d in response.devices  # type: ignore[attr-defined]
    ]


def groups(h: Harness) -> dict[str, list[str]]:
    """Non-default RSD groups as the simulated rbln-smi holds them: group id -> devices."""
    return {gid: sorted(names) for gid, names in h.node.groups().items() if gid != "0"}


async def test_single_container_pf_allocation() -> None:
    async with running("atom-max-8") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        # A group-create that takes 0.4 s: the durations reported must include it.
        h.node.inject_fault(Fault("slow", commands=("group-create",), delay=0.4, remaining=1))
        response = await h.kubelet.allocate(NPU, [["rbln2", "rbln0"]])
        (container,) = response.container_responses
        dev = h.node.dev_root
        assert specs(container) == [
            ("/dev/rsd0", str(dev / "rsd1"), "rw"),
            ("/dev/rbln2", str(dev / "rbln2"), "rw"),
            ("/dev/rbln0", str(dev / "rbln0"), "rw"),
        ]
        assert dict(container.annotations) == ANNOTATION
        assert (dev / "rsd1").exists()
        assert groups(h) == {"1": ["rbln0", "rbln2"]}
        assert not list(h.node.cdi_root.glob("*")), "no CDI spec is written"
        (done,) = await h.daemon.await_log("Completed container allocation")
        assert done["deviceIDs"] == ["rbln2", "rbln0"]
        # Each bus ID stands next to its device, in the kubelet's order (not sorted on
        # its own, which would pair rbln2 with rbln0's address).
        bus = {d.name: d.bus_id for d in h.node.layout.devices}
        assert bus["rbln2"] > bus["rbln0"]
        assert done["busIDs"] == [bus["rbln2"], bus["rbln0"]]
        assert done["hostRsdPath"] == str(dev / "rsd1")
        assert done["durationMs"] >= 400
        assert h.daemon.find(
            "Starting container allocation",
            deviceIDs=["rbln2", "rbln0"],
            busIDs=[bus["rbln2"], bus["rbln0"]],
        )
        (recreated,) = await h.daemon.await_log("Recreated RSD group")
        assert recreated["level"] == "debug"
        assert 400 <= recreated["durationMs"] <= done["durationMs"]


async def test_multi_container_request_gets_one_group_each() -> None:
    async with running("atom-max-8") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 32)
        response = await h.kubelet.allocate(NPU, [["rbln0", "rbln1"], ["rbln8"]])
        first, second = response.container_responses
        assert specs(first)[0][1] != specs(second)[0][1]
        assert len(groups(h)) == 2


async def test_reallocating_a_device_replaces_its_old_group() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        await h.kubelet.allocate(NPU, [["rbln0", "rbln1"]])
        await h.kubelet.allocate(NPU, [["rbln1"]])
        assert groups(h) == {"1": ["rbln1"]}


async def test_vf_allocation_creates_a_group_with_vf_nodes() -> None:
    async with running("rebel-sriov") as h:
        await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)
        response = await h.kubelet.allocate(VF4, [["rbln0-1", "rbln0-0"]])
        (container,) = response.container_responses
        dev = h.node.dev_root
        assert specs(container)[0] == ("/dev/rsd0", str(dev / "rsd1"), "rw")
        assert specs(container)[1:] == [
            ("/dev/rbln0-1", str(dev / "rbln0-1"), "rw"),
            ("/dev/rbln0-0", str(dev / "rbln0-0"), "rw"),
        ]
        assert dict(container.annotations) == ANNOTATION
        await h.kubelet.wait_for(VF1, lambda v: len(v.devices) == 1)
        response = await h.kubelet.allocate(VF1, [["rbln1-0"]])
        assert specs(response.container_responses[0])[0][1] == str(dev / "rsd2")


@pytest.mark.parametrize(
    ("containers", "expected"),
    [([["rbln99"]], "rbln99"),
     ([["../../etc/passwd"]], "../../etc/passwd"),
     ([[]], "no devices"),
     ([], "no containers"),
     ([["rbln0", "rbln0"]], "more than once"),
     ([["rbln0"], ["rbln1", "x" * 5000]], "xxx...")],
)  # fmt: skip
async def test_bad_requests_are_rejected_without_touching_the_node(
    rebel4: Harness, containers: list[list[str]], expected: str
) -> None:
    h = rebel4
    before = h.node.groups()
    message = await rejected(h, NPU, containers)
    assert expected in message and NPU in message
    assert len(message) < 2000
    assert h.node.groups() == before
    (failed,) = await h.daemon.await_log("Container allocation failed")
    assert failed["level"] == "error" and failed["err"] and "durationMs" in failed


async def test_unhealthy_device_is_rejected_by_the_final_check() -> None:
    async with running("rebel-4", interval="1h") as h:  # no scan sees the fault
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        h.node.set_status("rbln3", 4)
        message = await rejected(h, NPU, [["rbln2", "rbln3"]])
        assert "rbln3 is FAULT" in message
        assert groups(h) == {}
        # The read fed the history: an unreadable status now keeps rbln3 Unhealthy.
        h.node.set_status("rbln3", None)
        message = await rejected(h, NPU, [["rbln3"]])
        assert "rbln3 is UNREADABLE (last read FAULT)" in message
        h.node.set_status("rbln3", 0)
        response = await h.kubelet.allocate(NPU, [["rbln3"]])
        assert len(response.container_responses) == 1


async def test_a_fault_the_final_check_finds_reaches_the_kubelet_before_any_scan() -> None:
    async with running("rebel-4", interval="1h") as h:  # no scan within the test
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        scans = len(h.daemon.find("Reconciled device inventory"))
        h.node.set_status("rbln3", 4)
        assert "rbln3 is FAULT" in await rejected(h, NPU, [["rbln2", "rbln3"]])
        view = await h.kubelet.wait_for(NPU, lambda v: v.health("rbln3") == "Unhealthy")
        assert view.health("rbln2") == "Healthy"
        (changed,) = await h.daemon.await_log("Device state changed")
        assert changed["device"] == "rbln3" and changed["status"] == "FAULT"
        assert changed["healthyCount"] == 3 and changed["unhealthyCount"] == 1
        # A recovery the check reads is published at once as well.
        h.node.set_status("rbln3", 0)
        await h.kubelet.allocate(NPU, [["rbln3"]])
        await h.kubelet.wait_for(NPU, lambda v: v.health("rbln3") == "Healthy")
        assert len(h.daemon.find("Reconciled device inventory")) == scans


async def test_an_id_shared_by_two_containers_is_refused_before_any_host_access(
    rebel4: Harness,
) -> None:
    h = rebel4
    groups = h.node.groups()
    h.node.inject_fault(Fault("error"))  # any rbln-smi call would fail differently
    try:
        message = await rejected(h, NPU, [["rbln1", "rbln2"], ["rbln2"]])
    finally:
        h.node.clear_faults()
    assert "'rbln2' requested by more than one container" in message
    assert "rbln1" not in message.split(":", 1)[1]
    assert h.node.groups() == groups  # no group was touched
    # Distinct devices in two containers: two groups.
    response = await h.kubelet.allocate(NPU, [["rbln1"], ["rbln2"]])
    assert len(response.container_responses) == 2


@pytest.mark.parametrize(
    ("fault", "expected"),
    [(Fault("error", commands=("group-create",)), "exit"),
     (Fault("garbage", commands=("list-groups",)), "JSON"),
     pytest.param(Fault("hang", commands=("list-groups",)), "timed out",
                  marks=pytest.mark.slow)],  # waits out the 5 s rbln-smi limit
)  # fmt: skip
async def test_rbln_smi_failures_fail_the_request_and_the_daemon_serves_on(
    rebel4: Harness, fault: Fault, expected: str
) -> None:
    h = rebel4
    await h.kubelet.allocate(NPU, [["rbln0"]])  # a group to delete next time
    h.node.inject_fault(fault)
    try:
        message = await rejected(h, NPU, [["rbln0"]])
    finally:
        h.node.clear_faults()
    assert expected.lower() in message.lower()
    response = await h.kubelet.allocate(NPU, [["rbln1"]])
    assert len(response.container_responses) == 1
    assert await h.kubelet.preferred(NPU, ["rbln0", "rbln1"], [], 1)
    _assert_lock_free(h.node.rsd_lock_path)


@pytest.mark.slow  # waits out the 5 s wait for the group's node
async def test_missing_rsd_node_fails_after_polling() -> None:
    async with running("rebel-4") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        # The driver never creates the node where the daemon looks for it.
        elsewhere = h.node.root / "elsewhere"
        elsewhere.mkdir()
        with h.node.store.transaction() as state:
            state.dev_root = str(elsewhere)
        message = await rejected(h, NPU, [["rbln0"]])
        assert "rsd1" in message
        assert groups(h) == {"1": ["rbln0"]}  # the group exists: no rollback is claimed
        _assert_lock_free(h.node.rsd_lock_path)


@pytest.mark.slow  # waits out the 5 s lock budget
async def test_lock_held_elsewhere_times_out_cleanly(rebel4: Harness) -> None:
    h = rebel4
    h.node.rsd_lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(h.node.rsd_lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        message = await rejected(h, NPU, [["rbln0"]])
        assert "lock" in message.lower()
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    response = await h.kubelet.allocate(NPU, [["rbln0"]])
    assert len(response.container_responses) == 1


async def test_other_resources_answer_while_an_allocate_waits() -> None:
    async with running("rebel-sriov") as h:
        await h.kubelet.wait_for(VF4, lambda v: len(v.devices) == 4)
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 2)
        h.node.inject_fault(Fault("hold", commands=("group-create",), remaining=1))
        waiting = asyncio.create_task(h.kubelet.allocate(VF4, [["rbln0-0"]]))
        try:
            # The VF4 allocation holds the RSD lock, inside its group-create, until released.
            await wait_until(lambda: bool(h.node.held()), 30, "the held group-create")
            answer = await h.kubelet.preferred(NPU, ["rbln2", "rbln3"], [], 1)
            assert answer == ["rbln2"]
            assert not waiting.done()
        finally:
            h.node.release_held()
        assert len((await waiting).container_responses) == 1


async def test_concurrent_allocates_across_resources_all_succeed() -> None:
    async with running("rebel-sriov") as h:
        for resource, count in ((VF4, 4), (VF1, 1), (NPU, 2)):
            await h.kubelet.wait_for(resource, lambda v, c=count: len(v.devices) == c)
        requests = [(VF4, [f"rbln0-{k}"]) for k in range(4)]
        requests += [(VF1, ["rbln1-0"]), (NPU, ["rbln2"]), (NPU, ["rbln3"])]
        responses = await asyncio.gather(*(h.kubelet.allocate(r, [ids]) for r, ids in requests))
        rsd_paths = [specs(resp.container_responses[0])[0][1] for resp in responses]
        assert len(set(rsd_paths)) == len(requests)
        final = groups(h)
        assert len(final) == len(requests)
        assert sorted(n for names in final.values() for n in names) == sorted(
            i for _, ids in requests for i in ids
        )
        for path in rsd_paths:
            assert Path(path).exists()
        _assert_lock_free(h.node.rsd_lock_path)


def _assert_lock_free(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if anyone still holds it
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


async def test_a_driver_reload_between_scans_never_hands_out_a_wrong_device() -> None:
    # No periodic scan within the test: the daemon's snapshot stays the pre-reload one.
    async with running("rebel-4", interval="1h") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        before = {d.name: d.bus_id for d in h.node.layout.devices}
        scans = len(h.daemon.find("Reconciled device inventory"))
        h.node.renumber({"rbln0": "rbln1", "rbln1": "rbln0"})
        message = await rejected(h, NPU, [["rbln0", "rbln2"]])
        assert "rbln0" in message and before["rbln0"] in message and before["rbln1"] in message
        assert groups(h) == {}  # no group was touched
        (record,) = await h.daemon.await_log(
            "Device mapping changed since the last scan; allocation refused, rescanning"
        )
        assert record["level"] == "error" and record["device"] == "rbln0"
        assert record["snapshotBusID"] == before["rbln0"]
        assert record["currentBusID"] == before["rbln1"]
        # The refusal asked for a scan; after it the same request gets the right devices.
        await h.daemon.await_log("Reconciled device inventory", count=scans + 1)
        response = await h.kubelet.allocate(NPU, [["rbln0", "rbln2"]])
        (container,) = response.container_responses
        (gid,) = groups(h)
        assert groups(h)[gid] == ["rbln0", "rbln2"]  # rbln-smi's names, after the reload
        dev = h.node.dev_root
        assert [s[1] for s in specs(container)] == [str(dev / f"rsd{gid}"), str(dev / "rbln0"),
                                                    str(dev / "rbln2")]  # fmt: skip
        errors = [r for r in h.daemon.records if r.get("level") == "error"]
        # The refusal is also the failure record every failed allocation logs, right
        # after the record that says why, so an alert keyed on it sees it too.
        failed = [r for r in errors if r["msg"] == "Container allocation failed"]
        assert len(failed) == 1 and errors == [record, failed[0]], errors
        assert failed[0]["deviceIDs"] == ["rbln0", "rbln2"] and "rbln0" in failed[0]["err"]
        assert before["rbln1"] in failed[0]["err"] and "durationMs" in failed[0]


async def test_a_driver_reload_during_group_creation_never_hands_out_the_faulted_device() -> None:
    """The race the listing check cannot see: the reload lands after Allocate's last
    listing, while ``group -c`` runs. The npu numbers it was given then name other PCI
    functions, so the group (and /dev/rbln0) would be the faulted neighbour's."""
    async with running("rebel-4", interval="1h") as h:
        await h.kubelet.wait_for(NPU, lambda v: len(v.devices) == 4)
        before = {d.name: d.bus_id for d in h.node.layout.devices}
        scans = len(h.daemon.find("Reconciled device inventory"))
        h.node.set_status("rbln1", 4)  # FAULT: the function that becomes rbln0 below
        h.node.inject_fault(Fault("hold", commands=("group-create",), remaining=1))
        refused = asyncio.create_task(rejected(h, NPU, [["rbln0"]]))
        try:
            await wait_until(lambda: bool(h.node.held()), 30, "the held group-create")
            h.node.renumber({"rbln0": "rbln1", "rbln1": "rbln0"})
        finally:
            h.node.release_held()
        message = await refused
        assert "renumbered" in message, message
        assert before["rbln0"] in message and before["rbln1"] in message, message
        assert groups(h) == {}, "the group of the wrong device is destroyed again"
        (record,) = await h.daemon.await_log(
            "Device mapping changed since the last scan; allocation refused, rescanning"
        )
        assert record["device"] == "rbln0" and record["snapshotBusID"] == before["rbln0"]
        # The record names what the group held when it was read back after creation.
        assert record["groupBusIDs"] == [before["rbln1"]] and record["groupDestroyed"] is True
        assert not [r for r in h.daemon.records if r["msg"] == "Completed container allocation"]
        # The refusal asked for a scan: rbln0 is now the faulted function, and is published
        # Unhealthy; rbln1 (the healthy one) Healthy.
        await h.daemon.await_log("Reconciled device inventory", count=scans + 1)
        view = await h.kubelet.wait_for(
            NPU, lambda v: {d.ID: d.health for d in v.devices}.get("rbln0") == "Unhealthy"
        )
        assert {d.ID: d.health for d in view.devices}["rbln1"] == "Healthy"
        assert "rbln0 is FAULT" in await rejected(h, NPU, [["rbln0"]])
