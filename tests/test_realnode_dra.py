"""The chart's dra mode on the real one-node cluster (kubelet 1.37.2, containerd 2.4 with
CDI, the real scheduler), against the simulated node ``layouts.mixed``.

The plugin reaches the API server in-cluster style (its service account's token and CA)
at the node's address (``configs.in_cluster_api_env``: the suite runs no service proxy),
and the API server enforces RBAC: the chart's ClusterRole is what lets it work. Pods get
their NPUs from ResourceClaims the scheduler allocates from the published slice, and from
the DeviceClass's extended resource for a pod that asks ``rebellions.ai/npu`` by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rbln_device_plugin.dra import names

from .realnode import artifacts, configs
from .realnode.cluster import NODE_NAME, Cluster, wait_for
from .realnode.workloads import (
    NAMESPACE,
    RELEASE,
    REPORT,
    Consumer,
    consumer,
    plugin_records,
    ready_plugin_pods,
)

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1500)]

DRA_SETS = ("mode=dra", "logging.level=debug", "devicePlugin.deviceScanInterval=1s")
# layouts.mixed as DRA devices: four whole NPUs of the ATOM card, the four VFs of the
# vf-4 PF and the one VF of the vf-1 PF; never the two PFs that host VFs.
DEVICE_TYPES = {"npu": 4, "npu-vf4": 4, "npu-vf1": 1}
DOMAIN = names.DRIVER_NAME


def node_slices(cluster: Cluster) -> list[Any]:
    found = cluster.kubectl_json(
        "get", "resourceslices", "--field-selector",
        f"spec.nodeName={NODE_NAME},spec.driver={DOMAIN}",
    )  # fmt: skip
    return list(found["items"])


def published(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Device name -> its attributes, over the node's slices."""
    return {
        device["name"]: device.get("attributes", {})
        for piece in node_slices(cluster)
        for device in piece["spec"].get("devices", [])
    }


def device_types(devices: dict[str, dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for attributes in devices.values():
        kind = attributes["deviceType"]["string"]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def claim_template(name: str, device_class: str, count: int, **extra: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if "selector" in extra:
        request["selectors"] = [{"cel": {"expression": extra["selector"]}}]
    if extra.get("tolerate"):  # a claim that may get a tainted (Unhealthy) device
        request["tolerations"] = [{"key": f"{DOMAIN}/unhealthy", "operator": "Exists"}]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "npus", "exactly": request}]}}
    if "match" in extra:
        spec["devices"]["constraints"] = [{"requests": ["npus"], "matchAttribute": extra["match"]}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": spec},
    }


def claiming_pod(name: str, template: str) -> dict[str, Any]:
    """A consumer (it reports its /dev and env, then stays) with one claim from a template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "npus", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": artifacts.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", REPORT],
                    "resources": {"claims": [{"name": "npus"}]},
                }
            ],
        },
    }


def pod_claim(cluster: Cluster, pod: str) -> Any:
    """The ResourceClaim the pod's template made for it."""
    status = cluster.pod(pod)["status"].get("resourceClaimStatuses") or []
    (entry,) = status
    return cluster.kubectl_json("get", "resourceclaim", entry["resourceClaimName"], "-n", "default")


def allocated(claim: Any) -> list[str]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return sorted(r["device"] for r in results if r["driver"] == DOMAIN)


def spec_file(cluster: Cluster, uid: str) -> Path:
    return cluster.cdi_dir("run") / names.spec_file_name(uid)


def events(cluster: Cluster, pod: str) -> list[str]:
    found = cluster.kubectl_json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}"
    )
    return [f"{e.get('reason')}: {e.get('message')}" for e in found["items"]]


def run_claiming(cluster: Cluster, name: str, template: dict[str, Any]) -> Consumer:
    cluster.delete_pod(name)
    cluster.apply(template)
    cluster.apply(claiming_pod(name, template["metadata"]["name"]))
    return Consumer(cluster, name, {}, created=True)


def plugin_said(cluster: Cluster) -> str:
    """The plugin pods' last lines, this run's and the previous container's."""
    parts = []
    for pod in cluster.plugin_pods(NAMESPACE):
        name = pod["metadata"]["name"]
        for previous in (True, False):
            try:
                text = cluster.pod_logs(NAMESPACE, name, "plugin", previous=previous)
            except Exception as exc:  # no previous container, or none yet
                text = repr(exc)
            parts.append(f"--- {name} previous={previous}\n{text[-2500:]}")
        parts.append(json.dumps(pod["status"].get("containerStatuses"), indent=1)[-1500:])
    return "\n".join(parts) + "\n" + cluster.diagnose()


