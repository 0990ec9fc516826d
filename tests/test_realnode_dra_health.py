"""Device health in dra mode on the real one-node cluster (kubelet 1.37.2 with
``ResourceHealthStatus`` on by default, the real scheduler and controller manager): a
faulted NPU shows Unhealthy, with its status, in the status of the pod holding it
(through the plugin's DRAResourceHealth stream), is tainted in the ResourceSlice so the
scheduler gives it to no new claim, and is evicted from under its pod only with the
chart's ``devicePlugin.draTaintNoExecute``.

Each test prints how long the fault took to reach the pod's status and the slice
(``MEASURED``), next to the plugin's scan interval (1 s here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .realnode import configs
from .realnode.cluster import Cluster, wait_for
from .realnode.workloads import NAMESPACE, RELEASE, plugin_records, ready_plugin_pods
from .test_realnode_dra import (
    DEVICE_TYPES,
    DRA_SETS,
    allocated,
    claim_template,
    claiming_pod,
    device_types,
    node_slices,
    plugin_said,
    pod_claim,
    published,
    run_claiming,
)

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1500)]

TAINT_KEY = "npu.rebellions.ai/unhealthy"


def install(cluster: Cluster, *sets: str) -> None:
    """The chart in dra mode (with ``sets``), once a Ready plugin pod runs with them and its
    slice is published."""
    before = {p["metadata"]["uid"] for p in ready_plugin_pods(cluster)}
    cluster.install_chart(
        RELEASE, NAMESPACE, sets=[*DRA_SETS, *sets], extra_env=configs.in_cluster_api_env()
    )
    wanted = "true" if "devicePlugin.draTaintNoExecute=true" in sets else "false"

    def serving() -> bool:
        for pod in ready_plugin_pods(cluster):
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            if env.get("RBLN_DRA_TAINT_NO_EXECUTE") == wanted and (
                pod["metadata"]["uid"] not in before or not before
            ):
                return True
        return False

    wait_for("a Ready plugin pod with the new values", serving,
             diagnose=lambda: plugin_said(cluster))  # fmt: skip
    wait_for("the slice", lambda: device_types(published(cluster)) == DEVICE_TYPES,
             diagnose=lambda: plugin_said(cluster))  # fmt: skip


@pytest.fixture(scope="module")
def dra(realnode: Cluster) -> Iterator[Cluster]:
    install(realnode)
    yield realnode


def device_health(cluster: Cluster, pod: str) -> list[dict[str, Any]]:
    """The pod's ``allocatedResourcesStatus`` entries, over its containers."""
    statuses = cluster.pod(pod)["status"].get("containerStatuses") or []
    return [
        resource
        for status in statuses
        for entry in status.get("allocatedResourcesStatus") or []
        for resource in entry.get("resources") or []
    ]


