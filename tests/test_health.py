"""Health policy: lifecycle codes and the README's history rules, one case each."""

from __future__ import annotations

import pytest

from rbln_device_plugin.model.health import (
    HEALTHY,
    UNHEALTHY,
    Health,
    HealthHistory,
    StatusReading,
    Verdict,
    parse_status,
)

UNREADABLE_READ = StatusReading(None, "status file missing")
READY = StatusReading(0)
FAULT = StatusReading(4)
BUSY = StatusReading(1)


# --------------------------------------------------------------------- status values
@pytest.mark.parametrize(
    ("text", "name", "health"),
    [
        ("0", "READY", Health.HEALTHY),
        ("1", "BUSY", Health.UNHEALTHY),
        ("2", "PROBING", Health.UNHEALTHY),
        ("3", "INIT", Health.UNHEALTHY),
        ("4", "FAULT", Health.UNHEALTHY),
        ("5", "FINISH", Health.UNHEALTHY),
        ("6", "UNKNOWN(6)", Health.UNHEALTHY),
        ("-1", "UNKNOWN(-1)", Health.UNHEALTHY),
        ("255", "UNKNOWN(255)", Health.UNHEALTHY),
    ],
    ids=["ready", "busy", "probing", "init", "fault", "finish", "unknown-6", "unknown-neg", "255"],
)
def test_each_status_code_has_its_name_and_only_ready_is_healthy(
    text: str, name: str, health: Health
) -> None:
    reading = parse_status(text + "\n")
    assert reading.readable
    assert reading.name == name
    assert HealthHistory().observe("rbln0", reading).health is health


@pytest.mark.parametrize(
    "text",
    ["", "   \n", "READY", "0x1", "1.0", "1 2", "٣", "1_0", "9" * 5000, "\x00", "+"],
    ids=[
        "empty",
        "blank",
        "word",
        "hex",
        "float",
        "two",
        "arabic",
        "underscore",
        "longer-than-a-sysfs-page",
        "nul",
        "sign",
    ],
)
def test_malformed_status_is_unreadable_with_a_reason(text: str) -> None:
    reading = parse_status(text)
    assert reading.code is None
    assert reading.name == "UNREADABLE"
    assert reading.reason.startswith("malformed status")


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("1000000000000000000", "UNKNOWN(1000000000000000000)"),
        ("18446744073709551615", "UNKNOWN(18446744073709551615)"),  # 2**64 - 1, in full
        ("-99999999999999999999", "UNKNOWN(-99999999999999999999)"),
        ("7" * 21, "UNKNOWN(7777777777777777...21 digits)"),
        ("1" + "0" * 4000 + "\n", "UNKNOWN(1000000000000000...4001 digits)"),
        ("00", "READY"),
    ],
)
def test_any_integer_is_a_lifecycle_code_printed_within_bounds(text: str, name: str) -> None:
    reading = parse_status(text)
    assert reading.readable
    assert reading.name == name
    assert len(reading.name) <= len("UNKNOWN(-") + 40
    expected = Health.HEALTHY if name == "READY" else Health.UNHEALTHY
    assert HealthHistory().observe("rbln0", reading).health is expected


def test_whitespace_around_the_code_is_accepted() -> None:
    assert parse_status("  4 \n").name == "FAULT"


def test_long_malformed_values_are_shortened_in_the_reason() -> None:
    reading = parse_status("x" * 500)
    assert len(reading.reason) < 80


def test_lifecycle_name_of_none_is_unreadable() -> None:
    assert StatusReading(None).name == "UNREADABLE"
    assert StatusReading(3).name == "INIT"


def test_health_strings_are_the_kubelet_constants() -> None:
    assert HEALTHY == "Healthy" and UNHEALTHY == "Unhealthy"
    assert Health.HEALTHY == "Healthy"


# --------------------------------------------------------------------- history rules
def test_rule_unreadable_without_history_defaults_to_healthy() -> None:
    verdict = HealthHistory().observe("rbln0", UNREADABLE_READ)
    assert verdict == Verdict(Health.HEALTHY, "UNREADABLE")


