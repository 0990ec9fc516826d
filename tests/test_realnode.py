"""The product as an operator runs it, on a real one-node cluster (``make e2e``).

The chart installed with the real helm, the plugin running from the image built from
``deployments/container/Dockerfile``, the DaemonSet pod scheduled by the real scheduler,
the real kubelet (1.37.2) calling it, containerd starting consumer containers with the
devices, mounts and CDI edits of the Allocate answer. Behind it a simulated node with
real character devices (``tests/realnode``). Everything is observed the way a user
observes it: ``kubectl``, the pod's own view of ``/dev`` and its environment, the
container's devices cgroup, the plugin's log.

Every check waits for its outcome (generous deadlines: two cores run the whole cluster)
and judges order and outcome, never a duration.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rbln_device_plugin_sim.node import TOOLKIT_CDI_ENV

from .realnode.cluster import NODE_NAME, Cluster, wait_for
from .realnode.configs import API_SERVER_PORT, NODE_IP
from .realnode.layouts import EXPECTED
from .realnode.workloads import (
    KUBELET_GONE,
    NAMESPACE,
    NPU,
    PLUGIN_SETS,
    RELEASE,
    STREAM_LOST,
    VF4,
    Consumer,
    consumer,
    finished_pod,
    grant,
    in_cluster_pod,
    install,
    plugin_records,
    ready_plugin_pods,
    records,
)

pytestmark = [pytest.mark.realnode, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def plugin(realnode_plugin: Cluster) -> Cluster:
    return realnode_plugin


class Consumers:
    """A test's consumer pods: ``start`` runs one and keeps it for the teardown."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.made: list[Consumer] = []

    def start(self, name: str, limits: dict[str, int]) -> Consumer:
        pod = Consumer(self.cluster, name, limits)
        self.made.append(pod)
        return pod


@pytest.fixture
def consumers(plugin: Cluster) -> Iterator[Consumers]:
    started = Consumers(plugin)
    yield started
    plugin.note_memory()  # the test's pods are still running
    for pod in started.made:
        pod.delete()


def rsd_group_of(cluster: Cluster, names: list[str]) -> int:
    """The RSD group holding exactly ``names`` (rbln-smi's view of the node)."""
    groups = cluster.sim.groups()
    found = [int(g) for g, members in groups.items() if sorted(members) == sorted(names)]
    assert len(found) == 1, f"no RSD group holds exactly {names}: {groups}"
    return found[0]


def assert_devices_as_allocated(cluster: Cluster, pod: Consumer, names: list[str]) -> None:
    """/dev/rsd0 is the pod's group; each device node has the host node's numbers; the
    devices cgroup lets the container at exactly those nodes of the NPU major."""
    major = cluster.char_major
    npu_of = {d.name: d.npu for d in cluster.sim.layout.devices}
    group = rsd_group_of(cluster, names)
    expected = {"/dev/rsd0": (major, 128 + group)}
    expected |= {f"/dev/{n}": (major, npu_of[n]) for n in names}
    assert pod.devices == expected
    allowed = (cluster.container_cgroup(cluster.pod(pod.name)) / "devices.list").read_text()
    ours = {
        int(m.group(1))
        for m in re.finditer(rf"^c {major}:(\d+) (\w+)$", allowed, flags=re.MULTILINE)
    }
    assert ours == {minor for _, minor in expected.values()}, allowed
    assert not re.search(rf"^c {major}:\*", allowed, flags=re.MULTILINE), allowed
    assert not re.search(r"^a ", allowed, flags=re.MULTILINE), allowed


