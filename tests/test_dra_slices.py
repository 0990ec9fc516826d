"""The ResourceSlices built from the device state (``dra.slices``, pure): what each device
says, which devices appear, the API server's limits, and that equal input builds equal
output so "unchanged" costs one comparison."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbln_device_plugin.dra import slices
from rbln_device_plugin.dra import taints as taints_mod
from rbln_device_plugin.dra.names import DRIVER_NAME
from rbln_device_plugin.host.smi import parse_inventory
from rbln_device_plugin.model.devicetable import Entry
from rbln_device_plugin.model.health import Health, Verdict
from rbln_device_plugin.model.inventory import Device as InvDevice
from rbln_device_plugin.model.inventory import DeviceFacts, SriovFacts, classify, select_records

from .dra_scan import scanned

NODE = "node-a"
NPU, VF1, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"
READY = Verdict(Health.HEALTHY, "READY")
FAULT = Verdict(Health.UNHEALTHY, "FAULT")


def device(name: str, bus: str = "0000:05:00.0", **changes: object) -> InvDevice:
    fields: dict[str, object] = dict(
        name=name, product="RBLN-CA25", pci_device_id="1250", bus_id=bus, numa=1,
        sid="0000000022502229", parent_bus_id=None,
        pci_path=("pci0000:00", "0000:00:01.0", bus), uuid="6f1c3a52-0a4e-5b7e-9d0a-1f2e3d4c5b6a",
    )  # fmt: skip
    fields.update(changes)
    return InvDevice(**fields)  # type: ignore[arg-type]


def entry(name: str, verdict: Verdict = READY, **changes: object) -> Entry:
    return Entry(device(name, **changes), verdict)


def attributes_of(pool: slices.Pool) -> dict[str, dict[str, object]]:
    return {d["name"]: d["attributes"] for s in pool.slices for d in s.devices}


def many(count: int) -> dict[str, Entry]:
    return {
        f"rbln{i}": entry(f"rbln{i}", bus=f"0000:{i // 32:02x}:{i % 32:02x}.0")
        for i in range(count)
    }


def test_a_whole_npu_says_what_rebellions_driver_says_and_what_the_scan_knows() -> None:
    pool = slices.build_pool(NODE, {NPU: {"rbln0": entry("rbln0")}})
    assert attributes_of(pool)["rbln0"] == {
        # Rebellions' driver's names and types (cmd/npu-kubelet-plugin/state.go)
        "type": {"string": "npu"},
        "productName": {"string": "RBLN-CA25"},
        "sid": {"string": "0000000022502229"},
        "uuid": {"string": "6f1c3a52-0a4e-5b7e-9d0a-1f2e3d4c5b6a"},
        "pciDeviceID": {"string": "1250"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:05:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        # ours
        "deviceType": {"string": "npu"},
        "healthy": {"bool": True},
        "status": {"string": "READY"},
    }
    assert pool.omissions == ()
    body = pool.objects(7, slices.node_owner(NODE, "uid-1"))
    assert body == [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{NODE}-{DRIVER_NAME}-0",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": NODE,
                        "uid": "uid-1",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": "npu.rebellions.ai",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 7, "resourceSliceCount": 1},
                "devices": [{"name": "rbln0", "attributes": attributes_of(pool)["rbln0"]}],
            },
        }
    ]
    json.dumps(body)  # the body is plain JSON


def test_a_vf_says_its_mode_and_its_parent_pf() -> None:
    pool = slices.build_pool(
        NODE,
        {
            VF4: {"rbln0-1": entry("rbln0-1", bus="0000:17:00.2", parent_bus_id="0000:17:00.0")},
            VF1: {"rbln1-0": entry("rbln1-0", bus="0000:2a:00.1", parent_bus_id="0000:2a:00.0")},
        },
    )
    found = attributes_of(pool)
    assert found["rbln0-1"]["deviceType"] == {"string": "npu-vf4"}
    assert found["rbln0-1"]["parentPciBusID"] == {"string": "0000:17:00.0"}
    assert found["rbln1-0"]["deviceType"] == {"string": "npu-vf1"}
    assert found["rbln1-0"]["parentPciBusID"] == {"string": "0000:2a:00.0"}
    assert found["rbln1-0"]["type"] == {"string": "npu"}  # as Rebellions' driver: an NPU


def test_an_unknown_fact_is_an_absent_attribute_never_a_made_up_one() -> None:
    unknown = entry("rbln0", numa=None, pci_path=None, uuid="", sid="N/A", pci_device_id="")
    pool = slices.build_pool(NODE, {NPU: {"rbln0": unknown}})
    assert set(attributes_of(pool)["rbln0"]) == {
        "type", "productName", "resource.kubernetes.io/pciBusID", "deviceType", "healthy",
        "status",
    }  # fmt: skip
    # A PF has no parent.
    assert "parentPciBusID" not in attributes_of(slices.build_pool(NODE, {NPU: many(1)}))["rbln0"]


def test_health_and_status_follow_the_verdict() -> None:
    healthy = slices.build_pool(NODE, {NPU: {"rbln0": entry("rbln0")}})
    faulted = slices.build_pool(NODE, {NPU: {"rbln0": entry("rbln0", FAULT)}})
    assert healthy.slices != faulted.slices
    assert attributes_of(faulted)["rbln0"]["healthy"] == {"bool": False}
    assert attributes_of(faulted)["rbln0"]["status"] == {"string": "FAULT"}


def test_the_same_devices_in_any_order_build_the_same_pool() -> None:
    devices = many(40)
    names = list(devices)
    random.Random(4).shuffle(names)
    shuffled = {name: devices[name] for name in names}
    assert slices.build_pool(NODE, {NPU: devices}) == slices.build_pool(NODE, {NPU: shuffled})
    # Natural order: rbln2 before rbln10 (people read it).
    assert [d["name"] for d in slices.build_pool(NODE, {NPU: devices}).slices[0].devices][:3] == [
        "rbln0", "rbln1", "rbln2",
    ]  # fmt: skip


def test_exactly_64_devices_fit_one_slice_and_65_make_two() -> None:
    # 64, not the API's 128: a slice holding a tainted device may hold 64 at most, and a
    # fault must not move devices between slices.
    full = slices.build_pool(NODE, {NPU: many(64)})
    assert [len(s.devices) for s in full.slices] == [64]
    over = slices.build_pool(NODE, {NPU: many(65)})
    assert [len(s.devices) for s in over.slices] == [64, 1]
    assert over.names == (f"{NODE}-npu.rebellions.ai-0", f"{NODE}-npu.rebellions.ai-1")
    bodies = over.objects(3)
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {2}
    assert {b["spec"]["pool"]["generation"] for b in bodies} == {3}
    assert bodies[1]["spec"]["devices"][0]["name"] == "rbln64"
    faulted = {**many(65), "rbln3": entry("rbln3", FAULT, bus="0000:00:03.1")}
    assert slices.build_pool(NODE, {NPU: faulted}).names == over.names  # nothing moves


def test_no_devices_is_one_empty_slice() -> None:
    pool = slices.build_pool(NODE, {})
    assert [s.devices for s in pool.slices] == [()]
    assert pool.objects(1)[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_a_64_byte_string_is_kept_and_a_longer_one_is_left_out_with_its_reason() -> None:
    kept = slices.build_pool(NODE, {NPU: {"rbln0": entry("rbln0", uuid="u" * 64)}})
    assert attributes_of(kept)["rbln0"]["uuid"] == {"string": "u" * 64}
    assert kept.omissions == ()
    cut = slices.build_pool(NODE, {NPU: {"rbln0": entry("rbln0", uuid="u" * 65)}})
    assert "uuid" not in attributes_of(cut)["rbln0"]
    assert "productName" in attributes_of(cut)["rbln0"]  # the rest of the device stays
    [omission] = cut.omissions
    assert (omission.device, omission.attribute) == ("rbln0", "uuid")
    assert "65 bytes, the API allows 64" in omission.reason
    # Bytes, as the API server counts them: 33 two-byte characters are 66.
    wide = slices.build_pool(NODE, {NPU: {"rbln0": entry("rbln0", product="é" * 33)}})
    assert "productName" not in attributes_of(wide)["rbln0"]


def test_at_most_32_attributes_per_device_in_their_order() -> None:
    many_attributes = [(f"a{i:02d}", i) for i in range(40)]
    kept, left_out = slices.fit_attributes("rbln0", many_attributes)
    assert len(kept) == slices.MAX_ATTRIBUTES_PER_DEVICE == 32
    assert set(kept) == {f"a{i:02d}" for i in range(32)}
    assert [o.attribute for o in left_out] == [f"a{i:02d}" for i in range(32, 40)]
    exact, none_left = slices.fit_attributes("rbln0", many_attributes[:32])
    assert len(exact) == 32 and none_left == []


def test_attribute_names_follow_the_qualified_name_rules() -> None:
    ours = [v for k, v in vars(slices).items() if k.startswith("ATTR_")]
    assert len(ours) == 12
    assert [name for name in ours if slices.qualified_name_problem(name)] == []
    assert slices.qualified_name_problem("a" * 32) is None
    assert slices.qualified_name_problem("a" * 33) is not None
    assert slices.qualified_name_problem("1abc") is not None
    assert slices.qualified_name_problem(f"{'d' * 63}/x") is None
    assert slices.qualified_name_problem(f"{'d' * 64}/x") is not None
    assert slices.qualified_name_problem("Bad_Domain/x") is not None
    kept, left_out = slices.fit_attributes("rbln0", [("bad-name", "x"), ("good", "y")])
    assert list(kept) == ["good"] and left_out[0].attribute == "bad-name"


def test_a_device_id_that_is_not_a_dns_label_is_left_out_not_fatal() -> None:
    odd = {
        "rbln0": entry("rbln0"),
        "RBLN1": entry("RBLN1", bus="0000:06:00.0"),
        "r" * 64: entry("r" * 64, bus="0000:07:00.0"),
        "r" * 63: entry("r" * 63, bus="0000:08:00.0"),
    }
    pool = slices.build_pool(NODE, {NPU: odd, "example.com/other": {"rbln9": entry("rbln9")}})
    assert sorted(attributes_of(pool)) == ["rbln0", "r" * 63]
    reasons = {o.device: o.reason for o in pool.omissions}
    assert set(reasons) == {"RBLN1", "r" * 64, "rbln9"}
    assert "DNS label" in reasons["RBLN1"] and "deviceType" in reasons["rbln9"]


def test_a_pf_hosting_vfs_is_never_a_device() -> None:
    # The core's classification never offers it ...
    records, _ = parse_inventory(
        json.dumps(
            {"devices": [
                {"device": "rbln0", "name": "RBLN-CR13", "pci": {"bus_id": "0000:17:00.0"}},
                {"device": "rbln0-0", "name": "RBLN-CR13", "pci": {"bus_id": "0000:17:00.1"}},
                {"device": "rbln1", "name": "RBLN-CR13", "pci": {"bus_id": "0000:2a:00.0"}},
            ]}
        )
    )  # fmt: skip
    kept, _ = select_records(records)
    facts = {
        "0000:17:00.0": DeviceFacts(SriovFacts(vf_count=4)),
        "0000:17:00.1": DeviceFacts(SriovFacts(parent_bus_id="0000:17:00.0", vf_count=4)),
        "0000:2a:00.0": DeviceFacts(SriovFacts(vf_count=0)),
    }
    offered = classify(kept, facts).resources
    entries = {r: {d.name: Entry(d, READY) for d in ds} for r, ds in offered.items()}
    assert sorted(attributes_of(slices.build_pool(NODE, entries))) == ["rbln0-0", "rbln1"]
    # ... and the builder refuses one offered beside its own VFs.
    pf = {d.name: Entry(d, READY) for d in classify(kept[:1], {}).resources[NPU]}
    pool = slices.build_pool(NODE, {**entries, NPU: {**entries[NPU], **pf}})
    assert "rbln0" not in attributes_of(pool)
    assert [o.device for o in pool.omissions] == ["rbln0"]


def test_rbln_smi_uuid_reaches_the_slice_and_an_odd_one_is_not_fatal() -> None:
    listing = {"devices": [
        {"device": "rbln0", "name": "RBLN-CA25", "uuid": "abc-123",
         "pci": {"bus_id": "0000:05:00.0", "dev": "1250", "numa_node": "0"}},
        {"device": "rbln1", "name": "RBLN-CA25", "uuid": {"odd": 1},
         "pci": {"bus_id": "0000:06:00.0", "dev": "1250", "numa_node": "0"}},
    ]}  # fmt: skip
    records, problems = parse_inventory(json.dumps(listing))
    assert problems == []
    offered = classify(select_records(records)[0], {}).resources
    entries = {r: {d.name: Entry(d, READY) for d in ds} for r, ds in offered.items()}
    found = attributes_of(slices.build_pool(NODE, entries))
    assert found["rbln0"]["uuid"] == {"string": "abc-123"}
    assert "uuid" not in found["rbln1"]


def test_slice_names_fit_a_dns_subdomain_for_any_node_name() -> None:
    long_a = ("a" * 62 + ".") * 3 + "b" * 60  # 249 characters, a valid node name
    long_b = ("a" * 62 + ".") * 3 + "c" * 60
    assert slices.is_dns_subdomain(long_a)
    names = {slices.slice_name(node, i) for node in (long_a, long_b) for i in (0, 1, 12345)}
    assert len(names) == 6
    assert all(slices.is_dns_subdomain(name) for name in names), names
    assert slices.slice_name("n", 0) == "n-npu.rebellions.ai-0"
    with pytest.raises(ValueError, match="not a DNS subdomain"):
        slices.build_pool("Node_A", {})


def _scan_like(draw: st.DrawFn) -> Mapping[str, Mapping[str, Entry]]:
    count = draw(st.integers(0, 300))
    ids = draw(st.lists(st.integers(0, 999), min_size=count, max_size=count, unique=True))
    entries: dict[str, dict[str, Entry]] = {}
    for n in ids:
        resource = draw(st.sampled_from([NPU, VF1, VF4]))
        name = f"rbln{n}" if resource == NPU else f"rbln{n}-0"
        parent = None if resource == NPU else f"0001:{n // 256:02x}:{n % 256:02x}.0"
        verdict = draw(st.sampled_from([READY, FAULT]))
        numa = draw(st.none() | st.integers(0, 7))
        made = entry(name, verdict, bus=f"0000:{n // 256:02x}:{n % 256:02x}.1",
                     parent_bus_id=parent, numa=numa)  # fmt: skip
        entries.setdefault(resource, {})[name] = made
    return entries


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_device_is_in_exactly_one_slice_of_one_complete_generation(
    data: st.DataObject,
) -> None:
    entries = _scan_like(data.draw)
    pool = slices.build_pool(NODE, entries)
    bodies = pool.objects(5)
    published = [d["name"] for b in bodies for d in b["spec"]["devices"]]
    assert sorted(published) == sorted(i for ds in entries.values() for i in ds)
    assert all(len(b["spec"]["devices"]) <= 64 for b in bodies)
    assert len(bodies) == max(1, -(-len(published) // 64))
    assert {(b["spec"]["pool"]["generation"], b["spec"]["pool"]["resourceSliceCount"])
            for b in bodies} == {(5, len(bodies))}  # fmt: skip
    assert len({b["metadata"]["name"] for b in bodies}) == len(bodies)
    for b in bodies:
        for d in b["spec"]["devices"]:
            assert len(d["attributes"]) <= 32
            assert all(len(v.get("string", "").encode()) <= 64 for v in d["attributes"].values())
            healthy = d["attributes"]["healthy"]["bool"]
            assert d.get("taints", []) == ([] if healthy else [
                {"key": "npu.rebellions.ai/unhealthy", "value": "FAULT", "effect": "NoSchedule"}
            ])  # fmt: skip
    assert slices.build_pool(NODE, entries) == pool  # deterministic


async def test_a_scanned_node_publishes_every_offered_device_and_no_pf_hosting_vfs() -> None:
    async with scanned("rebel-sriov") as node:
        entries = node.entries()
        pool = slices.build_pool(NODE, entries)
    found = attributes_of(pool)
    # rbln1 hosts the vf-1 VF rbln1-0: it is not a device; rbln0 (vf-4) is not listed.
    assert sorted(found) == [*(f"rbln0-{i}" for i in range(4)), "rbln1-0", "rbln2", "rbln3"]
    assert {n: a["deviceType"]["string"] for n, a in found.items()} == {
        "rbln0-0": "npu-vf4", "rbln0-1": "npu-vf4", "rbln0-2": "npu-vf4", "rbln0-3": "npu-vf4",
        "rbln1-0": "npu-vf1", "rbln2": "npu", "rbln3": "npu",
    }  # fmt: skip
    assert found["rbln0-2"]["parentPciBusID"] == {"string": "0000:17:00.0"}
    assert all("uuid" in a for a in found.values())  # the simulator's rbln-smi prints one
    assert pool.omissions == ()


@pytest.mark.parametrize(
    ("verdict", "value"),
    [
        (FAULT, "FAULT"),
        (Verdict(Health.UNHEALTHY, "BUSY"), "BUSY"),
        (Verdict(Health.UNHEALTHY, "UNREADABLE", "FAULT"), "UNREADABLE"),
        (Verdict(Health.UNHEALTHY, "UNKNOWN(7)"), "UNKNOWN"),
        (Verdict(Health.UNHEALTHY, "UNKNOWN(-12)"), "UNKNOWN"),
    ],
)
def test_an_unhealthy_device_is_tainted_with_its_status_name(verdict: Verdict, value: str) -> None:
    entries = {NPU: {"rbln0": entry("rbln0", verdict), "rbln1": entry("rbln1", bus="0000:06:00.0")}}
    times = {"rbln0": "2026-12-01T10:00:00Z"}
    for effect in (taints_mod.NO_SCHEDULE, taints_mod.NO_EXECUTE):
        pool = slices.build_pool(NODE, entries, effect, times)
        (body,) = pool.objects(1)
        tainted, healthy = body["spec"]["devices"]
        assert tainted["taints"] == [{
            "key": "npu.rebellions.ai/unhealthy", "value": value, "effect": effect,
            "timeAdded": "2026-12-01T10:00:00Z",
        }]  # fmt: skip
        assert "taints" not in healthy
        assert pool.taints() == {"rbln0": (value, effect)}
    assert slices.tainted(entries) == {"rbln0"}
    # An unreadable status without an unresolved fault is Healthy: no taint.
    plain = {NPU: {"rbln0": entry("rbln0", Verdict(Health.HEALTHY, "UNREADABLE"))}}
    assert slices.build_pool(NODE, plain).taints() == {}
