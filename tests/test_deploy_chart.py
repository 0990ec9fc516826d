"""The Helm chart, checked with the real tools: helm lint/template and kubernetes-validate.

helm comes from `make tools` (deployments/fetch-tools.sh); the fixture fetches it when it is
missing and skips only when that is impossible. What the chart renders is also fed to the
daemon's own configuration code, so a value the schema lets through cannot crash-loop the pod.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rbln_device_plugin import _build_version, config, options
from rbln_device_plugin.telemetry import logs, otlp

from .daemon_process import DaemonProcess
from .probes import health, health_port
from .prometheusrule_schema import PROMETHEUS_RULE_SCHEMA
from .servicemonitor_schema import SERVICE_MONITOR_SCHEMA

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deployments" / "helm" / "k8s-device-plugin-chart"
if not (CHART / "Chart.yaml").is_file():  # e.g. a source tree without deployments/
    pytest.skip("the Helm chart is not in this source tree", allow_module_level=True)

# Every Kubernetes minor the chart supports (Chart.yaml: kubeVersion >= 1.27).
KUBE_VERSIONS = tuple(f"1.{minor}.0" for minor in range(27, 36))
RELEASE = "k8s-device-plugin"
NAMESPACE = "k8s-device-plugin"
# The Go plugin's chart names its objects after the chart, whatever the release is called.
CHART_NAME = "k8s-device-plugin-chart"

# The Go plugin's chart's values tree (every key an operator's values file can hold), each
# set away from its default, so a setting that is dropped shows up as a failed assertion.
GO_CHART_VALUES: dict[str, Any] = {
    "nameOverride": "rbln-npu",
    "fullnameOverride": "rbln-npu-plugin",
    "namespaceOverride": "npu-system",
    "selectorLabelsOverride": {"example.com/fleet": "npu"},
    "imagePullSecrets": [{"name": "regcred"}],
    "image": {
        "repository": "registry.example.com/npu/k8s-device-plugin",
        "pullPolicy": "Always",
        "tag": "1.10",
    },
    "serviceAccount": {
        "create": True,
        "annotations": {"example.com/owner": "ml-platform"},
        "name": "npu-plugin-sa",
    },
    "logging": {"level": "debug", "format": "text"},
    "devicePlugin": {
        "priorityClassName": "npu-critical",
        "updateStrategy": {"type": "OnDelete"},
        "podAnnotations": {"example.com/scrape": "false"},
        "podSecurityContext": {"runAsUser": 0},
        "nodeSelector": {"example.com/npu": "present"},
        "tolerations": [{"key": "example.com/npu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                            ]
                        }
                    ]
                }
            }
        },
        "kubeletDevicePluginPath": "/var/lib/k0s/kubelet/device-plugins",
        "cdiRoot": "/etc/cdi",
        "useGenericResourceName": False,
        "otlpEndpoint": "otel-collector.observability:4317",
        "containers": {
            "plugin": {
                "securityContext": {"privileged": True, "runAsUser": 0},
                "resources": {
                    "requests": {"cpu": "20m", "memory": "96Mi"},
                    "limits": {"memory": "300Mi"},
                },
                "healthcheckPort": 60000,
            }
        },
    },
}
# The Go chart's keys, as its values file lays them out. Maps and lists count as one setting.
GO_CHART_KEYS = {
    "nameOverride", "fullnameOverride", "namespaceOverride", "selectorLabelsOverride",
    "imagePullSecrets", "image.repository", "image.pullPolicy", "image.tag",
    "serviceAccount.create", "serviceAccount.annotations", "serviceAccount.name",
    "logging.level", "logging.format",
    "devicePlugin.priorityClassName", "devicePlugin.updateStrategy", "devicePlugin.podAnnotations",
    "devicePlugin.podSecurityContext", "devicePlugin.nodeSelector", "devicePlugin.tolerations",
    "devicePlugin.affinity", "devicePlugin.kubeletDevicePluginPath", "devicePlugin.cdiRoot",
    "devicePlugin.useGenericResourceName", "devicePlugin.otlpEndpoint",
    "devicePlugin.containers.plugin.securityContext", "devicePlugin.containers.plugin.resources",
    "devicePlugin.containers.plugin.healthcheckPort",
}  # fmt: skip
# Settings that are whole maps or lists in the Go chart (compared as one value).
GO_CHART_OPAQUE = {
    "selectorLabelsOverride", "imagePullSecrets", "serviceAccount.annotations",
    "devicePlugin.updateStrategy", "devicePlugin.podAnnotations", "devicePlugin.podSecurityContext",
    "devicePlugin.nodeSelector", "devicePlugin.tolerations", "devicePlugin.affinity",
    "devicePlugin.containers.plugin.securityContext", "devicePlugin.containers.plugin.resources",
}  # fmt: skip

# The Go chart's own defaults, as a values file copied from it would carry them.
GO_CHART_DEFAULTS: dict[str, Any] = {
    "nameOverride": "", "fullnameOverride": "", "namespaceOverride": "",
    "selectorLabelsOverride": {}, "imagePullSecrets": [],
    "image": {"repository": "registry.example.com/k8s-device-plugin", "pullPolicy": "IfNotPresent",
              "tag": ""},
    "serviceAccount": {"create": True, "annotations": {}, "name": ""},
    "logging": {"level": "info", "format": "json"},
    "devicePlugin": {
        "priorityClassName": "system-node-critical", "updateStrategy": {"type": "RollingUpdate"},
        "podAnnotations": {}, "podSecurityContext": {},
        "nodeSelector": {"rebellions.ai/npu.present": "true"}, "tolerations": [], "affinity": {},
        "kubeletDevicePluginPath": "/var/lib/kubelet/device-plugins", "cdiRoot": "/var/run/cdi",
        "useGenericResourceName": True, "otlpEndpoint": "",
        "containers": {"plugin": {"securityContext": {"privileged": True}, "resources": {},
                                  "healthcheckPort": 51515}},
    },
}  # fmt: skip

PLUGIN = "devicePlugin.containers.plugin"
# Value sets rendered once each, checked against every Kubernetes version and the daemon.
VARIANTS: Mapping[str, tuple[str, ...]] = {
    "default": (),
    "otlp": ("--set", "devicePlugin.otlpEndpoint=otel-collector.observability:4317"),
    "logging": ("--set", "logging.level=debug", "--set", "logging.format=text"),
    "healthcheck-disabled": ("--set", f"{PLUGIN}.healthcheckPort=-1"),
    "metrics": (
        "--set", "devicePlugin.metrics.prometheus.enabled=true",
        "--set", "devicePlugin.metrics.prometheus.port=9500",
        "--set", "devicePlugin.otlpEndpoint=otel-collector.observability:4317",
        "--set", "devicePlugin.metrics.otlp.enabled=true",
        "--set", "devicePlugin.metrics.otlp.exportInterval=30s",
        "--set", "devicePlugin.metrics.service.enabled=true",
        "--set", "devicePlugin.metrics.service.labels.team=ml",
        "--set-string", "devicePlugin.metrics.service.annotations.example\\.com/scrape=true",
        "--set", "devicePlugin.metrics.serviceMonitor.enabled=true",
        "--set", "devicePlugin.metrics.serviceMonitor.interval=1m",
        "--set", "devicePlugin.metrics.serviceMonitor.scrapeTimeout=15s",
        "--set", "devicePlugin.metrics.serviceMonitor.labels.release=prometheus",
        "--set", "devicePlugin.metrics.prometheusRule.enabled=true",
    ),
    "custom": (
        "--set", "devicePlugin.kubeletDevicePluginPath=/var/lib/k0s/kubelet/device-plugins",
        "--set", "devicePlugin.cdiRoot=/etc/cdi",
        "--set", f"{PLUGIN}.healthcheckPort=60000",
        "--set", "devicePlugin.deviceScanInterval=1m30s",
        "--set", "image.repository=registry.example.com/npu/k8s-device-plugin",
        "--set-string", "image.tag=1.10",
        "--set", "image.pullPolicy=Always",
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "devicePlugin.podAnnotations.team=ml",
        "--set", f"{PLUGIN}.resources.limits.memory=512Mi",
        "--set", f"{PLUGIN}.resources.requests.cpu=50m",
        "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=npu-sa",
        "--set", "devicePlugin.priorityClassName=",
        "--set", "devicePlugin.updateStrategy.type=OnDelete",
        "--set", f"{PLUGIN}.extraEnv[0].name=RBLN_SMI_PATH",
        "--set", f"{PLUGIN}.extraEnv[0].value=/host/usr/bin/rbln-smi",
    ),
}  # fmt: skip
VALUES_FILES: Mapping[str, dict[str, Any]] = {
    "go-values": GO_CHART_VALUES,
    "go-defaults": GO_CHART_DEFAULTS,
}
ALL_VARIANTS = (*VARIANTS, *VALUES_FILES)

# Variables the CLI reads that the chart leaves at their defaults on purpose: the mounts put
# sysfs, /dev and rbln-smi where the defaults look; the scan stall limit's default is the
# liveness rule the chart's probe is tuned to. extraEnv can still set them.
LEFT_AT_DEFAULT = {"SYSFS_ROOT", "DEV_ROOT", "RBLN_SMI_PATH", "SCAN_STALL_LIMIT"}
# Test only (the simulated node): the chart never sets it and refuses it in extraEnv.
TEST_ONLY = {"RBLN_TEST_FILE_DEVICE_NODES"}


# `helm template` answers by what helm was given: the binary, the arguments, the values
# file's contents (not its name) and the chart's files. Many tests (in several modules, each
# with its own `helm` fixture) render the same values; helm's answer to the same input is the
# same, and a changed chart is a new key.
_RENDERED: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}


# The chart's files, by what a look at them shows (name, inode, size, change times): a
# changed or replaced file is read again, an unchanged one is not reread on every
# `helm template`. An edit keeping the size within one tick of the file clock (a few ms)
# would go unseen: only a program makes one, and no test edits the chart.
_DIGESTS: dict[tuple[tuple[str, int, int, int, int], ...], str] = {}


def chart_digest(chart: Path = CHART) -> str:
    """A digest of every file of the chart, names and contents: what `helm template` reads."""
    files = sorted(p for p in chart.rglob("*") if p.is_file())
    seen = tuple(
        (
            str(path.relative_to(chart)),
            (st := path.stat()).st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
        )
        for path in files
    )
    known = _DIGESTS.get(seen)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(chart)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    _DIGESTS[seen] = digest.hexdigest()
    return _DIGESTS[seen]


class Helm:
    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.home = home
        # helm writes its config/cache under HOME; keep it out of the user's.
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home)}
        self._files = 0

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def values_file(self, values: Mapping[str, Any]) -> str:
        self._files += 1
        path = self.home / f"values-{self._files}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return str(path)

    def attempt(
        self, *args: str, values: Mapping[str, Any] | None = None, release: str = RELEASE
    ) -> subprocess.CompletedProcess[str]:
        """`helm template` of the chart with ``args``, memoized (see ``_RENDERED``)."""
        values_text = "" if values is None else yaml.safe_dump(dict(values))
        key = (str(self.binary), chart_digest(), release, values_text, *args)
        done = _RENDERED.get(key)
        if done is None:
            extra = ("-f", self.values_file(values)) if values is not None else ()
            command = ("template", release, str(CHART), "--namespace", NAMESPACE, *extra, *args)
            done = _RENDERED[key] = self.run(*command)
        # A copy: a test that changes what it got cannot change another test's answer.
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, done.stderr)

    def template(
        self, *args: str, values: Mapping[str, Any] | None = None, release: str = RELEASE
    ) -> str:
        done = self.attempt(*args, values=values, release=release)
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
    out = {name: helm.template(*args) for name, args in VARIANTS.items()}
    out.update({name: helm.template(values=values) for name, values in VALUES_FILES.items()})
    return out


# libyaml's safe loader: the pure-Python one takes ten times as long on these manifests, and
# both build the same objects from them (test_libyaml_parses_every_variant_as_pyyaml_does).
MANIFEST_LOADER = yaml.CSafeLoader
# A manifest's objects by its text, pickled: many tests read the same rendering, and each
# gets its own copy, so a test that changes what it got cannot change another test's.
_PARSED: dict[str, bytes] = {}


def objects(manifest: str) -> list[dict[str, Any]]:
    """The objects of a rendered manifest, empty documents left out."""
    parsed = _PARSED.get(manifest)
    if parsed is None:
        docs = [doc for doc in yaml.load_all(manifest, Loader=MANIFEST_LOADER) if doc]
        parsed = _PARSED[manifest] = pickle.dumps(docs)
    loaded: list[dict[str, Any]] = pickle.loads(parsed)
    return loaded


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


def literal_env(manifest: str) -> dict[str, str]:
    """The plugin's environment as the daemon will see it (downward-API entries left out)."""
    env = env_of(plugin_container(daemonset(manifest)))
    return {name: value for name, value in env.items() if isinstance(value, str)}