# ---------------------------------------------------------------- 1. install
def test_helm_install_schedules_the_plugin_and_advertises_every_resource(
    realnode: Cluster,
) -> None:
    with_release = realnode.helm("list", "-n", NAMESPACE, "-q").split()
    if RELEASE in with_release:
        realnode.uninstall_chart(RELEASE, NAMESPACE)
        wait_for("allocatable 0", lambda: not any(realnode.allocatable().values()))
    install(realnode)
    (pod,) = ready_plugin_pods(realnode)
    # Bound by the real scheduler (not a nodeName in the template), to the NPU node.
    assert pod["spec"]["nodeName"] == NODE_NAME
    events = realnode.kubectl_json(
        "get", "events", "-n", NAMESPACE,
        "--field-selector", f"involvedObject.name={pod['metadata']['name']},reason=Scheduled",
    )  # fmt: skip
    reporters = {
        e.get("reportingComponent") or e["source"].get("component") for e in events["items"]
    }
    assert reporters == {"default-scheduler"}, events["items"]
    raw = realnode.kubectl("get", "nodes", "-o", "jsonpath={..allocatable}")
    allocatable = json.loads(raw)
    assert {k: int(v) for k, v in allocatable.items() if k.startswith("rebellions.ai/")} == EXPECTED


# ---------------------------------------------------------------- 2. two NPUs
def test_a_pod_with_two_npus_runs_with_the_preferred_devices(
    plugin: Cluster, consumers: Consumers
) -> None:
    mark = len(plugin_records(plugin))
    pod = consumers.start("npu-pair", {NPU: 2})
    names = pod.npus()
    assert len(names) == 2 and all(n in ("rbln0", "rbln1", "rbln2", "rbln3") for n in names)
    assert_devices_as_allocated(plugin, pod, names)
    # The CDI annotation resolved against the stand-in for the toolkit's rbln.yaml.
    name, value = TOOLKIT_CDI_ENV
    assert pod.env.get(name) == value
    later = plugin_records(plugin)[mark:]
    chosen = [r for r in later if r["msg"] == "Selected preferred allocation"]
    assert chosen, [r["msg"] for r in later]
    assert sorted(chosen[-1]["deviceIDs"]) == names
    completed = [r for r in later if r["msg"] == "Completed container allocation"]
    assert sorted(completed[-1]["deviceIDs"]) == names
    # Each bus ID next to its own device, in whatever order the kubelet sent them.
    bus = {d.name: d.bus_id for d in plugin.sim.layout.devices}
    record = completed[-1]
    assert record["busIDs"] == [bus[n] for n in record["deviceIDs"]], record


# ---------------------------------------------------------------- 3. too many
def test_a_pod_asking_for_more_npus_than_the_node_has_stays_pending(plugin: Cluster) -> None:
    name = "npu-greedy"
    plugin.delete_pod(name)
    plugin.apply(consumer(name, {NPU: EXPECTED[NPU] + 1}))
    try:

        def unschedulable() -> str:
            pod = plugin.pod(name)
            for condition in pod["status"].get("conditions", []):
                if condition["type"] == "PodScheduled" and condition["status"] == "False":
                    return str(condition.get("message", ""))
            return ""

        message = wait_for("the scheduler's verdict", unschedulable)
        assert f"Insufficient {NPU}" in message
        assert plugin.pod(name)["status"]["phase"] == "Pending"
    finally:
        plugin.delete_pod(name)


# ---------------------------------------------------------------- 4. a fault
def _health(pod: Consumer, device: str) -> str:
    status = pod.status()
    for resource in status.get("allocatedResourcesStatus") or []:
        for entry in resource.get("resources") or []:
            if entry.get("resourceID") == device:
                return str(entry.get("health", ""))
    return ""


def test_a_device_fault_reaches_allocatable_and_the_pod_status(
    plugin: Cluster, consumers: Consumers
) -> None:
    pod = consumers.start("npu-single", {NPU: 1})
    (device,) = pod.npus()
    wait_for("Healthy in allocatedResourcesStatus", lambda: _health(pod, device) == "Healthy")
    plugin.sim.set_status(device, 4)  # FAULT
    try:
        wait_for("allocatable one lower", lambda: plugin.allocatable()[NPU] == EXPECTED[NPU] - 1)
        wait_for(
            "Unhealthy in allocatedResourcesStatus", lambda: _health(pod, device) == "Unhealthy"
        )
        assert pod.untouched()
    finally:
        plugin.sim.set_status(device, 0)  # READY
    wait_for("allocatable restored", lambda: plugin.allocatable() == EXPECTED)
    wait_for("Healthy again", lambda: _health(pod, device) == "Healthy")


