"""Every claim of completeness in README.md and docs/ ("every setting is ...", "lists
every ...", "all values ...") has a check, named in ``CLAIMS``.

A sentence that says "every" or "all" of something a reader could hold the code to (a
setting, flag, variable, value, key, record, metric, difference, change, place, example,
host path, ...) must be listed in ``CLAIMS`` with the test that checks it, or with the
reason it is not a claim about a list. A new such sentence fails until it is listed, and
a listed one that is gone from its page fails until it is removed, so the list stays the
page's own. The checks this module owns are below it: the settings tables against the
daemon's options and the chart, the README's new chart values against values.yaml and
the Go chart's keys, and the README's uninstall leftovers against the files a real
shutdown of the daemon leaves on a simulated node.
"""

from __future__ import annotations

import ast
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rbln_device_plugin import config
from rbln_device_plugin.model import resources
from rbln_device_plugin.runtime import instancelock
from rbln_device_plugin.telemetry import logs

from .simnode import running
from .test_deploy_chart import (
    CHART,
    GO_CHART_KEYS,
    GO_CHART_OPAQUE,
    Helm,
    daemonset,
    env_of,
    plugin_container,
)
from .test_deploy_chart import helm as helm
from .test_deploy_chart import leaf_keys as chart_leaf_keys

REPO = Path(__file__).resolve().parent.parent
NPU = resources.NPU.name
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

# What a claim of completeness is about: things a page can list and the code can be held to.
_NOUN = (
    r"(settings?|flags?|(?:environment )?variables?|values?|keys?|records?|messages?|"
    r"metrics?|differences?|changes?|places?|pages?|kinds?|host paths?|test modules?|"
    r"examples?|behaviou?rs?|commands?)"
)
_CLAIM = re.compile(
    rf"\b(every|all)\b(?: [\w`'.-]+){{0,3}}? {_NOUN}\b|"
    r"\b(lists?|describes?|names?|documents?|catalogue of) (every|all)\b",
    re.IGNORECASE,
)

# Why a sentence the finder picks is not a claim about a list the code could break.
NOT_A_LIST = "not a list claim"
# A claim no test can check, said with the reason; each is a promise kept by review.
BY_REVIEW = "by review"

