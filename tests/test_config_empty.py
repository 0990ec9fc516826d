"""A variable that is set but empty means what urfave/cli v2.25.3 (the Go plugin's
version) makes of it for the setting's flag type: IntFlag and DurationFlag skip it (the
default, silently), BoolFlag takes it for false, StringFlag applies the empty text, which
the setting's own checks then judge. Every option is covered, so a new one must say."""

from __future__ import annotations

from pathlib import Path

import pytest

from rbln_device_plugin import config, options
from rbln_device_plugin.telemetry import logs

# The string settings for which empty text is a value (what it means is in --help);
# every other string setting refuses it, as the Go plugin fails on an empty CDI_ROOT or
# KUBELET_DEVICE_PLUGIN_PATH (os.MkdirAll("") at start).
EMPTY_IS_A_VALUE = {
    "kubeconfig": None,  # the pod's service account
    "rbln_smi": None,  # the path search
    "node_name": "",
    "installation": "",
    "kubelet_pod_resources_socket": None,  # no look at the kubelet's PodResources
}
# OpenTelemetry's own variables: empty is unset (its specification).
OTEL_VARIABLES = {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER"}


def resolve(env: dict[str, str]) -> config.Config:
    return options.parse([], env)


@pytest.mark.parametrize("option", config.OPTIONS, ids=lambda o: o.env)
def test_an_empty_variable_reads_as_go_reads_its_flag_type(option: config.Option) -> None:
    assert option.kind in (config.STRING, config.INT, config.DURATION, config.BOOL)
    empty = {option.env: ""}
    if option.env in OTEL_VARIABLES or option.kind in (config.INT, config.DURATION):
        cfg = resolve(empty)
        assert cfg == resolve({})
        assert cfg.sources[option.field] == "default"
        assert cfg.ignored == ()  # silent, as in Go
    elif option.kind == config.BOOL:
        cfg = resolve(empty)
        assert getattr(cfg, option.field) is False
        assert cfg.sources[option.field] == "env"
        # The same variable set to a Go true is true: the empty text is what gave false.
        truthy = resolve({option.env: "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:1"})
        assert getattr(truthy, option.field) is True
    elif option.field in EMPTY_IS_A_VALUE:
        cfg = resolve(empty)
        assert getattr(cfg, option.field) == EMPTY_IS_A_VALUE[option.field]
        assert cfg.sources[option.field] == "env"
    else:
        with pytest.raises(options.UsageError) as caught:
            resolve(empty)
        message = str(caught.value)
        assert message.startswith(f"{option.env} (environment; the flag is {option.flag}): ")
        assert message.endswith("the variable is set but empty: unset it for the default")


@pytest.mark.parametrize("option", config.OPTIONS, ids=lambda o: o.env)
def test_an_empty_variable_never_beats_its_flag(option: config.Option) -> None:
    given = {
        config.INT: "7",
        config.DURATION: "100s",
        config.BOOL: "true",
    }.get(option.kind, {"mode": "device-plugin", "cdi_mode": "both", "traces_exporter": "none",
                        "node_name": "n1", "otlp_endpoint": "h:1", "installation": "ns/x"}
          .get(option.field, "/flag/x"))  # fmt: skip
    env = {option.env: "", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:1"}
    cfg = options.parse([f"{option.flag}={given}"], env)
    assert getattr(cfg, option.field) == option.convert(given)
    assert cfg.sources[option.field] == "flag"


@pytest.mark.parametrize(
    ("name", "value"),
    [("HEALTHCHECK_PORT", 51515), ("METRICS_PORT", -1), ("DEVICE_SCAN_INTERVAL", 5.0),
     ("METRICS_EXPORT_INTERVAL", 60.0), ("SCAN_STALL_LIMIT", 120.0)],
)  # fmt: skip
def test_an_empty_number_or_duration_is_the_documented_default(name: str, value: object) -> None:
    (option,) = [o for o in config.OPTIONS if o.env == name]
    assert getattr(resolve({name: ""}), option.field) == value


@pytest.mark.parametrize("name", ["METRICS_OTLP", "RBLN_TEST_FILE_DEVICE_NODES"])
def test_an_empty_boolean_variable_is_false(name: str) -> None:
    cfg = options.parse([], {name: "", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:1"})
    assert cfg.metrics_otlp is False and cfg.test_file_device_nodes is False


def test_an_empty_path_is_refused_with_how_to_get_the_default() -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve({"CDI_ROOT": ""})
    assert str(caught.value) == (
        "CDI_ROOT (environment; the flag is --cdi-root): a path is required; "
        "the variable is set but empty: unset it for the default"
    )
    # From the command line an empty value is refused too (Go's flag package: the same),
    # without the hint about the variable.
    with pytest.raises(options.UsageError, match=r"^--cdi-root \(command line\): a path is "):
        options.parse(["--cdi-root="], {})
    assert resolve({"KUBECONFIG": "", "RBLN_SMI_PATH": ""}).rbln_smi is None
    assert resolve({"SYSFS_ROOT": "/s"}).sysfs_root == Path("/s")


def test_an_empty_number_from_the_command_line_is_refused_as_in_go() -> None:
    # Go's flag package sets a flag's value with strconv: "" is a parse error there.
    with pytest.raises(options.UsageError, match=r"^--healthcheck-port \(command line\): "):
        options.parse(["--healthcheck-port="], {})
    with pytest.raises(options.UsageError, match=r"^-device-scan-interval|^--device-scan"):
        options.parse(["-device-scan-interval="], {})


def test_an_empty_operator_variable_is_false_as_the_go_bool_flag_reads_it() -> None:
    environ = {config.IGNORED_ENV: ""}
    assert config.ignored_env_problem(environ) is None
    # the "has no effect" warning
    assert config.legacy_names_requested(environ) == (config.IGNORED_ENV, "")
    assert config.legacy_names_requested({config.IGNORED_ENV: "true"}) is None
    assert resolve(environ) == resolve({})


def test_empty_logging_variables_are_the_defaults_without_a_warning() -> None:
    settings = logs.resolve_settings({logs.LEVEL_ENV: "", logs.FORMAT_ENV: ""})
    assert settings == logs.resolve_settings({})
    assert settings.fallbacks == ()