# ---------------------------------------------------------------- 5. kubelet restart
def test_a_kubelet_restart_keeps_pods_and_the_plugin_registers_again(
    plugin: Cluster, consumers: Consumers
) -> None:
    held = consumers.start("npu-held", {NPU: 1})
    mark = len(plugin_records(plugin))
    # While the kubelet is down it serves no `kubectl logs`: the node's log files tell.
    (pod,) = ready_plugin_pods(plugin)
    name = pod["metadata"]["name"]
    seen = len(records(plugin.container_log_files(NAMESPACE, name, "plugin")))
    assert seen >= mark > 0
    plugin.kill("kubelet")
    try:
        # As a service manager's restart goes: the old kubelet is gone (its kubelet.sock
        # left behind) for a moment before the new one starts; the plugin reacts meanwhile.
        wait_for(
            "the plugin's reaction to the kubelet exiting",
            lambda: [
                r
                for r in records(plugin.container_log_files(NAMESPACE, name, "plugin"))[seen:]
                if r["msg"] in (KUBELET_GONE, STREAM_LOST)
            ],
        )
    finally:
        plugin.start_kubelet()
    wait_for("Ready node after the restart", plugin.node_ready)

    def registered_again() -> list[dict[str, Any]]:
        later = plugin_records(plugin)[mark:]
        names = {
            r.get("resourceName")
            for r in later
            if r["msg"] == "Registered device plugin with kubelet"
        }
        return later if names >= set(EXPECTED) else []

    later = wait_for("registrations after the restart", registered_again)
    wait_for("allocatable after the restart", lambda: plugin.allocatable() == EXPECTED)
    assert held.untouched()
    fresh = consumers.start("npu-after-restart", {NPU: 1})
    assert fresh.npus() and fresh.npus() != held.npus()
    messages = [r["msg"] for r in later]
    # What the README's logging table says a kubelet restart logs, and nothing worse.
    assert "Detected kubelet socket recreation; restarting device plugins" in messages
    assert messages.index("Detected kubelet socket recreation; restarting device plugins") < (
        messages.index("Registered device plugin with kubelet")
    )
    errors = [r for r in later if r.get("level") == "error"]
    assert not errors, errors
    assert STREAM_LOST not in messages
    assert messages.index(KUBELET_GONE) < messages.index(
        "Detected kubelet socket recreation; restarting device plugins"
    )


