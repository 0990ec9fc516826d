"""Workloads and observations on the real node, for any test module marked ``realnode``.

The chart installed as the README's Quick Start does (``install``), consumer pods that
report what they see (``Consumer``: their ``/dev`` entries with major:minor and their
environment), the plugin's JSON records (``plugin_records``, or ``records`` of any log
text, e.g. ``Cluster.container_log_files`` while the kubelet is down), and pods that talk to
the API server in-cluster style with a service account RBAC allows what ``grant`` lists
(``in_cluster_pod``, ``finished_pod``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import artifacts
from .cluster import IMAGE_PYTHON, Cluster, wait_for
from .configs import in_cluster_api_env
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


def grant(
    cluster: Cluster,
    service_account: str,
    rules: Sequence[Mapping[str, Any]],
    namespace: str = "default",
) -> None:
    """A ServiceAccount allowed ``rules`` (a ClusterRole of that name, bound to it): the
    API server enforces RBAC, so a pod's token may do what this lists and nothing else.
    No rules: the account exists and is bound to nothing."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace},
        }
    )
    if not rules:
        return
    name = f"{namespace}-{service_account}"
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [dict(rule) for rule in rules],
        }
    )
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        }
    )


def in_cluster_pod(
    cluster: Cluster, name: str, service_account: str, script: str, namespace: str = "default"
) -> dict[str, Any]:
    """A pod of the plugin's image running ``python -c script`` once, with the service
    account's token mounted (projected: token, ``ca.crt``, namespace) and
    ``configs.in_cluster_api_env()``, so ``KubeConfig.from_service_account()`` works."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceAccountName": service_account,
            "automountServiceAccountToken": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.arts.plugin_image,
                    "imagePullPolicy": "Never",
                    "command": [IMAGE_PYTHON, "-c", script],
                    "env": [
                        *in_cluster_api_env(),
                        {
                            "name": "NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        },
                    ],
                }
            ],
        },
    }


def finished_pod(cluster: Cluster, name: str, namespace: str = "default") -> Any:
    """The pod once it ran to its end (Succeeded or Failed)."""

    def ended() -> Any:
        pod = cluster.pod(name, namespace)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_for(
        f"pod {name} finished", ended, diagnose=lambda: cluster.describe(name, namespace)
    )