def test_rule_vf_without_status_file_is_healthy() -> None:
    verdict = HealthHistory().observe("rbln0-3", StatusReading(None, "no status file"))
    assert verdict.health is Health.HEALTHY


def test_rule_unreadable_after_unhealthy_stays_unhealthy() -> None:
    history = HealthHistory()
    history.observe("rbln3", FAULT)
    verdict = history.observe("rbln3", UNREADABLE_READ)
    assert verdict.health is Health.UNHEALTHY
    assert verdict.last_unhealthy_status == "FAULT"


def test_rule_unreadable_is_never_reported_as_recovery() -> None:
    history = HealthHistory()
    history.observe("rbln3", BUSY)
    for _ in range(5):
        verdict = history.observe("rbln3", UNREADABLE_READ)
        assert verdict.health is Health.UNHEALTHY
        # Shown as UNREADABLE (what was read), with the last real status for context.
        assert verdict.status == "UNREADABLE"
        assert verdict.describe() == "UNREADABLE (last read BUSY)"


def test_rule_only_a_ready_read_resolves_unhealthy() -> None:
    history = HealthHistory()
    history.observe("rbln3", FAULT)
    history.observe("rbln3", UNREADABLE_READ)
    assert history.observe("rbln3", READY).health is Health.HEALTHY
    # Resolved: an unreadable status falls back to the compatibility default again.
    assert history.observe("rbln3", UNREADABLE_READ).health is Health.HEALTHY
    assert history.unresolved("rbln3") is None


def test_rule_latest_numeric_non_ready_is_remembered() -> None:
    history = HealthHistory()
    history.observe("rbln3", FAULT)
    history.observe("rbln3", BUSY)
    assert history.observe("rbln3", UNREADABLE_READ).last_unhealthy_status == "BUSY"


def test_rule_history_is_keyed_by_device_id() -> None:
    history = HealthHistory()
    history.observe("rbln1", FAULT)
    assert history.observe("rbln2", UNREADABLE_READ).health is Health.HEALTHY
    assert history.observe("rbln1", UNREADABLE_READ).health is Health.UNHEALTHY


def test_rule_history_survives_disappearance_and_reappearance() -> None:
    history = HealthHistory()
    history.observe("rbln5", FAULT)
    # Several scans without rbln5 observe only other devices.
    for _ in range(3):
        history.observe("rbln0", READY)
    assert history.observe("rbln5", UNREADABLE_READ).health is Health.UNHEALTHY


def test_rule_reused_device_id_inherits_history() -> None:
    history = HealthHistory()
    history.observe("rbln2", StatusReading(2))
    # A different physical device later shows up under the same ID with no status file.
    verdict = history.observe("rbln2", StatusReading(None, "missing"))
    assert verdict.health is Health.UNHEALTHY
    assert verdict.last_unhealthy_status == "PROBING"


def test_rule_new_instance_starts_empty() -> None:
    old = HealthHistory()
    old.observe("rbln3", FAULT)
    fresh = HealthHistory()
    assert len(fresh) == 0
    assert fresh.observe("rbln3", UNREADABLE_READ).health is Health.HEALTHY
    # The old instance is untouched by the new one: histories are never shared.
    assert old.observe("rbln3", UNREADABLE_READ).health is Health.UNHEALTHY
    assert old.unresolved("rbln3") is not None


def test_rule_scans_and_allocate_share_one_ordered_history() -> None:
    history = HealthHistory()
    # A scan sees FAULT; the Allocate check afterwards reads 0; order decides the result.
    history.observe("rbln4", FAULT)
    assert history.observe("rbln4", READY).health is Health.HEALTHY
    assert history.unresolved("rbln4") is None


def test_verdict_describe_plain_status() -> None:
    assert Verdict(Health.UNHEALTHY, "FAULT").describe() == "FAULT"