# ---------------------------------------------------------------- 6. helm upgrade
class Sampler:
    """Samples, every 100 ms, how many plugin processes serve the node's kubelet
    directory (own a listening socket there), and in a second thread what allocatable
    says, so the rollout's worst moments are seen however short they are."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.serving: list[tuple[float, int]] = []
        self.allocatable: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.watch: Any = None
        self.threads = [
            threading.Thread(target=self._serving, daemon=True),
            threading.Thread(target=self._allocatable, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _serving(self) -> None:
        while not self.stop.wait(0.1):
            self.serving.append((time.monotonic(), len(self.cluster.serving_plugins())))

    def _allocatable(self) -> None:
        # A watch sees every node update the API server stores, however brief.
        watch = self.cluster.kubectl_stream(
            "get", "node", NODE_NAME, "--watch",
            "-o", "jsonpath={.status.allocatable.rebellions\\.ai/npu}{\"\\n\"}",
        )  # fmt: skip
        self.watch = watch
        assert watch.stdout is not None
        for line in watch.stdout:
            self.allocatable.append((time.monotonic(), int(line.strip() or 0)))

    def finish(self) -> None:
        self.stop.set()
        if self.watch is not None:
            self.watch.kill()
        for thread in self.threads:
            thread.join(30)

    def timeline(self) -> str:
        """Allocatable as the API server stored it, and each change in the number of
        serving instances, in seconds from the first sample."""
        if not self.serving:
            return ""
        start = self.serving[0][0]
        events = [(at, f"allocatable={value}") for at, value in self.allocatable]
        last = None
        for at, count in self.serving:
            if count != last:
                events.append((at, f"serving={count}"))
                last = count
        return " ".join(f"{at - start:+.1f}s:{what}" for at, what in sorted(events))

    def longest_zero(self) -> float:
        longest, since = 0.0, None
        for at, value in self.allocatable:
            if value == 0 and since is None:
                since = at
            elif value and since is not None:
                longest, since = max(longest, at - since), None
        if since is not None:  # still 0 when sampling ended
            longest = max(longest, time.monotonic() - since)
        return longest


def test_helm_upgrade_rolls_the_plugin_without_two_instances_or_touching_pods(
    plugin: Cluster, consumers: Consumers
) -> None:
    held = consumers.start("npu-during-upgrade", {NPU: 1})
    zero, samples = upgrade_default(plugin, held)
    plugin.say(f"helm upgrade: longest time allocatable {NPU} was 0: {zero:.1f} s "
            f"({samples} samples)")  # fmt: skip
    install(plugin)  # back to the suite's settings


def upgrade_default(plugin: Cluster, held: Consumer) -> tuple[float, int]:
    """``helm upgrade`` with the default strategy: never two serving instances, ``held``
    untouched; the longest time allocatable was 0, and the number of samples."""
    (before,) = ready_plugin_pods(plugin)
    assert len(plugin.serving_plugins()) == 1
    sampler = Sampler(plugin)
    try:
        plugin.install_chart(
            RELEASE, NAMESPACE, sets=[*PLUGIN_SETS[:1], "devicePlugin.deviceScanInterval=2s"]
        )

        def replaced() -> bool:
            pods = ready_plugin_pods(plugin)
            return len(pods) == 1 and pods[0]["metadata"]["uid"] != before["metadata"]["uid"]

        wait_for("the new plugin pod Ready", replaced, diagnose=plugin.diagnose)
        wait_for("allocatable restored", lambda: plugin.allocatable() == EXPECTED)
        wait_for("one serving instance", lambda: len(plugin.serving_plugins()) == 1)
    finally:
        sampler.finish()
    assert sampler.serving, "no samples"
    assert max(count for _, count in sampler.serving) == 1, sampler.serving
    assert held.untouched()
    return sampler.longest_zero(), len(sampler.allocatable)


TOOK_OVER = "Took over from the previous instance of this installation"


def _longest_both(serving: list[tuple[float, int]]) -> float:
    """The longest stretch of samples with two serving instances."""
    longest, since = 0.0, None
    for at, count in serving:
        if count >= 2 and since is None:
            since = at
        elif count < 2 and since is not None:
            longest, since = max(longest, at - since), None
    return longest


@dataclass(frozen=True)
class SurgeReport:
    both_s: float  # the longest time two plugin instances served
    zero_s: float  # the longest time allocatable was 0
    lowest: int  # the lowest allocatable the API server stored
    samples: int
    timeline: str  # allocatable and serving instances over the rollout, for the report
    refused: tuple[str, ...] = ()  # pods the kubelet refused at admission (1.34 only)


def upgrade_with_surge(
    plugin: Cluster, held: Consumer, *, one_endpoint: bool = False
) -> SurgeReport:
    """``helm upgrade`` with devicePlugin.surgeHandover (the pods it replaces have it
    already) while allocatable is watched and a pod asking for one NPU is created every
    second; every such pod runs with the devices the plugin handed out, none shared.

    ``one_endpoint`` (a 1.34 kubelet): the old instance's leaving makes the kubelet close
    the successor's connection too, and an Allocate it is sending at that moment fails
    its pod (UnexpectedAdmissionError) until the successor registered again, as any pod
    admitted in the default strategy's longer gap fails. Such pods are reported, not
    failed on; every other pod runs with its devices."""
    # The rollout that brought the pods in has ended (a surge pod that is not ready yet
    # would be deleted by this upgrade's rollout: a fault case of its own).
    wait_for(
        "one plugin pod, ready and alone serving",
        lambda: (
            len(plugin.plugin_pods(NAMESPACE)) == 1
            and len(ready_plugin_pods(plugin)) == 1
            and len(plugin.serving_plugins()) == 1
        ),
        diagnose=plugin.diagnose,
    )
    (before,) = ready_plugin_pods(plugin)
    sampler = Sampler(plugin)
    started: list[tuple[float, str]] = []
    try:
        plugin.install_chart(
            RELEASE, NAMESPACE,
            sets=[*PLUGIN_SETS, "devicePlugin.surgeHandover=true",
                  "devicePlugin.deviceScanInterval=2s"],
        )  # fmt: skip

        def replaced() -> bool:
            # The node has 4 NPUs and ``held`` has one: three pods at most.
            if len(started) < 3 and time.monotonic() - (started[-1][0] if started else 0) >= 1:
                name = f"npu-surge-{len(started)}"
                plugin.delete_pod(name)
                plugin.apply(consumer(name, {NPU: 1}))
                started.append((time.monotonic(), name))
            pods = ready_plugin_pods(plugin)
            return len(pods) == 1 and pods[0]["metadata"]["uid"] != before["metadata"]["uid"]

        wait_for("the new plugin pod Ready", replaced, diagnose=plugin.diagnose)
        wait_for("one serving instance", lambda: len(plugin.serving_plugins()) == 1)
    finally:
        sampler.finish()
    try:
        # Every pod created during the rollout was admitted and runs with its devices.
        pods: list[Consumer] = []
        refused: list[str] = []
        for _, name in started:
            status = wait_for(
                f"{name} running or refused",
                lambda name=name: _admitted_or_refused(plugin, name),
                diagnose=plugin.diagnose,
            )
            if status.get("phase") == "Failed" and one_endpoint:
                assert status.get("reason") == "UnexpectedAdmissionError", status
                refused.append(f"{name}: {status.get('message', '')}")
                continue
            pods.append(Consumer(plugin, name, {NPU: 1}, created=True))
        for pod in pods:
            assert len(pod.npus()) == 1, pod.devices
            assert_devices_as_allocated(plugin, pod, pod.npus())
        handed = [npu for pod in (held, *pods) for npu in pod.npus()]
        assert len(handed) == len(set(handed)), handed  # no device in two containers
        assert held.untouched()
    finally:
        for _, name in started:
            plugin.delete_pod(name)
    assert sampler.allocatable, "no samples"
    return SurgeReport(
        both_s=_longest_both(sampler.serving),
        zero_s=sampler.longest_zero(),
        lowest=min(count for _, count in sampler.allocatable),
        samples=len(sampler.allocatable),
        timeline=sampler.timeline(),
        refused=tuple(refused),
    )


def _admitted_or_refused(plugin: Cluster, name: str) -> Any:
    """The pod's status once it runs or failed (a refused admission), else None."""
    status = plugin.pod(name).get("status", {})
    return status if status.get("phase") in ("Running", "Failed") else None