@pytest.fixture(scope="module")
def dra(realnode: Cluster) -> Iterator[Cluster]:
    """The chart installed in dra mode, its plugin registered and its slice published."""
    realnode.install_chart(
        RELEASE, NAMESPACE, sets=list(DRA_SETS), extra_env=configs.in_cluster_api_env()
    )
    wait_for(
        "a Ready plugin pod",
        lambda: ready_plugin_pods(realnode),
        diagnose=lambda: plugin_said(realnode),
    )
    wait_for(
        f"a ResourceSlice with {DEVICE_TYPES}",
        lambda: device_types(published(realnode)) == DEVICE_TYPES,
        diagnose=lambda: plugin_said(realnode),
    )
    yield realnode


def test_dra_mode_publishes_one_slice_that_matches_the_node(dra: Cluster) -> None:
    (piece,) = node_slices(dra)
    spec = piece["spec"]
    assert spec["pool"]["name"] == NODE_NAME and spec["pool"]["resourceSliceCount"] == 1
    assert piece["metadata"]["ownerReferences"][0]["kind"] == "Node"
    devices = published(dra)
    layout = dra.sim.layout
    hosting = {d.name for d in layout.devices if layout.vfs_of(d)}
    assert set(devices) == {d.name for d in layout.devices} - hosting
    for name, attributes in devices.items():
        device = next(d for d in layout.devices if d.name == name)
        assert attributes["resource.kubernetes.io/pciBusID"] == {"string": device.bus_id}
        assert attributes["healthy"] == {"bool": True}
    # The device-plugin API offers nothing: one node serves its NPUs one way.
    assert dra.allocatable() == {}
    # The kubelet's plugin manager registers the plugin from its reconciler loop (once a
    # second, pkg/kubelet/pluginmanager): the slice may be written first.
    wait_for(
        "the plugin registered with the kubelet",
        lambda: any(
            r["msg"] == "DRA plugin registered with the kubelet" for r in plugin_records(dra)
        ),
        diagnose=lambda: plugin_said(dra),
    )


def test_a_claim_for_two_npus_under_one_pcie_root_runs_with_exactly_those(dra: Cluster) -> None:
    template = claim_template(
        "two-npus", "npu.rebellions.ai", 2, match="resource.kubernetes.io/pcieRoot"
    )
    pod = run_claiming(dra, "dra-two", template)
    try:
        claim = pod_claim(dra, "dra-two")
        devices = published(dra)
        assert pod.npus() == allocated(claim)
        assert len(pod.npus()) == 2 and "/dev/rsd0" in pod.devices
        roots = {json.dumps(devices[d]["resource.kubernetes.io/pcieRoot"]) for d in pod.npus()}
        assert len(roots) == 1
        assert spec_file(dra, claim["metadata"]["uid"]).is_file()
    finally:
        pod.delete()
    # Deleting the pod unprepares its claim: the claim's CDI spec goes.
    wait_for(
        "the claim's CDI spec removed",
        lambda: not spec_file(dra, claim["metadata"]["uid"]).exists(),
    )


def test_a_claim_for_a_vf4_vf_runs_with_that_vf_alone(dra: Cluster) -> None:
    pod = run_claiming(dra, "dra-vf4", claim_template("one-vf4", "npu-vf4.rebellions.ai", 1))
    try:
        claim = pod_claim(dra, "dra-vf4")
        (vf,) = allocated(claim)
        assert published(dra)[vf]["deviceType"] == {"string": "npu-vf4"}
        assert pod.npus() == [vf] and "/dev/rsd0" in pod.devices
    finally:
        pod.delete()


def test_a_pod_asking_npu_by_name_is_served_through_the_device_class(dra: Cluster) -> None:
    dra.delete_pod("dra-by-name")
    dra.apply(consumer("dra-by-name", {"rebellions.ai/npu": 1}))
    pod = Consumer(dra, "dra-by-name", {}, created=True)
    try:
        (npu,) = pod.npus()
        assert published(dra)[npu]["deviceType"] == {"string": "npu"}
        assert "/dev/rsd0" in pod.devices
    finally:
        pod.delete()


def test_a_claim_for_more_npus_than_the_node_has_stays_pending(dra: Cluster) -> None:
    dra.delete_pod("dra-too-many")
    dra.apply(claim_template("five-npus", "npu.rebellions.ai", 5))
    dra.apply(claiming_pod("dra-too-many", "five-npus"))
    try:
        said = wait_for(
            "the scheduler's reason",
            lambda: [e for e in events(dra, "dra-too-many") if e.startswith("FailedScheduling")],
        )
        assert "claim" in said[0], said
        assert dra.pod("dra-too-many")["status"]["phase"] == "Pending"
    finally:
        dra.delete_pod("dra-too-many")


