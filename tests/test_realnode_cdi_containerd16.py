"""CDI as containerd 1.6 sees it, under the 1.34 kubelet, on the real one-node cluster.

The older pairing: Kubernetes 1.34.0's kubelet (three minors below the 1.37.2 control
plane, the skew policy's limit) with containerd 1.6.20, the release Debian bookworm ships,
built from the Go module proxy (``artifacts.LEGACY_TARGETS``), at debug level, where its
CRI plugin logs each container's OCI spec. Its config carries containerd 1.7's
``enable_cdi = true`` as an operator coming from 1.7 might leave it.

In each ``--cdi-mode`` the consumer starts with its device nodes and without the CDI
spec's edits, and containerd says nothing about CDI: 1.6 has no CDI code. Its debug
record of the CRI ``ContainerConfig`` it received shows the ``cdi.k8s.io/`` annotation
(``annotation``, ``both``), which it then leaves out of the OCI spec, and no CDI device
for ``field``: the ``CDIDevices`` field the kubelet fills is unknown to its CRI API
(``k8s.io/cri-api`` v0.25), so the message decodes without it. A missing spec stops
nothing either.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from rbln_device_plugin_sim.node import TOOLKIT_CDI_ENV, TOOLKIT_CDI_SPEC, TOOLKIT_CDI_SPEC_NAME

from .realnode import artifacts
from .realnode.cluster import Cluster, wait_for
from .realnode.layouts import EXPECTED
from .realnode.workloads import NPU, Consumer, install, plugin_records
from .test_realnode import upgrade_default, upgrade_with_surge

pytestmark = [
    pytest.mark.realnode(legacy_runtime=True),
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

ANNOTATION = "cdi.k8s.io/rebellions.ai_npu: rebellions.ai/npu=runtime"  # as Go prints a map
MISSING = (
    "No CDI spec defines the NPU CDI device; CDI-enabled container runtimes will refuse "
    "NPU containers until one is written"
)


@pytest.fixture
def cluster(realnode_plugin: Cluster) -> Iterator[Cluster]:
    yield realnode_plugin
    realnode_plugin.place_cdi_spec(TOOLKIT_CDI_SPEC_NAME, TOOLKIT_CDI_SPEC)


def container_spec(cluster: Cluster, since: int, pod: Consumer) -> str:
    """The OCI spec containerd 1.6 logged (debug) for the pod's container."""
    container_id = pod.container_id.split("://", 1)[1]
    marker = f'Container \\"{container_id}\\" spec:'
    for line in cluster.containerd_log()[since:].splitlines():
        if marker in line:
            return line
    raise AssertionError(f"containerd logged no spec for container {container_id}")


def received_config(cluster: Cluster, since: int, pod: Consumer) -> str:
    """The CRI ContainerConfig containerd 1.6 decoded for the pod's container (its debug
    record ``Container config``, pkg/cri/server/container_create.go)."""
    for line in cluster.containerd_log()[since:].splitlines():
        if "Container config &ContainerConfig{" in line and (
            f"io.kubernetes.pod.name: {pod.name}," in line
        ):
            return line
    raise AssertionError(f"containerd logged no container config for pod {pod.name}")


def cdi_lines(cluster: Cluster, since: int) -> list[str]:
    """containerd's lines since ``since`` that speak of CDI (2.x: the deprecation line,
    the injection, an unresolvable device) or name the plugin's CDI device."""
    pattern = re.compile(r"CDI|rebellions\.ai/npu=runtime")
    return [line for line in cluster.containerd_log()[since:].splitlines() if pattern.search(line)]


def test_the_node_runs_the_1_34_kubelet_with_containerd_1_6(realnode: Cluster) -> None:
    info = realnode.node_object()["status"]["nodeInfo"]
    assert info["kubeletVersion"] == artifacts.LEGACY_KUBERNETES_VERSION
    # (CRI's Version call answers without the tag's "v".)
    runtime = f"containerd://{artifacts.LEGACY_CONTAINERD_VERSION.removeprefix('v')}"
    assert info["containerRuntimeVersion"] == runtime
    # 1.6 took the config without a word about the CDI keys it does not know, and the CRI
    # config it runs with (logged whole at start) has no CDI setting at all.
    (started,) = [
        line
        for line in realnode.containerd_log().splitlines()
        if "Start cri plugin with config" in line
    ]
    assert "CDI" not in started, started
    assert not [line for line in realnode.containerd_log().splitlines() if "enable_cdi" in line]


