"""The Helm chart, checked with the real tools: helm lint/template and kubernetes-validate.

helm comes from `make tools` (deployments/fetch-tools.sh); the fixture fetches it when it is
missing and skips only when that is impossible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from rbln_device_plugin import config

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deployments" / "helm" / "k8s-device-plugin-chart"
KUBE_VALIDATE = Path(sys.executable).with_name("kubernetes-validate")
# kubernetes-validate ships schemas up to 1.37; 1.35 matches the fetched helm/kubectl.
KUBE_VERSION = "1.35.0"
RELEASE = "k8s-device-plugin"
NAMESPACE = "k8s-device-plugin"

# The value variants operators use, each rendered once and validated.
VARIANTS: Mapping[str, tuple[str, ...]] = {
    "default": (),
    "otlp": ("--set", "devicePlugin.otlpEndpoint=otel-collector.observability:4317"),
    "logging": ("--set", "logging.level=debug", "--set", "logging.format=text"),
    "healthcheck-disabled": ("--set", "healthcheckPort=-1"),
    "custom": (
        "--set", "kubeletDevicePluginPath=/var/lib/k0s/kubelet/device-plugins",
        "--set", "cdiRoot=/etc/cdi",
        "--set", "healthcheckPort=60000",
        "--set", "deviceScanInterval=1m30s",
        "--set", "image.repository=registry.example.com/npu/k8s-device-plugin",
        "--set-string", "image.tag=1.10",
        "--set", "image.pullPolicy=Always",
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "podAnnotations.team=ml",
        "--set", "resources.limits.memory=256Mi",
        "--set", "resources.requests.cpu=50m",
        "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=npu-sa",
        "--set", "fullnameOverride=npu-plugin",
        "--set", "devicePlugin.priorityClassName=",
        "--set", "devicePlugin.updateStrategy.type=OnDelete",
        "--set", "devicePlugin.updateStrategy.rollingUpdate=null",
        "--set", "extraEnv[0].name=RBLN_SMI_PATH",
        "--set", "extraEnv[0].value=/host/usr/bin/rbln-smi",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=kubernetes.io/arch",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=In",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].values[0]=amd64",
    ),
}  # fmt: skip

# Variables the CLI reads that the chart leaves at their defaults on purpose: the mounts put
# sysfs, /dev and rbln-smi where the defaults look, and USE_GENERIC_RESOURCE_NAME is only
# accepted for operator compatibility. extraEnv can still set any of them.
LEFT_AT_DEFAULT = {"SYSFS_ROOT", "DEV_ROOT", "RBLN_SMI_PATH", "RSD_LOCK_PATH"}
IGNORED_BY_CLI = {"USE_GENERIC_RESOURCE_NAME"}


class Helm:
    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        # helm writes its config/cache under HOME; keep it out of the user's.
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home)}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def template(self, *args: str) -> str:
        done = self.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout


def _find_helm() -> Path | None:
    local = REPO / ".tools" / "helm" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which("helm")
    return Path(found) if found else None


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = _find_helm()
    if binary is None:
        fetch = subprocess.run(
            ["bash", str(REPO / "deployments" / "fetch-tools.sh")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        binary = _find_helm()
        if binary is None:
            pytest.skip(f"helm unavailable (make tools): {fetch.stderr.strip()}")
    return Helm(binary, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[str, str]:
    return {name: helm.template(*args) for name, args in VARIANTS.items()}


def objects(manifest: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def daemonset(manifest: str) -> dict[str, Any]:
    (found,) = [o for o in objects(manifest) if o["kind"] == "DaemonSet"]
    return found


def plugin_container(ds: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "plugin"
    return dict(container)


def env_of(container: Mapping[str, Any]) -> dict[str, Any]:
    """name -> literal value, or the valueFrom mapping for downward-API entries."""
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), f"duplicate env entries: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def host_mounts(ds: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """mountPath in the container -> (host path, read-only)."""
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    return {
        m["mountPath"]: (volumes[m["name"]], bool(m.get("readOnly", False)))
        for m in plugin_container(ds)["volumeMounts"]
    }


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBE_VALIDATE), "--strict", "-k", KUBE_VERSION, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_chart_passes_helm_lint_strict(helm: Helm) -> None:
    done = helm.run("lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_variant_is_valid_kubernetes(
    variant: str, rendered: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / f"{variant}.yaml"
    path.write_text(rendered[variant])
    done = kubernetes_validate(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "daemonset/" in done.stdout


def test_strict_validation_rejects_an_unknown_field(
    rendered: dict[str, str], tmp_path: Path
) -> None:
    # Guards against a validator that silently accepts anything (e.g. a missing schema set).
    ds = daemonset(rendered["default"])
    plugin_container(ds)  # shape check
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = {}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(ds))
    done = kubernetes_validate(path)
    assert done.returncode != 0
    assert "livenessProb" in done.stdout + done.stderr


def test_default_daemonset_matches_the_deployment_contract(rendered: dict[str, str]) -> None:
    ds = daemonset(rendered["default"])
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(ds)

    assert ds["metadata"]["name"] == RELEASE
    assert ds["metadata"]["namespace"] == NAMESPACE
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert container["command"] == ["rbln-device-plugin"]
    assert container["image"] == "k8s-device-plugin:0.1.0"
    assert container["securityContext"] == {"privileged": True}
    assert container["livenessProbe"] == {
        "grpc": {"port": 51515, "service": "liveness"},
        "failureThreshold": 3,
        "periodSeconds": 10,
    }
    assert env_of(container) == {
        "CDI_ROOT": "/var/run/cdi",
        "KUBELET_DEVICE_PLUGIN_PATH": "/var/lib/kubelet/device-plugins",
        "HEALTHCHECK_PORT": "51515",
        "DEVICE_SCAN_INTERVAL": "5s",
        "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
        "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json",
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert host_mounts(ds) == {
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", False),
        "/var/run/cdi": ("/var/run/cdi", False),
        "/dev": ("/dev", False),
        "/run/rbln": ("/run/rbln", False),
        "/host/usr/bin": ("/usr/bin", True),
    }
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"rebellions.ai/npu.present": "true"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert "imagePullSecrets" not in pod
    assert "resources" not in container


def test_default_release_creates_the_service_account_the_pods_use(
    rendered: dict[str, str],
) -> None:
    docs = objects(rendered["default"])
    (account,) = [o for o in docs if o["kind"] == "ServiceAccount"]
    pod = daemonset(rendered["default"])["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == NAMESPACE
    # The plugin never calls the API server.
    assert pod["automountServiceAccountToken"] is False


def test_otlp_endpoint_is_passed_only_when_set(rendered: dict[str, str]) -> None:
    default_env = env_of(plugin_container(daemonset(rendered["default"])))
    otlp_env = env_of(plugin_container(daemonset(rendered["otlp"])))
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in default_env
    assert otlp_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "otel-collector.observability:4317"


def test_logging_values_become_the_logging_variables(rendered: dict[str, str]) -> None:
    env = env_of(plugin_container(daemonset(rendered["logging"])))
    assert env["RBLN_DEVICE_PLUGIN_LOG_LEVEL"] == "debug"
    assert env["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] == "text"


def test_negative_healthcheck_port_disables_probe_and_port(rendered: dict[str, str]) -> None:
    container = plugin_container(daemonset(rendered["healthcheck-disabled"]))
    assert env_of(container)["HEALTHCHECK_PORT"] == "-1"
    assert "livenessProbe" not in container
    assert "ports" not in container


def test_overrides_reach_the_daemonset(rendered: dict[str, str]) -> None:
    docs = objects(rendered["custom"])
    assert not [o for o in docs if o["kind"] == "ServiceAccount"]
    ds = daemonset(rendered["custom"])
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(ds)
    env = env_of(container)

    assert ds["metadata"]["name"] == "npu-plugin"
    assert container["image"] == "registry.example.com/npu/k8s-device-plugin:1.10"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "npu-sa"
    assert "priorityClassName" not in pod
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"team": "ml"}
    assert container["resources"] == {"limits": {"memory": "256Mi"}, "requests": {"cpu": "50m"}}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["amd64"]
    # The daemon, the mount and the host path must agree on each directory.
    assert env["KUBELET_DEVICE_PLUGIN_PATH"] == "/var/lib/k0s/kubelet/device-plugins"
    assert env["CDI_ROOT"] == "/etc/cdi"
    mounts = host_mounts(ds)
    assert mounts["/var/lib/k0s/kubelet/device-plugins"][0] == "/var/lib/k0s/kubelet/device-plugins"
    assert mounts["/etc/cdi"][0] == "/etc/cdi"
    assert env["DEVICE_SCAN_INTERVAL"] == "1m30s"
    assert env["RBLN_SMI_PATH"] == "/host/usr/bin/rbln-smi"
    assert env["HEALTHCHECK_PORT"] == "60000"
    assert container["livenessProbe"]["grpc"]["port"] == 60000
    assert container["ports"][0]["containerPort"] == 60000


@pytest.mark.parametrize(
    ("setting", "named_key"),
    [
        ("logging.level=verbose", "/logging/level"),
        ("logging.format=xml", "/logging/format"),
        ("healthcheckPort=0", "/healthcheckPort"),
        ("healthcheckPort=70000", "/healthcheckPort"),
        ("deviceScanInterval=5", "/deviceScanInterval"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("cdiRoot=relative/cdi", "/cdiRoot"),
    ],
)
def test_bad_values_are_rejected_with_the_key_named(
    helm: Helm, setting: str, named_key: str
) -> None:
    done = helm.run("template", RELEASE, str(CHART), "--set", setting)
    assert done.returncode != 0
    assert named_key in done.stderr


def test_chart_sets_exactly_the_variables_the_cli_reads(rendered: dict[str, str]) -> None:
    set_by_chart = set(env_of(plugin_container(daemonset(rendered["otlp"]))))
    assert set_by_chart <= config.ENVIRONMENT_VARIABLES, "chart sets variables the CLI ignores"
    assert set_by_chart == config.ENVIRONMENT_VARIABLES - LEFT_AT_DEFAULT - IGNORED_BY_CLI


def _leaf_keys(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, f"{path}.")
        else:
            yield path


def test_chart_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()

    def documented(key: str) -> bool:
        # A map documented as a whole (updateStrategy, nodeSelector) covers its children.
        parts = key.split(".")
        return any(f"`{'.'.join(parts[:n])}`" in readme for n in range(1, len(parts) + 1))

    missing = [key for key in _leaf_keys(values) if not documented(key)]
    assert not missing, f"values missing from the chart README: {missing}"


def test_values_and_chart_metadata_pass_yamllint() -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("yamllint")),
            "--strict",
            "-d",
            "{extends: default, rules: {document-start: disable, line-length: {max: 100}}}",
            str(CHART / "values.yaml"),
            str(CHART / "Chart.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