def host_mounts(ds: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """mountPath in the container -> (host path, read-only)."""
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    return {
        m["mountPath"]: (volumes[m["name"]], bool(m.get("readOnly", False)))
        for m in plugin_container(ds)["volumeMounts"]
    }


def daemon_objection(env: Mapping[str, str]) -> str | None:
    """Why the daemon would refuse (or ignore) this environment at start, or None.

    Uses the daemon's own code: config.config_from_settings (exit 2 on a bad setting), the logger's
    fallback to defaults, and the OTLP endpoint parser (tracing silently off).
    """
    try:
        config.config_from_settings({}, env)
    except config.ConfigError as exc:
        return str(exc)
    ignored = config.ignored_env_problem(env)
    if ignored is not None:
        return ignored
    fallbacks = logs.resolve_settings(env).fallbacks
    if fallbacks:
        return f"logging falls back to defaults: {fallbacks}"
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if endpoint:
        try:
            otlp.parse_endpoint(endpoint)
        except otlp.EndpointError as exc:
            return f"tracing disabled: {exc}"
    return None


def leaf_keys(values: Mapping[str, Any], opaque: set[str], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in opaque:
            yield from leaf_keys(value, opaque, f"{path}.")
        else:
            yield path


def test_chart_passes_helm_lint_strict(helm: Helm) -> None:
    done = helm.run("lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_chart_passes_helm_lint_strict_with_a_go_chart_values_file(helm: Helm) -> None:
    done = helm.run("lint", "--strict", str(CHART), "-f", helm.values_file(GO_CHART_VALUES))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_variant_is_strictly_valid_kubernetes(
    helm: Helm, rendered: dict[str, str], kube_version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kubernetes_validate.validate reads and parses the version's schema files (1.4 MB of
    # definitions) for every object it checks; here each is parsed once for this version.
    # validate itself runs unchanged on the same contents: it only reads them.
    read = kubernetes_validate.utils.schema_contents
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents", functools.cache(read))
    # helm itself accepts the version (Chart.yaml kubeVersion) ...
    assert helm.template("--kube-version", kube_version) == rendered["default"]
    # ... and every object of every variant matches that version's strict schemas.
    for variant in ALL_VARIANTS:
        docs = objects(rendered[variant])
        assert {o["kind"] for o in docs} >= {"DaemonSet"}
        for doc in docs:
            if doc["kind"] == "ServiceMonitor":  # a CRD: Kubernetes' schemas do not have it
                jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
                continue
            if doc["kind"] == "PrometheusRule":  # a CRD too
                jsonschema.validate(doc, PROMETHEUS_RULE_SCHEMA)
                continue
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{variant} {doc['kind']} on {kube_version}: {exc.message}")


def test_libyaml_parses_every_variant_as_pyyaml_does(rendered: dict[str, str]) -> None:
    # repr: the same keys in the same order, and the same types (True == 1, 1.0 == 1).
    for variant in ALL_VARIANTS:
        pure = [doc for doc in yaml.load_all(rendered[variant], Loader=yaml.SafeLoader) if doc]
        assert repr(objects(rendered[variant])) == repr(pure), variant
    # Each call has its own objects: a test that changes them cannot change another's.
    first = objects(rendered["default"])
    first[0]["metadata"]["name"] = "changed"
    assert objects(rendered["default"])[0]["metadata"]["name"] != "changed"


def test_the_chart_digest_follows_an_edited_or_added_file(tmp_path: Path) -> None:
    # The renderings are memoized by it: a stale digest would answer with an old chart.
    (tmp_path / "templates").mkdir()
    values = tmp_path / "values.yaml"
    values.write_text("a: 1\n")
    first = chart_digest(tmp_path)
    assert chart_digest(tmp_path) == first
    values.write_text("a: 22\n")
    second = chart_digest(tmp_path)
    assert second != first
    (tmp_path / "templates" / "x.yaml").write_text("")
    assert chart_digest(tmp_path) not in (first, second)


def test_chart_refuses_kubernetes_older_than_1_27(helm: Helm) -> None:
    done = helm.attempt("--kube-version", "1.26.0")
    assert done.returncode != 0
    assert "kubeVersion" in done.stderr


def test_strict_validation_rejects_an_unknown_field(rendered: dict[str, str]) -> None:
    # Guards against a validator that silently accepts anything (e.g. a missing schema set).
    ds = daemonset(rendered["default"])
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenessProb"):
        kubernetes_validate.validate(ds, KUBE_VERSIONS[0], strict=True)


def test_default_daemonset_matches_the_deployment_contract(rendered: dict[str, str]) -> None:
    ds = daemonset(rendered["default"])
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(ds)

    assert ds["metadata"]["name"] == CHART_NAME
    assert ds["metadata"]["namespace"] == NAMESPACE
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": CHART_NAME,
        "app.kubernetes.io/instance": RELEASE,
    }
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert container["command"] == ["rbln-device-plugin"]
    assert container["image"] == f"k8s-device-plugin:{_build_version.DEFAULT}"
    assert container["securityContext"] == {"privileged": True}
    assert container["livenessProbe"] == {
        "grpc": {"port": 51515, "service": "liveness"},
        "timeoutSeconds": 5,
        "periodSeconds": 10,
        "failureThreshold": 3,
    }
    assert container["readinessProbe"] == {
        "grpc": {"port": 51515, "service": "readiness"},
        "timeoutSeconds": 5,
        "periodSeconds": 10,
        "failureThreshold": 3,
    }
    assert env_of(container) == {
        "CDI_ROOT": "/var/run/cdi",
        "CDI_STATIC_DIR": "/etc/cdi",
        "CDI_MODE": "annotation",
        "KUBELET_DEVICE_PLUGIN_PATH": "/var/lib/kubelet/device-plugins",
        "HEALTHCHECK_PORT": "51515",
        "DEVICE_SCAN_INTERVAL": "5s",
        "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
        "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json",
        "USE_GENERIC_RESOURCE_NAME": "true",
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "METRICS_PORT": "-1",
        "METRICS_OTLP": "false",
        "METRICS_EXPORT_INTERVAL": "60s",
        "RSD_LOCK_PATH": "/run/rbln/rsd-group.lock",
        "RBLN_INSTALLATION": "k8s-device-plugin/k8s-device-plugin-chart",
    }
    assert container["ports"] == [{"name": "health", "containerPort": 51515, "protocol": "TCP"}]
    assert host_mounts(ds) == {
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", False),
        "/var/run/cdi": ("/var/run/cdi", False),
        "/etc/cdi": ("/etc/cdi", True),
        "/dev": ("/dev", False),
        "/run/rbln": ("/run/rbln", False),
        "/host/usr/bin": ("/usr/bin", True),
    }
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"rebellions.ai/npu.present": "true"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert "imagePullSecrets" not in pod
    assert "securityContext" not in pod
    assert container["resources"] == {"requests": {"memory": "80Mi"}, "limits": {"memory": "256Mi"}}


def test_default_release_creates_the_service_account_the_pods_use(
    rendered: dict[str, str],
) -> None:
    docs = objects(rendered["default"])
    (account,) = [o for o in docs if o["kind"] == "ServiceAccount"]
    pod = daemonset(rendered["default"])["spec"]["template"]["spec"]
    assert account["metadata"]["name"] == CHART_NAME
    assert pod["serviceAccountName"] == CHART_NAME
    assert account["metadata"]["namespace"] == NAMESPACE
    # The plugin never calls the API server.
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_no_service_link_variable_reaches_the_plugin(
    rendered: dict[str, str], variant: str
) -> None:
    # A Service named "metrics" in the namespace would set METRICS_PORT=tcp://...
    pod = daemonset(rendered[variant])["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False


@pytest.mark.parametrize("release", [RELEASE, "npu", "prod-k8s-device-plugin-chart"])
def test_objects_are_named_after_the_chart_whatever_the_release(helm: Helm, release: str) -> None:
    # So `helm upgrade` from the Go plugin's chart updates its DaemonSet in place: the name
    # and the (immutable) selector are the ones that chart created.
    docs = objects(helm.template(release=release))
    assert {(o["kind"], o["metadata"]["name"]) for o in docs} == {
        ("DaemonSet", CHART_NAME),
        ("ServiceAccount", CHART_NAME),
    }
    ds = daemonset(helm.template(release=release))
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": CHART_NAME,
        "app.kubernetes.io/instance": release,
    }


@pytest.mark.parametrize(
    ("overrides", "object_name", "name_label"),
    [
        ({"nameOverride": "npu-plugin"}, "npu-plugin", "npu-plugin"),
        ({"fullnameOverride": "npu-ds"}, "npu-ds", CHART_NAME),
        ({"nameOverride": "npu", "fullnameOverride": "npu-ds"}, "npu-ds", "npu"),
    ],
)
def test_name_overrides(
    helm: Helm, overrides: dict[str, str], object_name: str, name_label: str
) -> None:
    docs = objects(helm.template(values=overrides))
    assert {o["metadata"]["name"] for o in docs} == {object_name}
    ds = daemonset(helm.template(values=overrides))
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == name_label


def test_namespace_override_moves_every_object(helm: Helm) -> None:
    docs = objects(helm.template("--set", "namespaceOverride=npu-system"))
    assert {o["metadata"]["namespace"] for o in docs} == {"npu-system"}


def test_selector_labels_override_reaches_selector_and_pods(helm: Helm) -> None:
    ds = daemonset(helm.template(values={"selectorLabelsOverride": {"example.com/fleet": "a"}}))
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector["example.com/fleet"] == "a"
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_go_chart_values_file_covers_every_key_of_that_chart() -> None:
    # The fixture below must stay a complete Go-chart values file for the next test to mean
    # "every setting".
    assert set(leaf_keys(GO_CHART_VALUES, GO_CHART_OPAQUE)) == GO_CHART_KEYS
    assert set(leaf_keys(GO_CHART_DEFAULTS, GO_CHART_OPAQUE)) == GO_CHART_KEYS


def test_go_chart_values_file_reaches_the_daemonset(rendered: dict[str, str]) -> None:
    go = GO_CHART_VALUES
    plugin = go["devicePlugin"]
    container_values = plugin["containers"]["plugin"]
    docs = objects(rendered["go-values"])
    ds = daemonset(rendered["go-values"])
    (account,) = [o for o in docs if o["kind"] == "ServiceAccount"]
    pod_template = ds["spec"]["template"]
    pod = pod_template["spec"]
    container = plugin_container(ds)
    env = env_of(container)

    # Names, namespace and labels.
    assert ds["metadata"]["name"] == go["fullnameOverride"]
    assert {o["metadata"]["namespace"] for o in docs} == {go["namespaceOverride"]}
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": go["nameOverride"],
        "app.kubernetes.io/instance": RELEASE,
        **go["selectorLabelsOverride"],
    }
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_template["metadata"]["labels"].items()
    # Image and service account.
    assert pod["imagePullSecrets"] == go["imagePullSecrets"]
    assert container["image"] == f"{go['image']['repository']}:{go['image']['tag']}"
    assert container["imagePullPolicy"] == go["image"]["pullPolicy"]
    assert account["metadata"]["name"] == go["serviceAccount"]["name"]
    assert account["metadata"]["annotations"] == go["serviceAccount"]["annotations"]
    assert pod["serviceAccountName"] == go["serviceAccount"]["name"]
    # Logging.
    assert env["RBLN_DEVICE_PLUGIN_LOG_LEVEL"] == go["logging"]["level"]
    assert env["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] == go["logging"]["format"]
    # Pod-level devicePlugin settings.
    assert pod["priorityClassName"] == plugin["priorityClassName"]
    assert ds["spec"]["updateStrategy"] == plugin["updateStrategy"]
    assert pod_template["metadata"]["annotations"] == plugin["podAnnotations"]
    assert pod["securityContext"] == plugin["podSecurityContext"]
    # Maps merge with the defaults, as in the Go chart (whose default selector is the same).
    assert pod["nodeSelector"] == {"rebellions.ai/npu.present": "true", **plugin["nodeSelector"]}
    assert pod["tolerations"] == plugin["tolerations"]
    assert pod["affinity"] == plugin["affinity"]
    # Daemon settings: the variable, the mount and the host path agree on each directory.
    kubelet_dir, cdi_root = plugin["kubeletDevicePluginPath"], plugin["cdiRoot"]
    assert env["KUBELET_DEVICE_PLUGIN_PATH"] == kubelet_dir
    assert env["CDI_ROOT"] == cdi_root
    assert host_mounts(ds)[kubelet_dir] == (kubelet_dir, False)
    assert host_mounts(ds)[cdi_root] == (cdi_root, False)
    assert env["USE_GENERIC_RESOURCE_NAME"] == "false"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == plugin["otlpEndpoint"]
    # Container settings.
    assert container["securityContext"] == container_values["securityContext"]
    assert container["resources"] == container_values["resources"]
    port = container_values["healthcheckPort"]
    assert env["HEALTHCHECK_PORT"] == str(port)
    assert container["livenessProbe"]["grpc"]["port"] == port
    assert container["ports"] == [{"name": "health", "containerPort": port, "protocol": "TCP"}]


def test_go_chart_defaults_file_renders_the_go_charts_choices(rendered: dict[str, str]) -> None:
    ds = daemonset(rendered["go-defaults"])
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(ds)
    assert ds["metadata"]["name"] == CHART_NAME
    # A list replaces the chart's default; an empty map keeps it (helm merges maps).
    assert "tolerations" not in pod
    assert container["resources"]["requests"]["memory"] == "80Mi"
    assert env_of(container)["USE_GENERIC_RESOURCE_NAME"] == "true"


def test_custom_values_reach_the_daemonset(rendered: dict[str, str]) -> None:
    docs = objects(rendered["custom"])
    assert not [o for o in docs if o["kind"] == "ServiceAccount"]
    ds = daemonset(rendered["custom"])
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(ds)
    env = env_of(container)

    assert container["image"] == "registry.example.com/npu/k8s-device-plugin:1.10"
    assert pod["serviceAccountName"] == "npu-sa"
    assert "priorityClassName" not in pod
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert container["resources"] == {
        "limits": {"memory": "512Mi"},
        "requests": {"cpu": "50m", "memory": "80Mi"},
    }
    assert env["DEVICE_SCAN_INTERVAL"] == "1m30s"
    assert env["RBLN_SMI_PATH"] == "/host/usr/bin/rbln-smi"


def test_otlp_endpoint_is_passed_only_when_set(rendered: dict[str, str]) -> None:
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in literal_env(rendered["default"])
    assert "OTEL_TRACES_EXPORTER" not in literal_env(rendered["default"])
    otlp_env = literal_env(rendered["otlp"])
    assert otlp_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "otel-collector.observability:4317"
    assert otlp_env["OTEL_TRACES_EXPORTER"] == "otlp"


def test_tracing_off_keeps_the_endpoint_for_metrics(helm: Helm) -> None:
    manifest = helm.template(
        "--set", "devicePlugin.otlpEndpoint=otel-collector.observability:4317",
        "--set", "devicePlugin.metrics.otlp.enabled=true",
        "--set", "devicePlugin.tracing.enabled=false",
    )  # fmt: skip
    env = literal_env(manifest)
    assert env["OTEL_TRACES_EXPORTER"] == "none" and env["METRICS_OTLP"] == "true"
    cfg = options.parse([], env)
    assert not cfg.tracing_enabled and cfg.metrics_otlp


@pytest.mark.parametrize("port", [-1, 0])
def test_health_port_below_one_drops_probe_and_port(helm: Helm, port: int) -> None:
    container = plugin_container(
        daemonset(helm.template("--set", f"{PLUGIN}.healthcheckPort={port}"))
    )
    assert env_of(container)["HEALTHCHECK_PORT"] == str(port)
    assert "livenessProbe" not in container
    assert "readinessProbe" not in container
    assert "ports" not in container


@pytest.mark.parametrize(
    ("setting", "refused_key"),
    [
        ("devicePlugn.cdiRoot=/etc/cdi", "devicePlugn"),
        # The flat layout of earlier versions of this chart: gone, and refused, not ignored.
        ("cdiRoot=/etc/cdi", "cdiRoot"),
        ("kubeletDevicePluginPath=/var/lib/k0s/kubelet/device-plugins", "kubeletDevicePluginPath"),
        ("healthcheckPort=60000", "healthcheckPort"),
        ("resources.limits.memory=1Gi", "resources"),
        ("tolerations[0].operator=Exists", "tolerations"),
        ("devicePlugin.healthcheckPort=60000", "healthcheckPort"),
        ("devicePlugin.containers.plugin.resource.limits.memory=1Gi", "resource"),
        ("devicePlugin.containers.plugins.healthcheckPort=1", "plugins"),
        ("devicePlugin.containers.plugin.securityContext.privilegd=true", "privilegd"),
        ("devicePlugin.tolerations[0].efect=NoSchedule", "efect"),
        ("devicePlugin.updateStrategy.rollingUpdate.maxUnavaliable=2", "maxUnavaliable"),
        ("image.digest=sha256:0", "digest"),
        ("logging.colour=true", "colour"),
    ],
)
def test_unknown_keys_are_refused(helm: Helm, setting: str, refused_key: str) -> None:
    done = helm.attempt("--set", setting)
    assert refused_by_chart(done), done.stderr
    assert f"additional properties '{refused_key}' not allowed" in done.stderr


def test_global_values_are_allowed(helm: Helm) -> None:
    assert daemonset(helm.template("--set", "global.imageRegistry=registry.example.com"))


# (value key, value, environment variable the daemon reads it from). Each value is one the
# daemon refuses at start (or silently replaces); helm must refuse it at install.
SCAN = "devicePlugin.deviceScanInterval"
REFUSED: list[tuple[str, Any, str]] = [
    *((SCAN, v, "DEVICE_SCAN_INTERVAL") for v in (
        "0s", "0", "0.0ms", "-5s", "5", "5S", "1d", "abc", "25h", "24h0m0.001s",
        "86400001ms", "1441m", "24.5h", "100000s")),
    *((f"{PLUGIN}.healthcheckPort", v, "HEALTHCHECK_PORT") for v in (65536, 70000)),
    ("devicePlugin.kubeletDevicePluginPath", "", "KUBELET_DEVICE_PLUGIN_PATH"),
    ("devicePlugin.kubeletDevicePluginPath", None, "KUBELET_DEVICE_PLUGIN_PATH"),
    # 62 characters: the longest socket path inside it would exceed 107 bytes.
    ("devicePlugin.kubeletDevicePluginPath", "/" + "k" * 61, "KUBELET_DEVICE_PLUGIN_PATH"),
    ("devicePlugin.cdiRoot", "", "CDI_ROOT"),
    ("devicePlugin.cdiRoot", None, "CDI_ROOT"),
    ("devicePlugin.cdiRoot", " ", "CDI_ROOT"),
    ("devicePlugin.cdiRoot", "cdi", "CDI_ROOT"),
    ("devicePlugin.cdiRoot", "var/run/cdi", "CDI_ROOT"),
    ("devicePlugin.cdiRoot", "/var/run/../cdi", "CDI_ROOT"),
    ("devicePlugin.cdiStaticDir", "", "CDI_STATIC_DIR"),
    ("devicePlugin.cdiStaticDir", "etc/cdi", "CDI_STATIC_DIR"),
    ("devicePlugin.cdiStaticDir", "/etc/../cdi", "CDI_STATIC_DIR"),
    ("devicePlugin.cdiMode", "annotations", "CDI_MODE"),
    ("devicePlugin.cdiMode", "", "CDI_MODE"),
    ("devicePlugin.kubeletDevicePluginPath", "device-plugins", "KUBELET_DEVICE_PLUGIN_PATH"),
    ("devicePlugin.kubeletDevicePluginPath", "/var/lib/kubelet/..", "KUBELET_DEVICE_PLUGIN_PATH"),
    ("devicePlugin.useGenericResourceName", "maybe", "USE_GENERIC_RESOURCE_NAME"),
    ("devicePlugin.useGenericResourceName", "yes", "USE_GENERIC_RESOURCE_NAME"),
    ("logging.level", "verbose", "RBLN_DEVICE_PLUGIN_LOG_LEVEL"),
    ("logging.level", "trace", "RBLN_DEVICE_PLUGIN_LOG_LEVEL"),
    ("logging.format", "xml", "RBLN_DEVICE_PLUGIN_LOG_FORMAT"),
    *(("devicePlugin.otlpEndpoint", v, "OTEL_EXPORTER_OTLP_ENDPOINT") for v in (
        "otel-collector", "otel-collector:0", "otel-collector:65536", "otel-collector:otlp",
        "ftp://otel-collector:4317", "https://", "https://otel-collector:99999",
        "user@otel-collector:4317", "otel collector:4317", ":4317", "otel-collector:04317",
        "http://otel-collector:4317/v1/traces", "HTTPS://otel-collector:4317", "otel_:4317",
        "-otel:4317")),
    # (devicePlugin.tracing.enabled: "no" is refused by the schema, but not by the daemon
    # any more: an unsupported OTEL_TRACES_EXPORTER is a warning there, as OpenTelemetry's
    # specification says.)
    # OTLP metrics without a collector: the daemon stops with a usage error.
    ("devicePlugin.metrics.otlp.enabled", True, "METRICS_OTLP"),
    *(("devicePlugin.metrics.otlp.exportInterval", v, "METRICS_EXPORT_INTERVAL") for v in (
        "0s", "-1s", "25h", "60", "abc", "999ms", "1ms")),
    *(("devicePlugin.metrics.prometheus.port", v, "METRICS_PORT") for v in (65536, 99999)),
]  # fmt: skip


def refused_by_chart(done: subprocess.CompletedProcess[str]) -> bool:
    """helm failed on the chart's schema or one of its checks, not on its own arguments."""
    return done.returncode != 0 and (
        "values don't meet the specifications of the schema" in done.stderr
        or "execution error at (k8s-device-plugin-chart/templates/" in done.stderr
    )


def _set_json(key: str, value: Any) -> tuple[str, str]:
    return ("--set-json", f"{key}={json.dumps(value)}")


@pytest.mark.parametrize(("key", "value", "variable"), REFUSED)
def test_values_the_daemon_refuses_are_refused_at_install(
    helm: Helm, rendered: dict[str, str], key: str, value: Any, variable: str
) -> None:
    # What the pod would get if the chart let the value through: the value as text, and a
    # missing (null) value as the empty string the template would render.
    env = {**literal_env(rendered["default"]), variable: "" if value is None else str(value)}
    assert daemon_objection(env) is not None, f"the daemon accepts {variable}={value!r}"
    done = helm.attempt(*_set_json(key, value))
    assert done.returncode != 0, f"helm accepted {key}={value!r}"
    assert refused_by_chart(done), done.stderr
    assert key.rsplit(".", 1)[-1] in done.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [("SYSFS_ROOT", ""), ("SYSFS_ROOT", "  "), ("DEV_ROOT", ""), ("RSD_LOCK_PATH", "\t")],
)
def test_extra_env_paths_the_daemon_refuses_are_refused(
    helm: Helm, rendered: dict[str, str], name: str, value: str
) -> None:
    env = {**literal_env(rendered["default"]), name: value}
    assert daemon_objection(env) is not None
    done = helm.attempt(*_set_json(f"{PLUGIN}.extraEnv", [{"name": name, "value": value}]))
    assert refused_by_chart(done), done.stderr
    assert "extraEnv" in done.stderr


@pytest.mark.parametrize(
    "name",
    [
        "CDI_ROOT",
        "CDI_STATIC_DIR",
        "CDI_MODE",
        "HEALTHCHECK_PORT",
        "USE_GENERIC_RESOURCE_NAME",
        *sorted(TEST_ONLY),
    ],
)
def test_extra_env_cannot_shadow_a_chart_value(helm: Helm, name: str) -> None:
    done = helm.attempt(*_set_json(f"{PLUGIN}.extraEnv", [{"name": name, "value": "x"}]))
    assert refused_by_chart(done), done.stderr
    assert "extraEnv" in done.stderr


SIM_VOLUME = {"name": "simulated-node", "hostPath": {"path": "/srv/npu-node", "type": "Directory"}}
SIM_MOUNT = {"name": "simulated-node", "mountPath": "/srv/npu-node", "readOnly": True}


def test_extra_volumes_are_mounted_in_the_plugin_container(helm: Helm) -> None:
    ds = daemonset(
        helm.template(
            *_set_json("devicePlugin.extraVolumes", [SIM_VOLUME]),
            *_set_json(f"{PLUGIN}.extraVolumeMounts", [SIM_MOUNT]),
        )
    )
    assert SIM_VOLUME in ds["spec"]["template"]["spec"]["volumes"]
    assert SIM_MOUNT in plugin_container(ds)["volumeMounts"]
    assert host_mounts(ds)["/srv/npu-node"] == ("/srv/npu-node", True)
    # The chart's own mounts stay as they were.
    assert host_mounts(ds)["/dev"] == ("/dev", False)


@pytest.mark.parametrize(
    ("volumes", "mounts", "words"),
    [
        ([{**SIM_VOLUME, "name": "dev"}], [], "the volume name dev is already used by the chart"),
        ([SIM_VOLUME], [{**SIM_MOUNT, "name": "elsewhere"}], "elsewhere names no volume"),
        ([SIM_VOLUME], [{**SIM_MOUNT, "mountPath": "/run/rbln"}], "/run/rbln is already used"),
        ([SIM_VOLUME], [{**SIM_MOUNT, "mountPath": "/var/lib/kubelet/device-plugins/"}],
         "/var/lib/kubelet/device-plugins is already used by devicePlugin.kubeletDevicePluginPath"),
        ([SIM_VOLUME], [{**SIM_MOUNT, "mountPath": "srv/x"}], "is not an absolute path"),
        ([SIM_VOLUME], [SIM_MOUNT, SIM_MOUNT], "/srv/npu-node is already used by the extra mount"),
    ],
)  # fmt: skip
def test_extra_mounts_that_collide_or_dangle_are_refused(
    helm: Helm, volumes: list[Any], mounts: list[Any], words: str
) -> None:
    done = helm.attempt(
        *_set_json("devicePlugin.extraVolumes", volumes),
        *_set_json(f"{PLUGIN}.extraVolumeMounts", mounts),
    )
    assert refused_by_chart(done), done.stderr
    assert words in done.stderr


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("devicePlugin.cdiRoot", "/dev"),
        ("devicePlugin.cdiStaticDir", "/dev"),
        ("devicePlugin.cdiRoot", "/var/lib/kubelet/device-plugins/"),
        ("devicePlugin.kubeletDevicePluginPath", "/run/rbln"),
        ("devicePlugin.cdiRoot", "/host/usr/bin"),
    ],
)
def test_directories_that_collide_with_another_mount_are_refused(
    helm: Helm, key: str, value: str
) -> None:
    done = helm.attempt("--set", f"{key}={value}")
    assert refused_by_chart(done), done.stderr
    assert f"{key}: {value.rstrip('/')} is already used by" in done.stderr


