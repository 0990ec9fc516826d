"""Flags, environment variables and defaults -> Config."""

from __future__ import annotations

from pathlib import Path

import pytest

from rbln_device_plugin import config, options
from rbln_device_plugin.durations import format_duration, parse_duration


def resolve(argv: list[str], env: dict[str, str] | None = None) -> config.Config:
    return options.parse(argv, env or {})


def test_defaults_match_the_documented_table() -> None:
    cfg = resolve([])
    assert cfg.cdi_root == Path("/var/run/cdi")
    assert cfg.kubelet_dir == Path("/var/lib/kubelet/device-plugins")
    assert cfg.healthcheck_port == 51515
    assert cfg.scan_interval == 5.0
    assert cfg.otlp_endpoint == ""
    assert cfg.traces_exporter == "otlp" and not cfg.tracing_enabled
    assert cfg.sysfs_root == Path("/sys")
    assert cfg.dev_root == Path("/dev")
    assert cfg.rbln_smi is None
    assert cfg.rsd_lock_path == Path("/var/run/rbln-rsd-group.lock")
    assert cfg.test_file_device_nodes is False
    assert cfg.metrics_port == -1 and not cfg.metrics_endpoint_enabled
    assert cfg.metrics_otlp is False and not cfg.metrics_enabled
    assert cfg.metrics_export_interval == 60.0


@pytest.mark.parametrize(
    ("flag", "env", "field", "flag_value", "env_value", "expected_flag", "expected_env"),
    [
        ("--cdi-root", "CDI_ROOT", "cdi_root", "/f", "/e", Path("/f"), Path("/e")),
        ("--kubelet-device-plugin-path", "KUBELET_DEVICE_PLUGIN_PATH", "kubelet_dir", "/f",
         "/e", Path("/f"), Path("/e")),
        ("--healthcheck-port", "HEALTHCHECK_PORT", "healthcheck_port", "1", "2", 1, 2),
        ("--device-scan-interval", "DEVICE_SCAN_INTERVAL", "scan_interval", "1s", "2m", 1.0,
         120.0),
        ("--otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint", "a:1", "b:2", "a:1",
         "b:2"),
        ("--otel-traces-exporter", "OTEL_TRACES_EXPORTER", "traces_exporter", "none", "otlp",
         "none", "otlp"),
        ("--node-name", "NODE_NAME", "node_name", "f", "e", "f", "e"),
        ("--metrics-port", "METRICS_PORT", "metrics_port", "9464", "0", 9464, 0),
        ("--metrics-export-interval", "METRICS_EXPORT_INTERVAL", "metrics_export_interval",
         "2s", "1m", 2.0, 60.0),
        ("--sysfs-root", "SYSFS_ROOT", "sysfs_root", "/f", "/e", Path("/f"), Path("/e")),
        ("--dev-root", "DEV_ROOT", "dev_root", "/f", "/e", Path("/f"), Path("/e")),
        ("--rbln-smi", "RBLN_SMI_PATH", "rbln_smi", "/f", "/e", Path("/f"), Path("/e")),
        ("--rsd-lock-path", "RSD_LOCK_PATH", "rsd_lock_path", "/d/f", "/d/e", Path("/d/f"),
         Path("/d/e")),
        ("--test-file-device-nodes", "RBLN_TEST_FILE_DEVICE_NODES", "test_file_device_nodes",
         "true", "false", True, False),
    ],
)  # fmt: skip
def test_flag_beats_env_beats_default(
    flag: str, env: str, field: str, flag_value: str, env_value: str,
    expected_flag: object, expected_env: object,
) -> None:  # fmt: skip
    assert getattr(resolve([], {env: env_value}), field) == expected_env
    # A boolean flag takes no separate word (Go's flag package): only "=value".
    spaced = [flag, flag_value] if flag_value not in ("true", "false") else [f"{flag}={flag_value}"]
    assert getattr(resolve(spaced, {env: env_value}), field) == expected_flag
    assert getattr(resolve([f"{flag}={flag_value}"]), field) == expected_flag