def test_a_plugin_restart_between_prepare_and_unprepare_neither_leaks_nor_repeats(
    dra: Cluster,
) -> None:
    pod = run_claiming(dra, "dra-restart", claim_template("restart-one", "npu.rebellions.ai", 1))
    claim = pod_claim(dra, "dra-restart")
    uid = claim["metadata"]["uid"]
    (old,) = ready_plugin_pods(dra)
    dra.kubectl("delete", "pod", "-n", NAMESPACE, old["metadata"]["name"], "--wait=true")
    wait_for(
        "a new Ready plugin pod",
        lambda: [
            p for p in ready_plugin_pods(dra) if p["metadata"]["uid"] != old["metadata"]["uid"]
        ],
    )
    assert pod.untouched()
    records = plugin_records(dra)
    loaded = [r for r in records if r["msg"] == "DRA checkpoint loaded"]
    assert loaded and loaded[-1]["claimCount"] >= 1
    assert not [r for r in records if r["msg"] == "DRA claim prepared" and r["claimUID"] == uid]
    pod.delete()
    wait_for("the claim unprepared", lambda: not spec_file(dra, uid).exists())
    wait_for(
        "the unprepare record",
        lambda: [
            r
            for r in plugin_records(dra)
            if r["msg"] == "DRA claim unprepared" and r["claimUID"] == uid
        ],
    )


def test_a_device_faulted_after_allocation_is_refused_at_prepare_by_name(dra: Cluster) -> None:
    target = next(d for d in dra.sim.layout.devices if d.name == "rbln3")
    selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{target.bus_id}"'
    dra.sim.set_status("rbln3", 4)  # FAULT: published tainted; this claim tolerates that
    try:
        wait_for(
            "rbln3 published unhealthy",
            lambda: published(dra)["rbln3"]["healthy"] == {"bool": False},
        )
        dra.delete_pod("dra-faulted")
        dra.apply(
            claim_template(
                "the-faulted-one", "npu.rebellions.ai", 1, selector=selector, tolerate=True
            )
        )
        dra.apply(claiming_pod("dra-faulted", "the-faulted-one"))
        said = wait_for(
            "the kubelet's prepare failure",
            lambda: [e for e in events(dra, "dra-faulted") if "FailedPrepareDynamicResources" in e],
        )
        assert "rbln3" in said[0] and "FAULT" in said[0], said
        assert dra.pod("dra-faulted")["status"]["phase"] == "Pending"
    finally:
        dra.sim.set_status("rbln3", 0)
    # Healthy again: the kubelet's next periodic sync (the node's syncFrequency) prepares it.
    dra.wait_pod_phase("dra-faulted", "Running")
    dra.delete_pod("dra-faulted")


def test_a_kubelet_restart_registers_again_and_the_slice_comes_back(dra: Cluster) -> None:
    dra.kill("kubelet")
    dra.start_kubelet()
    wait_for("Ready node", dra.node_ready)
    # A starting kubelet deletes its node's slices; the plugin publishes them again.
    wait_for("the slice back", lambda: device_types(published(dra)) == DEVICE_TYPES)
    pod = run_claiming(
        dra, "dra-after-restart", claim_template("after-restart", "npu.rebellions.ai", 1)
    )
    pod.delete()


def test_helm_uninstall_removes_slices_and_classes_and_leaves_pods_running(dra: Cluster) -> None:
    pod = run_claiming(dra, "dra-stays", claim_template("stays", "npu.rebellions.ai", 1))
    uid = pod_claim(dra, "dra-stays")["metadata"]["uid"]
    dra.uninstall_chart(RELEASE, NAMESPACE)
    classes = dra.kubectl_json("get", "deviceclasses")["items"]
    assert not [c for c in classes if c["metadata"]["name"].endswith(".rebellions.ai")]
    # The kubelet wipes a driver's slices 30 s after its plugin went away for good.
    wait_for("the slices removed", lambda: not node_slices(dra), timeout=120)
    assert pod.untouched()
    # The pod's claim is still prepared (its CDI spec, the plugin's checkpoint on the
    # node): ending the pod needs NodeUnprepareResources, so its deletion waits for a
    # plugin. Installed again, the plugin finds the claim in its checkpoint and
    # unprepares it; the pod goes.
    dra.kubectl("delete", "pod", "dra-stays", "-n", "default", "--wait=false")
    assert spec_file(dra, uid).is_file()
    dra.install_chart(
        RELEASE, NAMESPACE, sets=list(DRA_SETS), extra_env=configs.in_cluster_api_env()
    )
    wait_for(
        "the pod gone once a plugin unprepared its claim",
        lambda: "dra-stays" not in {p["metadata"]["name"] for p in dra.pods("default")},
        diagnose=lambda: plugin_said(dra),
        timeout=120,
    )
    assert not spec_file(dra, uid).exists()
    records = plugin_records(dra)
    assert [r for r in records if r["msg"] == "DRA claim unprepared" and r["claimUID"] == uid]