# (value key, value, variable): edge values helm must accept, rendered unchanged.
ACCEPTED: list[tuple[str, Any, str]] = [
    *((SCAN, v, "DEVICE_SCAN_INTERVAL") for v in (
        "24h", "1440m", "86400s", "86400000ms", "23h59m59.999s", "23h59m60s", "1ns", ".5s",
        "+5s", "1h30m", "1.5h", "500ms", "5µs", "5us", "0.001ms")),
    *((f"{PLUGIN}.healthcheckPort", v, "HEALTHCHECK_PORT") for v in (65535, 1, 0, -1, -2)),
    ("devicePlugin.kubeletDevicePluginPath", "/" + "k" * 60, "KUBELET_DEVICE_PLUGIN_PATH"),
    ("devicePlugin.kubeletDevicePluginPath", "/var/snap/microk8s/common/var/lib/kubelet/"
     "device-plugins", "KUBELET_DEVICE_PLUGIN_PATH"),
    *(("logging.level", v, "RBLN_DEVICE_PLUGIN_LOG_LEVEL") for v in (
        "error", "WARN", "warning", "Info", "debug")),
    *(("logging.format", v, "RBLN_DEVICE_PLUGIN_LOG_FORMAT") for v in ("json", "TEXT")),
    *(("devicePlugin.otlpEndpoint", v, "OTEL_EXPORTER_OTLP_ENDPOINT") for v in (
        "otel-collector.observability:4317", "https://otel.example.com",
        "https://otel.example.com:4317/", "http://10.0.0.1:4318", "grpc://otel:4317",
        "grpcs://otel:443", "[::1]:4317", "localhost:65535")),
    *(("devicePlugin.metrics.otlp.exportInterval", v, "METRICS_EXPORT_INTERVAL") for v in (
        "24h", "1s", "15s", "1m30s")),
]  # fmt: skip


