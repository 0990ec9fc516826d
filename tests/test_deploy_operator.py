"""The daemon as the RBLN NPU operator runs it: configured by environment only, with the
operator's USE_GENERIC_RESOURCE_NAME, through the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rbln_device_plugin.model import inventory

from .daemon_process import DaemonProcess

WARNING = "USE_GENERIC_RESOURCE_NAME=false has no effect: resource names are fixed"
FIXED_NAMES = [inventory.RESOURCE_NPU, *inventory.VF_RESOURCES.values()]


def operator_env(tmp: Path, generic: str | None) -> dict[str, str]:
    """Environment-only configuration, host paths moved into a scratch directory."""
    (tmp / "kubelet").mkdir(exist_ok=True)  # the kubelet's to create; a node has it
    env = {
        "KUBELET_DEVICE_PLUGIN_PATH": str(tmp / "kubelet"),
        "CDI_ROOT": str(tmp / "cdi"),
        "SYSFS_ROOT": str(tmp / "sys"),
        "DEV_ROOT": str(tmp / "dev"),
        "RBLN_SMI_PATH": str(tmp / "no-rbln-smi"),
        "RSD_LOCK_PATH": str(tmp / "rsd.lock"),
        "HEALTHCHECK_PORT": "0",
        "NODE_NAME": "npu-node-1",
    }
    if generic is not None:
        env["USE_GENERIC_RESOURCE_NAME"] = generic
    return env


def start_records(
    tmp: Path, generic: str | None, args: list[str] | None = None
) -> list[dict[str, object]]:
    daemon = DaemonProcess(args or [], env=operator_env(tmp, generic), level="info")
    try:
        daemon.wait_for("Starting rbln-device-plugin")
        daemon.wait_for("Started healthcheck service")
    finally:
        assert daemon.stop() == 0
    return daemon.records


# "" too: urfave/cli v2 reads a set but empty boolean variable as false (flag_bool.go).
@pytest.mark.parametrize("value", ["false", "0", "False", ""])
def test_legacy_name_request_is_warned_about_once(short_tmp: Path, value: str) -> None:
    records = start_records(short_tmp, value)
    warnings = [r for r in records if r["level"] == "warn"]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning["msg"] == WARNING
    assert warning["variable"] == "USE_GENERIC_RESOURCE_NAME"
    assert warning["value"] == value
    assert warning["resourceNames"] == FIXED_NAMES
    # It comes with the start record, before the daemon does anything else.
    messages = [r["msg"] for r in records]
    assert messages.index(warning["msg"]) == messages.index("Starting rbln-device-plugin") + 1


@pytest.mark.parametrize("value", ["true", "1", None])
def test_generic_names_or_no_setting_start_quietly(short_tmp: Path, value: str | None) -> None:
    records = start_records(short_tmp, value)
    assert not [r for r in records if "USE_GENERIC_RESOURCE_NAME" in str(r.get("msg"))]


# " False " too: Go's strconv.ParseBool takes no spaces (the Go plugin refuses to start).
@pytest.mark.parametrize("value", ["maybe", "yes", " False "])
def test_a_value_that_is_not_a_boolean_is_named_once_and_changes_nothing(
    short_tmp: Path, value: str
) -> None:
    records = start_records(short_tmp, value)
    (warning,) = [r for r in records if "USE_GENERIC_RESOURCE_NAME" in str(r.get("msg"))]
    assert warning["level"] == "warn"
    assert warning["msg"] == "Invalid USE_GENERIC_RESOURCE_NAME, ignoring it"
    assert warning["value"] == value
    assert "is not a boolean" in warning["err"]


# The older Go release's flag, as its DaemonSet passes it: the same meaning as the variable.
@pytest.mark.parametrize(
    ("args", "variable", "value"),
    [
        (["--use-generic-resource-name=false"], None, "false"),
        (["-use-generic-resource-name=0"], "true", "0"),  # the flag beats the variable
        (["--use-generic-resource-name"], "false", None),
        (["-use-generic-resource-name=true"], "maybe", None),
    ],
)
def test_the_older_go_flag_is_the_variable_s_twin(
    short_tmp: Path, args: list[str], variable: str | None, value: str | None
) -> None:
    records = start_records(short_tmp, variable, args)
    named = [r for r in records if "USE_GENERIC_RESOURCE_NAME" in str(r.get("msg"))]
    if value is None:
        assert named == []
        return
    (warning,) = named
    assert (warning["level"], warning["msg"]) == ("warn", WARNING)
    assert warning["flag"] == "--use-generic-resource-name"
    assert "variable" not in warning
    assert warning["value"] == value
    assert warning["resourceNames"] == FIXED_NAMES
