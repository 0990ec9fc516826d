"""The example pods and claims: valid Kubernetes, the right resource or DeviceClass, and
guides that match their files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rbln_device_plugin.model import inventory

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
if not EXAMPLES.is_dir():  # e.g. a source tree without examples/
    pytest.skip("examples/ is not in this source tree", allow_module_level=True)
KUBE_VALIDATE = Path(sys.executable).with_name("kubernetes-validate")
KUBE_VERSION = "1.35.0"
# resource.k8s.io/v1 from 1.34; the DRA examples are checked against each version since.
DRA_KUBE_VERSIONS = ("1.34.0", "1.37.0")
FIXED_RESOURCES = {"rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"}

# guide name -> (resource requested, number of pods, devices per pod)
CASES: dict[str, tuple[str, int, int]] = {
    "single-pod-double-npu": ("rebellions.ai/npu", 1, 2),
    "two-pods-one-npu-each": ("rebellions.ai/npu", 2, 1),
    "single-pod-npu-vf4": ("rebellions.ai/npu-vf4", 1, 1),
    # Served through the DeviceClass's extendedResourceName in the chart's dra mode.
    "dra-extended-resource-npu": ("rebellions.ai/npu", 1, 1),
}
# DRA guide name -> (DeviceClass, devices in the claim, matchAttribute or None)
DRA_CASES: dict[str, tuple[str, int, str | None]] = {
    "dra-two-npus-same-pcie-root": ("npu.rebellions.ai", 2, "resource.kubernetes.io/pcieRoot"),
    "dra-single-pod-npu-vf1": ("npu-vf1.rebellions.ai", 1, None),
    "dra-single-pod-npu-vf4": ("npu-vf4.rebellions.ai", 1, None),
}
ALL_CASES = [*CASES, *DRA_CASES]


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]


def pods(name: str) -> list[dict[str, Any]]:
    docs = documents(name)
    if name in DRA_CASES:  # a claim template, then the pod that uses it
        assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "Pod"]
        return docs[1:]
    assert all(d["kind"] == "Pod" for d in docs)
    return docs


def test_every_example_is_covered() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.yaml")} == set(ALL_CASES)
    assert {p.stem for p in EXAMPLES.glob("*.md")} == set(ALL_CASES)


def test_fixed_resource_names_match_the_plugin() -> None:
    plugin_names = {inventory.RESOURCE_NPU, inventory.RESOURCE_NPU_VF1, inventory.RESOURCE_NPU_VF4}
    assert plugin_names == FIXED_RESOURCES


@pytest.mark.parametrize(
    ("name", "version"),
    [(name, KUBE_VERSION) for name in CASES]
    + [(name, version) for name in DRA_CASES for version in DRA_KUBE_VERSIONS],
)
def test_example_manifest_is_valid_kubernetes(name: str, version: str) -> None:
    done = subprocess.run(
        [str(KUBE_VALIDATE), "--strict", "-k", version, str(EXAMPLES / f"{name}.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed" not in done.stdout
    assert f"against version {version.rsplit('.', 1)[0]}" in done.stdout


@pytest.mark.parametrize("name", list(DRA_CASES))
def test_dra_example_claims_devices_of_a_chart_device_class(name: str) -> None:
    # The classes the chart's dra mode creates (test_deploy_chart_dra checks the chart).
    from .test_deploy_chart_dra import CLASSES

    device_class, count, match = DRA_CASES[name]
    template, pod = documents(name)
    assert device_class in {class_name for class_name, _, _ in CLASSES}
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"]["deviceClassName"] == device_class
    assert request["exactly"].get("count", 1) == count
    if match is None:
        assert "constraints" not in devices
    else:
        # matchAttribute takes the fully qualified name (domain/attribute).
        assert devices["constraints"] == [{"requests": [request["name"]], "matchAttribute": match}]
    # The pod makes its claim from the template and hands it to its one container.
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": claim["name"]}]}


def test_extended_resource_example_names_a_device_class_resource() -> None:
    from .test_deploy_chart_dra import CLASSES

    (pod,) = pods("dra-extended-resource-npu")
    assert "resourceClaims" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    (resource,) = container["resources"]["limits"]
    assert resource in {extended for _, _, extended in CLASSES}


@pytest.mark.parametrize("name", list(CASES))
def test_example_requests_the_right_npu_resource(name: str) -> None:
    resource, pod_count, per_pod = CASES[name]
    found = pods(name)
    assert len(found) == pod_count
    assert len({p["metadata"]["name"] for p in found}) == pod_count
    for pod in found:
        requested = 0
        for container in pod["spec"]["containers"]:
            resources = container.get("resources", {})
            limits = resources.get("limits", {})
            npu_keys = {k for k in limits if k.startswith("rebellions.ai/")}
            assert npu_keys <= FIXED_RESOURCES, f"unknown resource names {npu_keys}"
            # Extended resources cannot be overcommitted: requests, if given, equal limits.
            for key, value in resources.get("requests", {}).items():
                if key.startswith("rebellions.ai/"):
                    assert limits.get(key) == value
            requested += int(limits.get(resource, 0))
        assert requested == per_pod


def yaml_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```$", markdown, flags=re.S | re.M)


@pytest.mark.parametrize("name", ALL_CASES)
def test_guide_shows_its_manifest_and_apply_verify_cleanup(name: str) -> None:
    guide = (EXAMPLES / f"{name}.md").read_text()
    manifest = (EXAMPLES / f"{name}.yaml").read_text()
    assert manifest in yaml_blocks(guide), "the guide's YAML differs from the manifest file"
    path = f"examples/{name}.yaml"
    assert f"kubectl apply -f {path}" in guide
    assert f"kubectl delete -f {path}" in guide
    for pod in pods(name):
        # The verification steps refer to the pods the manifest actually creates.
        assert f"pod/{pod['metadata']['name']}" in guide
        assert f"kubectl logs {pod['metadata']['name']}" in guide
    assert (CASES[name] if name in CASES else DRA_CASES[name])[0] in guide


def test_example_manifests_pass_yamllint() -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("yamllint")),
            "--strict",
            "-d",
            "{extends: default, rules: {document-start: disable}}",
            *(str(EXAMPLES / f"{name}.yaml") for name in ALL_CASES),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
