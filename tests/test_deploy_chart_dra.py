"""The chart's `mode` value: device-plugin mode renders exactly as the chart did before the
value existed; dra mode deploys the DRA kubelet plugin with its mounts and environment, a
ClusterRole with exactly the plugin's API verbs, and the three DeviceClasses; combinations
that cannot work are refused at install, in words."""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rbln_device_plugin import options

from .test_deploy_chart import (
    ALL_VARIANTS,
    CHART,
    CHART_NAME,
    DRA_MODE_ONLY,
    GO_CHART_VALUES,
    LEFT_AT_DEFAULT,
    NAMESPACE,
    PLUGIN,
    RELEASE,
    REPO,
    TEST_ONLY,
    VALUES_FILES,
    VARIANTS,
    Helm,
    daemon_objection,
    daemonset,
    env_of,
    host_mounts,
    literal_env,
    objects,
    plugin_container,
    refused_by_chart,
)

# Fixtures shared with the main chart suite.
from .test_deploy_chart import helm as helm
from .test_deploy_chart import rendered as rendered

# The commit this mode was added on: its chart is "the chart before the value existed".
BEFORE_MODE = "ce4393d"
DRA = ("--set", "mode=dra")
DRIVER = "npu.rebellions.ai"
# The daemon settings of dra mode (issue 45), read by the CLI once the DRA mode lands.
DRA_SETTINGS = DRA_MODE_ONLY
# What only the device-plugin API uses: not set in dra mode.
DEVICE_PLUGIN_ONLY = {"KUBELET_DEVICE_PLUGIN_PATH", "CDI_MODE", "USE_GENERIC_RESOURCE_NAME"}
# Kubernetes versions with resource.k8s.io/v1 that kubernetes-validate has schemas for.
DRA_KUBE_VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
# (name, deviceType, extended resource) of each DeviceClass.
CLASSES = [
    ("npu.rebellions.ai", "npu", "rebellions.ai/npu"),
    ("npu-vf1.rebellions.ai", "npu-vf1", "rebellions.ai/npu-vf1"),
    ("npu-vf4.rebellions.ai", "npu-vf4", "rebellions.ai/npu-vf4"),
]
# The pod's node, as the downward API fills NODE_NAME (literal_env leaves it out).
NODE = {"NODE_NAME": "npu-node-1"}


def by_kind(manifest: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects(manifest) if o["kind"] == kind]


@pytest.fixture(scope="module")
def dra(helm: Helm) -> str:
    return helm.template(*DRA)


# ---- device-plugin mode: unchanged -------------------------------------------------------


@pytest.fixture(scope="module")
def chart_before_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The chart as it was before `mode`, with today's Chart.yaml (the version label)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git history (a source tree without it has no earlier chart)")
    relative = CHART.relative_to(REPO)
    done = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", BEFORE_MODE, str(relative)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"commit {BEFORE_MODE} is not in this clone: {done.stderr.decode()[-200:]}")
    root = tmp_path_factory.mktemp("chart-before-mode")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(root, filter="data")
    old = root / relative
    # The chart's version is bumped with every change; it only shows in the helm.sh/chart
    # label, so the old chart takes today's Chart.yaml and must then render byte for byte.
    shutil.copy(CHART / "Chart.yaml", old / "Chart.yaml")
    yield old


@pytest.mark.parametrize("variant", [*ALL_VARIANTS, "explicit-mode"])
def test_device_plugin_mode_renders_byte_for_byte_as_before_the_mode_value(
    helm: Helm, rendered: dict[str, str], chart_before_mode: Path, variant: str
) -> None:
    if variant in VARIANTS:
        args: tuple[str, ...] = VARIANTS[variant]
        now = rendered[variant]
    elif variant in VALUES_FILES:
        args = ("-f", helm.values_file(VALUES_FILES[variant]))
        now = rendered[variant]
    else:  # mode given as its default: the old chart never had the key
        args = ()
        now = helm.template("--set", "mode=device-plugin")
    before = helm.run("template", RELEASE, str(chart_before_mode), "--namespace", NAMESPACE, *args)
    assert before.returncode == 0, before.stderr
    assert now == before.stdout


def test_device_plugin_mode_creates_no_dra_objects(rendered: dict[str, str]) -> None:
    for variant in ALL_VARIANTS:
        kinds = {o["kind"] for o in objects(rendered[variant])}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding", "DeviceClass"}, variant


# ---- dra mode: the DaemonSet -------------------------------------------------------------