@pytest.mark.parametrize("mode", ["annotation", "field", "both"])
def test_each_mode_starts_the_container_with_its_devices_and_without_the_spec_edits(
    cluster: Cluster, mode: str
) -> None:
    install(cluster, f"devicePlugin.cdiMode={mode}")
    since = len(cluster.containerd_log())
    pod = Consumer(cluster, f"cdi16-{mode}", {NPU: 1})
    try:
        (device,) = pod.npus()
        npu_of = {d.name: d.npu for d in cluster.sim.layout.devices}
        # The devices reached it: the kubelet's device list, which 1.6 applies as ever.
        assert pod.devices[f"/dev/{device}"] == (cluster.char_major, npu_of[device])
        assert "/dev/rsd0" in pod.devices
        # The spec's edits did not: neither in the container nor in its OCI spec.
        name, _ = TOOLKIT_CDI_ENV
        assert name not in pod.env, pod.env
        spec = container_spec(cluster, since, pod)
        assert f"/dev/{device}" in spec and name not in spec and "cdi.k8s.io" not in spec
        # What it received: the annotation when the plugin sent one, never a CDI device.
        config = received_config(cluster, since, pod)
        assert (ANNOTATION in config) == (mode != "field"), config
        assert "CDI" not in config, config
        # And nothing else it logged speaks of CDI: no injection, no deprecation line.
        others = [line for line in cdi_lines(cluster, since) if line != config]
        print(f"cdi-mode {mode} under containerd 1.6: started, devices {sorted(pod.devices)}, "
              f"spec edit absent, annotation received {ANNOTATION in config}, "
              f"other containerd lines about CDI {len(others)}")  # fmt: skip
        assert not others, others
        assert pod.untouched()
    finally:
        pod.delete()


def test_without_the_spec_the_container_starts_all_the_same(cluster: Cluster) -> None:
    install(cluster)
    mark = len(plugin_records(cluster))
    cluster.remove_cdi_spec(TOOLKIT_CDI_SPEC_NAME)
    # The plugin cannot tell the runtime: it warns as for any node.
    wait_for(
        "the missing-spec warning",
        lambda: [r for r in plugin_records(cluster)[mark:] if r["msg"] == MISSING],
    )
    since = len(cluster.containerd_log())
    pod = Consumer(cluster, "cdi16-nospec", {NPU: 1})
    try:
        assert TOOLKIT_CDI_ENV[0] not in pod.env
        assert pod.status()["restartCount"] == 0
        config = received_config(cluster, since, pod)
        assert [line for line in cdi_lines(cluster, since) if line != config] == []
    finally:
        pod.delete()


# ---------------------------------------------------------------- upgrades on 1.34
def test_helm_upgrade_on_the_1_34_kubelet_with_and_without_the_surge_handover(
    cluster: Cluster,
) -> None:
    """1.34 keeps one endpoint per resource: the old instance's leaving cuts the
    successor's stream, which registers again at once. The gaps of both strategies are
    printed (never asserted), and so are the pods the kubelet refused when an Allocate
    met that moment; every other pod runs with its devices."""
    held = Consumer(cluster, "npu-during-upgrade", {NPU: 1})
    try:
        zero, samples = upgrade_default(cluster, held)
        cluster.say(f"1.34 helm upgrade (default): longest time allocatable {NPU} was 0: "
                    f"{zero:.1f} s ({samples} samples)")  # fmt: skip
        install(cluster, "devicePlugin.surgeHandover=true")  # pods that hand over
        report = upgrade_with_surge(cluster, held, one_endpoint=True)
        cluster.say(
            f"1.34 helm upgrade (surge hand-over): longest time both instances served "
            f"{report.both_s:.1f} s, longest time allocatable {NPU} was 0: "
            f"{report.zero_s:.1f} s, lowest {report.lowest} ({report.samples} samples); "
            f"pods refused at admission: {list(report.refused)}; timeline: {report.timeline}"
        )
        assert cluster.allocatable() == EXPECTED
    finally:
        held.delete()
        install(cluster)