def test_helm_upgrade_with_the_surge_handover_keeps_allocatable_and_pods(
    plugin: Cluster, consumers: Consumers
) -> None:
    """devicePlugin.surgeHandover: the new pod takes over while the old one serves; the
    node's allocatable never drops below the expected count (1.37.2's kubelet)."""
    install(plugin, "devicePlugin.surgeHandover=true")  # pods that hand over
    held = consumers.start("npu-during-surge", {NPU: 1})
    report = upgrade_with_surge(plugin, held)
    took = [r for r in plugin_records(plugin) if r.get("msg") == TOOK_OVER]
    plugin.say(
        f"surge hand-over: longest time both instances served {report.both_s:.1f} s, "
        f"longest time allocatable {NPU} was 0: {report.zero_s:.1f} s, lowest "
        f"{report.lowest} ({report.samples} samples); the successor's record: {took}; "
        f"timeline: {report.timeline}"
    )
    assert report.lowest >= EXPECTED[NPU]
    assert len(took) == 1 and took[0]["bothRegisteredSeconds"] >= 0
    install(plugin)  # back to the suite's settings


# ---------------------------------------------------------------- 7. a VF
def test_a_pod_asking_for_a_vf4_gets_its_vf_and_a_group_of_it_alone(
    plugin: Cluster, consumers: Consumers
) -> None:
    pod = consumers.start("npu-vf4", {VF4: 1})
    (vf,) = pod.npus()
    assert re.fullmatch(r"rbln4-[0-3]", vf), vf
    assert_devices_as_allocated(plugin, pod, [vf])


