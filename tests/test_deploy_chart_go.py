"""Go values files through this chart, rendered with helm and held to what the documentation
promises: the chart of the Go release this plugin follows (k8s-device-plugin-chart) and the
older public one (rbln-device-plugin), each as a values file of its keys and defaults
(tests/go-charts/). Also the empty values of settings the daemon reads from a variable: an
empty variable means the default to the Go plugin, so such a value renders what the Go
chart renders, or is refused when the daemon would refuse it."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml

from rbln_device_plugin import config
from rbln_device_plugin.telemetry import logs

from .test_deploy_chart import (
    CHART,
    GO_CHART_KEYS,
    GO_CHART_OPAQUE,
    PLACEHOLDERS,
    PLUGIN,
    REPO,
    Helm,
    _set_json,
    daemon_objection,
    daemonset,
    env_of,
    host_mounts,
    leaf_keys,
    literal_env,
    objects,
    plugin_container,
    refused_by_chart,
)

# Fixtures shared with the main chart suite.
from .test_deploy_chart import helm as helm
from .test_deploy_chart import rendered as rendered

GO_CHARTS = REPO / "tests" / "go-charts"
SPEC_VALUES: dict[str, Any] = yaml.safe_load(
    (GO_CHARTS / "k8s-device-plugin-chart.values.yaml").read_text()
)
OLDER_VALUES: dict[str, Any] = yaml.safe_load(
    (GO_CHARTS / "rbln-device-plugin.values.yaml").read_text()
)
OLDER_CHART_NAME = "rbln-device-plugin"
# This plugin's image, as the README's commands set it.
OUR_IMAGE = ("--set", "image.repository=registry.example.com/k8s-device-plugin")
DIFFERENCES = REPO / "docs" / "differences-from-go.md"
CHART_DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
DEFAULT_RESOURCES = CHART_DEFAULTS["devicePlugin"]["containers"]["plugin"]["resources"]
GO_IMAGE_REFUSAL = "image.repository: rebellions/k8s-device-plugin is the Go plugin's image"


def _with(values: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``values`` with ``dotted`` (a.b.c) set to ``value``."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(values))
    node = out
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def _row(table_label: str) -> list[str]:
    """The cells of the differences page's table row whose first cell is ``table_label``."""
    for line in DIFFERENCES.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == table_label:
            return cells
    raise AssertionError(f"no row {table_label!r} in {DIFFERENCES.name}")


# -- the two values files -------------------------------------------------------------------


def test_the_fixtures_hold_every_key_of_each_go_chart() -> None:
    # The newer chart's keys are the main suite's list; the older chart's layout is the
    # same without the two keys it did not have yet.
    assert set(leaf_keys(SPEC_VALUES, GO_CHART_OPAQUE)) == GO_CHART_KEYS
    older = GO_CHART_KEYS - {"logging.level", "logging.format", "devicePlugin.otlpEndpoint"}
    assert set(leaf_keys(OLDER_VALUES, GO_CHART_OPAQUE)) == older


@pytest.mark.parametrize("values", [SPEC_VALUES, OLDER_VALUES], ids=["spec", "older"])
def test_a_go_values_file_as_it_is_fails_naming_only_the_go_image(
    helm: Helm, values: dict[str, Any]
) -> None:
    done = helm.attempt(values=values)
    assert refused_by_chart(done), done.stderr
    assert GO_IMAGE_REFUSAL in done.stderr
    # That is the one difference: with this plugin's image the same file installs.
    assert helm.attempt(*OUR_IMAGE, values=values).returncode == 0
    docker_hub = _with(values, "image.repository", "docker.io/rebellions/k8s-device-plugin")
    assert "is the Go plugin's image" in helm.attempt(values=docker_hub).stderr


# -- resources: {} and the recipe that gives the Go chart's render --------------------------


def test_a_go_values_file_gets_the_memory_figures_the_documentation_names(helm: Helm) -> None:
    container = plugin_container(daemonset(helm.template(*OUR_IMAGE, values=SPEC_VALUES)))
    # Helm merges the Go file's `resources: {}` into this chart's defaults.
    assert container["resources"] == DEFAULT_RESOURCES
    memory = _row("memory")
    request, limit = DEFAULT_RESOURCES["requests"]["memory"], DEFAULT_RESOURCES["limits"]["memory"]
    assert f"request {request}, limit {limit}, also for a Go values file" in memory[2]


