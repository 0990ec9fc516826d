"""The chart's dra-mode objects and the DRA examples on a real 1.37.2 API server and
scheduler (tests/kubeapi.py, no kubelet): the server accepts every object (it compiles the
DeviceClasses' CEL selectors), and the scheduler, given a node's ResourceSlice as the plugin
publishes it, allocates each example's claim from the right devices: two whole NPUs under
one PCIe root, a vf-1 VF, a vf-4 VF, and one NPU for a pod that names only
`rebellions.ai/npu`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import load_all_yaml
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from . import kubeapi
from .test_deploy_chart import NAMESPACE, Helm, objects
from .test_deploy_chart import helm as helm

pytestmark = [
    pytest.mark.apiserver,
    pytest.mark.skipif(kubeapi.missing() is not None, reason=str(kubeapi.missing())),
]

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DRIVER = "npu.rebellions.ai"
NODE = "npu-node-1"
SCHEDULED_WITHIN_S = 60.0

# A REBEL node as the plugin publishes it: four whole NPUs on two root complexes (rbln0
# alone on pci0000:00, rbln1-rbln3 on pci0000:80), two vf-1 VFs, four vf-4 VFs.
DEVICES: list[tuple[str, str, str]] = [
    ("rbln0", "npu", "pci0000:00"),
    ("rbln1", "npu", "pci0000:80"),
    ("rbln2", "npu", "pci0000:80"),
    ("rbln3", "npu", "pci0000:80"),
    ("rbln4-0", "npu-vf1", "pci0000:00"),
    ("rbln5-0", "npu-vf1", "pci0000:00"),
    *((f"rbln6-{n}", "npu-vf4", "pci0000:80") for n in range(4)),
]


def _slice() -> ResourceSlice:
    return ResourceSlice.from_dict(  # type: ignore[no-any-return]
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}-0"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": name,
                        "attributes": {
                            "type": {"string": "npu"},
                            "deviceType": {"string": device_type},
                            "resource.kubernetes.io/pcieRoot": {"string": root},
                        },
                    }
                    for name, device_type, root in DEVICES
                ],
            },
        }
    )


def _node() -> Node:
    return Node.from_dict(  # type: ignore[no-any-return]
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        }
    )


@contextlib.contextmanager
def _scheduler(server: kubeapi.ApiServer, state: Path) -> Iterator[None]:
    kubeconfig = str(server.kubeconfig)
    with (server.logs / "kube-scheduler.log").open("ab") as out:
        process = subprocess.Popen(
            [
                str(kubeapi.BIN_DIR / "kube-scheduler"),
                "--kubeconfig", kubeconfig,
                "--authentication-kubeconfig", kubeconfig,
                "--authorization-kubeconfig", kubeconfig,
                "--leader-elect=false", "--bind-address", "127.0.0.1",
                "--secure-port", str(kubeapi.free_port()),
            ],
            stdout=out, stderr=subprocess.STDOUT, cwd=state,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(state)},
            start_new_session=True,
        )  # fmt: skip
    try:
        yield
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, helm: Helm
) -> Iterator[tuple[Client, kubeapi.ApiServer]]:
    state = tmp_path_factory.mktemp("dra-apiserver")
    with kubeapi.running_apiserver(state) as server:
        client = Client(KubeConfig.from_file(Path(server.kubeconfig)))
        # The chart's dra-mode objects, as helm would install them (the namespace first).
        client.create(
            load_all_yaml(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}")[0]
        )
        for doc in objects(helm.template("--set", "mode=dra", "--kube-version", "1.37.2")):
            client.create(_generic(doc))
        # A node that is Ready and can hold pods: the scheduler needs nothing else.
        client.create(_node())
        # The server taints a new node not-ready; without a node controller, nothing lifts it.
        client.patch(Node, NODE, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)
        client.patch(  # the status subresource, as a kubelet would write it
            Node.Status,
            NODE,
            {
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                    "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                }
            },
            patch_type=PatchType.MERGE,
        )
        client.create(_slice())
        # No controller manager makes the namespace's default account: the pods need it.
        client.create(
            load_all_yaml("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: default}")[0],
            namespace="default",
        )
        with _scheduler(server, state):
            yield client, server


def _generic(doc: dict[str, Any]) -> Any:
    """Any object of a manifest as lightkube sends it (its typed model when it has one)."""
    return load_all_yaml(yaml.safe_dump(doc))[0]


def test_the_api_server_accepts_the_charts_dra_objects(
    cluster: tuple[Client, kubeapi.ApiServer],
) -> None:
    client, _ = cluster
    names = sorted(c.metadata.name for c in client.list(DeviceClass) if c.metadata)
    assert names == ["npu-vf1.rebellions.ai", "npu-vf4.rebellions.ai", "npu.rebellions.ai"]
    # The extended resource names survived the server (DRAExtendedResource is on in 1.37).
    got = client.get(DeviceClass, "npu.rebellions.ai")
    assert got.spec.extendedResourceName == "rebellions.ai/npu"


def _scheduled_claim(client: Client, pod: str) -> list[dict[str, Any]]:
    """The allocation results of the pod's claims, once the scheduler has bound it."""
    deadline = time.monotonic() + SCHEDULED_WITHIN_S
    while True:
        found = client.get(Pod, pod, namespace="default")
        if found.spec is not None and found.spec.nodeName:
            break
        if time.monotonic() > deadline:
            conditions = found.status.conditions if found.status else None
            pytest.fail(f"{pod} not scheduled: {conditions}")
        time.sleep(0.3)
    assert found.spec.nodeName == NODE
    results = []
    for claim in client.list(ResourceClaim, namespace="default"):
        reserved = claim.status.reservedFor if claim.status else None
        if reserved and any(r.name == pod for r in reserved):
            assert claim.status is not None and claim.status.allocation is not None
            devices = claim.status.allocation.devices
            assert devices is not None
            results.extend(r.to_dict() for r in devices.results)
    return results