@pytest.mark.parametrize(("key", "value", "variable"), ACCEPTED)
def test_edge_values_the_chart_accepts_are_accepted_by_the_daemon(
    helm: Helm, key: str, value: Any, variable: str
) -> None:
    env = literal_env(helm.template(*_set_json(key, value)))
    assert env[variable] == str(value)
    assert daemon_objection(env) is None


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_variant_starts_the_daemon_configuration(
    rendered: dict[str, str], variant: str
) -> None:
    assert daemon_objection(literal_env(rendered[variant])) is None


def test_empty_logging_values_become_the_daemon_defaults(helm: Helm) -> None:
    env = literal_env(helm.template("--set", "logging.level=", "--set", "logging.format="))
    assert env["RBLN_DEVICE_PLUGIN_LOG_LEVEL"] == "info"
    assert env["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] == "json"


_TERM = st.tuples(
    st.one_of(
        st.integers(0, 100_000).map(str),
        st.tuples(st.integers(0, 30_000), st.integers(0, 999)).map(lambda p: f"{p[0]}.{p[1]:03d}"),
        st.integers(0, 999).map(lambda n: f".{n}"),
    ),
    st.sampled_from(["ns", "us", "µs", "ms", "s", "m", "h"]),
)


@pytest.mark.slow  # about 40 helm runs: seconds
@settings(max_examples=40, deadline=None, derandomize=True)
@given(sign=st.sampled_from(["", "+"]), terms=st.lists(_TERM, min_size=1, max_size=3))
# Go cuts each term to whole nanoseconds: ".1ns" is 0 s, and "0.5ns1ns" is 1 ns.
@example(sign="", terms=[(".1", "ns")])
@example(sign="", terms=[("0.5", "ns"), ("1", "ns")])
def test_scan_interval_helm_and_daemon_agree(
    helm: Helm, sign: str, terms: list[tuple[str, str]]
) -> None:
    text = sign + "".join(number + unit for number, unit in terms)
    seconds = config.parse_duration(text)
    # The daemon adds in binary floating point, the templates in decimal: within a
    # microsecond of 24h the two may round differently, so that sliver is not compared.
    if abs(seconds - 86400) < 1e-6:
        return
    daemon_ok = daemon_objection({"DEVICE_SCAN_INTERVAL": text}) is None
    helm_ok = helm.attempt("--set-string", f"{SCAN}={text}").returncode == 0
    assert helm_ok == daemon_ok, f"{text!r} ({seconds} s): helm {helm_ok}, daemon {daemon_ok}"


# (what --set gives, words the refusal must contain). Each names the key, says what is
# wrong and what to write instead; none prints a pattern.
READABLE: list[tuple[list[str], str]] = [
    (["--set", f"{SCAN}=5"], f"{SCAN}: 5 is a number, but the plugin needs a Go duration with "
     "a unit, such as 5s"),
    (["--set", f"{SCAN}=5x"], f'{SCAN}: "5x" is not a Go duration: write numbers with units'),
    (["--set", "devicePlugin.otlpEndpoint=otel-collector"], 'devicePlugin.otlpEndpoint: '
     '"otel-collector" is neither host:port (port 1-65535, no TLS) nor a URL'),
    (["--set", "devicePlugin.cdiRoot=cdi"], 'devicePlugin.cdiRoot: "cdi" is not an absolute '
     "path; give the host directory, such as /var/run/cdi"),
    (["--set", "devicePlugin.kubeletDevicePluginPath=/var/lib/kubelet/../x"],
     "devicePlugin.kubeletDevicePluginPath: \"/var/lib/kubelet/../x\" contains '..'"),
    (["--set", f"{PLUGIN}.resources.limits.memory=256MB"], f"{PLUGIN}.resources.limits.memory: "
     '"256MB" is not a Kubernetes quantity (such as 256Mi'),
    (["--set-json", f'{PLUGIN}.extraEnv=[{{"name": "SYSFS_ROOT", "value": " "}}]'],
     f"{PLUGIN}.extraEnv: SYSFS_ROOT is blank; give a path"),
    (["--set-json", f'{PLUGIN}.extraEnv=[{{"name": "RSD_LOCK_PATH", "value": "/var"}}]'],
     f'{PLUGIN}.extraEnv: RSD_LOCK_PATH "/var" is not a lock file\'s path'),
]  # fmt: skip


@pytest.mark.parametrize(("args", "words"), READABLE)
def test_refusals_say_what_is_wrong_in_words(helm: Helm, args: list[str], words: str) -> None:
    done = helm.attempt(*args)
    assert refused_by_chart(done), done.stderr
    assert words in done.stderr
    assert "pattern" not in done.stderr and "^" not in done.stderr, done.stderr


_ENDPOINT = st.tuples(
    st.sampled_from(["", "http://", "https://", "grpc://", "grpcs://", "HTTP://", "ftp://"]),
    st.sampled_from(["otel", "otel-collector.ns.svc", "-otel", "otel-", "o_t", "[::1]", "[zz]",
                     "10.0.0.1", "", "o tel", "otel.", "a"]),
    st.sampled_from(["", ":4317", ":0", ":1", ":65535", ":65536", ":04317", ":x", ":"]),
    st.sampled_from(["", "/", "/v1/traces", "?q"]),
)  # fmt: skip


@pytest.mark.slow  # about 60 helm runs: seconds
@settings(max_examples=60, deadline=None, derandomize=True)
@given(parts=_ENDPOINT)
def test_otlp_endpoint_helm_and_daemon_agree(helm: Helm, parts: tuple[str, str, str, str]) -> None:
    endpoint = "".join(parts)
    if not endpoint:
        return  # empty turns tracing off in both
    daemon_ok = daemon_objection({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}) is None
    done = helm.attempt(*_set_json("devicePlugin.otlpEndpoint", endpoint))
    assert done.returncode == 0 or refused_by_chart(done), done.stderr
    assert (done.returncode == 0) == daemon_ok, f"{endpoint!r}: helm {done.stderr}"


@pytest.mark.slow  # about 40 helm runs: seconds
@settings(max_examples=40, deadline=None, derandomize=True)
@given(parts=st.lists(st.sampled_from(["", ".", "..", "run", "rbln", "a.lock"]), max_size=4),
       lead=st.sampled_from(["/", "", "//"]), tail=st.sampled_from(["", "/", "/."]))  # fmt: skip
def test_rsd_lock_path_helm_and_daemon_agree(
    helm: Helm, parts: list[str], lead: str, tail: str
) -> None:
    path = lead + "/".join(parts) + tail
    if not path.strip():
        return  # blank: refused by the chart's own blank check (above)
    daemon_ok = daemon_objection({"RSD_LOCK_PATH": path}) is None
    done = helm.attempt(
        *_set_json(f"{PLUGIN}.extraEnv", [{"name": "RSD_LOCK_PATH", "value": path}])
    )
    assert done.returncode == 0 or refused_by_chart(done), done.stderr
    assert (done.returncode == 0) == daemon_ok, f"{path!r}: helm {done.stderr}"


# The daemon's dra-mode settings: set only with `mode: dra` (test_deploy_chart_dra.py).
DRA_MODE_ONLY = {
    "RBLN_MODE", "KUBELET_PLUGINS_REGISTRY_PATH", "KUBELET_PLUGINS_PATH", "KUBECONFIG",
    # dra mode, and device-plugin mode with modeSwitch (a node switched between the modes)
    "KUBELET_POD_RESOURCES_SOCKET",
    "RBLN_DRA_TAINT_NO_EXECUTE",
}  # fmt: skip


def test_chart_sets_exactly_the_variables_the_cli_reads(rendered: dict[str, str]) -> None:
    set_by_chart = set(env_of(plugin_container(daemonset(rendered["otlp"]))))
    assert set_by_chart <= options.ENVIRONMENT_VARIABLES, "chart sets variables the CLI ignores"
    assert set_by_chart == (
        options.ENVIRONMENT_VARIABLES - LEFT_AT_DEFAULT - TEST_ONLY - DRA_MODE_ONLY
    )


def _daemon_args(tmp: Path) -> list[str]:
    """Host paths moved into a scratch directory; everything else comes from the chart."""
    return [
        "--kubelet-device-plugin-path", str(tmp / "kubelet"),
        "--cdi-root", str(tmp / "cdi"),
        "--sysfs-root", str(tmp / "sys"),
        "--dev-root", str(tmp / "dev"),
        "--rbln-smi", str(tmp / "no-rbln-smi"),
        "--rsd-lock-path", str(tmp / "rsd.lock"),
        "--healthcheck-port", "0",
    ]  # fmt: skip


def test_go_values_with_legacy_names_make_the_daemon_warn_once(
    rendered: dict[str, str], short_tmp: Path
) -> None:
    # The pod's environment as the chart renders it for a Go values file that still asks
    # for the per-product names, run through the real CLI.
    env = literal_env(rendered["go-values"])
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT")  # no collector here
    env["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] = "json"  # what DaemonProcess parses
    daemon = DaemonProcess(_daemon_args(short_tmp), env=env, level="info")
    try:
        (start,) = daemon.wait_for("Starting rbln-device-plugin")
        daemon.wait_for("Started healthcheck service")
    finally:
        assert daemon.stop() == 0
    assert start["config"]["scanInterval"] == "5s"
    warnings = [r for r in daemon.records if "USE_GENERIC_RESOURCE_NAME" in r["msg"]]
    assert len(warnings) == 1
    assert warnings[0]["level"] == "warn"


def test_chart_app_version_is_the_package_default_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == _build_version.DEFAULT


def test_chart_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()

    def documented(key: str) -> bool:
        # A map documented as a whole (updateStrategy, nodeSelector) covers its children.
        parts = key.split(".")
        return any(f"`{'.'.join(parts[:n])}`" in readme for n in range(1, len(parts) + 1))

    missing = [key for key in leaf_keys(values, set()) if not documented(key)]
    assert not missing, f"values missing from the chart README: {missing}"


def test_chart_readme_states_the_default_memory_figures() -> None:
    plugin = yaml.safe_load((CHART / "values.yaml").read_text())["devicePlugin"]
    resources = plugin["containers"]["plugin"]["resources"]
    readme = (CHART / "README.md").read_text()
    assert f"request {resources['requests']['memory']}" in readme
    assert f"limit {resources['limits']['memory']}" in readme
    assert "spec.devicePlugin.resources" in readme  # where operator users set the same


def _yamllint(paths: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(Path(sys.executable).with_name("yamllint")),
            "--strict",
            "-d",
            "{extends: default, rules: {document-start: disable, line-length: {max: 100}}}",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_values_and_chart_metadata_pass_yamllint() -> None:
    done = _yamllint([CHART / "values.yaml", CHART / "Chart.yaml"])
    assert done.returncode == 0, done.stdout + done.stderr


def readme_commands(prefix: str) -> list[list[str]]:
    """Shell commands in the README's sh blocks that start with ``prefix``, as argv lists."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```$", readme, flags=re.S | re.M)
    lines = [line.strip() for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(prefix)]


PLACEHOLDERS = {
    "<registry>": "registry.example.com",
    "<tag>": "1.2.0",
    "<release>": RELEASE,
    "<namespace>": NAMESPACE,
}


def _fill(word: str, values_file: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        word = word.replace(placeholder, value)
    return word.replace("<your-values.yaml>", values_file)


@pytest.mark.parametrize("kind", ["quick start", "migration"])
def test_readme_helm_commands_render_with_this_chart(helm: Helm, kind: str) -> None:
    prefix = "helm upgrade --install" if kind == "quick start" else "helm upgrade <release>"
    (argv,) = readme_commands(prefix)
    argv = [_fill(word, helm.values_file(GO_CHART_VALUES)) for word in argv]
    # `helm upgrade [--install] RELEASE CHART ARGS...` rendered as `helm template`.
    positional = [w for w in argv[2:] if not w.startswith("-")][:2]
    assert positional[1] == "./deployments/helm/k8s-device-plugin-chart"
    rest = argv[2:]
    for word in positional:
        rest.remove(word)
    rest = [w for w in rest if w not in ("--install", "--create-namespace")]
    done = helm.run("template", positional[0], str(REPO / positional[1]), *rest)
    assert done.returncode == 0, done.stderr
    ds = daemonset(done.stdout)
    assert plugin_container(ds)["image"] == "registry.example.com/k8s-device-plugin:1.2.0"
    if kind == "quick start":
        # The README's rollout check looks in the namespace the install used.
        (check,) = [c for c in readme_commands("kubectl -n") if "daemonset,pods" in c]
        assert ds["metadata"]["namespace"] == check[2]


SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# Kubernetes objects passed through from the values: their keys must be Kubernetes' own.
PASSED_THROUGH = {
    "devicePlugin/podSecurityContext": "io.k8s.api.core.v1.PodSecurityContext",
    "devicePlugin/containers/plugin/securityContext": "io.k8s.api.core.v1.SecurityContext",
    "devicePlugin/containers/plugin/resources": "io.k8s.api.core.v1.ResourceRequirements",
    "devicePlugin/containers/plugin/extraEnv/[]": "io.k8s.api.core.v1.EnvVar",
    "devicePlugin/containers/plugin/extraVolumeMounts/[]": "io.k8s.api.core.v1.VolumeMount",
    "devicePlugin/extraVolumes/[]": "io.k8s.api.core.v1.Volume",
    "devicePlugin/tolerations/[]": "io.k8s.api.core.v1.Toleration",
    "devicePlugin/affinity": "io.k8s.api.core.v1.Affinity",
    "devicePlugin/updateStrategy": "io.k8s.api.apps.v1.DaemonSetUpdateStrategy",
    "devicePlugin/updateStrategy/rollingUpdate": "io.k8s.api.apps.v1.RollingUpdateDaemonSet",
    "imagePullSecrets/[]": "io.k8s.api.core.v1.LocalObjectReference",
}


def schema_at(path: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in path.split("/"):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def schema_objects(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Any]]:
    if "properties" in node:
        yield path or "/", node
        for key, child in node["properties"].items():
            yield from schema_objects(child, f"{path}/{key}")
    if isinstance(node.get("items"), dict):
        yield from schema_objects(node["items"], f"{path}/[]")


def test_every_object_in_the_schema_is_closed() -> None:
    found = dict(schema_objects(SCHEMA))
    assert len(found) > 15
    open_objects = [path for path, node in found.items() if node.get("additionalProperties")]
    assert not open_objects
    assert all(node.get("additionalProperties") is False for node in found.values())
    assert schema_at("global") == {"type": "object"}


@pytest.mark.parametrize("path", sorted(PASSED_THROUGH))
def test_passed_through_objects_take_exactly_the_kubernetes_fields(path: str) -> None:
    definitions = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{KUBE_VERSIONS[-1]}-local-strict/_definitions.json",
        KUBE_VERSIONS[-1],
    )["$defs"]
    kubernetes_fields = set(definitions[PASSED_THROUGH[path]]["properties"])
    assert set(schema_at(path)["properties"]) == kubernetes_fields


# ---------------------------------------------------------------- probes and the RSD lock
def _probe_services(container: Mapping[str, Any]) -> dict[str, str]:
    return {
        kind: container[kind]["grpc"]["service"]
        for kind in ("livenessProbe", "readinessProbe")
        if kind in container
    }


@pytest.mark.parametrize(
    ("strategy", "readiness"),
    [
        ({"type": "RollingUpdate"}, True),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2, "maxSurge": 0}}, True),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "0%"}}, True),
        ({"type": "OnDelete"}, True),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}, False),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "10%"}},
            False,
        ),
    ],
)
def test_a_surge_rollout_has_no_readiness_probe_to_deadlock_on(
    helm: Helm, strategy: dict[str, Any], readiness: bool
) -> None:
    # With maxSurge the controller deletes the old pod only once the new one is ready, and
    # the new one serves only once the old one is gone: a readiness probe would hold both.
    manifest = helm.template(values={"devicePlugin": {"updateStrategy": strategy}})
    services = _probe_services(plugin_container(daemonset(manifest)))
    expected = {"livenessProbe": "liveness"}
    if readiness:
        expected["readinessProbe"] = "readiness"
    assert services == expected


def test_the_surge_handover_value_rolls_one_new_pod_in_before_the_old_one_goes(
    helm: Helm,
) -> None:
    manifest = helm.template(values={"devicePlugin": {"surgeHandover": True}})
    ds = daemonset(manifest)
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    container = plugin_container(ds)
    # Ready means every resource is registered: only then does the controller delete
    # the old pod, which the new one took over from.
    assert _probe_services(container) == {
        "livenessProbe": "liveness",
        "readinessProbe": "registered",
    }
    assert env_of(container)["RBLN_INSTALLATION"] == "k8s-device-plugin/k8s-device-plugin-chart"
    # The default is unchanged: the chart's strategy and readiness as before.
    default = plugin_container(daemonset(helm.template()))
    assert _probe_services(default) == {"livenessProbe": "liveness", "readinessProbe": "readiness"}


@pytest.mark.parametrize(
    ("plugin", "says"),
    [
        ({"updateStrategy": {"type": "OnDelete"}}, "sets the update strategy itself"),
        (
            {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2}}},
            "sets the update strategy itself",
        ),
        ({"containers": {"plugin": {"healthcheckPort": -1}}}, "needs the health service"),
        ({"kubeletDevicePluginPath": "/" + "k" * 56}, "longer than 56 characters"),
    ],
)
def test_the_surge_handover_value_refuses_what_would_defeat_it(
    helm: Helm, plugin: dict[str, Any], says: str
) -> None:
    done = helm.attempt(values={"devicePlugin": {"surgeHandover": True, **plugin}})
    assert done.returncode != 0 and refused_by_chart(done), done.stderr
    assert says in done.stderr


def _container_to_host(ds: Mapping[str, Any], path: str) -> tuple[str, bool]:
    """The host path behind a container path, through the pod's hostPath mounts."""
    for mount, (host, read_only) in sorted(host_mounts(ds).items(), key=lambda m: -len(m[0])):
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return host + path[len(mount.rstrip("/")) :], read_only
    raise AssertionError(f"{path} is inside the container only: no hostPath mount holds it")


def _without(args: Sequence[str], *flags: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


async def test_the_charts_probes_mean_alive_and_ready_on_the_real_daemon(
    rendered: dict[str, str],
) -> None:
    """Two pods of the chart on one node: the second waits, alive but not ready."""
    from rbln_device_plugin_sim.kubelet import KubeletStub
    from rbln_device_plugin_sim.layout import preset
    from rbln_device_plugin_sim.node import materialize, short_tempdir

    ds = daemonset(rendered["default"])
    services = _probe_services(plugin_container(ds))
    assert services == {"livenessProbe": "liveness", "readinessProbe": "readiness"}
    env = literal_env(rendered["default"])
    env["RBLN_DEVICE_PLUGIN_LOG_FORMAT"] = "json"  # what DaemonProcess parses
    root = short_tempdir()
    node = materialize(preset("rebel-4"), root)
    # The node's host paths replace the chart's; the health port is picked per pod.
    args = [*_without(node.daemon_args(), "--healthcheck-port", "--rsd-lock-path")]
    args += ["--healthcheck-port", "0"]
    env["RSD_LOCK_PATH"] = str(
        node.root / "host" / _container_to_host(ds, env["RSD_LOCK_PATH"])[0].lstrip("/")
    )
    async with KubeletStub(node.kubelet_dir) as kubelet:
        first = DaemonProcess(args, env=env)
        second: DaemonProcess | None = None
        try:
            await kubelet.wait_for("rebellions.ai/npu", lambda v: len(v.devices) == 4)
            # A second release: another installation, which waits (the same DaemonSet's
            # next pod takes over instead, see tests/test_handover.py).
            other = {**env, "RBLN_INSTALLATION": f"{env['RBLN_INSTALLATION']}-2"}
            second = DaemonProcess(args, env=other)
            ports = {}
            for name, daemon in (("first", first), ("second", second)):
                ports[name] = await health_port(daemon)
            await second.await_log(
                "Another rbln-device-plugin instance serves this kubelet directory; "
                "waiting for it to exit"
            )
            assert await health(ports["second"], services["livenessProbe"]) == "SERVING"
            assert await health(ports["second"], services["readinessProbe"]) == "NOT_SERVING"
            assert await health(ports["first"], services["livenessProbe"]) == "SERVING"
            assert await health(ports["first"], services["readinessProbe"]) == "SERVING"
            # The RSD lock is the host file the chart names, shared by both pods.
            await kubelet.allocate("rebellions.ai/npu", [["rbln0"]])
            assert Path(env["RSD_LOCK_PATH"]).is_file()
        finally:
            first.kill()
            if second is not None:
                second.kill()
            shutil.rmtree(root, ignore_errors=True)


def test_the_rsd_lock_is_a_host_file_every_instance_on_the_node_shares(
    rendered: dict[str, str],
) -> None:
    # A lock inside the container would serialise only this pod's own allocations: a surge
    # successor, or an rbln-smi orphaned by a killed pod, would not see it.
    for variant in ("default", "custom", "go-values"):
        ds = daemonset(rendered[variant])
        path = literal_env(rendered[variant])["RSD_LOCK_PATH"]
        host, read_only = _container_to_host(ds, path)
        assert host == "/run/rbln/rsd-group.lock" and not read_only


@pytest.mark.parametrize("mode", ["annotation", "field", "both"])
def test_cdi_settings_reach_the_daemon(helm: Helm, mode: str) -> None:
    ds = daemonset(
        helm.template("--set", f"devicePlugin.cdiMode={mode}",
                      "--set", "devicePlugin.cdiStaticDir=/opt/cdi")
    )  # fmt: skip
    env = env_of(plugin_container(ds))
    assert (env["CDI_MODE"], env["CDI_STATIC_DIR"]) == (mode, "/opt/cdi")
    assert daemon_objection({k: v for k, v in env.items() if isinstance(v, str)}) is None
    # Read only: the plugin never writes the static directory.
    assert host_mounts(ds)["/opt/cdi"] == ("/opt/cdi", True)


def test_a_static_dir_equal_to_the_cdi_root_is_mounted_once(helm: Helm) -> None:
    ds = daemonset(helm.template("--set", "devicePlugin.cdiStaticDir=/var/run/cdi/"))
    mounts = host_mounts(ds)
    assert mounts["/var/run/cdi"] == ("/var/run/cdi", False)
    assert [p for p in mounts if "cdi" in p] == ["/var/run/cdi"]
