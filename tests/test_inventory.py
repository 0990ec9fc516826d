"""Inventory policy: identity checks, SR-IOV classification, problems with stable keys."""

from __future__ import annotations

import pytest

from rbln_device_plugin.model.inventory import (
    RESOURCE_NPU,
    RESOURCE_NPU_VF1,
    RESOURCE_NPU_VF4,
    Device,
    DeviceFacts,
    SmiRecord,
    SriovFacts,
    classify,
    inventory_from,
    parse_numa,
    screen,
    select_records,
    sid_is_known,
)


def rec(
    name: str = "rbln0", bus: str = "0000:05:00.0", product: str = "RBLN-CA25", **kw: str
) -> SmiRecord:
    return SmiRecord(name=name, product=product, bus_id=bus, **kw)  # type: ignore[arg-type]


PF = SriovFacts()
PATH = ("pci0000:00", "0000:00:01.0", "0000:05:00.0")


def facts(sriov: SriovFacts = PF, path: tuple[str, ...] | None = PATH) -> DeviceFacts:
    return DeviceFacts(sriov=sriov, pci_path=path)


# --------------------------------------------------------------------- identity checks
@pytest.mark.parametrize("name", ["rbln0", "rbln15", "rbln0-0", "rbln3-3", "rbln123-4"])
def test_valid_names_are_kept(name: str) -> None:
    kept, problems = select_records([rec(name)])
    assert [r.name for r in kept] == [name]
    assert problems == []


@pytest.mark.parametrize(
    "name",
    [
        "",
        "rbln",
        "npu0",
        "../../etc/passwd",
        "rbln0/..",
        "rbln-1",
        "rbln0-",
        "RBLN0",
        "rbln0-0-0",
        "rbln٣",
        " rbln0",
    ],
)
def test_invalid_names_are_skipped_with_a_problem(name: str) -> None:
    kept, problems = select_records([rec(name), rec("rbln1", "0000:06:00.0")])
    assert [r.name for r in kept] == ["rbln1"]
    assert len(problems) == 1
    assert problems[0].message == "Skipping device with an invalid name"
    assert problems[0].fields["device"] == name


@pytest.mark.parametrize(
    "bus",
    [
        "",
        "05:00.0",
        "0000:05:00.8",
        "0000:05:00",
        "0000:5:00.0",
        "../0000:05:00.0",
        "0000:05:00.0 ",
    ],
)
def test_invalid_bus_ids_are_skipped_with_a_problem(bus: str) -> None:
    kept, problems = select_records([rec(bus=bus)])
    assert kept == []
    assert problems[0].message == "Skipping device with an invalid PCI bus ID"
    assert problems[0].fields["busID"] == bus


def test_bus_ids_are_normalised_to_lowercase() -> None:
    kept, _ = select_records([rec(bus="0000:AF:00.0")])
    assert kept[0].bus_id == "0000:af:00.0"


@pytest.mark.parametrize(
    "product", ["RBLN-CA12", "RBLN-CA22", "RBLN-CA25", "RBLN-CR03", "RBLN-CR13"]
)
def test_supported_products(product: str) -> None:
    assert select_records([rec(product=product)])[1] == []


@pytest.mark.parametrize("product", ["", "RBLN-XX01", "NVIDIA-A100", "CA25", "RBLN-C"])
def test_unsupported_product_is_skipped_with_one_problem(product: str) -> None:
    kept, problems = select_records([rec(product=product)])
    assert kept == []
    assert [p.message for p in problems] == ["Skipping unsupported device"]
    assert problems[0].fields == {
        "device": "rbln0",
        "product": product,
        "busID": "0000:05:00.0",
        "reason": "product is not RBLN-CA* or RBLN-CR*",
    }


def test_problem_keys_are_stable_across_scans() -> None:
    first = inventory_from(screen([rec(product="RBLN-XX01")]), {}).problems
    second = inventory_from(screen([rec(product="RBLN-XX01")]), {}).problems
    assert [p.key for p in first] == [p.key for p in second]
    other = inventory_from(screen([rec("rbln1", "0000:06:00.0", "RBLN-XX01")]), {}).problems
    assert first[0].key != other[0].key


