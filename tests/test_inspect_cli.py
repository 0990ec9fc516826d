"""``rbln-device-plugin inspect`` against simulated nodes: its report, in-process, and what
only a process shows, as a real process.

Every case of issue #18: a clean node, a mixed SR-IOV node with an unsupported VF count,
a faulted device, a missing ``rbln-smi``, garbage ``rbln-smi`` output, an unreadable PCI
link, and the README's preferred-allocation table. Each JSON report is validated against
the shipped schema. These run the command's own entry (``cli.main(["inspect", ...])``) on
the test's thread with the process's environment, stdout and stderr (``run``): the same
parser, discovery (the simulator's real ``rbln-smi`` executable), report and output, and
each run is checked to leave no thread, descriptor, working directory, environment or
logger change behind. The real process (``run_process``) shows the rest: exit statuses
and usage errors end to end, log records on stderr only at debug, its report equal to the
in-process one, a status file that blocks, and the read-only guarantees: an audit hook
records no write, lock, bound or connected socket, and no gRPC import; the node's files
are byte-for-byte unchanged; and a daemon running on the same node is not disturbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import structlog

from rbln_device_plugin import cli
from rbln_device_plugin.host.smi import DEFAULT_CANDIDATES
from rbln_device_plugin.inspect import command
from rbln_device_plugin.telemetry import logs
from rbln_device_plugin_sim.demo import DemoConfig, run_demo
from rbln_device_plugin_sim.layout import Layout, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir
from rbln_device_plugin_sim.state import Fault

from .simnode import running

BIN = Path(sys.executable).parent / "rbln-device-plugin"
SCHEMA = json.loads(
    (resources.files("rbln_device_plugin.inspect") / "report.schema.json").read_text()
)
NPU, VF1, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"
# The daemon's own variables, which a developer's shell might set.
_DAEMON_ENV = ("RBLN_", "OTEL_", "KUBELET_", "CDI_", "HEALTHCHECK_", "NODE_NAME")
_DAEMON_ENV_EXACT = ("SYSFS_ROOT", "DEV_ROOT", "RSD_LOCK_PATH", "DEVICE_SCAN_INTERVAL")


@contextmanager
def sim(layout: str | Layout) -> Iterator[SimNode]:
    root = short_tempdir()
    try:
        yield materialize(preset(layout) if isinstance(layout, str) else layout, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def host_flags(node: SimNode, *, smi: bool = True) -> list[str]:
    """The daemon's host-path flags for the node (the same ones the daemon gets)."""
    flags = node.daemon_args()
    if not smi:
        at = flags.index("--rbln-smi")
        del flags[at : at + 2]
    return flags


def process_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The command's environment: the test process's without the daemon's variables."""
    full_env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_DAEMON_ENV) and key not in _DAEMON_ENV_EXACT
    }
    full_env["PYTHONDONTWRITEBYTECODE"] = "1"
    full_env.update(env or {})
    return full_env


def run_process(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rbln-device-plugin inspect ARGS`` as a real process."""
    return subprocess.run(
        [str(BIN), "inspect", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=process_env(env),
        stdin=subprocess.DEVNULL,
    )


@contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ as the process would have it (rbln-smi's $PATH search reads it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _logging_restored() -> Iterator[None]:
    """inspect installs the process-wide logger: structlog's configuration, a sink with a
    writer thread, and the bridge on gRPC's and OpenTelemetry's stdlib loggers. All undone."""
    structlog_config = structlog.get_config()
    bridged = [logging.getLogger(name) for name in ("grpc", "opentelemetry")]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in bridged]
    sink = logs._sink
    try:
        yield
    finally:
        if logs._sink is not sink and logs._sink is not None:
            logs._sink.close(logs.FLUSH_TIMEOUT_S)  # its writer thread ends
        structlog.configure(**structlog_config)
        for logger, (handlers, level, propagate) in zip(bridged, saved, strict=True):
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def _descriptors() -> dict[str, str]:
    fds = Path("/proc/self/fd")
    found = {}
    for fd in os.listdir(fds):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            found[fd] = os.readlink(fds / fd)
    return found


def run(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rbln-device-plugin inspect ARGS`` in this process, on this thread: the CLI's own
    entry with the process's environment, stdout and stderr; the same answer as
    ``run_process`` (test_the_process_prints_the_in_process_report). Checks that the run
    left nothing behind: no thread, descriptor (socket, pipe, file), working directory,
    environment or logger change."""
    full_env = process_env(env)
    threads, descriptors, cwd = set(threading.enumerate()), _descriptors(), os.getcwd()
    environ = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    with _logging_restored(), _environ(full_env), redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["inspect", *args])
    left = [thread for thread in threading.enumerate() if thread not in threads]
    for thread in left:
        thread.join(5.0)  # asyncio's child watcher ends once rbln-smi is reaped
    assert [thread.name for thread in left if thread.is_alive()] == []
    # Only new ones count: a loop an earlier test left to the garbage collector may close.
    assert _descriptors().items() - descriptors.items() == set()
    assert (os.getcwd(), dict(os.environ)) == (cwd, environ)
    return subprocess.CompletedProcess(["inspect", *args], code, out.getvalue(), err.getvalue())