def _apply_example(client: Client, name: str) -> None:
    """The example's claim template as a claim (no controller manager here), then its pod."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]
    pod = docs[-1]
    if docs[0]["kind"] == "ResourceClaimTemplate":
        template = docs[0]
        claim_name = f"{pod['metadata']['name']}-claim"
        client.create(
            ResourceClaim.from_dict(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": claim_name, "namespace": "default"},
                    "spec": template["spec"]["spec"],
                }
            )
        )
        for entry in pod["spec"]["resourceClaims"]:
            del entry["resourceClaimTemplateName"]
            entry["resourceClaimName"] = claim_name
    pod["metadata"]["namespace"] = "default"
    client.create(Pod.from_dict(pod))


def _types(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    by_name = {name: (device_type, root) for name, device_type, root in DEVICES}
    assert all(r["driver"] == DRIVER and r["pool"] == NODE for r in results)
    return [by_name[r["device"]] for r in results]


def test_two_npus_are_allocated_under_one_pcie_root(
    cluster: tuple[Client, kubeapi.ApiServer],
) -> None:
    client, _ = cluster
    _apply_example(client, "dra-two-npus-same-pcie-root")
    found = _types(_scheduled_claim(client, "dra-npu-pair"))
    # rbln0 is alone on its root: only two of rbln1-rbln3 satisfy the constraint.
    assert found == [("npu", "pci0000:80"), ("npu", "pci0000:80")]


@pytest.mark.parametrize(("name", "device_type"), [("vf1", "npu-vf1"), ("vf4", "npu-vf4")])
def test_a_vf_claim_gets_one_vf_of_its_mode(
    cluster: tuple[Client, kubeapi.ApiServer], name: str, device_type: str
) -> None:
    client, _ = cluster
    _apply_example(client, f"dra-single-pod-npu-{name}")
    found = _types(_scheduled_claim(client, f"dra-npu-{name}"))
    assert [t for t, _ in found] == [device_type]


def test_a_pod_naming_rebellions_ai_npu_is_served_through_the_device_class(
    cluster: tuple[Client, kubeapi.ApiServer],
) -> None:
    client, _ = cluster
    _apply_example(client, "dra-extended-resource-npu")
    found = _types(_scheduled_claim(client, "dra-npu-by-name"))
    assert [t for t, _ in found] == ["npu"]