def test_every_option_is_listed_for_deployment_checks() -> None:
    assert {o.env for o in config.OPTIONS} <= options.ENVIRONMENT_VARIABLES
    assert "USE_GENERIC_RESOURCE_NAME" in options.ENVIRONMENT_VARIABLES
    assert "RBLN_DEVICE_PLUGIN_LOG_LEVEL" in options.ENVIRONMENT_VARIABLES


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5), ("200ms", 0.2), ("1m30s", 90), ("1h", 3600), ("1.5h", 5400), ("300us", 3e-4),
     ("2h45m", 9900), ("0", 0), ("-5s", -5), ("1h1m1s1ms", 3661.001), (".5s", 0.5)],
)  # fmt: skip
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


# What Go's time.Duration.String prints for the same durations.
@pytest.mark.parametrize(
    ("seconds", "go"),
    [(0, "0s"), (1e-9, "1ns"), (999e-9, "999ns"), (1.5e-6, "1.5µs"), (5e-4, "500µs"),
     (0.2, "200ms"), (0.0015, "1.5ms"), (1, "1s"), (1.5, "1.5s"), (5, "5s"), (60, "1m0s"),
     (90, "1m30s"), (3600, "1h0m0s"), (5400, "1h30m0s"), (3661.001, "1h1m1.001s"),
     (86400, "24h0m0s"), (-5, "-5s"), (-5400, "-1h30m0s")],
)  # fmt: skip
def test_durations_print_as_go_prints_them(seconds: float, go: str) -> None:
    assert format_duration(seconds) == go


@pytest.mark.parametrize(
    ("text", "go"),
    [("1h30m", "1h30m0s"), ("90m", "1h30m0s"), ("1.5h", "1h30m0s"), ("5400s", "1h30m0s"),
     ("2h", "2h0m0s"), ("300s", "5m0s"), ("1m30s", "1m30s"), ("1500ms", "1.5s")],
)  # fmt: skip
def test_parsed_durations_print_in_go_form(text: str, go: str) -> None:
    assert format_duration(parse_duration(text)) == go


