"""The chart's metrics values: the endpoint's named port and variables, OTLP push, the
optional headless Service and ServiceMonitor, and every combination the plugin or the
Prometheus Operator would refuse, refused at install."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from .servicemonitor_schema import SERVICE_MONITOR_SCHEMA
from .test_deploy_chart import (
    PLUGIN,
    Helm,
    daemon_objection,
    daemonset,
    env_of,
    literal_env,
    objects,
    plugin_container,
    refused_by_chart,
)

# Fixtures shared with the main chart suite.
from .test_deploy_chart import helm as helm
from .test_deploy_chart import rendered as rendered

M = "devicePlugin.metrics"


def by_kind(manifest: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects(manifest) if o["kind"] == kind]


def test_metrics_are_off_by_default(rendered: dict[str, str]) -> None:
    env = literal_env(rendered["default"])
    assert (env["METRICS_PORT"], env["METRICS_OTLP"]) == ("-1", "false")
    assert daemon_objection(env) is None
    assert not by_kind(rendered["default"], "Service")
    assert not by_kind(rendered["default"], "ServiceMonitor")
    ports = plugin_container(daemonset(rendered["default"]))["ports"]
    assert [p["name"] for p in ports] == ["health"]


def test_every_metrics_value_reaches_the_pod_the_service_and_the_monitor(
    rendered: dict[str, str],
) -> None:
    manifest = rendered["metrics"]
    ds = daemonset(manifest)
    container = plugin_container(ds)
    env = env_of(container)
    assert env["METRICS_PORT"] == "9500"
    assert env["METRICS_OTLP"] == "true"
    assert env["METRICS_EXPORT_INTERVAL"] == "30s"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "otel-collector.observability:4317"
    assert daemon_objection(literal_env(manifest)) is None
    assert {"name": "metrics", "containerPort": 9500, "protocol": "TCP"} in container["ports"]

    (service,) = by_kind(manifest, "Service")
    assert service["spec"]["clusterIP"] == "None"  # each pod is its own target
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # The Service selects exactly the plugin's pods.
    assert service["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert service["metadata"]["labels"]["team"] == "ml"
    assert service["metadata"]["annotations"] == {"example.com/scrape": "true"}

    (monitor,) = by_kind(manifest, "ServiceMonitor")
    jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {
        "matchNames": [service["metadata"]["namespace"]]
    }
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
        "/metrics", "1m", "15s"
    )  # fmt: skip
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node"} in endpoint["relabelings"]  # fmt: skip


def test_the_endpoint_alone_opens_a_port_and_nothing_else(helm: Helm) -> None:
    manifest = helm.template("--set", f"{M}.prometheus.enabled=true")
    container = plugin_container(daemonset(manifest))
    assert env_of(container)["METRICS_PORT"] == "9464"
    assert [p["name"] for p in container["ports"]] == ["health", "metrics"]
    assert not by_kind(manifest, "Service")


def test_the_metrics_port_stays_when_the_health_port_is_off(helm: Helm) -> None:
    container = plugin_container(daemonset(helm.template(
        "--set", f"{M}.prometheus.enabled=true", "--set", f"{PLUGIN}.healthcheckPort=-1"
    )))  # fmt: skip
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert "livenessProbe" not in container


def test_the_service_monitor_validator_refuses_an_unknown_field(rendered: dict[str, str]) -> None:
    (monitor,) = by_kind(rendered["metrics"], "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ([f"{M}.otlp.enabled=true"], "devicePlugin.metrics.otlp.enabled: OTLP metrics need "
         "devicePlugin.otlpEndpoint"),
        ([f"{M}.service.enabled=true"],
         "the Service needs devicePlugin.metrics.prometheus.enabled"),
        ([f"{M}.prometheus.enabled=true", f"{M}.serviceMonitor.enabled=true"],
         "the ServiceMonitor needs devicePlugin.metrics.service.enabled"),
        ([f"{M}.prometheus.enabled=true", f"{M}.prometheus.port=51515"],
         "devicePlugin.metrics.prometheus.port: 51515 is already the health port"),
        ([f"{M}.serviceMonitor.interval=10s", f"{M}.serviceMonitor.scrapeTimeout=11s"],
         "scrapeTimeout: 11s is longer than the interval 10s"),
        ([f"{M}.serviceMonitor.interval=1.5s"], "interval"),
        ([f"{M}.serviceMonitor.interval=0s"], "interval"),
        ([f"{M}.serviceMonitor.scrapeTimeout=10"], "scrapeTimeout"),
        ([f"{M}.prometheus.port=0"], "port"),
        ([f"{M}.prometheus.enable=true"], "additional properties 'enable' not allowed"),
        ([f"{M}.servicemonitor.enabled=true"],
         "additional properties 'servicemonitor' not allowed"),
    ],
)  # fmt: skip
def test_combinations_that_cannot_work_are_refused(
    helm: Helm, settings: list[str], message: str
) -> None:
    done = helm.attempt(*[arg for setting in settings for arg in ("--set", setting)])
    assert refused_by_chart(done), done.stderr
    assert message in done.stderr


def test_extra_env_cannot_shadow_any_variable_the_chart_sets(
    helm: Helm, rendered: dict[str, str]
) -> None:
    for name in env_of(plugin_container(daemonset(rendered["metrics"]))):
        done = helm.attempt("--set", f"{PLUGIN}.extraEnv[0].name={name}",
                            "--set", f"{PLUGIN}.extraEnv[0].value=/run/x/rsd.lock")  # fmt: skip
        if name == "RSD_LOCK_PATH":
            # A default that extraEnv replaces (the chart then leaves its own out), not a
            # value extraEnv could shadow.
            container = plugin_container(daemonset(done.stdout))
            assert [e for e in container["env"] if e["name"] == name] == [
                {"name": name, "value": "/run/x/rsd.lock"}
            ]
            continue
        assert refused_by_chart(done), f"extraEnv may shadow {name}"
