"""A plugin's device table: changes between scans and the shared health history."""

from __future__ import annotations

from rbln_device_plugin.model.devicetable import DeviceTable
from rbln_device_plugin.model.health import Health, StatusReading
from rbln_device_plugin.model.inventory import Device


def dev(name: str, numa: int | None = 0) -> Device:
    return Device(name, "RBLN-CA25", "1250", f"0000:0{name[-1]}:00.0", numa, "1", None, None)


def reader(statuses: dict[str, int | None]) -> dict[str, StatusReading]:
    return {name: StatusReading(code) for name, code in statuses.items()}


def test_first_scan_reports_every_device_as_appeared() -> None:
    table = DeviceTable()
    changes = table.apply_scan([dev("rbln0"), dev("rbln1")], reader({"rbln0": 0, "rbln1": 4}))
    assert [(c.kind, c.entry.device.name) for c in changes] == [
        ("appeared", "rbln0"),
        ("appeared", "rbln1"),
    ]
    counts = table.counts()
    assert (counts.devices, counts.healthy, counts.unhealthy) == (2, 1, 1)


def test_unchanged_scan_reports_nothing_and_view_is_stable() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0")], reader({"rbln0": 0}))
    view = table.kubelet_view()
    assert table.apply_scan([dev("rbln0")], reader({"rbln0": 0})) == []
    assert table.kubelet_view() == view == (("rbln0", "Healthy", 0),)


def test_state_change_carries_previous_verdict() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0")], reader({"rbln0": 0}))
    (change,) = table.apply_scan([dev("rbln0")], reader({"rbln0": 1}))
    assert change.kind == "changed"
    assert change.previous is not None and change.previous.status == "READY"
    assert (change.entry.verdict.health, change.entry.verdict.status) == (
        Health.UNHEALTHY,
        "BUSY",
    )


def test_unreadable_after_fault_stays_unhealthy_and_is_not_a_recovery() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0")], reader({"rbln0": 4}))
    (change,) = table.apply_scan([dev("rbln0")], reader({"rbln0": None}))
    assert change.entry.verdict.health is Health.UNHEALTHY
    assert change.entry.verdict.describe() == "UNREADABLE (last read FAULT)"


def test_disappeared_device_keeps_history_in_the_same_table() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0")], reader({"rbln0": 4}))
    (gone,) = table.apply_scan([], reader({}))
    assert gone.kind == "disappeared"
    (back,) = table.apply_scan([dev("rbln0")], reader({"rbln0": None}))
    assert back.kind == "appeared" and back.entry.verdict.health is Health.UNHEALTHY


def test_a_new_table_starts_with_empty_history() -> None:
    old = DeviceTable()
    old.apply_scan([dev("rbln0")], reader({"rbln0": 4}))
    fresh = DeviceTable()
    fresh.apply_scan([dev("rbln0")], reader({"rbln0": None}))
    assert fresh.entries["rbln0"].verdict.health is Health.HEALTHY


def test_final_check_publishes_what_it_finds_and_feeds_the_history() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0"), dev("rbln1")], reader({"rbln0": 0, "rbln1": 0}))
    verdicts, changes = table.final_check(reader({"rbln0": 0, "rbln1": 4}))
    assert verdicts["rbln1"].health is Health.UNHEALTHY
    # The fault is in the published set now, not at the next scan; rbln0 did not change.
    assert table.entries["rbln1"].verdict.health is Health.UNHEALTHY
    (change,) = changes
    assert (change.kind, change.entry.device.name) == ("changed", "rbln1")
    assert change.previous is not None and change.previous.health is Health.HEALTHY
    assert table.kubelet_view()[1] == ("rbln1", "Unhealthy", 0)
    # The history keeps rbln1 Unhealthy when its status becomes unreadable.
    table.apply_scan([dev("rbln0"), dev("rbln1")], reader({"rbln0": 0, "rbln1": None}))
    assert table.entries["rbln1"].verdict.health is Health.UNHEALTHY
    # A recovery found by the check is published too.
    _, (recovered,) = table.final_check(reader({"rbln1": 0}))
    assert recovered.entry.healthy and table.entries["rbln1"].healthy


def test_final_check_of_a_device_the_table_no_longer_holds_only_feeds_the_history() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0")], reader({"rbln0": 0}))
    _, changes = table.final_check(reader({"rbln1": 4}))
    assert changes == [] and set(table.entries) == {"rbln0"}
    assert table.history.unresolved("rbln1") == "FAULT"


def test_unknown_numa_is_not_reported_to_kubelet() -> None:
    table = DeviceTable()
    table.apply_scan([dev("rbln0", numa=None)], reader({"rbln0": 0}))
    assert table.kubelet_view() == (("rbln0", "Healthy", None),)


def test_the_same_scan_again_changes_nothing_but_not_after_a_final_check() -> None:
    table = DeviceTable()
    devices = [dev("rbln0"), dev("rbln1")]
    table.apply_scan(devices, reader({"rbln0": 0, "rbln1": 0}))
    entries = table.entries
    # An idle node: the same devices and readings leave the table as it is.
    assert table.apply_scan(list(devices), reader({"rbln0": 0, "rbln1": 0})) == []
    assert table.entries is entries
    # The final check reads a fault and publishes it; the next scan reads READY again,
    # the same readings as the scan before the check, and must publish the recovery.
    table.final_check(reader({"rbln1": 4}))
    assert not table.entries["rbln1"].healthy
    (recovered,) = table.apply_scan(devices, reader({"rbln0": 0, "rbln1": 0}))
    assert recovered.entry.healthy and table.entries["rbln1"].healthy
    # A changed reading is never skipped.
    (faulted,) = table.apply_scan(devices, reader({"rbln0": 4, "rbln1": 0}))
    assert faulted.entry.device.name == "rbln0" and not faulted.entry.healthy