@pytest.mark.parametrize("text", ["", "5", "s", "5 s", "5x", "1m30", "ms5", "--5s", "5s5"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", ["0s", "0", "-1s", "banana", "5", "25h"])
def test_unusable_interval_is_a_usage_error_naming_flag_and_env(value: str) -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve([f"--device-scan-interval={value}"])
    assert str(caught.value).startswith("--device-scan-interval (command line): ")
    with pytest.raises(options.UsageError) as from_env:
        resolve([], {"DEVICE_SCAN_INTERVAL": value})
    assert str(from_env.value).startswith(
        "DEVICE_SCAN_INTERVAL (environment; the flag is --device-scan-interval): "
    )


@pytest.mark.parametrize("value", ["65536", "99999", "http", "1.5", ""])
def test_bad_ports_are_usage_errors(value: str) -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve(["--healthcheck-port", value])
    assert str(caught.value).startswith("--healthcheck-port (command line): ")


@pytest.mark.parametrize(("value", "port"), [("-1", -1), ("-42", -42), ("0", 0), ("65535", 65535)])
def test_negative_port_disables_and_zero_picks_any(value: str, port: int) -> None:
    cfg = resolve(["--healthcheck-port", value])
    assert cfg.healthcheck_port == port
    assert cfg.healthcheck_enabled == (port >= 0)


def test_positional_arguments_are_rejected() -> None:
    with pytest.raises(options.UsageError):
        resolve(["extra"])


def test_abbreviated_flags_are_not_guessed() -> None:
    with pytest.raises(options.UsageError):
        resolve(["--cdi", "/x"])


def test_operator_variable_is_accepted_and_ignored() -> None:
    assert resolve([], {"USE_GENERIC_RESOURCE_NAME": "true"}) == resolve([])


def test_kubelet_dir_too_long_for_unix_sockets_is_rejected() -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve(["--kubelet-device-plugin-path", "/" + "d" * 90])
    assert "too long" in str(caught.value)


def test_too_long_interval_names_the_limit_in_go_form() -> None:
    with pytest.raises(options.UsageError, match="longer than 24h0m0s"):
        resolve(["--device-scan-interval", "25h"])


@pytest.mark.parametrize("value", ["-1s", "-5m", "-1"])
def test_a_negative_interval_after_a_space_is_the_same_error_as_after_equals(value: str) -> None:
    with pytest.raises(options.UsageError) as spaced:
        resolve(["--device-scan-interval", value])
    with pytest.raises(options.UsageError) as joined:
        resolve([f"--device-scan-interval={value}"])
    assert str(spaced.value) == str(joined.value)
    assert "--device-scan-interval (command line)" in str(spaced.value)


def test_a_dash_value_is_taken_by_any_value_flag() -> None:
    assert resolve(["--node-name", "-edge-7"]).node_name == "-edge-7"
    assert resolve(["--healthcheck-port", "-1"]).healthcheck_port == -1


def test_a_value_that_is_exactly_two_dashes_is_that_text_as_in_go() -> None:
    # argparse drops "--" from "--flag=--" and leaves a list: the daemon crashed on it.
    assert resolve(["--node-name=--"]).node_name == "--"
    for flag in ("--test-file-device-nodes", "--device-scan-interval", "--cdi-root"):
        with pytest.raises(options.UsageError, match=f"{flag} .*'--'"):
            resolve([f"{flag}=--"])


def test_the_next_word_is_the_value_even_a_flag_as_in_go() -> None:
    # Go's flag package: "value is the next arg", whatever it is; "/x" is then an argument.
    with pytest.raises(options.UsageError, match=r"^arguments not supported: \[/x\]$"):
        resolve(["--device-scan-interval", "--cdi-root", "/x"])
    assert resolve(["--node-name", "--cdi-root"]).node_name == "--cdi-root"
    with pytest.raises(options.UsageError, match=r"^flag needs an argument: --cdi-root$"):
        resolve(["--cdi-root"])
    with pytest.raises(options.UsageError, match=r"^arguments not supported: \[--node-name -x\]"):
        resolve(["--", "--node-name", "-x"])


def test_config_is_frozen_and_describes_itself() -> None:
    cfg = resolve(["--device-scan-interval", "1h30m"])
    with pytest.raises(AttributeError):
        cfg.scan_interval = 1.0  # type: ignore[misc]
    described = cfg.describe()
    assert described["scanInterval"] == "1h30m0s"
    assert described["kubeletDir"] == "/var/lib/kubelet/device-plugins"
    assert described["rblnSmi"] == "(search)"


@pytest.mark.parametrize("raw", ["maybe", "yes", "", "2"])
def test_test_only_device_node_setting_takes_go_booleans_only(raw: str) -> None:
    with pytest.raises(
        options.UsageError, match=r"^--test-file-device-nodes \(command line\):.*not a boolean"
    ):
        resolve([f"--test-file-device-nodes={raw}"])
    assert resolve([], {"RBLN_TEST_FILE_DEVICE_NODES": "T"}).test_file_device_nodes is True


@pytest.mark.parametrize("raw", [" true", "true ", "\ttrue", "true\n", " 1 ", "\u00a0T"])
def test_booleans_take_no_surrounding_whitespace_as_go_parse_bool(raw: str) -> None:
    for argv, env, origin in (
        ([f"--test-file-device-nodes={raw}"], {}, "--test-file-device-nodes (command line)"),
        ([], {"RBLN_TEST_FILE_DEVICE_NODES": raw}, "RBLN_TEST_FILE_DEVICE_NODES (environment"),
        ([f"--metrics-otlp={raw}", "--otlp-endpoint=x:1"], {}, "--metrics-otlp (command line)"),
        (["--otlp-endpoint=x:1"], {"METRICS_OTLP": raw}, "METRICS_OTLP (environment"),
    ):
        with pytest.raises(options.UsageError, match="not a boolean") as caught:
            resolve(argv, env)
        assert str(caught.value).startswith(origin)
    # Without the whitespace the same word is a boolean.
    assert resolve([f"--test-file-device-nodes={raw.strip()}"]).test_file_device_nodes is True


@pytest.mark.parametrize(
    ("flag", "env", "value", "why"),
    [
        ("--cdi-root", "CDI_ROOT", "cdi", "'cdi' is not an absolute path"),
        ("--cdi-root", "CDI_ROOT", "./var/run/cdi", "is not an absolute path"),
        ("--cdi-root", "CDI_ROOT", "/var/run/../cdi", "contains '..'"),
        ("--kubelet-device-plugin-path", "KUBELET_DEVICE_PLUGIN_PATH", "kubelet", "absolute"),
        ("--kubelet-device-plugin-path", "KUBELET_DEVICE_PLUGIN_PATH", "/var/lib/..", "'..'"),
    ],
)
def test_host_directories_must_be_absolute_as_the_chart_requires(
    flag: str, env: str, value: str, why: str
) -> None:
    with pytest.raises(options.UsageError) as from_flag:
        resolve([flag, value])
    assert str(from_flag.value).startswith(f"{flag} (command line): ")
    assert why in str(from_flag.value)
    with pytest.raises(options.UsageError) as from_env:
        resolve([], {env: value})
    assert str(from_env.value).startswith(f"{env} (environment; the flag is {flag}): ")
    # A flag that is fine wins over a bad variable, as everywhere else.
    assert resolve([flag, "/ok"], {env: value}) is not None


def test_a_directory_named_with_dots_is_still_a_directory() -> None:
    assert str(resolve(["--cdi-root", "/var/run/..cdi/x.."]).cdi_root) == "/var/run/..cdi/x.."


@pytest.mark.parametrize(
    ("value", "problem"),
    [("true", False), ("F", False), ("0", False), (" false ", True), ("false\n", True),
     ("maybe", True), ("yes", True), ("", False)],
)  # fmt: skip
def test_operator_variable_that_is_not_a_boolean_is_named_and_ignored(
    value: str, problem: bool
) -> None:
    found = config.ignored_env_problem({"USE_GENERIC_RESOURCE_NAME": value})
    assert (found is not None) == problem
    if problem:
        assert found is not None and found.startswith("USE_GENERIC_RESOURCE_NAME (environment)")
    # Never a refusal: the variable changes nothing.
    assert resolve([], {"USE_GENERIC_RESOURCE_NAME": value}) == resolve([])


def test_origin_names_what_supplied_each_setting() -> None:
    cfg = resolve(["--otlp-endpoint", "x:1"], {"NODE_NAME": "n1"})
    assert cfg.origin("otlp_endpoint") == "--otlp-endpoint (command line)"
    assert cfg.origin("node_name") == "NODE_NAME (environment; the flag is --node-name)"
    assert cfg.origin("cdi_root") == "--cdi-root (default)"


def test_otlp_metrics_need_the_collector_endpoint() -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve(["--metrics-otlp"])
    assert str(caught.value) == (
        "--metrics-otlp (command line): OTLP metrics need a collector; "
        "set --otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    cfg = resolve([], {"METRICS_OTLP": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"})
    assert cfg.metrics_otlp and cfg.metrics_enabled and not cfg.metrics_endpoint_enabled


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["--metrics-port", "65536"], "--metrics-port (command line): "),
     (["--metrics-port", "x"], "--metrics-port (command line): "),
     (["--metrics-otlp=maybe"], "--metrics-otlp (command line): "),
     (["--metrics-export-interval", "0s"], "--metrics-export-interval (command line): "),
     (["--metrics-export-interval", "25h"], "--metrics-export-interval (command line): ")],
)  # fmt: skip
def test_bad_metrics_settings_are_usage_errors_naming_flag_and_variable(
    argv: list[str], named: str
) -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve(argv)
    assert str(caught.value).startswith(named)