# ---------------------------------------------------------------- 8. uninstall
def test_helm_uninstall_takes_every_resource_away_but_not_the_running_pods(
    plugin: Cluster, consumers: Consumers
) -> None:
    held = consumers.start("npu-at-uninstall", {NPU: 1})
    plugin.uninstall_chart(RELEASE, NAMESPACE)
    wait_for(
        "allocatable 0 for every resource",
        lambda: (a := plugin.allocatable()) and all(a.get(r) == 0 for r in EXPECTED),
    )
    assert held.untouched()


# ---------------------------------------------------------------- 9. the operator's shape
def operator_daemonset(cluster: Cluster) -> dict[str, Any]:
    """The DaemonSet as the RBLN NPU operator writes it (reference.md §8)."""
    kubelet_dir, cdi_root = "/var/lib/kubelet/device-plugins", "/var/run/cdi"
    env = {
        "CDI_ROOT": cdi_root,
        "KUBELET_DEVICE_PLUGIN_PATH": kubelet_dir,
        "HEALTHCHECK_PORT": "51515",
        "DEVICE_SCAN_INTERVAL": "5s",
        "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
        "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json",
        "USE_GENERIC_RESOURCE_NAME": "true",
        # Only what the simulated node needs on top (a real node has these defaults).
        "SYSFS_ROOT": str(cluster.sim.sysfs_root),
        "DEV_ROOT": str(cluster.sim.dev_root),
        "RBLN_SMI_PATH": str(cluster.sim.smi_path),
    }
    mounts = {
        "device-plugin": (kubelet_dir, kubelet_dir),
        "cdi-root": (cdi_root, cdi_root),
        "dev": ("/dev", "/dev"),
        "run-rbln": ("/run/rbln", "/run/rbln"),
        "host-usr-bin": ("/usr/bin", "/host/usr/bin"),
        "simulated-node": (str(cluster.sim.root), str(cluster.sim.root)),
    }
    labels = {"app": "rbln-device-plugin"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "rbln-device-plugin", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"rebellions.ai/npu.deploy.device-plugin": "true"},
                    "priorityClassName": "system-node-critical",
                    "containers": [
                        {
                            "name": "plugin",
                            "image": cluster.arts.plugin_image,
                            "imagePullPolicy": "Never",
                            "command": ["rbln-device-plugin"],
                            "securityContext": {"privileged": True},
                            "env": [{"name": k, "value": v} for k, v in env.items()]
                            + [
                                {
                                    "name": "NODE_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                }
                            ],
                            "livenessProbe": {
                                "grpc": {"port": 51515, "service": "liveness"},
                                "periodSeconds": 10,
                                "failureThreshold": 3,
                            },
                            "volumeMounts": [
                                {
                                    "name": n,
                                    "mountPath": m,
                                    **({"readOnly": True} if n == "host-usr-bin" else {}),
                                }
                                for n, (_, m) in mounts.items()
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": n, "hostPath": {"path": h}} for n, (h, _) in mounts.items()
                    ],
                },
            },
        },
    }