def test_the_documented_recipe_renders_no_requests_or_limits(helm: Helm) -> None:
    # The "Go behaviour" cell of the memory row, e.g. `devicePlugin.containers...: null`.
    recipe = re.match(r"`([\w.]+): (\w+)`", _row("memory")[4])
    assert recipe is not None, _row("memory")[4]
    key, value = recipe[1], yaml.safe_load(recipe[2])
    assert value is None  # an empty map would be merged into the defaults
    as_file = helm.template(*OUR_IMAGE, values=_with(SPEC_VALUES, key, value))
    as_set = helm.template(*OUR_IMAGE, "--set", f"{key}=null", values=SPEC_VALUES)
    for manifest in (as_file, as_set):
        assert "resources" not in plugin_container(daemonset(manifest))
    # ...where the Go chart's own `{}` does not remove them.
    empty_map = helm.template(*OUR_IMAGE, values=_with(SPEC_VALUES, key, {}))
    assert plugin_container(daemonset(empty_map))["resources"] == DEFAULT_RESOURCES


def _notes(helm: Helm, *args: str, values: dict[str, Any]) -> str:
    done = helm.run(
        "install", "r", str(CHART), "--dry-run=client", "-f", helm.values_file(values), *args
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_the_install_notes_print_the_memory_figures_and_the_ignored_names(helm: Helm) -> None:
    notes = _notes(helm, *OUR_IMAGE, values=_with(OLDER_VALUES, f"{PLUGIN}.resources", {}))
    assert '"requests":{"memory":"80Mi"}' in notes
    assert "resources=null leaves them out" in notes
    assert "rebellions.ai/ATOM" not in notes
    legacy = _with(OLDER_VALUES, "devicePlugin.useGenericResourceName", False)
    notes = _notes(helm, *OUR_IMAGE, "--set", f"{PLUGIN}.resources=null", values=legacy)
    assert "resources" not in notes
    assert "useGenericResourceName=false is ignored" in notes
    assert "rebellions.ai/ATOM or rebellions.ai/REBEL" in notes


def test_the_readmes_name_the_keys_that_mean_something_else() -> None:
    for readme in (REPO / "README.md", CHART / "README.md"):
        text = " ".join(readme.read_text().split())
        assert "same name, place and meaning" not in text
        assert "`image.repository` must" in text
        assert "`devicePlugin.containers.plugin.resources: {}` gets" in text
        assert "`resources: null` leaves them out" in text


# -- the older chart, rbln-device-plugin -----------------------------------------------------


def _documented_migration(values_file: str) -> list[str]:
    """The differences page's migration command, placeholders filled, as argv."""
    text = DIFFERENCES.read_text()
    section = text[text.index("### Migrating from the `rbln-device-plugin` chart") :]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[:1]
    argv = shlex.split(block.replace("\\\n", " "))
    filled = [w.replace("<your-values.yaml>", values_file) for w in argv]
    for placeholder, value in PLACEHOLDERS.items():
        filled = [w.replace(placeholder, value) for w in filled]
    return filled


def _render_upgrade(helm: Helm, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`helm upgrade RELEASE CHART ARGS...` rendered as `helm template`."""
    assert argv[:2] == ["helm", "upgrade"]
    release, chart, *rest = argv[2:]
    assert chart == "./deployments/helm/k8s-device-plugin-chart"
    return helm.run("template", release, str(REPO / chart), *rest)


def test_the_documented_migration_upgrades_the_older_release_in_place(helm: Helm) -> None:
    argv = _documented_migration(helm.values_file(OLDER_VALUES))
    done = _render_upgrade(helm, argv)
    assert done.returncode == 0, done.stderr
    docs = objects(done.stdout)
    ds = daemonset(done.stdout)
    release = PLACEHOLDERS["<release>"]
    # The older chart's object names and selector: the DaemonSet is updated, not replaced.
    (account,) = [o for o in docs if o["kind"] == "ServiceAccount"]
    assert ds["metadata"]["name"] == account["metadata"]["name"] == OLDER_CHART_NAME
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": OLDER_CHART_NAME,
        "app.kubernetes.io/instance": release,
    }
    assert {o["metadata"]["namespace"] for o in docs} == {PLACEHOLDERS["<namespace>"]}
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(ds)
    env = env_of(container)
    plugin = OLDER_VALUES["devicePlugin"]
    # The variables the older chart set, with the same values.
    assert env["CDI_ROOT"] == plugin["cdiRoot"]
    assert env["KUBELET_DEVICE_PLUGIN_PATH"] == plugin["kubeletDevicePluginPath"]
    assert env["USE_GENERIC_RESOURCE_NAME"] == "true"
    assert env["HEALTHCHECK_PORT"] == "51515"
    # The older plugin's own interval, kept by the command's last line.
    assert env["DEVICE_SCAN_INTERVAL"] == "1m"
    assert container["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    # Its mounts, each from the same host path.
    mounts = host_mounts(ds)
    for path in (plugin["kubeletDevicePluginPath"], plugin["cdiRoot"], "/dev", "/run/rbln"):
        assert mounts[path] == (path, False)
    assert mounts["/host/usr/bin"] == ("/usr/bin", True)
    # What the page says changes: no tolerations (the list replaces the defaults), this
    # chart's memory figures, this plugin's image.
    assert "tolerations" not in pod
    assert container["resources"] == DEFAULT_RESOURCES
    assert container["image"] == "registry.example.com/k8s-device-plugin:1.2.0"
    assert daemon_objection(literal_env(done.stdout)) is None


def test_without_the_name_override_the_older_daemonset_would_be_replaced(helm: Helm) -> None:
    # Why the migration sets nameOverride: otherwise the objects get this chart's name.
    argv = _documented_migration(helm.values_file(OLDER_VALUES))
    drop = argv.index("nameOverride=rbln-device-plugin")
    assert argv[drop - 1] == "--set"
    without = argv[: drop - 1] + argv[drop + 1 :]
    done = _render_upgrade(helm, without)
    assert done.returncode == 0, done.stderr
    assert daemonset(done.stdout)["metadata"]["name"] == "k8s-device-plugin-chart"


def test_the_older_scan_interval_and_resource_names_are_as_documented() -> None:
    older = OLDER_VALUES["devicePlugin"]
    assert "deviceScanInterval" not in older  # the older chart left the plugin's 1m
    interval = _row("scan interval")
    assert "default `1m`; its chart sets none" in interval[1]
    assert f"default `{CHART_DEFAULTS['devicePlugin']['deviceScanInterval']}`" in interval[2]
    assert interval[3] == "`devicePlugin.deviceScanInterval: 1m`"
    names = _row("resource names")
    assert "`rebellions.ai/ATOM` and `rebellions.ai/REBEL` by default" in names[1]


def test_every_older_key_has_a_row_in_the_documentation() -> None:
    text = DIFFERENCES.read_text()
    table = text[text.index("| Older chart's key (default) | Here |") :].split("\n\n", 1)[0]
    for key in leaf_keys(OLDER_VALUES, GO_CHART_OPAQUE):
        assert f"`{key}`" in table, key


# -- empty values of settings the daemon reads from a variable ------------------------------

# (value key, variable, extra arguments): every chart value the daemon reads as a variable's
# text. Switches (enabled: true/false) stay booleans: the templates choose objects with them.
VARIABLE_VALUES: list[tuple[str, str, tuple[str, ...]]] = [
    ("devicePlugin.deviceScanInterval", "DEVICE_SCAN_INTERVAL", ()),
    (f"{PLUGIN}.healthcheckPort", "HEALTHCHECK_PORT", ()),
    ("devicePlugin.useGenericResourceName", "USE_GENERIC_RESOURCE_NAME", ()),
    ("logging.level", "RBLN_DEVICE_PLUGIN_LOG_LEVEL", ()),
    ("logging.format", "RBLN_DEVICE_PLUGIN_LOG_FORMAT", ()),
    ("devicePlugin.otlpEndpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", ()),
    ("devicePlugin.cdiRoot", "CDI_ROOT", ()),
    ("devicePlugin.cdiStaticDir", "CDI_STATIC_DIR", ()),
    ("devicePlugin.cdiMode", "CDI_MODE", ()),
    ("devicePlugin.kubeletDevicePluginPath", "KUBELET_DEVICE_PLUGIN_PATH", ()),
    ("devicePlugin.metrics.otlp.exportInterval", "METRICS_EXPORT_INTERVAL", ()),
    ("devicePlugin.metrics.prometheus.port", "METRICS_PORT",
     ("--set", "devicePlugin.metrics.prometheus.enabled=true")),
]  # fmt: skip


def _daemon_view(env: dict[str, str]) -> tuple[config.Config, logs.LogSettings]:
    return config.config_from_settings({}, env), logs.resolve_settings(env)


@pytest.mark.parametrize(("key", "variable", "args"), VARIABLE_VALUES)
def test_an_empty_value_is_accepted_exactly_when_the_daemon_accepts_the_empty_variable(
    helm: Helm, rendered: dict[str, str], key: str, variable: str, args: tuple[str, ...]
) -> None:
    default_env = literal_env(rendered["default"])
    daemon_ok = daemon_objection({**default_env, variable: ""}) is None
    done = helm.attempt(*args, *_set_json(key, ""))
    if not daemon_ok:
        assert refused_by_chart(done), done.stderr
        assert key.rsplit(".", 1)[-1] in done.stderr
        return
    assert done.returncode == 0, done.stderr
    env = literal_env(done.stdout)
    assert daemon_objection(env) is None
    if key == "devicePlugin.metrics.prometheus.port":
        # This chart's own value: empty is its default port.
        assert env[variable] == str(CHART_DEFAULTS["devicePlugin"]["metrics"]["prometheus"]["port"])
        return
    # The daemon ends up where the empty variable puts it: its default.
    with_args = literal_env(helm.template(*args))
    assert _daemon_view(env) == _daemon_view({**with_args, variable: ""})


@pytest.mark.parametrize("how", ["--set", "values file", "null"])
def test_an_empty_scan_interval_renders_what_the_go_chart_renders(helm: Helm, how: str) -> None:
    key = "devicePlugin.deviceScanInterval"
    if how == "--set":
        manifest = helm.template(*OUR_IMAGE, "--set", f"{key}=", values=SPEC_VALUES)
    else:
        manifest = helm.template(
            *OUR_IMAGE, values=_with(SPEC_VALUES, key, "" if how == "values file" else None)
        )
    env = literal_env(manifest)
    # The Go chart sets no DEVICE_SCAN_INTERVAL: the plugin's own default applies.
    assert "DEVICE_SCAN_INTERVAL" not in env
    assert config.config_from_settings({}, env).scan_interval == 5.0


@pytest.mark.parametrize("value", ["", None])
def test_an_empty_health_port_renders_what_the_go_chart_renders(
    helm: Helm, value: str | None
) -> None:
    manifest = helm.template(
        *OUR_IMAGE, values=_with(SPEC_VALUES, f"{PLUGIN}.healthcheckPort", value)
    )
    container = plugin_container(daemonset(manifest))
    # The Go chart: HEALTHCHECK_PORT="" and no probe (its `gt (int "") 0` is false).
    assert env_of(container)["HEALTHCHECK_PORT"] == ""
    assert not {"livenessProbe", "readinessProbe", "ports"} & container.keys()
    assert config.config_from_settings({}, literal_env(manifest)).healthcheck_port == 51515
    # The metrics port still may not take the health server's port.
    clash = helm.attempt(
        *OUR_IMAGE,
        "--set", "devicePlugin.metrics.prometheus.enabled=true",
        "--set", "devicePlugin.metrics.prometheus.port=51515",
        values=_with(SPEC_VALUES, f"{PLUGIN}.healthcheckPort", value),
    )  # fmt: skip
    assert refused_by_chart(clash), clash.stderr
    assert "51515 is already the health port" in clash.stderr


def test_an_empty_metrics_port_is_the_default_port_everywhere(helm: Helm) -> None:
    manifest = helm.template(
        "--set", "devicePlugin.metrics.prometheus.enabled=true",
        "--set", "devicePlugin.metrics.prometheus.port=",
        "--set", "devicePlugin.metrics.service.enabled=true",
    )  # fmt: skip
    (service,) = [o for o in objects(manifest) if o["kind"] == "Service"]
    assert service["spec"]["ports"][0]["port"] == 9464
    ports = {p["name"]: p["containerPort"] for p in plugin_container(daemonset(manifest))["ports"]}
    assert ports["metrics"] == 9464


def test_the_chart_readme_documents_the_empty_values() -> None:
    readme = (CHART / "README.md").read_text()
    assert "Empty or `null` sets no variable: the plugin's default, `5s`" in readme
    assert 'Empty or `null` renders what the Go chart renders for it: `HEALTHCHECK_PORT=""`' in (
        readme
    )
