"""CDI as containerd 2.x sees it, on the real one-node cluster (``make e2e``).

The toolkit's ``rbln.yaml`` taken away and put back under a running plugin; a consumer
pod waiting in CreateContainerError meanwhile; and the ``field`` and ``both`` modes, in
which containerd gets the CDI device through CRI ``CDIDevices``. What containerd did is
read from containerd itself: the pod's status, and the container's OCI spec (``ctr
containers info``), whose environment carries the spec's edit and whose annotations show
whether the device came as an annotation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from rbln_device_plugin_sim.node import TOOLKIT_CDI_ENV, TOOLKIT_CDI_SPEC, TOOLKIT_CDI_SPEC_NAME

from .realnode import cluster as realnode_cluster
from .realnode.cluster import Cluster, wait_for
from .realnode.workloads import (
    NAMESPACE,
    NPU,
    Consumer,
    consumer,
    install,
    plugin_records,
    ready_plugin_pods,
)

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(900)]

RUNTIME = "rebellions.ai/npu=runtime"
ANNOTATION_KEY = "cdi.k8s.io/rebellions.ai_npu"
MISSING = (
    "No CDI spec defines the NPU CDI device; CDI-enabled container runtimes will refuse "
    "NPU containers until one is written"
)
FOUND = "CDI spec found for the NPU CDI device"
METRICS = "devicePlugin.metrics.prometheus.enabled=true"
DEPRECATED = "Passing CDI devices as annotations will be deprecated soon"
SCRAPE = (
    "import urllib.request; "
    "print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=10).read().decode())"
)


@pytest.fixture(scope="module", autouse=True)
def containerd_at_debug() -> Iterator[None]:
    """This module's cluster runs containerd at debug level: it logs the annotation
    deprecation there. Set before the module's cluster starts (autouse, module scope)."""
    original = realnode_cluster.CONTAINERD_CONFIG
    realnode_cluster.CONTAINERD_CONFIG = original + '\n[debug]\n  level = "debug"\n'
    yield
    realnode_cluster.CONTAINERD_CONFIG = original


@pytest.fixture
def cluster(realnode_plugin: Cluster) -> Iterator[Cluster]:
    yield realnode_plugin
    # Whatever a test did, the next one finds the toolkit's spec in place.
    realnode_plugin.place_cdi_spec(TOOLKIT_CDI_SPEC_NAME, TOOLKIT_CDI_SPEC)


def plugin_pod(cluster: Cluster) -> Any:
    (pod,) = ready_plugin_pods(cluster)
    return pod


def in_plugin(cluster: Cluster, *argv: str) -> str:
    name = plugin_pod(cluster)["metadata"]["name"]
    return cluster.kubectl("exec", "-n", NAMESPACE, name, "-c", "plugin", "--", *argv)


def cdi_gauge(cluster: Cluster) -> dict[str, float]:
    text = in_plugin(cluster, "python3", "-c", SCRAPE)
    out = {}
    for line in text.splitlines():
        if line.startswith("rbln_device_plugin_cdi_spec{"):
            state = line.split('state="', 1)[1].split('"', 1)[0]
            out[state] = float(line.rsplit(" ", 1)[1])
    return out


def inspect_cdi(cluster: Cluster) -> dict[str, Any]:
    done = in_plugin(cluster, "rbln-device-plugin", "inspect", "--output", "json")
    document: dict[str, Any] = json.loads(done)
    return document


def waiting(cluster: Cluster, name: str) -> dict[str, Any] | None:
    statuses = cluster.pod(name)["status"].get("containerStatuses") or []
    for status in statuses:
        state = status.get("state", {}).get("waiting")
        if state and state.get("reason") == "CreateContainerError":
            return dict(state)
    return None


def deprecations(cluster: Cluster, since: int) -> list[str]:
    """containerd's annotation-deprecation lines since ``since`` (a log offset): the
    consumer is the only container created meanwhile (the line names none)."""
    text = cluster.containerd_log()[since:]
    return [line for line in text.splitlines() if DEPRECATED in line]


def test_without_the_spec_the_pod_waits_and_starts_once_the_spec_is_back(
    cluster: Cluster,
) -> None:
    install(cluster, METRICS)
    before = plugin_pod(cluster)
    mark = len(plugin_records(cluster))
    cluster.remove_cdi_spec(TOOLKIT_CDI_SPEC_NAME)
    (warn,) = wait_for(
        "the missing-spec warning",
        lambda: [r for r in plugin_records(cluster)[mark:] if r["msg"] == MISSING],
    )
    assert warn["level"] == "warn" and warn["missing"] == [RUNTIME]
    assert wait_for("gauge missing", lambda: cdi_gauge(cluster).get("missing") == 1)
    document = inspect_cdi(cluster)
    assert document["cdi"]["state"] == "missing"
    assert "cdi-spec-missing" in [p["kind"] for p in document["problems"]]

    cluster.delete_pod("cdi-wait")
    cluster.apply(consumer("cdi-wait", {NPU: 1}))
    try:
        state = wait_for("CreateContainerError", lambda: waiting(cluster, "cdi-wait"))
        assert "unresolvable CDI devices rebellions.ai/npu=runtime" in state["message"], state
        print(f"waiting: {state}")
        # It stays there: the kubelet retries, containerd refuses each time.
        assert wait_for("a retry", lambda: cluster.pod("cdi-wait")["status"]["phase"] == "Pending")

        cluster.place_cdi_spec(TOOLKIT_CDI_SPEC_NAME, TOOLKIT_CDI_SPEC)
        running = cluster.wait_pod_phase("cdi-wait", "Running")
        (status,) = running["status"]["containerStatuses"]
        assert status["restartCount"] == 0
        (found,) = wait_for(
            "the spec-found record",
            lambda: [r for r in plugin_records(cluster)[mark:] if r["msg"] == FOUND],
        )
        assert found["missingSeconds"] > 0
        assert wait_for("gauge present", lambda: cdi_gauge(cluster).get("present") == 1)
        # Nothing restarted: the same plugin pod, never restarted.
        after = plugin_pod(cluster)
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    finally:
        cluster.delete_pod("cdi-wait")


@pytest.mark.parametrize("mode", ["annotation", "field", "both"])
def test_each_mode_starts_the_container_with_the_spec_edits(cluster: Cluster, mode: str) -> None:
    install(cluster, f"devicePlugin.cdiMode={mode}")
    since = len(cluster.containerd_log())
    pod = Consumer(cluster, f"cdi-{mode}", {NPU: 1})
    try:
        name, value = TOOLKIT_CDI_ENV
        assert pod.env.get(name) == value  # the spec's edit applied
        warned = deprecations(cluster, since)
        print(f"cdi-mode {mode}: containerd deprecation lines {len(warned)}")
        # The annotation draws containerd's deprecation line, with both too (it injects
        # the device once, and logs whenever the annotation is there); the field never.
        assert bool(warned) == (mode != "field"), warned
    finally:
        pod.delete()