def test_dra_mode_runs_the_same_image_as_a_dra_kubelet_plugin(
    dra: str, rendered: dict[str, str]
) -> None:
    ds = daemonset(dra)
    container = plugin_container(ds)
    assert container["image"] == plugin_container(daemonset(rendered["default"]))["image"]
    assert container["command"] == ["rbln-device-plugin"]
    assert env_of(container) == {
        "RBLN_MODE": "dra",
        "KUBELET_PLUGINS_REGISTRY_PATH": "/var/lib/kubelet/plugins_registry",
        "KUBELET_PLUGINS_PATH": "/var/lib/kubelet/plugins",
        # Unhealthy devices are tainted NoSchedule: eviction is the operator's choice.
        "RBLN_DRA_TAINT_NO_EXECUTE": "false",
        "CDI_ROOT": "/var/run/cdi",
        "CDI_STATIC_DIR": "/etc/cdi",
        "HEALTHCHECK_PORT": "51515",
        "DEVICE_SCAN_INTERVAL": "5s",
        "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info",
        "RBLN_DEVICE_PLUGIN_LOG_FORMAT": "json",
        # The ResourceSlice pool and the slices' node: always the pod's own node.
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "METRICS_PORT": "-1",
        "METRICS_OTLP": "false",
        "METRICS_EXPORT_INTERVAL": "60s",
        "RSD_LOCK_PATH": "/run/rbln/rsd-group.lock",
        "RBLN_INSTALLATION": "k8s-device-plugin/k8s-device-plugin-chart",
        # What pods hold through the device-plugin API (a node switched between modes).
        "KUBELET_POD_RESOURCES_SOCKET": "/var/lib/kubelet/pod-resources/kubelet.sock",
    }
    # The kubelet's plugin directories instead of the device-plugin one; the rest as before.
    assert host_mounts(ds) == {
        "/var/lib/kubelet/plugins_registry": ("/var/lib/kubelet/plugins_registry", False),
        "/var/lib/kubelet/plugins": ("/var/lib/kubelet/plugins", False),
        "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", True),
        "/var/run/cdi": ("/var/run/cdi", False),
        "/etc/cdi": ("/etc/cdi", True),
        "/dev": ("/dev", False),
        "/run/rbln": ("/run/rbln", False),
        "/host/usr/bin": ("/usr/bin", True),
    }
    volumes = {v["name"]: v["hostPath"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["plugins-registry"]["type"] == "Directory"
    assert volumes["plugins"]["type"] == "Directory"
    assert "device-plugin" not in volumes
    assert container["securityContext"] == {"privileged": True}
    assert container["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 51515, "service": "readiness"}


def test_dra_mode_mounts_the_service_account_token(dra: str) -> None:
    (account,) = by_kind(dra, "ServiceAccount")
    pod = daemonset(dra)["spec"]["template"]["spec"]
    assert account["automountServiceAccountToken"] is True
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == account["metadata"]["name"] == CHART_NAME


def test_dra_paths_are_configurable_and_reach_env_and_mounts(helm: Helm) -> None:
    manifest = helm.template(
        *DRA,
        "--set", "devicePlugin.kubeletPluginsRegistryPath=/var/lib/k0s/kubelet/plugins_registry",
        "--set", "devicePlugin.kubeletPluginsPath=/var/lib/k0s/kubelet/plugins",
    )  # fmt: skip
    ds = daemonset(manifest)
    env = env_of(plugin_container(ds))
    assert env["KUBELET_PLUGINS_REGISTRY_PATH"] == "/var/lib/k0s/kubelet/plugins_registry"
    assert env["KUBELET_PLUGINS_PATH"] == "/var/lib/k0s/kubelet/plugins"
    mounts = host_mounts(ds)
    assert mounts["/var/lib/k0s/kubelet/plugins_registry"] == (
        "/var/lib/k0s/kubelet/plugins_registry",
        False,
    )
    assert mounts["/var/lib/k0s/kubelet/plugins"] == ("/var/lib/k0s/kubelet/plugins", False)


def test_no_execute_taints_are_a_chart_value_of_dra_mode_only(helm: Helm) -> None:
    manifest = helm.template(*DRA, "--set", "devicePlugin.draTaintNoExecute=true")
    env = literal_env(manifest)
    assert env["RBLN_DRA_TAINT_NO_EXECUTE"] == "true"
    assert options.parse([], {**env, **NODE}).dra_taint_no_execute is True
    done = helm.attempt("--set", "devicePlugin.draTaintNoExecute=true")
    assert refused_by_chart(done), done.stderr
    assert "devicePlugin.draTaintNoExecute taints devices in ResourceSlices" in done.stderr
    assert "pattern" not in done.stderr


def test_dra_mode_environment_is_what_the_cli_reads(dra: str) -> None:
    set_by_chart = set(env_of(plugin_container(daemonset(dra))))
    readable = options.ENVIRONMENT_VARIABLES | DRA_SETTINGS
    # In-cluster configuration: KUBECONFIG stays unset (empty means the service account).
    expected = readable - LEFT_AT_DEFAULT - TEST_ONLY - DEVICE_PLUGIN_ONLY - {"KUBECONFIG"}
    expected -= {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER"}  # no endpoint set
    assert set_by_chart == expected


def test_the_cli_reads_the_dra_settings_the_chart_sets() -> None:
    missing = DRA_SETTINGS - options.ENVIRONMENT_VARIABLES
    if missing == DRA_SETTINGS:
        pytest.skip("the daemon's dra mode settings are not in this tree yet (issue 45)")
    assert not missing


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_variant_in_dra_mode_starts_the_daemon_configuration(
    helm: Helm, variant: str
) -> None:
    if variant in VARIANTS:
        manifest = helm.template(*VARIANTS[variant], *DRA)
    else:
        manifest = helm.template(*DRA, values=VALUES_FILES[variant])
    env = literal_env(manifest)
    assert env["RBLN_MODE"] == "dra"
    assert not DEVICE_PLUGIN_ONLY & set(env)
    assert daemon_objection({**env, **NODE}) is None


# ---- dra mode: RBAC ----------------------------------------------------------------------


def test_dra_rbac_grants_exactly_the_plugins_verbs_to_its_account(dra: str) -> None:
    (role,) = by_kind(dra, "ClusterRole")
    (binding,) = by_kind(dra, "ClusterRoleBinding")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        *(
            ("resource.k8s.io", "resourceslices", verb)
            for verb in ("get", "list", "watch", "create", "update", "delete")
        ),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("", "nodes", "get"),
    }
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": CHART_NAME, "namespace": NAMESPACE}
    ]
    # Cluster-wide names carry the namespace: another namespace's installation keeps its own.
    assert role["metadata"]["name"] == f"{NAMESPACE}:{CHART_NAME}"
    assert "namespace" not in role["metadata"]


def test_dra_rbac_follows_overrides_and_an_existing_account(helm: Helm) -> None:
    manifest = helm.template(
        *DRA,
        "--set", "namespaceOverride=npu-system",
        "--set", "fullnameOverride=npu-dra",
        "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=npu-sa",
    )  # fmt: skip
    (binding,) = by_kind(manifest, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == "npu-system:npu-dra"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "npu-sa", "namespace": "npu-system"}
    ]
    assert not by_kind(manifest, "ServiceAccount")
    pod = daemonset(manifest)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "npu-sa"
    assert pod["automountServiceAccountToken"] is True


# ---- dra mode: DeviceClasses ------------------------------------------------------------


def test_dra_device_classes_select_each_kind_of_device_and_name_its_resource(dra: str) -> None:
    classes = {c["metadata"]["name"]: c for c in by_kind(dra, "DeviceClass")}
    assert sorted(classes) == sorted(name for name, _, _ in CLASSES)
    for name, device_type, resource in CLASSES:
        found = classes[name]
        assert found["apiVersion"] == "resource.k8s.io/v1"
        assert "namespace" not in found["metadata"]
        assert found["spec"] == {
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{DRIVER}" && '
                        f'device.attributes["{DRIVER}"].deviceType == "{device_type}"'
                    }
                }
            ],
            "extendedResourceName": resource,
        }