Runner = Callable[[Sequence[str], Mapping[str, str] | None], subprocess.CompletedProcess[str]]


def inspect(
    node: SimNode,
    *args: str,
    env: Mapping[str, str] | None = None,
    smi: bool = True,
    via: Runner = run,
) -> subprocess.CompletedProcess[str]:
    return via([*host_flags(node, smi=smi), *args], env)


def report(
    node: SimNode,
    *args: str,
    env: Mapping[str, str] | None = None,
    smi: bool = True,
    via: Runner = run,
) -> tuple[dict[str, Any], int]:
    """The JSON report, checked against the schema and against the exit status."""
    done = inspect(node, "--output", "json", *args, env=env, smi=smi, via=via)
    assert done.stderr == "", done.stderr
    document = json.loads(done.stdout)
    jsonschema.validate(document, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert document["exitCode"] == done.returncode
    return document, done.returncode


def inspect_process(
    node: SimNode, *args: str, env: Mapping[str, str] | None = None, smi: bool = True
) -> subprocess.CompletedProcess[str]:
    return inspect(node, *args, env=env, smi=smi, via=run_process)


def report_process(
    node: SimNode, *args: str, env: Mapping[str, str] | None = None, smi: bool = True
) -> tuple[dict[str, Any], int]:
    return report(node, *args, env=env, smi=smi, via=run_process)


def device(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in document["devices"] if d["device"] == name)
    return found


def summary(document: Mapping[str, Any]) -> dict[str, tuple[int, int, int]]:
    return {
        r["resourceName"]: (r["deviceCount"], r["healthyCount"], r["unhealthyCount"])
        for r in document["resources"]
    }


def table_line(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.split()[:1] == [name])


def test_the_schema_itself_is_valid() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


# ----------------------------------------------------------------------------- the node


def test_clean_node() -> None:
    with sim("atom-max-8") as node:
        done = inspect(node)
        document, code = report(node)
    assert done.returncode == 0 and code == 0
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert sum(1 for line in lines if re.match(r"rbln\d+ ", line)) == 32
    assert re.search(r"rbln31[ \t]+RBLN-CA25", done.stdout), done.stdout
    assert table_line(done.stdout, "rbln7").split()[6:9] == [NPU, "Healthy", "READY"]
    assert table_line(done.stdout, NPU).split() == [NPU, "32", "32", "0"]
    assert "Problems: none" in lines
    assert lines[-1] == "OK: 32 devices advertised, 0 errors, 0 warnings (exit 0)"
    assert summary(document) == {NPU: (32, 32, 0), VF1: (0, 0, 0), VF4: (0, 0, 0)}
    assert document["problems"] == []
    numa = [d["numa"] for d in document["devices"]]
    assert numa.count(0) == numa.count(1) == 16
    assert all(len(d["pciPath"]) == 5 for d in document["devices"])  # root port, switch
    assert document["discovery"]["rblnSmi"] == str(node.smi_path)


def test_mixed_sriov_node_with_an_unsupported_vf_count() -> None:
    with sim("rebel-sriov-bad") as node:
        done = inspect(node)
        document, code = report(node)
    assert done.returncode == 1 and code == 1
    assert summary(document) == {NPU: (1, 1, 0), VF1: (0, 0, 0), VF4: (4, 4, 0)}
    for vf in ("rbln0-0", "rbln0-1"):
        row = device(document, vf)
        assert row["resourceName"] is None
        assert row["whyNot"] == {
            "kind": "unsupported-vf-count",
            "reason": "parent PF has 2 VFs, an unsupported count",
        }
        assert row["parentBusID"] == "0000:17:00.0"
    # rbln-smi does not list either PF; sysfs shows them, and says why they are hidden.
    assert device(document, "rbln0")["whyNot"]["reason"] == (
        "hosts 2 VFs, an unsupported count, not listed by rbln-smi"
    )
    assert device(document, "rbln1")["whyNot"]["kind"] == "hosting-vfs"
    assert not device(document, "rbln1")["listedBySmi"]
    assert [d["resourceName"] for d in document["devices"] if d["device"].startswith("rbln1-")] == [
        VF4
    ] * 4
    assert [(p["kind"], p["device"], p["details"]["vfCount"]) for p in document["problems"]] == [
        ("unsupported-vf-count", "rbln0-0", 2),
        ("unsupported-vf-count", "rbln0-1", 2),
    ]
    assert "(parent PF has 2 VFs, an unsupported count)" in table_line(done.stdout, "rbln0-0")
    assert "Skipping VF of a PF with an unsupported VF count" in done.stdout


def test_faulted_device() -> None:
    with sim("rebel-4") as node:
        node.set_status("rbln2", 4)
        node.set_status("rbln1", "garbage")
        done = inspect(node)
        document, code = report(node)
    assert done.returncode == 1 and code == 1
    faulted = device(document, "rbln2")
    assert (faulted["health"], faulted["status"]) == ("Unhealthy", "FAULT")
    # A first scan has no history: an unreadable status is Healthy, with its reason.
    garbled = device(document, "rbln1")
    assert (garbled["health"], garbled["status"]) == ("Healthy", "UNREADABLE")
    assert "malformed status" in garbled["statusDetail"]
    assert summary(document)[NPU] == (4, 3, 1)
    assert [(p["severity"], p["kind"], p["device"]) for p in document["problems"]] == [
        ("error", "unhealthy", "rbln2")
    ]
    assert table_line(done.stdout, "rbln2").split()[7:9] == ["Unhealthy", "FAULT"]
    assert done.stdout.splitlines()[-1].startswith("NOT OK: 4 devices advertised, 1 error")


def test_a_status_file_that_blocks_is_reported_not_waited_for() -> None:
    with sim("rebel-4") as node:
        status = node.status_path("rbln1")
        status.unlink()
        os.mkfifo(status)  # a wedged driver: open() never returns
        # The command ends on its own; its abandoned reader thread goes with the process
        # (a process of its own: in this one the thread would stay blocked in open()).
        document, _ = report_process(node)
    stuck = device(document, "rbln1")
    assert stuck["status"] == "UNREADABLE"
    assert "did not finish within" in stuck["statusDetail"]
    assert device(document, "rbln2")["status"] == "READY"


def test_missing_rbln_smi_names_every_path_tried(tmp_path: Path) -> None:
    present = [str(path) for path in DEFAULT_CANDIDATES if path.exists()]
    if present:
        pytest.skip(f"this machine has a real rbln-smi: {present}")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with sim("rebel-4") as node:
        done = inspect(node, smi=False, env={"PATH": str(empty)})
        document, code = report(node, smi=False, env={"PATH": str(empty)})
        configured = inspect(node, smi=False, env={"RBLN_SMI_PATH": str(empty / "rbln-smi")})
    assert done.returncode == 1 and code == 1
    tried = [*map(str, DEFAULT_CANDIDATES), str(empty / "rbln-smi")]
    assert document["discovery"]["tried"] == tried
    assert document["problems"][0]["kind"] == "rbln-smi-not-found"
    assert document["problems"][0]["details"]["tried"] == tried
    assert document["problems"][-1]["kind"] == "nothing-advertised"
    assert done.stdout.startswith("rbln-smi: not found")
    for path in tried:
        assert path in done.stdout
    # The devices are still shown, from sysfs, with the reason they are not advertised.
    assert [d["device"] for d in document["devices"]] == ["rbln0", "rbln1", "rbln2", "rbln3"]
    assert {d["whyNot"]["kind"] for d in document["devices"]} == {"discovery-failed"}
    # RBLN_SMI_PATH is honoured like the daemon's --rbln-smi.
    assert configured.returncode == 1
    assert f"configured rbln-smi {empty / 'rbln-smi'} is not an executable file" in (
        configured.stdout
    )


def test_garbage_rbln_smi_output() -> None:
    with sim("rebel-4") as node:
        node.inject_fault(Fault("garbage", ("list",)))
        done = inspect(node)
        document, code = report(node)
        node.clear_faults()
        node.inject_fault(Fault("error", ("list",), exit_code=3, message="driver not loaded"))
        failing, _ = report(node)
    assert done.returncode == 1 and code == 1
    assert "\x1b" not in done.stdout  # the tool's escape codes never reach the terminal
    problem = document["problems"][0]
    assert problem["kind"] == "discovery-failed"
    assert "rbln-smi printed invalid JSON" in problem["details"]["err"]
    assert document["discovery"]["ok"] is False
    assert summary(document)[NPU] == (0, 0, 0)
    assert len(document["devices"]) == 4  # sysfs still shows them
    assert "(no rbln-smi inventory)" in table_line(done.stdout, "rbln0")
    err = failing["problems"][0]["details"]["err"]
    assert "exited with code 3" in err and "driver not loaded" in err


def test_unreadable_pci_link() -> None:
    with sim("rebel-4") as node:
        target = node.layout.device("rbln1")
        odd = node.sysfs_root / "devices" / "platform" / "virt" / target.bus_id
        odd.mkdir(parents=True)
        link = node.pci_link(target.bus_id)
        link.unlink()
        link.symlink_to(os.path.relpath(odd, link.parent))
        node.pci_link(node.layout.device("rbln3").bus_id).unlink()
        done = inspect(node)
        document, code = report(node)
    # rbln1's placement is degraded, but it is still advertised and healthy. rbln3's PCI
    # directory is gone altogether while sysfs shows the others: a REBEL PF that rbln-smi
    # lists no VFs of is offered whole with an unknown placement, as the Go plugin does.
    assert done.returncode == 0 and code == 0
    assert summary(document)[NPU] == (4, 4, 0)
    assert device(document, "rbln1")["pciPath"] is None
    assert "has no pciDDDD:BB host bridge" in device(document, "rbln1")["pciPathError"]
    rbln3 = node.layout.device("rbln3").bus_id
    assert device(document, "rbln3")["pciPathError"] == (
        f"{node.sysfs_root}/bus/pci/devices/{rbln3} does not exist"
    )
    assert device(document, "rbln3")["resourceName"] == NPU
    assert device(document, "rbln3")["inSysfs"] is True  # its driver class entry is there
    found = [(p["severity"], p["kind"], p["device"]) for p in document["problems"]]
    assert found == [
        ("warning", "pci-path-unreadable", "rbln1"),
        ("warning", "pci-path-unreadable", "rbln3"),
    ]
    assert "does not exist" in table_line(done.stdout, "rbln3")
    assert done.stdout.splitlines()[-1] == (
        "OK: 4 devices advertised, 0 errors, 2 warnings (exit 0)"
    )


def test_a_pf_sysfs_does_not_show_that_rbln_smi_lists_vfs_of_is_an_error() -> None:
    with sim("rebel-sriov") as node:
        node.pci_link(node.layout.device("rbln1").bus_id).unlink()
        document, code = report(node)
    assert code == 1
    assert device(document, "rbln1")["resourceName"] is None
    assert device(document, "rbln1")["whyNot"] == {
        "kind": "sysfs-unseen",
        "reason": "sysfs does not show it",
    }
    (finding,) = [p for p in document["problems"] if p["kind"] == "sysfs-unseen"]
    assert finding["device"] == "rbln1"
    assert finding["details"]["reason"] == (
        "rbln-smi lists VFs of it: a PF hosting VFs is not advertised"
    )


# ----------------------------------------------------------------------------- preferred

ALL = [f"rbln{i}" for i in range(7)]


def readme(**changes: dict[str, object]) -> Layout:
    base = preset("readme-example")
    return Layout(
        base.name,
        tuple(
            dataclasses.replace(d, **changes[d.name]) if d.name in changes else d  # type: ignore[arg-type]
            for d in base.devices
        ),
    )


SHARED_SID = {"sid": preset("readme-example").device("rbln0").sid}
BLANK = {"sid": "", "numa": "-1", "pci_path": None}

# The README's "Preferred device allocation" table, row by row, with the score level
# that separates the answer from the runner-up.
README_ROWS = [
    ("choose 2", readme(), ALL, [], 2, ["rbln0", "rbln2"], "device_ids"),
    (
        "choose 2 of 0/2/4 where 0 and 4 share a SID",
        readme(rbln4=SHARED_SID),
        ["rbln0", "rbln2", "rbln4"],
        [],
        2,
        ["rbln0", "rbln4"],
        "share_groups",
    ),
    (
        "must 0, choose 2 of 0/1/2 with 2 on NUMA 1",
        readme(rbln2={"numa": "1"}),
        ["rbln0", "rbln1", "rbln2"],
        ["rbln0"],
        2,
        ["rbln0", "rbln1"],
        "numa_nodes",
    ),
    (
        "choose 2 of 0/1/2 all on one card",
        readme(rbln0=SHARED_SID, rbln1=SHARED_SID, rbln2=SHARED_SID),
        ["rbln0", "rbln1", "rbln2"],
        [],
        2,
        ["rbln0", "rbln2"],
        "max_distance",
    ),
    (
        "must 6 (no PCI path), choose 3",
        readme(),
        ALL,
        ["rbln6"],
        3,
        ["rbln6", "rbln0", "rbln2"],
        "device_ids",
    ),
    (
        "must 0, choose 2 of 0/4/5",
        readme(),
        ["rbln0", "rbln4", "rbln5"],
        ["rbln0"],
        2,
        ["rbln0", "rbln4"],
        "cross_root_pairs",
    ),
    (
        "choose 2, no SID/NUMA/PCI data at all",
        readme(**{name: BLANK for name in ALL}),
        ALL,
        [],
        2,
        ["rbln0", "rbln1"],
        "device_ids",
    ),
]


@pytest.mark.parametrize(
    ("layout", "available", "must", "size", "answer", "decided_by"),
    [row[1:] for row in README_ROWS],
    ids=[row[0] for row in README_ROWS],
)
def test_preferred_gives_the_readme_answers(
    layout: Layout,
    available: list[str],
    must: list[str],
    size: int,
    answer: list[str],
    decided_by: str,
) -> None:
    args = ["--preferred", str(size), "--available", ",".join(available)]
    if must:
        args += ["--must-include", ",".join(must)]
    with sim(layout) as node:
        document, _ = report(node, *args)
    preferred = document["preferred"]
    assert preferred["deviceIDs"] == answer
    assert preferred["fallback"] is None
    assert preferred["decidedBy"] == decided_by
    winner, runner_up = preferred["winner"]["score"], preferred["runnerUp"]["score"]
    assert winner[decided_by] < runner_up[decided_by]
    assert preferred["runnerUp"]["deviceIDs"] != answer


def test_preferred_table_shows_the_levels_of_winner_and_runner_up() -> None:
    with sim("readme-example") as node:
        done = inspect(node, "--preferred", "2")
    assert done.returncode == 0  # rbln6's missing PCI path is only a warning
    text = done.stdout
    assert "Preferred allocation for rebellions.ai/npu: size 2, 7 available" in text
    assert "  answer: rbln0, rbln2\n" in text
    levels = {
        line.split()[0]: line.split()[1:]
        for line in text.splitlines()
        if line.startswith("  ") and line.split()[0] in ("max_distance", "device_ids")
    }
    assert levels == {"max_distance": ["2", "2"], "device_ids": ["rbln0,rbln2", "rbln1,rbln3"]}
    assert "runner-up: rbln1, rbln3; decided by device_ids" in text


def test_preferred_fallbacks_are_reported_not_failed() -> None:
    with sim("readme-example") as node:
        too_big, code = report(node, "--preferred", "9")
        foreign, _ = report(node, "--preferred", "1", "--available", "rbln0,rbln99")
        absent, _ = report(node, "--preferred", "1", "--resource", VF4)
    assert code == 0  # the node is fine; the question had no preferred answer
    assert too_big["preferred"]["deviceIDs"] == []
    assert "exceeds the 7 available devices" in too_big["preferred"]["fallback"]
    assert "'rbln99' is not managed by this plugin" in foreign["preferred"]["fallback"]
    assert "not advertised on this node" in absent["preferred"]["fallback"]


def test_preferred_size_zero_shows_an_empty_answer_as_such() -> None:
    with sim("readme-example") as node:
        done = inspect(node, "--preferred", "0")
        document, code = report(node, "--preferred", "0")
    assert done.returncode == 0 and code == 0
    assert "  answer: [] (size 0: nothing to choose)\n" in done.stdout
    assert "LEVEL" not in done.stdout  # no score table for an empty selection
    assert document["preferred"]["deviceIDs"] == []


def test_an_unreadable_status_shows_its_reason_in_the_table() -> None:
    with sim("rebel-sriov") as node:
        node.set_status("rbln2", "garbage")
        done = inspect(node)
    # rbln1-0 is a VF without a status file: Healthy, and the table says why.
    vf = table_line(done.stdout, "rbln1-0")
    assert re.search(r"Healthy[ \t]+UNREADABLE \(status file does not exist\)", vf), vf
    assert "UNREADABLE (malformed status 'garbage')" in table_line(done.stdout, "rbln2")
    assert "(Healthy with an UNREADABLE status: " in done.stdout
    assert str(node.root) not in vf.split("UNREADABLE", 1)[1].split(")")[0]


def test_no_device_line_says_whether_rbln_smi_ran(tmp_path: Path) -> None:
    bare = tmp_path / "sys"
    bare.mkdir()
    never_ran = run(["--sysfs-root", str(bare), "--rbln-smi", str(tmp_path / "none")])
    assert "(no device: rbln-smi did not run and sysfs shows none; see problems)" in (
        never_ran.stdout
    )
    empty = materialize(Layout(name="empty", devices=()), short_tempdir())
    try:
        ran = run(host_flags(empty))
        empty.inject_fault(Fault("error", ("list",)))
        failed = run(host_flags(empty))
    finally:
        shutil.rmtree(empty.root, ignore_errors=True)
    assert "(no device: rbln-smi lists none and sysfs shows none)" in ran.stdout
    assert "(no device: rbln-smi failed and sysfs shows none; see problems)" in failed.stdout


def test_help_lists_only_the_flags_that_change_the_report() -> None:
    done = run(["--help"])
    assert done.returncode == 0 and done.stdout == ""
    for shown in (
        "--sysfs-root",
        "--rbln-smi",
        "--output",
        "--preferred",
        "--must-include",
        "--cdi-root",
        "--cdi-static-dir",  # the CDI spec check reads both
        "--mode",  # the mode part: the sockets of both modes, dra mode's checkpoint
        "--node-name",
        "--kubelet-device-plugin-path",
        "--kubelet-plugins-registry-path",
        "--kubelet-plugins-path",
    ):
        assert shown in done.stderr
    for hidden in ("--cdi-mode", "--healthcheck-port", "--device-scan-interval",
                   "--otlp-endpoint", "--rsd-lock-path", "--test-file-device-nodes"):  # fmt: skip
        assert hidden not in done.stderr
    # Hidden is not refused: the daemon's own command line still works.
    with sim("rebel-4") as node:
        assert inspect(node, "--cdi-mode", "field").returncode == 0


# ----------------------------------------------------------------------------- the command


# Two of them as a real process (argparse's error and inspect's own check), the exit
# status and streams end to end; the rest in-process, where the same main() answers.
@pytest.mark.parametrize(
    ("via", "args", "message"),
    [
        (run_process, ["--bogus"], "flag provided but not defined: --bogus"),
        (run, ["--preferred", "two"], "invalid int value: 'two'"),
        (run_process, ["--must-include", "rbln0"], "--must-include needs --preferred SIZE"),
        (
            run,
            ["--resource", "rebellions.ai/npu", "--available", "rbln0", "--must-include", "rbln0"],
            "--resource, --available and --must-include need --preferred SIZE",
        ),
        (run, ["--output", "yaml"], "invalid choice: 'yaml'"),
        (run, ["--resource", "gpu", "--preferred", "1"], "invalid choice: 'gpu'"),
        (run, ["--device-scan-interval", "0s"], "interval must be positive"),
        (run, ["positional"], "arguments not supported: [positional]"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_usage_errors_exit_2_with_stdout_empty(via: Runner, args: list[str], message: str) -> None:
    done = via(args, None)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "usage: rbln-device-plugin inspect" in done.stderr
    assert message in done.stderr


def test_daemon_environment_is_validated_the_same_way() -> None:
    done = run([], env={"HEALTHCHECK_PORT": "70000"})
    assert done.returncode == 2
    assert "HEALTHCHECK_PORT (environment; the flag is --healthcheck-port)" in done.stderr


def test_configuration_comes_from_the_daemons_environment_variables() -> None:
    with sim("rebel-sriov") as node:
        by_flags, _ = report(node)
        env = {"SYSFS_ROOT": str(node.sysfs_root), "RBLN_SMI_PATH": str(node.smi_path)}
        done = run(["--output", "json"], env=env)
    by_env = json.loads(done.stdout)
    assert by_env["devices"] == by_flags["devices"]
    assert by_env["config"]["sysfsRoot"] == str(node.sysfs_root)
    assert by_env["config"]["kubeletDir"] == "/var/lib/kubelet/device-plugins"  # default


def test_subcommand_is_only_recognised_first() -> None:
    """Anywhere else "inspect" stays what it always was for the daemon: a bad argument."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RBLN_")}
    done = subprocess.run(
        [str(BIN), "--healthcheck-port", "-1", "inspect"],
        capture_output=True, text=True, timeout=30, env=full_env,
    )  # fmt: skip
    assert done.returncode == 2
    record = json.loads(done.stdout.splitlines()[-1])
    assert record["msg"] == "Invalid command line"


LEVEL = "RBLN_DEVICE_PLUGIN_LOG_LEVEL"


def test_log_records_go_to_stderr_and_only_at_debug() -> None:
    with sim("rebel-4") as node:
        quiet = inspect_process(node, "--output", "json", env={LEVEL: "info"})
        bogus = inspect_process(node, "--output", "json", env={LEVEL: "loud"})
        debug = inspect_process(node, "--output", "json", env={LEVEL: "debug"})
    for done in (quiet, bogus, debug):
        assert json.loads(done.stdout)["exitCode"] == 0  # stdout is exactly the report
    assert quiet.stderr == "" and bogus.stderr == ""
    records = [json.loads(line) for line in debug.stderr.splitlines()]
    inspected = [r for r in records if r["msg"] == "Inspected node"]
    assert len(inspected) == 1 and inspected[0]["exitCode"] == 0


def test_the_process_prints_the_in_process_report() -> None:
    """The layer the report tests run on: the real process prints the same report and
    exits the same way (the rbln-smi run's duration aside)."""
    with sim("rebel-sriov") as node:
        node.set_status("rbln2", 4)
        by_process, code = report_process(node, "--preferred", "2")
        table = inspect_process(node, "--preferred", "2")
        here, here_code = report(node, "--preferred", "2")
        here_table = inspect(node, "--preferred", "2")
    assert code == here_code == table.returncode == here_table.returncode == 1  # rbln2
    for document in (by_process, here):
        assert document["discovery"].pop("durationMs") is not None
    assert by_process == here
    took = re.compile(r", \d+ ms\)")
    assert took.search(table.stdout), table.stdout
    assert took.sub(")", table.stdout) == took.sub(")", here_table.stdout)
    assert table.stderr == here_table.stderr == ""


def test_gather_ends_its_host_io_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-shot pass leaves no host I/O thread waiting for work (inspect in-process, or
    any caller that goes on running after it)."""
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def recorded(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)

    with sim("rebel-4") as node:
        request = command.parse(command.build_parser(), host_flags(node), {})
        monkeypatch.setattr(threading.Thread, "start", recorded)
        facts = asyncio.run(command.gather(request.config))
        monkeypatch.undo()
        for thread in started:
            thread.join(5.0)  # asyncio's child watcher ends once rbln-smi is reaped
    assert facts.smi.ok and len(facts.statuses) == 4
    assert "host-io" in {thread.name for thread in started}  # the runner did run threads
    assert [thread.name for thread in started if thread.is_alive()] == []


# ----------------------------------------------------------------------------- read-only

AUDIT_HOOK = """
import atexit, json, os, sys
_fd = os.open(os.environ["RBLN_TEST_AUDIT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {"os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink",
            "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree",
            "shutil.copyfile", "shutil.move", "os.mkfifo", "os.mknod"}
_SPAWNS = {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.system", "os.fork",
           "os.forkpty", "pty.spawn"}
def _emit(record):
    os.write(_fd, (json.dumps(record, default=repr) + "\\n").encode())
def _text(value):
    return os.fsdecode(value) if isinstance(value, (str, bytes, os.PathLike)) else repr(value)
def _hook(event, args):
    try:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE)
            if writes:
                _emit({"event": "open-for-write", "path": _text(path)})
        elif event in _CHANGES:
            _emit({"event": event, "args": [_text(a) for a in args[:2]]})
        elif event.startswith("socket."):
            _emit({"event": event, "args": [repr(a) for a in args[1:3]]})
        elif event in ("fcntl.flock", "fcntl.lockf"):
            _emit({"event": event})
        elif event in _SPAWNS:
            _emit({"event": "spawn", "how": event, "args": [repr(a) for a in args[:2]]})
    except Exception as exc:
        _emit({"event": "hook-error", "error": repr(exc)})
sys.addaudithook(_hook)
atexit.register(lambda: _emit({"event": "exit", "grpc": [m for m in sys.modules
                                                          if m.split(".")[0] == "grpc"]}))
"""


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under root: kind, mode, mtime and contents (or link target)."""
    out: dict[str, tuple[Any, ...]] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory) / name
            info = path.lstat()
            if path.is_symlink():
                out[str(path)] = ("link", os.readlink(path))
            elif path.is_dir():
                out[str(path)] = ("dir", info.st_mode, info.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[str(path)] = ("file", info.st_mode, info.st_mtime_ns, digest)
    return out


def test_inspect_writes_nothing_locks_nothing_and_opens_no_socket(tmp_path: Path) -> None:
    site = Path(tempfile.mkdtemp(prefix="rbln-audit-", dir="/tmp"))
    (site / "sitecustomize.py").write_text(AUDIT_HOOK)
    audit_log = site / "audit.jsonl"
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": python_path, "RBLN_TEST_AUDIT_LOG": str(audit_log)}
    try:
        with sim("rebel-sriov") as node:
            stale_spec = node.cdi_root / "rebellions.ai-npu_stale.yaml"
            stale_spec.write_text("kind: rebellions.ai/npu\n")  # the daemon would delete it
            node.set_status("rbln2", 4)
            groups = node.groups()
            before = snapshot(node.root)
            done = inspect_process(node, "--preferred", "2", "--resource", VF4, env=env)
            after = snapshot(node.root)
            assert node.groups() == groups
            assert not node.rsd_lock_path.exists()
        events = [json.loads(line) for line in audit_log.read_text().splitlines()]
    finally:
        shutil.rmtree(site, ignore_errors=True)
    assert done.returncode == 1, done.stdout + done.stderr  # rbln2 is faulted
    assert "answer: rbln0-0, rbln0-1" in done.stdout
    assert after == before
    assert [e for e in events if e["event"] == "exit"] == [{"event": "exit", "grpc": []}]
    assert not [e for e in events if e["event"] == "hook-error"]
    writes = [e for e in events if e["event"] == "open-for-write"]
    assert {e["path"] for e in writes} <= {os.devnull}  # rbln-smi's stdin
    changes = [e for e in events if e["event"].startswith(("os.", "shutil."))]
    assert changes == []
    assert [e for e in events if e["event"].startswith("fcntl.")] == []
    # asyncio's event loop wakes itself through an unnamed AF_UNIX socketpair; nothing is
    # ever bound, connected or listened on, and no other socket family appears.
    sockets = [e for e in events if e["event"].startswith("socket.")]
    assert {e["event"] for e in sockets} <= {"socket.__new__"}
    assert all(e["args"][0] in ("1", "<AddressFamily.AF_UNIX: 1>") for e in sockets), sockets
    spawns = [e for e in events if e["event"] == "spawn"]
    assert len(spawns) == 1  # rbln-smi -j, once, without a shell
    assert str(node.smi_path) in spawns[0]["args"][0] and "'-j'" in spawns[0]["args"][1]


def _sriov_with_a_faulted_vf() -> Layout:
    base = preset("rebel-sriov")
    faulted = dataclasses.replace(base.device("rbln0-2"), status="4\n")
    return base.with_devices(faulted if d.name == "rbln0-2" else d for d in base.devices)


@pytest.mark.parametrize(
    ("layout", "counts", "unhealthy"),
    [
        (_sriov_with_a_faulted_vf(), {NPU: 2, VF1: 1, VF4: 4}, ["rbln0-2"]),
        (preset("rebel-sriov-bad"), {NPU: 1, VF1: 0, VF4: 4}, []),
    ],
    ids=["rebel-sriov-with-a-fault", "rebel-sriov-bad"],
)
async def test_inspect_beside_a_running_daemon_reports_what_the_kubelet_sees(
    layout: Layout, counts: dict[str, int], unhealthy: list[str]
) -> None:
    async with running(layout, interval="1h") as h:
        for resource, count in counts.items():
            if count:
                await h.kubelet.wait_for(resource, lambda v, n=count: len(v.devices) == n)  # type: ignore[misc]
        registrations = len(h.kubelet.registrations)
        sockets = {name: (h.node.kubelet_dir / name).stat().st_ino for name in h.sockets()}
        done = await asyncio.to_thread(inspect_process, h.node, "--output", "json")
        document = json.loads(done.stdout)
        told: dict[str, str] = {}
        for resource in (NPU, VF1, VF4):
            view = h.kubelet.view(resource)
            assert (view is None) == (counts[resource] == 0)
            seen = {} if view is None else {d.ID: d.health for d in view.devices}
            reported = {
                d["device"]: d["health"]
                for d in document["devices"]
                if d["resourceName"] == resource
            }
            assert reported == seen, resource
            told.update(seen)
            view_counts = (
                (0, 0, 0)
                if view is None
                else (len(view.devices), view.count("Healthy"), view.count("Unhealthy"))
            )
            assert summary(document)[resource] == view_counts
            assert view_counts[0] == counts[resource]
        # The daemon's mode, and its sockets as the report's own mode's.
        assert document["mode"]["configured"] == "device-plugin"
        assert {
            Path(s["path"]).name: s["found"]
            for s in document["mode"]["sockets"]
            if s["mode"] == "device-plugin"
        } == {name: "socket" for name in h.sockets() if name != "kubelet.sock"}
        assert not [p for p in document["problems"] if p["kind"] == "other-mode-socket"]
        # Nothing changed for the daemon: same sockets, no new registration, still serving.
        assert len(h.kubelet.registrations) == registrations
        assert {n: (h.node.kubelet_dir / n).stat().st_ino for n in h.sockets()} == sockets
        assert h.daemon.proc.poll() is None
        assert h.daemon.find("ListAndWatch stream ended; registering again") == []
    assert [device for device, health in told.items() if health == "Unhealthy"] == unhealthy
    assert done.returncode == 1  # a faulted VF / an unsupported VF count


def test_demo_fails_the_inspect_step_when_inspect_fails(tmp_path: Path) -> None:
    out = io.StringIO()
    config = DemoConfig(
        inspect_command=lambda node: [sys.executable, "-c", "import sys; sys.exit('boom')"],
        daemon_command=lambda node: [sys.executable, "-c", "raise SystemExit(3)"],
        daemon_available=True,
        register_timeout=5.0,
        out=out,
    )
    assert run_demo(config) == 1
    text = out.getvalue()
    assert "[1] Inspect the node before starting the daemon" in text
    assert re.search(r"FAILED[ \t]+inspect exited with code 1: boom", text), text


def test_an_internal_error_is_one_record_on_stderr_never_a_bare_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def broken(_: object) -> None:
        raise RuntimeError("a bug in the report")

    monkeypatch.setattr(command, "build_report", broken)
    args = ["--sysfs-root", str(tmp_path), "--rbln-smi", str(tmp_path / "rbln-smi")]
    assert command.main(args, environ={}) == 1
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and record["err"] == "a bug in the report"


def test_ctrl_c_exits_130_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def interrupted(_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "gather", interrupted)
    assert command.main(["--sysfs-root", str(tmp_path)], environ={}) == 130
    assert capsys.readouterr() == ("", "")
