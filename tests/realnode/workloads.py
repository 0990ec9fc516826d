"""Workloads and observations on the real node, for any test module marked ``realnode``.

The chart installed as the README's Quick Start does (``install``), consumer pods that
report what they see (``Consumer``: their ``/dev`` entries with major:minor and their
environment), the plugin's JSON records (``plugin_records``, or ``records`` of any log
text, e.g. ``Cluster.container_log_files`` while the kubelet is down).
"""

from __future__ import annotations

import json
from typing import Any

from . import artifacts
from .cluster import Cluster, wait_for
from .layouts import EXPECTED

NAMESPACE = "kube-system"
RELEASE = "rbln"
NPU, VF4, VF1 = "rebellions.ai/npu", "rebellions.ai/npu-vf4", "rebellions.ai/npu-vf1"
# The consumer reports what it sees, then stays (as a workload would).
REPORT = (
    'for f in /dev/rsd* /dev/rbln*; do [ -e "$f" ] && stat -c \'DEV %n %t %T\' "$f"; done; '
    "env | sed 's/^/ENV /'; echo REPORTED; exec sleep 1000000"
)
# What the plugin says when the kubelet's streams end: the kubelet exited (a restart), or
# a stream was lost alone (README, Logging).
KUBELET_GONE = "Kubelet is not serving; waiting for it to start again"
STREAM_LOST = "ListAndWatch stream ended; registering again"
# Debug: "Selected preferred allocation" says which set the plugin chose.
PLUGIN_SETS = ("logging.level=debug", "devicePlugin.deviceScanInterval=1s")


def consumer(name: str, limits: dict[str, int]) -> dict[str, Any]:
    amounts = {k: str(v) for k, v in limits.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": artifacts.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", REPORT],
                    "resources": {"limits": amounts, "requests": amounts},
                }
            ],
        },
    }


def records(log: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "msg" in record:
            out.append(record)
    return out


def plugin_records(cluster: Cluster) -> list[dict[str, Any]]:
    logs = cluster.plugin_logs(NAMESPACE)
    return [r for log in logs.values() for r in records(log)]


def ready_plugin_pods(cluster: Cluster, namespace: str = NAMESPACE) -> list[Any]:
    return [
        p
        for p in cluster.plugin_pods(namespace)
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    ]


def install(cluster: Cluster, *sets: str) -> None:
    """``helm upgrade --install`` with the suite's settings; waits until it serves."""
    cluster.install_chart(RELEASE, NAMESPACE, sets=[*PLUGIN_SETS, *sets])
    wait_for("a Ready plugin pod", lambda: ready_plugin_pods(cluster), diagnose=cluster.diagnose)
    wait_for(f"allocatable {EXPECTED}", lambda: cluster.allocatable() == EXPECTED)


class Consumer:
    """A running consumer pod and what it reported about itself."""

    def __init__(
        self, cluster: Cluster, name: str, limits: dict[str, int], *, created: bool = False
    ) -> None:
        """``created``: the pod was applied already (``consumer``); wait for it alone."""
        self.cluster, self.name = cluster, name
        if not created:
            cluster.delete_pod(name)
            cluster.apply(consumer(name, limits))
        self.pod = cluster.wait_pod_phase(name, "Running")
        log = wait_for(
            f"{name}'s report",
            lambda: (text := cluster.pod_logs("default", name)) and "REPORTED" in text and text,
        )
        self.devices: dict[str, tuple[int, int]] = {}
        self.env: dict[str, str] = {}
        for line in log.splitlines():
            if line.startswith("DEV "):
                _, path, major, minor = line.split()
                self.devices[path] = (int(major, 16), int(minor, 16))
            elif line.startswith("ENV ") and "=" in line:
                key, value = line[4:].split("=", 1)
                self.env[key] = value
        self.container_id = self.status()["containerID"]

    def status(self) -> Any:
        pod = self.cluster.pod(self.name)
        return next(s for s in pod["status"]["containerStatuses"] if s["name"] == "main")

    def npus(self) -> list[str]:
        return sorted(p.removeprefix("/dev/") for p in self.devices if p != "/dev/rsd0")

    def untouched(self) -> bool:
        """Still the same running container, never restarted."""
        status = self.status()
        return (
            "running" in status["state"]
            and status["restartCount"] == 0
            and status["containerID"] == self.container_id
        )

    def delete(self) -> None:
        self.cluster.delete_pod(self.name)