def test_duplicate_name_keeps_the_first_entry() -> None:
    kept, problems = select_records([rec("rbln0", "0000:05:00.0"), rec("rbln0", "0000:06:00.0")])
    assert [r.bus_id for r in kept] == ["0000:05:00.0"]
    assert problems[0].message == "Skipping duplicate device"
    assert problems[0].fields["busID"] == "0000:06:00.0"
    assert "name" in problems[0].fields["reason"]


def test_duplicate_bus_id_differing_only_in_case_keeps_the_first_entry() -> None:
    kept, problems = select_records([rec("rbln0", "0000:0a:00.0"), rec("rbln1", "0000:0A:00.0")])
    assert [r.name for r in kept] == ["rbln0"]
    assert problems[0].fields["device"] == "rbln1"
    assert "bus ID" in problems[0].fields["reason"]


def test_unsupported_entry_does_not_claim_a_name() -> None:
    kept, _ = select_records([rec("rbln0", product="OTHER"), rec("rbln0", "0000:06:00.0")])
    assert [r.bus_id for r in kept] == ["0000:06:00.0"]


# --------------------------------------------------------------------- SR-IOV branches
def test_non_partitioned_pf_is_npu() -> None:
    inv = classify([rec()], {"0000:05:00.0": facts()})
    assert list(inv.resources) == [RESOURCE_NPU]
    assert inv.problems == ()


def test_pf_with_zero_vfs_is_npu() -> None:
    inv = classify([rec()], {"0000:05:00.0": facts(SriovFacts(vf_count=0))})
    assert list(inv.resources) == [RESOURCE_NPU]


@pytest.mark.parametrize(("count", "resource"), [(1, RESOURCE_NPU_VF1), (4, RESOURCE_NPU_VF4)])
def test_vf_resource_follows_parent_vf_count(count: int, resource: str) -> None:
    vf = rec("rbln0-0", "0000:17:00.1", "RBLN-CR13")
    inv = classify([vf], {vf.bus_id: facts(SriovFacts("0000:17:00.0", count))})
    (device,) = inv.resources[resource]
    assert device.is_vf and device.parent_bus_id == "0000:17:00.0"
    assert inv.problems == ()


@pytest.mark.parametrize("count", [1, 4])
def test_pf_hosting_supported_vfs_is_excluded_silently(count: int) -> None:
    inv = classify([rec(bus="0000:17:00.0")], {"0000:17:00.0": facts(SriovFacts(vf_count=count))})
    assert inv.resources == {}
    assert inv.problems == ()


@pytest.mark.parametrize("count", [2, 3, 8])
def test_pf_with_unsupported_vf_count_is_excluded_with_a_problem(count: int) -> None:
    inv = classify([rec(bus="0000:17:00.0")], {"0000:17:00.0": facts(SriovFacts(vf_count=count))})
    assert inv.resources == {}
    assert inv.problems[0].message == "Skipping PF with an unsupported VF count"
    assert inv.problems[0].fields["vfCount"] == count


def test_vf_of_pf_with_unsupported_count_is_excluded_with_a_problem() -> None:
    vf = rec("rbln0-0", "0000:17:00.1", "RBLN-CR13")
    inv = classify([vf], {vf.bus_id: facts(SriovFacts("0000:17:00.0", 2))})
    assert inv.resources == {}
    assert inv.problems[0].message == "Skipping VF of a PF with an unsupported VF count"
    assert inv.problems[0].fields["parentBusID"] == "0000:17:00.0"


def test_indeterminate_sriov_state_is_excluded_with_a_problem() -> None:
    sriov = SriovFacts("0000:17:00.0", error="malformed sriov_numvfs")
    inv = classify([rec("rbln0-0", "0000:17:00.1")], {"0000:17:00.1": facts(sriov)})
    assert inv.resources == {}
    assert inv.problems[0].message == "Skipping device with indeterminate SR-IOV state"
    assert inv.problems[0].fields["reason"] == "malformed sriov_numvfs"


def test_vf_without_parent_count_is_indeterminate() -> None:
    inv = classify(
        [rec("rbln0-0", "0000:17:00.1")], {"0000:17:00.1": facts(SriovFacts("0000:17:00.0"))}
    )
    assert inv.resources == {}
    assert "indeterminate" in inv.problems[0].message


