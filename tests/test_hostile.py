"""Hostile input: arbitrary kubelet requests and hostile rbln-smi device names.

One daemon serves the whole module. It runs under a Python audit hook (installed by a
``sitecustomize`` on its PYTHONPATH, before any daemon code runs) that records every
file-system and process-spawn event with its path. The hypothesis tests throw arbitrary
Allocate and GetPreferredAllocation requests at it over gRPC; the last tests check the
audit record: no path outside the configured roots, no shell, no hostile name used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rbln_device_plugin
from rbln_device_plugin.api.v1beta1 import api_pb2, api_pb2_grpc
from rbln_device_plugin.kubelet.plugin import socket_name
from rbln_device_plugin_sim.kubelet import KubeletStub
from rbln_device_plugin_sim.layout import preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.state import Fault

from .daemon_process import DaemonProcess
from .fault_helpers import NPU, BackgroundLoop, lock_is_free, no_crash_records

# The whole module runs one daemon through hundreds of generated requests.
pytestmark = pytest.mark.slow

ANNOTATION = {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}
MAX_MESSAGE = 4096
INVALID_NAME = "Skipping device with an invalid name"
# What the property tests ended up exercising, per family ("preferred", "allocate"), and
# which families ran in this session; checked once they have run.
OUTCOMES: Counter[str] = Counter()
FAMILIES_RUN: set[str] = set()
FAULTED = "rbln5"
# Device names rbln-smi might print that would escape sysfs or /dev if used as paths.
HOSTILE_NAMES = ("../../x", "rbln0/../../etc", "/dev/sda", "rbln7/..", "rbln1\n", "rbln 2")
PATH_LIKE = (
    "../../etc/passwd",
    "/dev/sda",
    "rbln0/../..",
    "rbln0/../../etc",
    "../rbln0",
    "./rbln0",
    "rbln0/",
    "rbln0\x00",
    "rbln0 ",
    "RBLN0",
    "rbln-1",
    "rbln0-0/../..",
    "%2e%2e%2fetc",
    *HOSTILE_NAMES,
)
LONG = ("x" * 10_000, "rbln0" * 2_000, "\u00e9" * 10_000, "/" * 10_000, "../" * 3_000)

# The hook writes one JSON line per event straight to a descriptor opened before it is
# installed: os.write raises no audit event, so the hook never re-enters itself.
AUDIT_HOOK = """
import json, os, sys
_fd = os.open(os.environ["RBLN_TEST_AUDIT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
_PATH_EVENTS = {
    "open": (0,), "os.listdir": (0,), "os.scandir": (0,), "os.remove": (0,),
    "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
    "os.truncate": (0,), "os.utime": (0,), "os.chdir": (0,), "shutil.rmtree": (0,),
    "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (0, 1),
}
_SPAWN_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.system", "os.fork",
                 "os.forkpty", "pty.spawn", "os.startfile"}
def _hook(event, args):
    try:
        if event in _PATH_EVENTS:
            paths = [args[i] for i in _PATH_EVENTS[event] if i < len(args)]
            paths = [os.fsdecode(p) for p in paths if isinstance(p, (str, bytes, os.PathLike))]
            if paths:
                os.write(_fd, (json.dumps({"event": event, "paths": paths}) + "\\n").encode())
        elif event in _SPAWN_EVENTS:
            shown = [os.fsdecode(a) if isinstance(a, (str, bytes)) else
                     [os.fsdecode(x) for x in a] if isinstance(a, (list, tuple)) else None
                     for a in args[:2]]
            os.write(_fd, (json.dumps({"event": event, "spawn": shown}) + "\\n").encode())
    except Exception as exc:
        os.write(_fd, (json.dumps({"event": "hook-error", "error": repr(exc)}) + "\\n").encode())
sys.addaudithook(_hook)
"""


@dataclass
class Hostile:
    node: SimNode
    daemon: DaemonProcess
    kubelet: KubeletStub
    loop: BackgroundLoop
    audit_log: Path
    site_dir: Path
    managed: tuple[str, ...]

    def stub(self, resource: str = NPU) -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix:{self.node.kubelet_dir / socket_name(resource)}")
        return api_pb2_grpc.DevicePluginStub(channel)

    def audit(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]

    def allowed_roots(self) -> list[str]:
        """Where the daemon may open files, and why.

        - the node root: sysfs, /dev, kubelet dir, CDI root, RSD lock and rbln-smi, i.e.
          every configured host path (they all live under it in the simulation);
        - the Python installation and the virtualenv: modules imported lazily;
        - the project's source tree (editable install): the daemon's own modules;
        - the sitecustomize directory: the audit hook itself, imported at start.
        /dev/null is allowed as a single file: rbln-smi runs with stdin from it.
        """
        source = Path(rbln_device_plugin.__file__).resolve().parent.parent
        return [
            str(self.node.root),
            os.path.realpath(sys.base_prefix),
            os.path.realpath(sys.prefix),
            str(source),
            str(self.site_dir),
        ]


def _hostile_node(node: SimNode) -> None:
    """rbln-smi reports path-like names: one real device renamed, others added."""
    with node.store.transaction() as state:
        template = next(r for r in state.devices if r["device"] == "rbln31")
        template["device"] = HOSTILE_NAMES[0]
        for index, name in enumerate(HOSTILE_NAMES[1:]):
            extra = json.loads(json.dumps(template))
            extra.update(device=name, npu=100 + index)
            extra["pci"]["bus_id"] = f"0000:f{index}:00.0"
            state.devices.append(extra)


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    root = short_tempdir()
    site_dir = Path(tempfile.mkdtemp(prefix="rbln-audit-", dir="/tmp"))
    (site_dir / "sitecustomize.py").write_text(AUDIT_HOOK)
    audit_log = site_dir / "audit.jsonl"
    node = materialize(preset("atom-max-8"), root)
    _hostile_node(node)
    node.set_status(FAULTED, 4)
    loop = BackgroundLoop()
    kubelet = KubeletStub(node.kubelet_dir)
    loop.run(kubelet.start())
    python_path = os.pathsep.join(filter(None, [str(site_dir), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": python_path, "RBLN_TEST_AUDIT_LOG": str(audit_log)}
    daemon = DaemonProcess(node.daemon_args("500ms"), env=env, level="info")
    try:
        view = loop.run(kubelet.wait_for(NPU, lambda v: v.messages > 0, 20))
        yield Hostile(node, daemon, kubelet, loop, audit_log, site_dir, tuple(view.ids))
    finally:
        daemon.kill()
        loop.run(kubelet.stop())
        loop.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(site_dir, ignore_errors=True)


# --------------------------------------------------------------------------- strategies
MANAGED = tuple(f"rbln{i}" for i in range(31))  # atom-max-8 minus the renamed rbln31
valid_ids = st.sampled_from(MANAGED)
junk_text = st.text(st.characters(codec="utf-8"), max_size=24)  # protobuf strings are UTF-8
device_id = st.one_of(
    valid_ids,
    valid_ids,
    st.sampled_from(PATH_LIKE),
    st.sampled_from(LONG),
    junk_text,
    st.just(""),
)
sizes = st.one_of(st.integers(-3, 34), st.integers(-(2**31), 2**31 - 1))
SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def hostile_preferred(draw: st.DrawFn) -> tuple[list[str], list[str], int]:
    available = draw(st.lists(st.one_of(valid_ids, device_id), max_size=40))
    from_available = draw(st.booleans())
    if available and from_available:
        must = draw(st.lists(st.sampled_from(available), max_size=4))
    else:
        must = draw(st.lists(device_id, max_size=3))
    size = draw(st.one_of(st.integers(0, len(available) + 1), sizes))
    return available, must, size


@st.composite
def plausible_preferred(draw: st.DrawFn) -> tuple[list[str], list[str], int]:
    """What a kubelet would ask: known IDs (repeats allowed), a size that fits."""
    available = draw(st.lists(valid_ids, min_size=1, max_size=31))
    distinct = list(dict.fromkeys(available))
    size = draw(st.integers(0, len(distinct)))
    must = draw(st.lists(st.sampled_from(distinct), max_size=min(size, 4)))
    return available, must, size


preferred_container = st.one_of(
    plausible_preferred(), plausible_preferred(), plausible_preferred(), hostile_preferred()
)


def _preferred_request(
    containers: list[tuple[list[str], list[str], int]],
) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
            for available, must, size in containers
        ]
    )


def _check_preferred(h: Hostile, containers: list[tuple[list[str], list[str], int]]) -> None:
    # A gRPC error here fails the test: the plugin must always answer.
    FAMILIES_RUN.add("preferred")
    response = h.stub().GetPreferredAllocation(_preferred_request(containers), timeout=30)
    assert len(response.container_responses) == len(containers)
    for (available, must, size), answer in zip(
        containers, response.container_responses, strict=True
    ):
        ids = list(answer.deviceIDs)
        OUTCOMES["preferred selection" if ids else "preferred empty"] += 1
        if not ids:
            continue  # the documented fallback: the kubelet chooses
        assert len(ids) == size, (ids, size)
        assert len(set(ids)) == len(ids), ids
        assert set(ids) <= set(available), ids
        assert set(must) <= set(ids), (must, ids)
        assert set(ids) <= set(h.managed), ids


@settings(SETTINGS, max_examples=150)
@given(containers=st.lists(preferred_container, min_size=1, max_size=3))
def test_preferred_allocation_answers_a_valid_selection_or_nothing(
    hostile: Hostile, containers: list[tuple[list[str], list[str], int]]
) -> None:
    _check_preferred(hostile, containers)


@settings(SETTINGS, max_examples=6)
@given(
    count=st.integers(1_000, 6_000),
    size=st.one_of(st.integers(0, 8), sizes),
    with_junk=st.booleans(),
)
def test_preferred_allocation_survives_huge_lists(
    hostile: Hostile, count: int, size: int, with_junk: bool
) -> None:
    available = [MANAGED[i % len(MANAGED)] for i in range(count)]  # mostly duplicates
    if with_junk:
        available += [f"rbln{i}" for i in range(count)] + list(LONG)
    _check_preferred(hostile, [(available, available[:3], size)])


def _allocate(h: Hostile, containers: list[list[str]]) -> api_pb2.AllocateResponse | str:
    """The response, or the message of an INVALID_ARGUMENT; any other outcome fails."""
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
    try:
        return h.stub().Allocate(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        message = exc.details() or ""
        assert 0 < len(message.encode()) < MAX_MESSAGE, len(message.encode())
        return message


def _check_allocation(h: Hostile, containers: list[list[str]]) -> None:
    FAMILIES_RUN.add("allocate")
    outcome = _allocate(h, containers)
    OUTCOMES["allocate refused" if isinstance(outcome, str) else "allocate granted"] += 1
    if isinstance(outcome, str):
        return
    dev_root = str(h.node.dev_root)
    assert len(outcome.container_responses) == len(containers)
    for ids, answer in zip(containers, outcome.container_responses, strict=True):
        assert dict(answer.annotations) == ANNOTATION
        rsd, *nodes = answer.devices
        assert rsd.container_path == "/dev/rsd0"
        assert os.path.dirname(rsd.host_path) == dev_root
        assert os.path.basename(rsd.host_path).removeprefix("rsd").isdigit()
        assert [(d.container_path, d.host_path) for d in nodes] == [
            (f"/dev/{i}", os.path.join(dev_root, i)) for i in ids
        ]
        assert all(d.permissions == "rw" for d in answer.devices)
        # Only managed, healthy devices are ever granted.
        assert set(ids) <= set(h.managed) - {FAULTED}


any_container = st.lists(device_id, max_size=5)
# Distinct known IDs: requests that pass validation and really create RSD groups.
plausible_container = st.lists(valid_ids, min_size=1, max_size=4, unique=True)


@settings(SETTINGS, max_examples=60)
@given(
    containers=st.lists(
        st.one_of(plausible_container, plausible_container, plausible_container, any_container),
        max_size=3,
    )
)
def test_allocate_answers_a_valid_response_or_invalid_argument(
    hostile: Hostile, containers: list[list[str]]
) -> None:
    _check_allocation(hostile, containers)


@settings(SETTINGS, max_examples=4)
@given(count=st.integers(1_000, 5_000), long_ids=st.booleans())
def test_allocate_survives_huge_lists(hostile: Hostile, count: int, long_ids: bool) -> None:
    ids = [MANAGED[i % len(MANAGED)] for i in range(count)]
    if long_ids:
        ids += list(LONG)
    outcome = _allocate(hostile, [ids, ids[:2]])
    assert isinstance(outcome, str)  # duplicates (and unknown IDs) are always refused


def test_long_rbln_smi_error_output_keeps_the_message_bounded(hostile: Hostile) -> None:
    hostile.node.inject_fault(
        Fault("error", commands=("group-create",), message="E" * 20_000, remaining=1)
    )
    outcome = _allocate(hostile, [["rbln3"]])
    assert isinstance(outcome, str) and "creating group" in outcome


# --------------------------------------------------------------------------- afterwards
def _outside(h: Hostile, event: str, path: str) -> bool:
    full = os.path.normpath(os.path.join(str(h.node.root), path))
    if full == "/dev/null":
        return False
    if event == "open" and re.fullmatch(r"/proc/self/fd/[0-9]+", full):
        # A file reopened through the descriptor its type was checked on (O_PATH first,
        # see host/ownfiles.py and host/cdientry.py): the descriptor's own file, opened
        # under a root a moment before and checked there; the final listing of the
        # daemon's descriptors below still sees where every one of them points.
        return False
    if event == "os.listdir" and full in (os.getcwd(), *(os.path.realpath(p) for p in sys.path)):
        # The import system lists each sys.path entry once to fill its cache: the working
        # directory (`python -m` puts it first) and, in a development install, the
        # simulator's source directory. Nothing in them is opened.
        return False
    return not any(full == root or full.startswith(root + os.sep) for root in h.allowed_roots())


def test_the_property_runs_exercised_every_outcome() -> None:
    """Every property test family that ran saw both of its outcomes, often enough."""
    if not FAMILIES_RUN:
        pytest.skip("no property test ran in this session (selected alone)")
    floors = {
        "allocate": {"allocate granted": 10, "allocate refused": 10},
        "preferred": {"preferred selection": 30, "preferred empty": 30},
    }
    for family in FAMILIES_RUN:
        for outcome, floor in floors[family].items():
            assert OUTCOMES[outcome] >= floor, OUTCOMES


def test_daemon_is_still_serving_after_the_hostile_run(hostile: Hostile) -> None:
    # Fallbacks are for requests that cannot be optimised, never for a failing search.
    fallbacks = hostile.daemon.find("Preferred allocation fallback to kubelet")
    assert not [r for r in fallbacks if "internal error" in r["reason"]], fallbacks[:3]
    assert hostile.daemon.proc.poll() is None
    view = hostile.kubelet.view(NPU)
    assert view is not None and view.ended is None and len(view.devices) == 31
    final = _allocate(hostile, [["rbln0", "rbln1"], ["rbln2"]])
    assert not isinstance(final, str), final
    assert lock_is_free(hostile.node.rsd_lock_path)
    # Refused requests, the rbln-smi failure injected above and the hostile names are the
    # only errors; nothing carries a traceback.
    no_crash_records(hostile.daemon, ["Container allocation failed", INVALID_NAME])


def test_no_file_outside_the_configured_roots_is_touched(hostile: Hostile) -> None:
    events = [e for e in hostile.audit() if "paths" in e]
    assert len(events) > 100, "the audit hook recorded nothing: is it installed?"
    assert not [e for e in hostile.audit() if e["event"] == "hook-error"]
    outside = [e for e in events if any(_outside(hostile, e["event"], p) for p in e["paths"])]
    assert not outside, outside[:20]
    # Descriptors opened below Python (gRPC's C core) escape the hook: check those too.
    fd_dir = f"/proc/{hostile.daemon.proc.pid}/fd"
    targets = [os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)]
    files = [t for t in targets if t.startswith("/")]
    assert not [t for t in files if _outside(hostile, "open", t)], files


def test_subprocesses_are_only_the_configured_rbln_smi_without_a_shell(hostile: Hostile) -> None:
    spawns = [e for e in hostile.audit() if "spawn" in e]
    assert spawns, "no rbln-smi run was recorded"
    smi = str(hostile.node.smi_path)
    for event in spawns:
        assert event["event"] == "subprocess.Popen", event
        executable, argv = event["spawn"]
        assert executable == smi and argv[0] == smi, event


def test_path_like_device_names_from_rbln_smi_are_rejected_unused(hostile: Hostile) -> None:
    for name in HOSTILE_NAMES:
        hostile.daemon.wait_for(INVALID_NAME, device=name)
    assert hostile.managed == tuple(sorted(MANAGED)), hostile.managed
    records = hostile.daemon.find(INVALID_NAME)
    assert all(r["level"] == "error" for r in records)
    # Logged once while the condition lasts, not once per scan.
    assert len(records) == len(HOSTILE_NAMES), len(records)
    touched = [p for e in hostile.audit() if "paths" in e for p in e["paths"]]
    status_reads = [p for p in touched if p.startswith(str(hostile.node.sysfs_root))]
    assert status_reads, "no sysfs read was recorded"
    for name in HOSTILE_NAMES:
        assert not [p for p in touched if name in p], name
    assert not [p for p in touched if ".." in Path(p).parts]