# (page, a phrase of the sentence) -> the test that checks it ("tests/<file>::<test>"),
# or NOT_A_LIST / BY_REVIEW followed by the reason.
CLAIMS: dict[tuple[str, str], str] = {
    ("README.md", "Every setting is an environment variable"):
        "tests/test_doc_claims.py::test_the_settings_tables_match_the_daemon_and_the_chart",
    ("README.md", "The chart's README describes every value"):
        "tests/test_deploy_chart.py::test_chart_readme_documents_every_value",
    ("README.md", "silently drop every value a new chart version adds"):
        f"{NOT_A_LIST}: what Helm's --reuse-values does",
    ("README.md", "every key of that chart has the same name and place here"):
        "tests/test_deploy_chart.py::test_go_chart_values_file_reaches_the_daemonset",
    ("README.md", "Every change is in"):
        f"{BY_REVIEW}: a behaviour difference from the Go plugin is found by reading both",
    ("README.md", "Every record is one line on stdout"):
        "tests/test_cli.py::test_startup_logs_version_and_resolved_configuration",
    ("README.md", "every flag, environment variable and chart value, with defaults"):
        "tests/test_docs.py::test_every_flag_and_variable_of_help_is_documented_and_nothing_else",
    ("README.md", "the catalogue of every record"):
        "tests/test_docs.py::test_every_record_message_is_in_the_logging_page",
    ("README.md", "the OTLP push, every metric"):
        "tests/test_metrics_recorder.py::test_the_readme_lists_exactly_the_metrics_with_type_and_labels",
    ("README.md", "every behaviour that differs from the Go plugin"):
        f"{BY_REVIEW}: a behaviour difference from the Go plugin is found by reading both",
    ("docs/allocation.md", "must name every requested device"):
        f"{NOT_A_LIST}: a rule the RSD sequence applies to rbln-smi's answer",
    ("docs/cdi.md", "every refresh after a change"):
        f"{NOT_A_LIST}: what the runtime's CDI library does",
    ("docs/configuration.md", "Every setting of the daemon is an environment variable"):
        "tests/test_doc_claims.py::test_the_settings_tables_match_the_daemon_and_the_chart",
    ("docs/configuration.md", "every flag takes one dash or two"):
        "tests/test_goflags.py::test_every_value_flag_takes_one_dash_or_two_and_either_value_form",
    ("docs/configuration.md", "Every host path is configurable"):
        "tests/test_doc_claims.py::test_the_settings_tables_match_the_daemon_and_the_chart",
    ("docs/configuration.md", "the templates refuse every value the daemon would refuse"):
        "tests/test_deploy_chart.py::test_values_the_daemon_refuses_are_refused_at_install",
    ("docs/deployment.md", "describes every"):
        "tests/test_deploy_chart.py::test_chart_readme_documents_every_value",
    ("docs/deployment.md", "the templates refuse every value the daemon would refuse"):
        "tests/test_deploy_chart.py::test_values_the_daemon_refuses_are_refused_at_install",
    ("docs/deployment.md", "Every value is described in the chart's README"):
        "tests/test_deploy_chart.py::test_chart_readme_documents_every_value",
    ("docs/development.md", "Every command in these pages"):
        "tests/test_readme_commands.py::test_simulator_demo_and_troubleshooting_commands_run_as_printed",
    ("docs/differences-from-go.md", "This page lists every place"):
        f"{BY_REVIEW}: a behaviour difference from the Go plugin is found by reading both",
    ("docs/differences-from-go.md", "every host path"):
        f"{NOT_A_LIST}: how the spec check reads a file",
    ("docs/dra.md", "Every example under `examples/`"):
        "tests/test_deploy_examples.py::test_dra_example_claims_devices_of_a_chart_device_class",
    ("docs/logging.md", "Every record the daemon writes"):
        "tests/test_docs.py::test_every_record_message_is_in_the_logging_page",
    ("docs/logging.md", "the retries every scan are debug records"):
        f"{NOT_A_LIST}: a record's level on retries",
    ("docs/performance.md", "a formatter for every flag"):
        f"{NOT_A_LIST}: how argparse works",
    ("docs/testing.md", "every flag, variable, chart value, record and metric is documented"):
        "tests/test_docs.py::test_every_chart_value_is_documented_and_nothing_else",
    ("docs/testing.md", "every test but five changes its node"):
        f"{NOT_A_LIST}: how the end-to-end modules share nodes",
    ("docs/testing.md", "compiled every test module"):
        f"{NOT_A_LIST}: what Python did without a bytecode cache",
    ("docs/testing.md", "defines every behaviour"):
        f"{NOT_A_LIST}: where the fake rbln-smi's behaviours live",
    ("docs/testing.md", "enters every package's cache key"):
        f"{NOT_A_LIST}: how Go's build cache works",
    ("docs/simulator.md", "Every command it prints is spelled the way it was started"):
        "tests/test_readme_commands.py::test_simulator_demo_and_troubleshooting_commands_run_as_printed",
    ("docs/troubleshooting.md", "every record, by situation"):
        "tests/test_docs.py::test_every_record_message_is_in_the_logging_page",
    ("docs/simulator.md", "every metric is described in"):
        "tests/test_metrics_recorder.py::test_the_readme_lists_exactly_the_metrics_with_type_and_labels",
    ("docs/troubleshooting.md", "names every path it tried"):
        "tests/test_inspect_cli.py::test_missing_rbln_smi_names_every_path_tried",
    ("docs/troubleshooting.md", "(then every record, including"):
        f"{NOT_A_LIST}: what the debug level shows",
    ("docs/troubleshooting.md", "Every key is always present"):
        "tests/test_docs.py::test_the_json_report_table_names_every_key_and_kind_of_the_schema",
    ("docs/troubleshooting.md", "every `whyNot` kind"):
        "tests/test_docs.py::test_the_json_report_table_names_every_key_and_kind_of_the_schema",
    ("README.md", "What stays on each node"):
        "tests/test_doc_claims.py::test_the_uninstall_leftovers_are_what_a_real_shutdown_leaves",
    ("README.md", "New optional values"):
        "tests/test_doc_claims.py::test_the_readmes_new_chart_values_are_those_the_go_chart_lacks",
}  # fmt: skip