def taints(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    return {
        device["name"]: device["taints"]
        for piece in node_slices(cluster)
        for device in piece["spec"].get("devices", [])
        if device.get("taints")
    }


def timed(what: str, check: Callable[[], Any], since: float) -> tuple[Any, float]:
    """Wait for ``check``, polling every 0.1 s; what it returned and the seconds since
    ``since`` (a ``time.monotonic`` reading)."""
    found = wait_for(what, check, interval=0.1)
    return found, time.monotonic() - since


def scheduling_refused(cluster: Cluster, pod: str) -> bool:
    conditions = cluster.pod(pod)["status"].get("conditions") or []
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def test_a_fault_reaches_the_pod_status_and_taints_the_device_for_new_claims(
    dra: Cluster,
) -> None:
    holder = run_claiming(
        dra, "health-holder", claim_template("health-one", "npu.rebellions.ai", 1)
    )
    claim = pod_claim(dra, "health-holder")
    (device,) = allocated(claim)
    resource_id = f"k8s.npu.rebellions.ai/npu={claim['metadata']['uid']}-{device}"
    wait_for(
        "the device Healthy in the pod's status",
        lambda: (
            device_health(dra, "health-holder")
            == [{"resourceID": resource_id, "health": "Healthy", "message": "READY"}]
        ),
        diagnose=lambda: str(dra.pod("health-holder")["status"]),
    )

    started = time.monotonic()
    dra.sim.set_status(device, 4)  # FAULT
    try:
        _, to_status = timed(
            "the device Unhealthy with its status in the pod's status",
            lambda: (
                device_health(dra, "health-holder")
                == [{"resourceID": resource_id, "health": "Unhealthy", "message": "FAULT"}]
            ),
            started,
        )
        found, to_taint = timed("the taint", lambda: taints(dra).get(device), started)
        print(f"MEASURED fault -> pod status {to_status:.2f} s, fault -> taint {to_taint:.2f} s "
              "(scan interval 1 s)")  # fmt: skip
        (one,) = found
        assert (one["key"], one["value"], one["effect"]) == (TAINT_KEY, "FAULT", "NoSchedule")
        assert one["timeAdded"]
        assert set(taints(dra)) == {device}
        assert holder.untouched()  # NoSchedule: the pod keeps its device and runs on

        # A new claim for one NPU gets another one.
        other = run_claiming(
            dra, "health-other", claim_template("health-two", "npu.rebellions.ai", 1)
        )
        (given,) = allocated(pod_claim(dra, "health-other"))
        assert given != device
        other.delete()
    finally:
        dra.sim.set_status(device, 0)
    started = time.monotonic()
    _, untaint = timed("the taint gone", lambda: device not in taints(dra), started)
    _, healthy = timed(
        "the device Healthy again in the pod's status",
        lambda: (
            device_health(dra, "health-holder")
            == [{"resourceID": resource_id, "health": "Healthy", "message": "READY"}]
        ),
        started,
    )
    print(f"MEASURED recovery -> taint gone {untaint:.2f} s, -> pod status Healthy {healthy:.2f} s")
    records = plugin_records(dra)
    assert [r for r in records if r["msg"] == "Device tainted in the ResourceSlices"
            and r["device"] == device and r["value"] == "FAULT"]  # fmt: skip
    assert [r for r in records if r["msg"] == "Device taint removed from the ResourceSlices"
            and r["device"] == device]  # fmt: skip
    assert holder.untouched()
    holder.delete()


def test_a_tainted_device_is_never_allocated_and_is_again_once_it_recovers(dra: Cluster) -> None:
    whole = [d for d, a in published(dra).items() if a["deviceType"]["string"] == "npu"]
    assert len(whole) == DEVICE_TYPES["npu"]
    faulted = whole[-1]
    dra.sim.set_status(faulted, 4)
    try:
        wait_for("the taint", lambda: faulted in taints(dra))
        # Every whole NPU in one claim: the scheduler cannot allocate it while one is tainted
        # (were it allocated, the prepare would fail instead and the claim would show it).
        dra.delete_pod("health-all")
        dra.apply(claim_template("health-all", "npu.rebellions.ai", len(whole)))
        dra.apply(claiming_pod("health-all", "health-all"))
        wait_for("the pod unschedulable", lambda: scheduling_refused(dra, "health-all"))
        claim = pod_claim(dra, "health-all")
        assert not (claim.get("status") or {}).get("allocation"), claim["status"]
    finally:
        dra.sim.set_status(faulted, 0)
    wait_for("the taint gone", lambda: faulted not in taints(dra))
    dra.wait_pod_phase("health-all", "Running")
    assert allocated(pod_claim(dra, "health-all")) == sorted(whole)
    dra.delete_pod("health-all")


def test_no_execute_evicts_the_pod_holding_a_faulted_device_only_when_chosen(
    dra: Cluster,
) -> None:
    install(dra, "devicePlugin.draTaintNoExecute=true")
    try:
        victim = run_claiming(
            dra, "health-evicted", claim_template("health-evict", "npu.rebellions.ai", 1)
        )
        uid = dra.pod("health-evicted")["metadata"]["uid"]
        (device,) = allocated(pod_claim(dra, "health-evicted"))
        started = time.monotonic()
        dra.sim.set_status(device, 4)
        try:
            found, to_taint = timed("the NoExecute taint", lambda: taints(dra).get(device), started)
            assert [(t["key"], t["value"], t["effect"]) for t in found] == [
                (TAINT_KEY, "FAULT", "NoExecute")
            ]

            def evicted() -> bool:
                pods = {p["metadata"]["name"]: p for p in dra.pods("default")}
                pod = pods.get("health-evicted")
                return (
                    pod is None
                    or pod["metadata"]["uid"] != uid
                    or bool(pod["metadata"].get("deletionTimestamp"))
                )

            _, to_eviction = timed("the pod evicted", evicted, started)
            print(f"MEASURED NoExecute: fault -> taint {to_taint:.2f} s, fault -> pod deleted "
                  f"{to_eviction:.2f} s")  # fmt: skip
        finally:
            dra.sim.set_status(device, 0)
        wait_for("the taint gone", lambda: device not in taints(dra))
        del victim
    finally:
        dra.delete_pod("health-evicted")
        install(dra)