def test_mixed_node_advertises_both_resources() -> None:
    records = [
        rec("rbln0", "0000:17:00.0", "RBLN-CR13"),
        *(rec(f"rbln0-{k}", f"0000:17:00.{k + 1}", "RBLN-CR13") for k in range(4)),
        rec("rbln1", "0000:18:00.0", "RBLN-CR13"),
    ]
    table = {
        "0000:17:00.0": facts(SriovFacts(vf_count=4)),
        **{f"0000:17:00.{k + 1}": facts(SriovFacts("0000:17:00.0", 4)) for k in range(4)},
        "0000:18:00.0": facts(),
    }
    inv = inventory_from(screen(records), table)
    assert {k: [d.name for d in v] for k, v in inv.resources.items()} == {
        RESOURCE_NPU_VF4: ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"],
        RESOURCE_NPU: ["rbln1"],
    }


def test_device_without_facts_is_a_pf_with_unknown_path() -> None:
    inv = classify([rec()], {})
    assert inv.resources[RESOURCE_NPU][0].pci_path is None


UNSEEN = DeviceFacts(SriovFacts(unseen=True))


@pytest.mark.parametrize(
    ("records", "sysfs_missing", "offered"),
    [
        # One REBEL PF sysfs does not show: whole, with an unknown placement.
        ([rec("rbln0", product="RBLN-CR13", pci_device_id="2130")], False, ["rbln0"]),
        # ... unless rbln-smi lists VFs of it (rbln0-1, not rbln10-0) ...
        (
            [rec("rbln0", product="RBLN-CR13"), rec("rbln0-1", "0000:05:00.2", "RBLN-CR13")],
            False,
            [],
        ),
        (
            [rec("rbln1", product="RBLN-CR13"), rec("rbln10-0", "0000:05:00.2", "RBLN-CR13")],
            False,
            ["rbln1"],
        ),
        # ... or it is a VF by its PCI device ID ...
        ([rec("rbln0", product="RBLN-CR13", pci_device_id="2131")], False, []),
        # ... or sysfs shows no PCI device at all: only ATOM PFs are known to be whole.
        ([rec("rbln0", product="RBLN-CR13"), rec("rbln1", "0000:06:00.0")], True, ["rbln1"]),
    ],
)
def test_a_device_sysfs_does_not_show(
    records: list[SmiRecord], sysfs_missing: bool, offered: list[str]
) -> None:
    table = {r.bus_id: UNSEEN for r in records}
    inv = classify(records, table, sysfs_missing=sysfs_missing)
    assert [d.name for d in inv.resources.get(RESOURCE_NPU, ())] == offered
    assert all(d.pci_path is None for d in inv.resources.get(RESOURCE_NPU, ()))
    skipped = {str(p.fields["device"]) for p in inv.problems if p.kind == "sysfs-unseen"}
    assert skipped == {r.name for r in records} - set(offered)


# --------------------------------------------------------------------- device fields
def test_device_carries_what_later_stages_need() -> None:
    record = rec(pci_device_id="1250", numa_node="1", sid="0000000022502229")
    inv = classify([record], {"0000:05:00.0": facts()})
    assert inv.resources[RESOURCE_NPU] == (
        Device(
            name="rbln0",
            product="RBLN-CA25",
            pci_device_id="1250",
            bus_id="0000:05:00.0",
            numa=1,
            sid="0000000022502229",
            parent_bus_id=None,
            pci_path=PATH,
        ),
    )


@pytest.mark.parametrize(
    ("raw", "numa"),
    [("0", 0), ("3", 3), (" 1 ", 1), ("-1", None), ("", None), ("n/a", None), ("1.5", None)],
)
def test_numa_known_only_for_non_negative_integers(raw: str, numa: int | None) -> None:
    assert parse_numa(raw) == numa


@pytest.mark.parametrize(
    ("sid", "known"),
    [
        ("0000000022502229", True),
        ("", False),
        ("N/A", False),
        ("Unknown", False),
        ("0000", False),
        ("0x0000", False),
        ("0x12", True),
    ],
)
def test_sid_known(sid: str, known: bool) -> None:
    assert sid_is_known(sid) is known


def test_large_inventory_classifies_every_device() -> None:
    records = [
        rec(f"rbln{i}", f"0000:{i // 256:02x}:{i % 256 // 8:02x}.{i % 8}") for i in range(4096)
    ]
    inv = inventory_from(screen(records), {r.bus_id: facts() for r in records})
    assert [d.name for d in inv.resources[RESOURCE_NPU]] == [r.name for r in records]