def test_dra_device_classes_can_be_left_out_or_left_without_extended_resources(
    helm: Helm,
) -> None:
    without = helm.template(*DRA, "--set", "deviceClasses.create=false")
    assert not by_kind(without, "DeviceClass")
    assert by_kind(without, "ClusterRole")  # the plugin itself is still deployed
    claims_only = helm.template(*DRA, "--set", "deviceClasses.extendedResourceNames=false")
    classes = by_kind(claims_only, "DeviceClass")
    assert len(classes) == 3
    assert all("extendedResourceName" not in c["spec"] for c in classes)
    assert all(c["spec"]["selectors"] for c in classes)


def test_device_class_values_are_ignored_in_device_plugin_mode(
    helm: Helm, rendered: dict[str, str]
) -> None:
    for setting in ("deviceClasses.create=true", "deviceClasses.extendedResourceNames=false"):
        assert helm.template("--set", setting) == rendered["default"], setting


@pytest.mark.parametrize("kube_version", DRA_KUBE_VERSIONS)
def test_dra_variants_are_strictly_valid_kubernetes(
    helm: Helm, kube_version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = kubernetes_validate.utils.schema_contents
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents", functools.cache(read))
    manifests = [
        helm.template(*DRA, "--kube-version", kube_version),
        helm.template(*DRA, "--kube-version", kube_version, values=GO_CHART_VALUES),
        helm.template(*DRA, "--kube-version", kube_version, *VARIANTS["custom"]),
    ]
    for manifest in manifests:
        kinds = set()
        for doc in objects(manifest):
            kinds.add(doc["kind"])
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message}")
        assert {"DaemonSet", "ClusterRole", "ClusterRoleBinding", "DeviceClass"} <= kinds