@pytest.mark.parametrize(("value", "on"), [("-1", False), ("-9", False), ("0", True),
                                           ("9464", True)])  # fmt: skip
def test_a_negative_metrics_port_is_off(value: str, on: bool) -> None:
    cfg = resolve([], {"METRICS_PORT": value})
    assert cfg.metrics_endpoint_enabled is on and cfg.metrics_enabled is on


@pytest.mark.parametrize(
    ("endpoint", "exporter", "on"),
    [("", "otlp", False), ("", "none", False), ("c:4317", "otlp", True),
     ("c:4317", "none", False), ("c:4317", " None ", False),
     ("c:4317", "OTLP", True)],
)  # fmt: skip
def test_traces_need_an_endpoint_and_can_be_switched_off_apart(
    endpoint: str, exporter: str, on: bool
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_EXPORTER": exporter}
    assert resolve([], env).tracing_enabled is on


@pytest.mark.parametrize("value", ["zipkin", "console", "otlp,console", "false"])
def test_an_unsupported_traces_exporter_is_ignored_as_if_unset(value: str) -> None:
    cfg = resolve([], {"OTEL_TRACES_EXPORTER": value, "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"})
    assert cfg.traces_exporter == "otlp" and cfg.tracing_enabled
    ((setting, raw, reason),) = cfg.ignored
    assert setting == "OTEL_TRACES_EXPORTER (environment; the flag is --otel-traces-exporter)"
    assert raw == value and "is not supported" in reason and "ignored as if unset" in reason


@pytest.mark.parametrize("name", ["OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_opentelemetry_variable_is_unset(name: str, value: str) -> None:
    cfg = resolve([], {name: value})
    assert cfg == resolve([]) and cfg.ignored == ()
    assert cfg.sources["traces_exporter"] == "default"


@pytest.mark.parametrize("name", ["METRICS_PORT", "HEALTHCHECK_PORT"])
def test_a_kubernetes_service_link_in_a_port_variable_is_ignored(name: str) -> None:
    cfg = resolve([], {name: "tcp://10.0.0.1:9464"})
    assert cfg == resolve([])
    ((setting, raw, reason),) = cfg.ignored
    assert setting.startswith(f"{name} (environment")
    assert raw == "tcp://10.0.0.1:9464" and "service link" in reason


@pytest.mark.parametrize(
    ("value", "port"),
    [("0x1f90", 8080), ("0o17", 15), ("017", 15), ("8_080", 8080), ("+80", 80), ("-0x1", -1)],
)
def test_ports_are_integers_as_go_reads_them(value: str, port: int) -> None:
    assert resolve(["--healthcheck-port", value]).healthcheck_port == port


@pytest.mark.parametrize(
    "value", ["\uff18\uff10", " 80", "80 ", "0x", "08", "8__0", "_80", "80_", "1e3"]
)
def test_ports_go_refuses_are_refused(value: str) -> None:
    with pytest.raises(options.UsageError, match="is not an integer port"):
        resolve([], {"METRICS_PORT": value})


@pytest.mark.parametrize("value", ["\uff15s", " 5s", "5s ", "5 s"])
def test_durations_go_refuses_are_refused(value: str) -> None:
    with pytest.raises(options.UsageError):
        resolve([], {"DEVICE_SCAN_INTERVAL": value})


@pytest.mark.parametrize(
    ("interval", "limit"), [("300ms", "999ms"), ("5s", "14s"), ("1s", "2999ms"), ("1s", "1ns")]
)
def test_a_stall_limit_below_three_scan_intervals_is_refused(interval: str, limit: str) -> None:
    with pytest.raises(options.UsageError, match="shorter than its floor"):
        resolve(["--device-scan-interval", interval, "--scan-stall-limit", limit])


@pytest.mark.parametrize(
    ("interval", "limit"), [("300ms", "1s"), ("5s", "15s"), ("1h", "2m"), ("100ms", "1s")]
)
def test_a_stall_limit_at_its_floor_is_accepted(interval: str, limit: str) -> None:
    cfg = resolve(["--device-scan-interval", interval, "--scan-stall-limit", limit])
    assert cfg.scan_stall_limit == parse_duration(limit)


def test_the_default_stall_limit_suits_every_interval() -> None:
    assert resolve(["--device-scan-interval", "24h"]).scan_stall_limit == 120


@pytest.mark.parametrize("value", ["1ns", "999ms"])
def test_an_export_interval_below_one_second_is_refused(value: str) -> None:
    with pytest.raises(options.UsageError, match="shorter than the floor of 1s"):
        resolve([], {"METRICS_EXPORT_INTERVAL": value})


@pytest.mark.parametrize("flag", ["--rsd-lock-path", "--dev-root"])
def test_relative_host_paths_are_refused(flag: str) -> None:
    with pytest.raises(options.UsageError, match="is not an absolute path"):
        resolve([flag, "run/x"])


def test_every_option_is_a_config_field_with_its_own_converter() -> None:
    from dataclasses import fields

    settings = {f.name for f in fields(config.Config)} - {"sources", "ignored", "legacy_names_flag"}
    assert {o.field for o in config.OPTIONS} == settings
    assert all(callable(o.convert) for o in config.OPTIONS)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/", "'/' is the root directory"),
        ("//", "'//' is the root directory"),
        ("/var", "'/var' lies directly in the root directory"),
        ("/./var", "'/./var' lies directly in the root directory"),
        ("/rsd.lock", "'/rsd.lock' lies directly in the root directory"),
        ("/run/rbln/", "'/run/rbln/' names a directory"),
        ("/run/rbln/.", "'/run/rbln/.' names a directory"),
    ],
)
def test_an_rsd_lock_path_that_is_the_root_a_top_level_name_or_a_directory_is_refused(
    value: str, why: str
) -> None:
    """The lock file and the instance lock beside it would be made in the host's root, or
    the path names a directory the daemon would otherwise rename at the first Allocate."""
    with pytest.raises(options.UsageError) as refused:
        resolve(["--rsd-lock-path", value])
    assert str(refused.value).startswith(f"--rsd-lock-path (command line): {why}")
    assert "such as /run/rbln/rsd-group.lock" in str(refused.value)
    with pytest.raises(options.UsageError, match="RSD_LOCK_PATH \\(environment"):
        resolve([], {"RSD_LOCK_PATH": value})


@pytest.mark.parametrize("value", ["/run/rsd.lock", "/run/./rsd.lock", "/a/b/c.lock", "/run/.x"])
def test_an_rsd_lock_file_in_a_directory_below_the_root_is_accepted(value: str) -> None:
    assert resolve(["--rsd-lock-path", value]).rsd_lock_path == Path(value)


def test_the_kubelet_paths_not_given_follow_the_device_plugin_directory() -> None:
    """The kubelet keeps every socket under its --root-dir: one setting moves them all,
    and a value given for one of them is used as given."""
    moved = options.parse(["--kubelet-device-plugin-path", "/k0s/kubelet/device-plugins"], {})
    assert moved.kubelet_plugins_path == Path("/k0s/kubelet/plugins")
    assert moved.kubelet_plugins_registry_path == Path("/k0s/kubelet/plugins_registry")
    assert moved.kubelet_pod_resources_socket == Path("/k0s/kubelet/pod-resources/kubelet.sock")
    assert moved.sources["kubelet_plugins_path"] == "default"
    given = options.parse(
        ["--kubelet-device-plugin-path", "/k0s/kubelet/device-plugins"],
        {"KUBELET_PLUGINS_PATH": "/elsewhere/plugins", "KUBELET_POD_RESOURCES_SOCKET": ""},
    )
    assert given.kubelet_plugins_path == Path("/elsewhere/plugins")
    assert given.kubelet_plugins_registry_path == Path("/k0s/kubelet/plugins_registry")
    assert given.kubelet_pod_resources_socket is None
    default = options.parse([], {})
    assert default.kubelet_plugins_path == Path("/var/lib/kubelet/plugins")
    assert default.kubelet_pod_resources_socket == Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )
