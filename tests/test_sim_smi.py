"""The fake rbln-smi, run as a real subprocess against a materialised node."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbln_device_plugin_sim import smi_exe, smi_tool
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, remove_node, short_tempdir
from rbln_device_plugin_sim.state import Fault, StateError, StateStore


@pytest.fixture
def node() -> Iterator[SimNode]:
    root = short_tempdir("rbln-t-")
    yield materialize(preset("atom-max-8"), root / "n")
    shutil.rmtree(root, ignore_errors=True)


def smi(node: SimNode, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(node.smi_path), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def listing(node: SimNode, *args: str) -> dict[str, Any]:
    result = smi(node, *args)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def group_of(node: SimNode) -> dict[str, str]:
    return {d["device"]: d["group_id"] for d in listing(node, "-g", "-j")["devices"]}


def test_list_has_the_documented_schema(node: SimNode) -> None:
    data = listing(node, "-j")
    assert isinstance(data["KMD_version"], str)
    assert len(data["devices"]) == 32
    first = data["devices"][0]
    assert first["npu"] == 0 and first["device"] == "rbln0" and first["name"] == "RBLN-CA25"
    assert "group_id" not in first
    assert first["pci"]["dev"] == "1250" and first["pci"]["bus_id"] == "0000:03:00.0"
    # Every number is a string except npu.
    for dev in data["devices"]:
        for key in ("sid", "uuid", "status", "fw_ver"):
            assert isinstance(dev[key], str)
        assert all(isinstance(v, str) for v in dev["pci"].values())
        assert all(isinstance(v, str) for v in dev["memory"].values())
        assert isinstance(dev["npu"], int)


def test_group_listing_starts_everything_in_the_default_group(node: SimNode) -> None:
    assert set(group_of(node).values()) == {"0"}
    assert (node.dev_root / "rsd0").exists()


def test_group_create_and_destroy_change_listing_and_dev_nodes(node: SimNode) -> None:
    created = smi(node, "group", "-c", "3", "-a", "4,5,6,7")
    assert created.returncode == 0, created.stderr
    groups = group_of(node)
    assert [groups[f"rbln{i}"] for i in range(3, 9)] == ["0", "3", "3", "3", "3", "0"]
    assert (node.dev_root / "rsd3").exists()
    smi(node, "group", "-c", "1", "-a", "0")
    destroyed = smi(node, "group", "-d", "3,1")
    assert destroyed.returncode == 0, destroyed.stderr
    assert set(group_of(node).values()) == {"0"}
    assert not (node.dev_root / "rsd3").exists() and not (node.dev_root / "rsd1").exists()
    assert (node.dev_root / "rsd0").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["group", "-c", "4", "-a", "9,99"], "npu 99 not found"),
        (["group", "-c", "2", "-a", "0"], "already belongs to group 1"),
        (["group", "-c", "1", "-a", "9"], "group 1 already exists"),
        (["group", "-c", "0", "-a", "9"], "default group"),
        (["group", "-c", "x", "-a", "9"], "invalid group id"),
        (["group", "-c", "5", "-a", "9,9"], "duplicate npu"),
        (["group", "-d", "7"], "group 7 does not exist"),
        (["group", "-d", "0"], "default group"),
        (["--topo"], "unknown arguments"),
        ([], "unknown arguments"),
        (["-j", "-x"], "unknown arguments"),
        (["group", "-c", "5"], "unknown arguments"),
    ],
)
def test_refuses_what_the_real_tool_refuses(node: SimNode, args: list[str], message: str) -> None:
    assert smi(node, "group", "-c", "1", "-a", "0,1").returncode == 0
    before = node.store.read().devices
    result = smi(node, *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert result.stdout == ""
    assert node.store.read().devices == before  # a refusal changes nothing


def test_concurrent_group_creations_lose_no_update(node: SimNode) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda g: smi(node, "group", "-c", str(g + 1), "-a", f"{4 * g},{4 * g + 1}"),
                range(8),
            )
        )
    assert [r.returncode for r in results] == [0] * 8
    groups = group_of(node)
    assert {groups[f"rbln{4 * g + 1}"] for g in range(8)} == {str(g + 1) for g in range(8)}
    assert sorted(p.name for p in node.dev_root.glob("rsd*")) == sorted(
        ["rsd0", *(f"rsd{g + 1}" for g in range(8))]
    )


def test_injected_error_only_hits_the_chosen_command(node: SimNode) -> None:
    node.inject_fault(Fault("error", ("group-create",), exit_code=7, message="device busy"))
    failed = smi(node, "group", "-c", "1", "-a", "0")
    assert (failed.returncode, failed.stderr.strip()) == (7, "device busy")
    assert len(listing(node, "-j")["devices"]) == 32
    assert set(group_of(node).values()) == {"0"}  # the failed create did nothing
    node.clear_faults()
    assert smi(node, "group", "-c", "1", "-a", "0").returncode == 0


def test_garbage_and_limited_faults(node: SimNode) -> None:
    node.inject_fault(Fault("garbage", ("list",), remaining=2))
    for _ in range(2):
        result = smi(node, "-j")
        assert result.returncode == 0
        with pytest.raises(json.JSONDecodeError):
            json.loads(result.stdout)
    assert len(listing(node, "-j")["devices"]) == 32  # the third call is clean again


def test_hang_and_slow_answers_outlast_a_caller_timeout(node: SimNode) -> None:
    node.inject_fault(Fault("hang", ("list",)))
    with pytest.raises(subprocess.TimeoutExpired):
        smi(node, "-j", timeout=0.5)
    node.clear_faults()
    node.inject_fault(Fault("slow", delay=30))
    with pytest.raises(subprocess.TimeoutExpired):
        smi(node, "-g", "-j", timeout=0.5)
    node.clear_faults()
    node.inject_fault(Fault("slow", delay=0.2))
    assert len(listing(node, "-j")["devices"]) == 32  # slow, but a full answer


def test_a_held_invocation_waits_for_its_release_then_runs(node: SimNode) -> None:
    node.inject_fault(Fault("hold", ("group-create",), remaining=1))
    create = subprocess.Popen(
        [str(node.smi_path), "group", "-c", "1", "-a", "0,1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30  # a hang guard: the marker is written at once
        while not node.held() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert node.held() == [(create.pid, "group-create")]
        # Held means not done: nothing has changed yet, and other commands still answer.
        assert create.poll() is None
        assert set(group_of(node).values()) == {"0"}
        node.release_held()
        _, err = create.communicate(timeout=30)
    finally:
        if create.poll() is None:
            create.kill()
            create.wait()
    assert create.returncode == 0, err
    assert node.held() == []
    assert group_of(node)["rbln0"] == group_of(node)["rbln1"] == "1"


def test_a_held_invocation_that_was_killed_is_not_listed(node: SimNode) -> None:
    node.inject_fault(Fault("hold"))
    stuck = subprocess.Popen([str(node.smi_path), "-j"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30  # a hang guard
    while not node.held() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [pid for pid, _ in node.held()] == [stuck.pid]
    stuck.kill()
    stuck.wait()
    assert node.held() == []


def test_bad_fault_specs_and_broken_state_are_clear_errors(node: SimNode) -> None:
    with pytest.raises(StateError, match="unknown fault mode"):
        Fault("explode")
    with pytest.raises(StateError, match="unknown rbln-smi command"):
        Fault("error", ("topo",))
    node.state_path.write_text("{broken")
    result = smi(node, "-j")
    assert result.returncode != 0 and "not JSON" in result.stderr


def test_unlisted_devices_stay_out_of_the_listing() -> None:
    root = short_tempdir("rbln-t-")
    try:
        node = materialize(preset("rebel-sriov"), root / "n")
        names = [d["device"] for d in listing(node, "-j")["devices"]]
        assert "rbln0" not in names and "rbln1" in names
        assert names[:4] == ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"]
        vf = listing(node, "-j")["devices"][0]
        assert vf["pci"]["dev"] == "2131" and vf["pci"]["bus_id"] == "0000:17:00.1"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_tool_still_runs_after_the_node_moves_its_cwd(node: SimNode, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(node.smi_path), "-j"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode == 0 and json.loads(result.stdout)["devices"]


# ---------------------------------------------------------------- the quick listing
# smi_exe answers a listing from the sidecar StateStore writes; smi_tool is what every answer
# must be. The oracle: smi_tool run on the same state file and arguments.
def _full_answer(state_path: Path, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = smi_tool.run(argv, StateStore(state_path), out, err)
    return code, out.getvalue(), err.getvalue()


_LISTINGS = (["-j"], ["-g", "-j"], ["-j", "-g"])
_ARGVS = st.sampled_from([*_LISTINGS, ["-j", "-x"], []])
_JSON_SCALARS = st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=4)
_VARIANTS = st.sampled_from(
    [
        "as-is",
        "no-KMD_version",
        "KMD_version",  # replaced by a drawn value
        "no-dev_root",
        "no-devices",
        "devices",  # replaced by a drawn value
        "a-device",  # one record replaced by a drawn value
        "no-group_id",
        "faults",  # replaced by a drawn value
        "a-fault",
        "char_major",  # replaced by a drawn value
        "not-an-object",
        "not-json",
    ]
)
# What a test or the daemon does to the node between two listings, through the store.
_CHANGES = st.lists(
    st.sampled_from(["group", "ungroup", "fault", "fault-once", "clear", "status", "remove"]),
    max_size=6,
)


@pytest.fixture
def rebel_state() -> Iterator[Path]:
    root = short_tempdir("rbln-t-")
    node = materialize(preset("rebel-4"), root / "n")
    with node.store.transaction() as state:  # a device in a group: -g -j differs from -j
        state.devices[0]["group_id"] = "3"
    yield node.state_path
    shutil.rmtree(root, ignore_errors=True)


def test_every_state_the_store_saves_is_listed_quickly_and_as_smi_tool_lists_it(
    rebel_state: Path,
) -> None:
    store = StateStore(rebel_state)

    @given(changes=_CHANGES, argv=_ARGVS)
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def check(changes: list[str], argv: list[str]) -> None:
        with store.transaction() as state:
            for change in changes:
                if change == "group":
                    state.devices[-1]["group_id"] = str(len(changes))
                elif change == "ungroup":
                    state.devices[-1]["group_id"] = "0"
                elif change == "fault":
                    state.faults.append(Fault("error", ("group-create",)))
                elif change == "fault-once":
                    state.faults.append(Fault("garbage", ("list",), remaining=1))
                elif change == "clear":
                    state.faults.clear()
                elif change == "status":
                    state.devices[0]["status"] = str(len(changes))
                elif change == "remove" and len(state.devices) > 1:
                    state.devices.pop()
            faulted = bool(state.faults)
        quick = smi_exe.quick_listing(argv, str(rebel_state))
        if faulted or argv not in _LISTINGS:
            assert quick is None  # smi_tool decides: a fault may act on this very listing
        else:
            assert quick is not None and _full_answer(rebel_state, argv) == (0, quick, "")

    check()


def test_a_state_written_behind_the_stores_back_is_left_to_smi_tool(rebel_state: Path) -> None:
    pristine = rebel_state.read_text()

    @given(
        variant=_VARIANTS,
        value=_JSON_SCALARS | st.lists(_JSON_SCALARS, max_size=2),
        argv=_ARGVS,
    )
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def check(variant: str, value: Any, argv: list[str]) -> None:
        data: Any = json.loads(pristine)
        if variant.startswith("no-") and variant != "no-group_id":
            del data[variant[3:]]
        elif variant in ("KMD_version", "devices", "faults", "char_major"):
            data[variant] = value
        elif variant == "a-device":
            data["devices"][1] = value
        elif variant == "no-group_id":
            data["devices"][0].pop("group_id")
        elif variant == "a-fault":
            data["faults"] = [Fault("error", ("group-create",)).to_dict()]
        elif variant == "not-an-object":
            data = [data]
        rebel_state.write_text("{broken" if variant == "not-json" else json.dumps(data))
        # The sidecar still holds the listings of the state the store last saved.
        assert smi_exe.quick_listing(argv, str(rebel_state)) is None

    check()
    rebel_state.write_text(pristine)  # the very text the sidecar was made from
    assert smi_exe.quick_listing(["-j"], str(rebel_state)) == _full_answer(rebel_state, ["-j"])[1]


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated", "no-prefix", "two-parts"])
def test_a_missing_or_damaged_sidecar_is_left_to_smi_tool(rebel_state: Path, damage: str) -> None:
    sidecar = rebel_state.with_name(rebel_state.name + ".listings")
    whole = sidecar.read_text()
    state_size, _, rest = whole.partition("\n")
    sidecar.unlink() if damage == "missing" else sidecar.write_text(
        {
            "empty": "",
            "truncated": whole[:-2],
            "no-prefix": rest,
            "two-parts": whole[: len(state_size) + 1 + int(state_size)] + "5\nabcde",
        }[damage]
    )
    assert smi_exe.quick_listing(["-g", "-j"], str(rebel_state)) is None
    code, out, _ = _full_answer(rebel_state, ["-g", "-j"])  # and the tool still answers
    assert code == 0 and json.loads(out)["devices"][0]["group_id"] == "3"


def test_a_listing_from_the_executable_imports_neither_smi_tool_nor_json(
    node: SimNode,
) -> None:
    # What the executable runs, plus a look at what it imported: the quick path at work.
    heavy = "{'dataclasses', 'json', 'pathlib', 'rbln_device_plugin_sim.smi_tool'}"
    script = node.smi_path.read_text().replace("sys.exit(main(", "code = (main(")
    script += f"print(sorted({heavy} & set(sys.modules)), code)\n"
    result = subprocess.run(
        [sys.executable, "-S", "-c", script, "-g", "-j"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    *_, last = result.stdout.splitlines()
    assert last == "[] 0", result.stderr
    node.inject_fault(Fault("error", ("list",), exit_code=5, message="busy"))
    faulted = subprocess.run(
        [sys.executable, "-S", "-c", script, "-j"], capture_output=True, text=True, timeout=30
    )
    assert faulted.stdout.splitlines()[-1].endswith(" 5") and "smi_tool" in faulted.stdout
    assert faulted.stderr == "busy\n"


def test_removing_a_node_leaves_nothing_of_it_under_its_root() -> None:
    # `materialize --force` removes only the node's own entries (NODE_ENTRIES): a file the
    # state store writes and that list forgets would stay behind for ever.
    root = short_tempdir("rbln-t-")
    try:
        node = materialize(preset("rebel-4"), root)
        node.inject_fault(Fault("error", ("group-create",)))
        node.clear_faults()
        assert listing(node, "-j")["devices"]
        remove_node(root)
        assert sorted(p.name for p in root.iterdir()) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