def test_strict_validation_knows_the_device_class_fields(dra: str) -> None:
    # Guards against a schema set that accepts anything for DeviceClass.
    (device_class, *_) = by_kind(dra, "DeviceClass")
    device_class["spec"]["extendedResourceNames"] = "rebellions.ai/npu"
    with pytest.raises(kubernetes_validate.ValidationError, match="extendedResourceNames"):
        kubernetes_validate.validate(device_class, DRA_KUBE_VERSIONS[-1], strict=True)


# ---- refusals ---------------------------------------------------------------------------

# (arguments, words the refusal must contain)
DRA_REFUSED: list[tuple[tuple[str, ...], str]] = [
    (("--set", "devicePlugin.surgeHandover=true"),
     "devicePlugin.surgeHandover is a hand-over between two device-plugin registrations"),
    (("--kube-version", "1.33.0"), "mode dra needs Kubernetes 1.34 or later"),
    (("--set", "serviceAccount.create=false"),
     "with serviceAccount.create=false, give serviceAccount.name"),
    (("--set", "devicePlugin.kubeletPluginsPath=plugins"),
     'devicePlugin.kubeletPluginsPath: "plugins" is not an absolute path; give the host '
     "directory, such as /var/lib/kubelet/plugins"),
    (("--set", "devicePlugin.kubeletPluginsRegistryPath=/var/lib/kubelet/../registry"),
     "devicePlugin.kubeletPluginsRegistryPath: \"/var/lib/kubelet/../registry\" contains '..'"),
    (("--set", "devicePlugin.kubeletPluginsPath=/" + "p" * 80),
     "devicePlugin.kubeletPluginsPath: 81 characters is too long; at most 80"),
    (("--set", "devicePlugin.kubeletPluginsRegistryPath=/var/lib/kubelet/plugins"),
     "devicePlugin.kubeletPluginsPath: /var/lib/kubelet/plugins is already used by "
     "devicePlugin.kubeletPluginsRegistryPath"),
    (("--set", "devicePlugin.cdiRoot=/var/lib/kubelet/plugins_registry"),
     "devicePlugin.cdiRoot: /var/lib/kubelet/plugins_registry is already used by "
     "devicePlugin.kubeletPluginsRegistryPath"),
    (("--set", "devicePlugin.kubeletPluginsPath=/dev"),
     "devicePlugin.kubeletPluginsPath: /dev is already used by the /dev mount"),
    (("--set-json", 'devicePlugin.extraVolumes=[{"name": "plugins", "emptyDir": {}}]'),
     "devicePlugin.extraVolumes: the volume name plugins is already used by the chart"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "words"), DRA_REFUSED)
def test_dra_combinations_that_cannot_work_are_refused_in_words(
    helm: Helm, args: tuple[str, ...], words: str
) -> None:
    done = helm.attempt(*DRA, *args)
    assert refused_by_chart(done), done.stderr
    assert words in done.stderr
    assert "pattern" not in done.stderr, done.stderr


def test_dra_only_names_are_free_in_device_plugin_mode(helm: Helm) -> None:
    # Device-plugin installations keep what they had: a volume called "plugins" is theirs,
    # and the dra paths are not checked against its mounts.
    assert helm.attempt(
        "--set-json", 'devicePlugin.extraVolumes=[{"name": "plugins", "emptyDir": {}}]'
    ).returncode == 0  # fmt: skip
    assert helm.attempt("--set", "devicePlugin.kubeletPluginsPath=/dev").returncode == 0