def test_the_operators_daemonset_registers_the_same_devices(realnode: Cluster) -> None:
    if RELEASE in realnode.helm("list", "-n", NAMESPACE, "-q").split():
        realnode.uninstall_chart(RELEASE, NAMESPACE)
    wait_for("allocatable 0", lambda: not any(realnode.allocatable().values()))
    realnode.apply(operator_daemonset(realnode))
    try:

        def running() -> list[Any]:
            pods = realnode.pods(NAMESPACE, "app=rbln-device-plugin")
            return [p for p in pods if p["status"].get("phase") == "Running"]

        (pod,) = wait_for("the operator's plugin pod Running", running)
        wait_for(f"allocatable {EXPECTED}", lambda: realnode.allocatable() == EXPECTED)
        log = records(realnode.pod_logs(NAMESPACE, pod["metadata"]["name"]))
        registered = {
            r["resourceName"] for r in log if r["msg"] == "Registered device plugin with kubelet"
        }
        assert registered == set(EXPECTED)
        assert not [r for r in log if r.get("level") == "error"]
    finally:
        realnode.kubectl(
            "delete", "daemonset", "rbln-device-plugin", "-n", NAMESPACE, "--wait=true"
        )
        wait_for("allocatable 0", lambda: not any(realnode.allocatable().values()))


# ---------------------------------------------------------------- the API server from a pod
# What the DRA mode does at start (lightkube's in-cluster configuration), then one GET.
GET_OWN_NODE = """\
import os
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.core_v1 import Node

config = KubeConfig.from_service_account()
print("SERVER", config.get().cluster.server)
try:
    node = Client(config).get(Node, os.environ["NODE_NAME"])
except ApiError as exc:
    print("REFUSED", exc.status.code, exc.status.reason)
else:
    print("NODE", node.metadata.name)
"""


def test_a_pod_reaches_the_api_server_in_cluster_style_with_what_rbac_grants(
    realnode: Cluster,
) -> None:
    """The plugin's image with a service account token, TLS verified against the token's
    ``ca.crt``: the account RBAC lets get nodes reads its node; one bound to nothing is
    refused (the suite's API server enforces RBAC, so a chart's ClusterRole counts)."""
    grant(realnode, "node-reader", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
    grant(realnode, "no-rights", [])
    pods = {"api-reader": "node-reader", "api-nobody": "no-rights"}
    try:
        for name, account in pods.items():
            realnode.delete_pod(name)
            realnode.apply(in_cluster_pod(realnode, name, account, GET_OWN_NODE))
        ended = {name: finished_pod(realnode, name) for name in pods}
        logs = {name: realnode.pod_logs("default", name) for name in pods}
        server = f"SERVER https://{NODE_IP}:{API_SERVER_PORT}"
        assert logs["api-reader"].splitlines() == [server, f"NODE {NODE_NAME}"], logs
        assert ended["api-reader"]["status"]["phase"] == "Succeeded"
        assert logs["api-nobody"].splitlines() == [server, "REFUSED 403 Forbidden"], logs
        # The token came from the TokenRequest API through a projected volume, as the
        # ServiceAccount admission plugin mounts it, with the published root CA beside it.
        sources = [
            source
            for volume in ended["api-reader"]["spec"]["volumes"]
            for source in volume.get("projected", {}).get("sources", [])
        ]
        assert any("serviceAccountToken" in s for s in sources), sources
        assert {
            "configMap": {
                "name": "kube-root-ca.crt",
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            }
        } in sources
    finally:
        for name in pods:
            realnode.delete_pod(name)