def _sentences(text: str) -> Iterator[str]:
    """The page's sentences and table cells, code blocks left out, each on one line."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        yield from re.split(r"(?<=[.;:])\s+(?=[A-Z`(\[-])|\|", flat)


def found_claims() -> Iterator[tuple[str, str]]:
    for path in PAGES:
        for sentence in _sentences(path.read_text(encoding="utf-8")):
            if _CLAIM.search(sentence):
                yield str(path.relative_to(REPO)), sentence


def _flat(path: str) -> str:
    return " ".join((REPO / path).read_text(encoding="utf-8").split())


def test_every_claim_of_completeness_is_listed_with_its_check() -> None:
    unlisted = [
        f"{page}: {sentence}"
        for page, sentence in found_claims()
        if not any(p == page and phrase in sentence for p, phrase in CLAIMS)
    ]
    assert not unlisted, "add each to CLAIMS with its check:\n" + "\n".join(unlisted)


def test_every_listed_claim_is_still_on_its_page() -> None:
    gone = [key for key in CLAIMS if key[1] not in _flat(key[0])]
    assert not gone, f"remove these from CLAIMS (or fix the phrase): {gone}"


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_check_named_is_a_test_that_exists() -> None:
    missing = []
    for check in CLAIMS.values():
        if check.startswith((NOT_A_LIST + ": ", BY_REVIEW + ": ")):
            continue
        file, _, name = check.partition("::")
        if not (REPO / file).is_file() or name not in _test_names(REPO / file):
            missing.append(check)
    assert not missing, f"CLAIMS names tests that do not exist: {missing}"


def test_the_finder_sees_the_kinds_of_claim_it_is_for() -> None:
    for sentence in (
        "Every setting is a flag.",
        "This page lists every place where it differs.",
        "All values are described.",
    ):
        assert _CLAIM.search(sentence), sentence
    assert not _CLAIM.search("The daemon scans every interval.")


# -- the settings tables -----------------------------------------------------------------

CONFIG_PAGE = REPO / "docs" / "configuration.md"
# A sample for each setting, the values (or extraEnv entry) that set it, and what the
# daemon's variable must then be. Kept beside the page's table: the test fails when a row
# lacks a sample or a sample lacks a row.
CHART_SAMPLES: dict[str, tuple[dict[str, Any], str]] = {
    "RBLN_MODE": ({"mode": "dra"}, "dra"),
    "RBLN_DRA_TAINT_NO_EXECUTE": (
        {"mode": "dra", "devicePlugin": {"draTaintNoExecute": True}}, "true"),
    "KUBELET_PLUGINS_REGISTRY_PATH": (
        {"mode": "dra", "devicePlugin": {"kubeletPluginsRegistryPath": "/k/reg"}}, "/k/reg"),
    "KUBELET_POD_RESOURCES_SOCKET": (
        {"mode": "dra", "devicePlugin": {"kubeletPodResourcesPath": "/k/pr"}},
        "/k/pr/kubelet.sock"),
    "KUBELET_PLUGINS_PATH": (
        {"mode": "dra", "devicePlugin": {"kubeletPluginsPath": "/k/plugins"}}, "/k/plugins"),
    "CDI_ROOT": ({"devicePlugin": {"cdiRoot": "/x/cdi"}}, "/x/cdi"),
    "CDI_STATIC_DIR": ({"devicePlugin": {"cdiStaticDir": "/x/etc-cdi"}}, "/x/etc-cdi"),
    "CDI_MODE": ({"devicePlugin": {"cdiMode": "field"}}, "field"),
    "KUBELET_DEVICE_PLUGIN_PATH": (
        {"devicePlugin": {"kubeletDevicePluginPath": "/k/dp"}}, "/k/dp"),
    "HEALTHCHECK_PORT": (
        {"devicePlugin": {"containers": {"plugin": {"healthcheckPort": 6000}}}}, "6000"),
    "DEVICE_SCAN_INTERVAL": ({"devicePlugin": {"deviceScanInterval": "7s"}}, "7s"),
    "OTEL_EXPORTER_OTLP_ENDPOINT": ({"devicePlugin": {"otlpEndpoint": "c:4317"}}, "c:4317"),
    "METRICS_PORT": (
        {"devicePlugin": {"metrics": {"prometheus": {"enabled": True, "port": 9999}}}}, "9999"),
    "OTEL_TRACES_EXPORTER": (
        {"devicePlugin": {"otlpEndpoint": "c:4317", "tracing": {"enabled": False}}}, "none"),
    "METRICS_OTLP": (
        {"devicePlugin": {"otlpEndpoint": "c:4317", "metrics": {"otlp": {"enabled": True}}}},
        "true"),
    "METRICS_EXPORT_INTERVAL": (
        {"devicePlugin": {"metrics": {"otlp": {"exportInterval": "90s"}}}}, "90s"),
    "RBLN_DEVICE_PLUGIN_LOG_LEVEL": ({"logging": {"level": "debug"}}, "debug"),
    "RBLN_DEVICE_PLUGIN_LOG_FORMAT": ({"logging": {"format": "text"}}, "text"),
    "USE_GENERIC_RESOURCE_NAME": ({"devicePlugin": {"useGenericResourceName": False}}, "false"),
}  # fmt: skip
EXTRA_ENV_SAMPLES = {
    "KUBECONFIG": "/etc/kube/config",
    "SYSFS_ROOT": "/host/sys",
    "DEV_ROOT": "/host/dev",
    "RBLN_SMI_PATH": "/opt/rbln/rbln-smi",
    "RSD_LOCK_PATH": "/run/rbln/other.lock",
    "SCAN_STALL_LIMIT": "5m",
    "GRPC_VERBOSITY": "INFO",
}


def settings_rows() -> dict[str, tuple[str | None, str]]:
    """variable -> (its flag or None, its chart value cell), from every table of the page
    whose header has a Chart value column."""
    rows: dict[str, tuple[str | None, str]] = {}
    columns: list[str] = []
    for line in CONFIG_PAGE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            columns = []
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if "Chart value" in cells and ("Environment variable" in cells or "Variable" in cells):
            columns = cells
            continue
        if not columns or set(line) <= set("|-"):
            continue
        by = dict(zip(columns, cells, strict=False))
        variable = (by.get("Environment variable") or by["Variable"]).strip("`")
        flag = by.get("Flag", "").strip("`") or None
        rows[variable] = (flag, by["Chart value"])
    return rows


def _value_keys(cell: str) -> list[str]:
    """The chart values a cell names (`extraEnv` is a way in, not the setting's value)."""
    spans = re.findall(r"`([a-z][\w.]*)`", cell)
    return [span for span in spans if span != "extraEnv"]


def _env(helm: Helm, values: dict[str, Any]) -> dict[str, Any]:
    return env_of(plugin_container(daemonset(helm.template(values=values))))


def test_the_settings_tables_match_the_daemon_and_the_chart(helm: Helm) -> None:
    rows = settings_rows()
    # Flags and variables: exactly the daemon's options, logging without a flag.
    options = {option.env: option.flag for option in config.OPTIONS}
    expected = {**options, logs.LEVEL_ENV: None, logs.FORMAT_ENV: None}
    assert {v: f for v, (f, _) in rows.items() if v in expected} == expected
    assert set(rows) - set(expected) == {config.IGNORED_ENV, "GRPC_VERBOSITY"}
    # Every host path the daemon reads is a setting (the simulator depends on it).
    assert {"--sysfs-root", "--dev-root", "--rbln-smi", "--rsd-lock-path"} <= set(options.values())

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    defaults = _env(helm, {})
    keyed = {v: _value_keys(cell) for v, (_, cell) in rows.items() if _value_keys(cell)}
    assert set(keyed) == set(CHART_SAMPLES), "CHART_SAMPLES and the page's chart values differ"
    for variable, keys in keyed.items():
        sample, want = CHART_SAMPLES[variable]
        for key in keys:  # each value the row names exists, and the sample sets it
            node: Any = values
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{variable}: no value {key}"
                node = node[part]
        assert set(keys) <= set(chart_leaf_keys(sample, set())), variable
        assert _env(helm, sample).get(variable) == want, variable
        assert defaults.get(variable) != want, f"{variable}: the sample is the default"

    unkeyed = {v: cell for v, (_, cell) in rows.items() if v not in keyed}
    for variable, cell in unkeyed.items():
        assert cell.startswith("none: "), f"{variable}: {cell}"
        if "extraEnv" in cell:
            sample_value = EXTRA_ENV_SAMPLES[variable]
            extra = [{"name": variable, "value": sample_value}]
            env = _env(helm, {"devicePlugin": {"containers": {"plugin": {"extraEnv": extra}}}})
            assert env[variable] == sample_value, variable
        if "the chart sets it" in cell:
            assert variable in defaults, variable
        if "refuses" in cell:
            extra = [{"name": variable, "value": "true"}]
            done = helm.attempt(
                values={"devicePlugin": {"containers": {"plugin": {"extraEnv": extra}}}}
            )
            assert done.returncode != 0, variable
    assert set(EXTRA_ENV_SAMPLES) == {v for v, c in unkeyed.items() if "extraEnv" in c}


# -- the README's new chart values -------------------------------------------------------


def test_the_readmes_new_chart_values_are_those_the_go_chart_lacks() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    flat = " ".join(readme.split())
    listed_text = flat.split("New optional values", 1)[1].split("Every change is in", 1)[0]
    listed = set(re.findall(r"`([a-zA-Z][\w.*]*)`", listed_text))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # Maps the Go chart takes whole stay whole; a new map is listed as `key.*` or its keys.
    ours = set(chart_leaf_keys(values, GO_CHART_OPAQUE))
    new = {k for k in ours if not any(k == go or k.startswith(f"{go}.") for go in GO_CHART_KEYS)}
    covered = {
        key
        for key in new
        if key in listed or any(key.startswith(w[:-1]) for w in listed if w.endswith("*"))
    }
    assert new == covered, f"new chart values the README does not list: {sorted(new - covered)}"
    stale = {w for w in listed if not any(k == w or k.startswith(w[:-1]) for k in ours)}
    assert not stale, f"the README lists values the chart does not have: {stale}"
    assert not listed & GO_CHART_KEYS, "the README lists Go chart values as new"


# -- the README's uninstall leftovers ----------------------------------------------------


def _uninstall_section() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## Uninstall\n", 1)[1].split("\n## ", 1)[0]


def _files_under(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir()}


@pytest.mark.asyncio
async def test_the_uninstall_leftovers_are_what_a_real_shutdown_leaves(tmp_path: Path) -> None:
    section = " ".join(_uninstall_section().split())
    both = section.split("in both modes", 1)[1].split("- in `device-plugin` mode", 1)[0]
    plugin_mode = section.split("in `device-plugin` mode", 1)[1].split("- in `dra` mode", 1)[0]
    # The chart's RSD lock dir is /run/rbln and its kubelet dir the one the page names.
    lock_files = {p.split("/run/rbln/", 1)[1] for p in re.findall(r"`(/run/rbln/[^`]+)`", both)}
    kubelet_files = set(re.findall(r"`<kubelet dir>/([^`]+)`", plugin_mode))
    assert lock_files and kubelet_files
    assert instancelock.ANCHOR_NAME in lock_files

    lock_dir = tmp_path / "run-rbln"
    lock_dir.mkdir()
    lock_path = lock_dir / "rsd-group.lock"
    before: set[str] = set()
    async with running(
        "rebel-4",
        extra_args=["--rsd-lock-path", str(lock_path)],
        prepare=lambda node: before.update(_files_under(node.kubelet_dir)),
    ) as h:
        await h.daemon.await_log("Registered device plugin with kubelet")
        # A pod got an NPU: the RSD lock exists from the first allocation on.
        await h.kubelet.allocate(NPU, [["rbln0"]])
        assert h.daemon.stop(signal.SIGTERM) == 0
        # The sockets go with the daemon (kubelet.sock is the kubelet's); the rest is the page's.
        left = _files_under(h.node.kubelet_dir) - before - {"kubelet.sock"}
        assert left == kubelet_files
    assert _files_under(lock_dir) == lock_files