@pytest.mark.parametrize(
    ("args", "refused_key"),
    [
        (("--set", "mode=DRA"), "mode"),
        (("--set", "mode=both"), "mode"),
        (("--set", "deviceClasses.extendedResourceName=false"), "extendedResourceName"),
        (("--set", "deviceClasses.create=yes"), "create"),
        (("--set", f"{PLUGIN}.extraEnv[0].name=RBLN_MODE", "--set",
          f"{PLUGIN}.extraEnv[0].value=device-plugin"), "extraEnv/0/name"),
        (("--set", f"{PLUGIN}.extraEnv[0].name=KUBELET_PLUGINS_PATH", "--set",
          f"{PLUGIN}.extraEnv[0].value=/x"), "extraEnv/0/name"),
        (("--set", f"{PLUGIN}.extraEnv[0].name=RBLN_DRA_TAINT_NO_EXECUTE", "--set",
          f"{PLUGIN}.extraEnv[0].value=true"), "extraEnv/0/name"),
        (("--set", f"{PLUGIN}.draTaintNoExecute=yes"), "draTaintNoExecute"),
    ],
)  # fmt: skip
def test_the_schema_refuses_unknown_modes_and_mode_settings(
    helm: Helm, args: tuple[str, ...], refused_key: str
) -> None:
    done = helm.attempt(*args)
    assert refused_by_chart(done), done.stderr
    assert "values don't meet the specifications of the schema" in done.stderr
    assert refused_key in done.stderr


def test_dra_mode_with_go_chart_values_passes_helm_lint_strict(helm: Helm) -> None:
    done = helm.run(
        "lint", "--strict", str(CHART), "-f", helm.values_file({**GO_CHART_VALUES, "mode": "dra"})
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_values_yaml_mode_default_is_device_plugin() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["mode"] == "device-plugin"
    assert values["deviceClasses"] == {"create": True, "extendedResourceNames": True}


# ---- a node switched between the modes ----------------------------------------------------


def test_mode_switch_in_device_plugin_mode_reads_podresources_and_the_dra_checkpoint(
    helm: Helm, rendered: dict[str, str]
) -> None:
    """modeSwitch=true (device-plugin mode on a pool that ran dra): the PodResources socket
    directory and the DRA driver's directory are mounted read-only and named to the daemon,
    which then reads exactly those paths; without it nothing changes."""
    manifest = helm.template("--set", "modeSwitch=true",
                             "--set", "devicePlugin.kubeletPluginsPath=/k/plugins",
                             "--set", "devicePlugin.kubeletPodResourcesPath=/k/pr")  # fmt: skip
    ds = daemonset(manifest)
    container = plugin_container(ds)
    env = env_of(container)
    assert env["KUBELET_POD_RESOURCES_SOCKET"] == "/k/pr/kubelet.sock"
    assert env["KUBELET_PLUGINS_PATH"] == "/k/plugins"
    assert "RBLN_MODE" not in env
    mounts = host_mounts(ds)
    assert mounts["/k/pr"] == ("/k/pr", True)
    assert mounts[f"/k/plugins/{DRIVER}"] == (f"/k/plugins/{DRIVER}", True)
    config = options.parse([], {**literal_env(manifest), **NODE})
    assert config.kubelet_pod_resources_socket == Path("/k/pr/kubelet.sock")
    assert config.kubelet_plugins_path / DRIVER == Path(f"/k/plugins/{DRIVER}")
    default_env = env_of(plugin_container(daemonset(rendered["default"])))
    assert "KUBELET_POD_RESOURCES_SOCKET" not in default_env


def test_mode_switch_is_ignored_in_dra_mode_which_always_reads_podresources(
    helm: Helm, dra: str
) -> None:
    assert helm.template(*DRA, "--set", "modeSwitch=true") == dra


def test_two_releases_with_node_selectors_split_the_nodes_between_the_modes(helm: Helm) -> None:
    """docs/dra.md's procedure: one release per mode, each selecting the nodes labelled
    for it, distinct object names, the same /run/rbln (the node's instance lock)."""
    label = "rebellions\\.ai/npu\\.mode"
    selector = f"devicePlugin.nodeSelector.{label}"
    dp = daemonset(helm.template("--set", "modeSwitch=true", "--set", f"{selector}=device-plugin"))
    dra = daemonset(helm.template(*DRA, "--set", "fullnameOverride=npu-dra",
                                  "--set", f"{selector}=dra"))  # fmt: skip
    selectors = [d["spec"]["template"]["spec"]["nodeSelector"] for d in (dp, dra)]
    assert [s["rebellions.ai/npu.mode"] for s in selectors] == ["device-plugin", "dra"]
    assert all(s["rebellions.ai/npu.present"] == "true" for s in selectors)
    assert dp["metadata"]["name"] != dra["metadata"]["name"]
    for ds in (dp, dra):
        assert host_mounts(ds)["/run/rbln"] == ("/run/rbln", False)
        assert env_of(plugin_container(ds))["RSD_LOCK_PATH"] == "/run/rbln/rsd-group.lock"
