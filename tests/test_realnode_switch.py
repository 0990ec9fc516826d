"""A node switched between the two modes with pods running, on the real one-node cluster
(kubelet 1.37.2, the real scheduler, the simulated node ``layouts.mixed``): the chart's
release is upgraded from the device-plugin mode (``modeSwitch=true``) to ``mode=dra`` and
back (docs/dra.md, "Switching a node between the modes").

Two pods hold NPUs through the device plugin when the node moves to DRA: those two NPUs
are not in the ResourceSlice until the pods end, and a new claim gets another one. Moving
back with a claim's pod running: its NPU is not advertised until that pod ends. At every
step no NPU is in two running containers' device cgroups.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from .realnode import configs
from .realnode.cluster import Cluster, wait_for
from .realnode.layouts import EXPECTED
from .realnode.workloads import (
    NAMESPACE,
    NPU,
    PLUGIN_SETS,
    RELEASE,
    Consumer,
    plugin_records,
    ready_plugin_pods,
)
from .test_realnode_dra import (
    allocated,
    claim_template,
    plugin_said,
    pod_claim,
    published,
    run_claiming,
)

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(1500)]

DP_SETS = (*PLUGIN_SETS, "modeSwitch=true")
DRA_SETS = (*PLUGIN_SETS, "mode=dra")


def npus_in_cgroup(cluster: Cluster, pod: Consumer) -> set[int]:
    """The NPU minors (not the RSD group's) the container's devices cgroup allows."""
    allowed = (cluster.container_cgroup(cluster.pod(pod.name)) / "devices.list").read_text()
    major = cluster.char_major
    minors = {
        int(m.group(1)) for m in re.finditer(rf"^c {major}:(\d+) \w+$", allowed, flags=re.MULTILINE)
    }
    return {minor for minor in minors if minor < 128}


def assert_never_twice(cluster: Cluster, pods: list[Consumer]) -> None:
    seen: dict[int, str] = {}
    for pod in pods:
        for minor in npus_in_cgroup(cluster, pod):
            assert minor not in seen, f"NPU minor {minor} in {seen[minor]} and {pod.name}"
            seen[minor] = pod.name


def switch(cluster: Cluster, sets: tuple[str, ...], env: Any = ()) -> None:
    cluster.install_chart(RELEASE, NAMESPACE, sets=list(sets), extra_env=env)
    wait_for(
        "the new mode's plugin pod Ready",
        lambda: len(ready_plugin_pods(cluster)) == 1 and len(cluster.plugin_pods(NAMESPACE)) == 1,
        diagnose=lambda: plugin_said(cluster),
    )


def test_a_node_moves_to_dra_and_back_without_giving_an_npu_twice(realnode: Cluster) -> None:
    switch(realnode, DP_SETS)
    wait_for(f"allocatable {EXPECTED}", lambda: realnode.allocatable() == EXPECTED)
    first, second = Consumer(realnode, "dp-one", {NPU: 1}), Consumer(realnode, "dp-two", {NPU: 1})
    held = set(first.npus()) | set(second.npus())
    assert len(held) == 2
    running = [first, second]
    assert_never_twice(realnode, running)

    # ---- to DRA: the two held NPUs are not published while their pods run.
    switch(realnode, DRA_SETS, configs.in_cluster_api_env())
    layout = realnode.sim.layout
    hosting = {d.name for d in layout.devices if layout.vfs_of(d)}
    every = {d.name for d in layout.devices} - hosting
    wait_for(
        "the slice without the device-plugin pods' NPUs",
        lambda: set(published(realnode)) == every - held,
        diagnose=lambda: plugin_said(realnode),
    )
    assert first.untouched() and second.untouched()
    kept = [r for r in plugin_records(realnode) if r["msg"].startswith("Device held through")]
    assert {r["device"] for r in kept} == held
    claimed = run_claiming(realnode, "dra-one", claim_template("one-npu", "npu.rebellions.ai", 1))
    running.append(claimed)
    (got,) = claimed.npus()
    assert got not in held and [got] == allocated(pod_claim(realnode, "dra-one"))
    assert_never_twice(realnode, running)
    first.delete()
    running.remove(first)
    wait_for(
        f"{first.npus()[0]} published once its pod ended",
        lambda: set(published(realnode)) == every - set(second.npus()),
        diagnose=lambda: plugin_said(realnode),
    )
    second.delete()
    running.remove(second)
    wait_for("every NPU published", lambda: set(published(realnode)) == every)

    # ---- back to the device plugin with the claim's pod running: its NPU is kept back.
    switch(realnode, DP_SETS)
    wait_for(
        "allocatable without the claim's NPU",
        lambda: realnode.allocatable() == {**EXPECTED, NPU: EXPECTED[NPU] - 1},
        diagnose=lambda: plugin_said(realnode),
    )
    assert claimed.untouched()
    other = Consumer(realnode, "dp-three", {NPU: EXPECTED[NPU] - 1})
    running.append(other)
    assert got not in other.npus()
    assert_never_twice(realnode, running)
    other.delete()
    running.remove(other)
    # Without a DRA plugin the kubelet cannot unprepare the claim: a deleted pod stays
    # Terminating and the kubelet keeps listing it, so its NPU stays kept back. Removed
    # from the API server (its containers have stopped), it is listed no more.
    realnode.kubectl("delete", "pod", claimed.name, "--wait=false")
    wait_for("the claim's pod Terminating", lambda: realnode.pod(claimed.name)["metadata"].get(
        "deletionTimestamp"))  # fmt: skip
    assert realnode.allocatable()[NPU] == EXPECTED[NPU] - 1
    realnode.kubectl("delete", "pod", claimed.name, "--force", "--grace-period=0")
    wait_for(
        "the claim's NPU advertised once its pod is gone",
        lambda: realnode.allocatable() == EXPECTED,
        diagnose=lambda: plugin_said(realnode),
    )
