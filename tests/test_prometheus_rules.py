"""The alerts: one rules file for a plain Prometheus and the chart's PrometheusRule, kept
identical; promtool checks them and runs their unit tests (series that fire each alert
and series that must not)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from .prometheus_server import RULES, RULES_TEST, promtool
from .prometheusrule_schema import PROMETHEUS_RULE_SCHEMA
from .test_deploy_chart import CHART, Helm, _yamllint, objects, refused_by_chart

# Fixtures shared with the main chart suite.
from .test_deploy_chart import helm as helm

CHART_RULES = CHART / "files" / "rules.yaml"
ON = ("--set", "devicePlugin.metrics.prometheusRule.enabled=true")
ALERTS = {"RblnNpuUnhealthy", "RblnAllocationsFailing", "RblnPluginNotRegistered",
          "RblnScanStuck", "RblnPluginWaiting", "RblnCdiSpecMissing"}  # fmt: skip


def alerts(groups: Any) -> list[dict[str, Any]]:
    return [rule for group in groups["groups"] for rule in group["rules"]]


def test_the_chart_carries_the_plain_rules_file_unchanged() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), (
        "deployments/prometheus/rules.yaml and the chart's files/rules.yaml differ: "
        "edit the first and copy it over the second"
    )


def test_every_alert_follows_the_operator_conventions() -> None:
    rules = alerts(yaml.safe_load(RULES.read_text()))
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        assert rule["for"], rule["alert"]


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_promtool_unit_tests_fire_each_alert_and_only_where_they_should() -> None:
    tested = yaml.safe_load(RULES_TEST.read_text())
    fired = {case["alertname"] for test in tested["tests"] for case in test["alert_rule_test"]
             if case.get("exp_alerts")}  # fmt: skip
    quiet = {case["alertname"] for test in tested["tests"] for case in test["alert_rule_test"]
             if not case.get("exp_alerts")}  # fmt: skip
    assert fired == quiet == ALERTS  # each alert both fires and stays quiet somewhere
    done = promtool("test", "rules", str(RULES_TEST))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unit_tests_can_fail() -> None:
    """A broken rule is caught: the same unit tests against a rule that never fires."""
    broken = RULES.read_text().replace("rbln_device_plugin_device_healthy == 0",
                                       "rbln_device_plugin_device_healthy == 2")  # fmt: skip
    assert broken != RULES.read_text()
    # rule_files are relative to the test file: copy both.
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "rules.yaml").write_text(broken)
        (Path(scratch) / "rules.test.yaml").write_text(RULES_TEST.read_text())
        done = promtool("test", "rules", str(Path(scratch) / "rules.test.yaml"))
    assert done.returncode != 0 and "RblnNpuUnhealthy" in done.stdout + done.stderr


def test_the_prometheusrule_is_off_by_default(helm: Helm) -> None:
    assert not [o for o in objects(helm.template()) if o["kind"] == "PrometheusRule"]


def test_the_prometheusrule_holds_the_rules_file_with_its_labels(
    helm: Helm, tmp_path: Path
) -> None:
    manifest = helm.template(
        *ON, "--set", "devicePlugin.metrics.prometheusRule.labels.release=prom"
    )
    (rule,) = [o for o in objects(manifest) if o["kind"] == "PrometheusRule"]
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump(rule["spec"]))
    done = promtool("check", "rules", str(rendered))
    assert done.returncode == 0, done.stdout + done.stderr


def test_for_override_shortens_every_window_and_nothing_else(helm: Helm) -> None:
    manifest = helm.template(*ON, "--set", "devicePlugin.metrics.prometheusRule.forOverride=0s")
    (rule,) = [o for o in objects(manifest) if o["kind"] == "PrometheusRule"]
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    expected = yaml.safe_load(RULES.read_text())
    for alert in alerts(expected):
        alert["for"] = "0s"
    assert rule["spec"] == expected


@pytest.mark.parametrize("value", ["5 minutes", "-1s", "1d"])
def test_a_for_override_prometheus_would_refuse_is_refused_at_install(
    helm: Helm, value: str
) -> None:
    done = helm.attempt(
        *ON, "--set-string", f"devicePlugin.metrics.prometheusRule.forOverride={value}"
    )
    assert refused_by_chart(done), done.stderr


def test_the_rules_files_pass_yamllint() -> None:
    done = _yamllint([RULES, CHART_RULES])
    assert done.returncode == 0, done.stdout + done.stderr
