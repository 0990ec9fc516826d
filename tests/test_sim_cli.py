"""The rbln-device-plugin-sim console script, run as a real process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_device_plugin_sim import servecmd, shell
from rbln_device_plugin_sim.layout import PRESETS, preset
from rbln_device_plugin_sim.node import SimNode, materialize, short_tempdir

from .daemon_process import DaemonProcess

SIM = [sys.executable, "-c", "import sys; from rbln_device_plugin_sim.cli import main; "
       "sys.exit(main())"]  # fmt: skip


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("rbln-c-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_presets_lists_every_preset() -> None:
    out = subprocess.run([*SIM, "presets"], capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == list(PRESETS)
    assert "atom-max-8        32 devices" in out


def test_usage_errors_exit_2_without_a_traceback() -> None:
    result = subprocess.run([*SIM, "serve"], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "--root" in result.stderr and "Traceback" not in result.stderr


def test_materialize_from_a_layout_file(root: Path) -> None:
    layout = root / "mine.json"
    subprocess.run([*SIM, "materialize", "--preset", "rebel-4", "--root", str(root / "a")],
                   check=True, capture_output=True)  # fmt: skip
    shutil.copy(root / "a" / "layout.json", layout)
    result = subprocess.run(
        [*SIM, "materialize", "--layout", str(layout), "--root", str(root / "b")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert SimNode.open(root / "b").layout == SimNode.open(root / "a").layout
    layout.write_text("{not json")
    bad = subprocess.run(
        [*SIM, "materialize", "--layout", str(layout), "--root", str(root / "c")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "layout is not JSON" in bad.stderr


class Serve:
    """``serve`` as a real process; its output collected line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*SIM, "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        else:
            raise AssertionError(f"no banner: {''.join(self.lines)}")
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        """Until serve has printed ``text`` (an event of its kubelet stand-in)."""
        with self._changed:
            if not self._changed.wait_for(lambda: text in "".join(self.lines), timeout):
                raise AssertionError(f"serve never printed {text!r}: {''.join(self.lines)}")

    @property
    def banner(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=30)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIM, *args], capture_output=True, text=True, check=False)


def test_serve_runs_a_kubelet_stub_until_interrupted(root: Path) -> None:
    node_root = root / "n"
    serve = Serve("--preset", "rebel-4", "--root", str(node_root))
    try:
        text = serve.banner
        assert f"node rebel-4: 4 devices under {node_root}, built" in text
        assert "-m rbln_device_plugin --sysfs-root" in text.replace(" \\\n     ", "")
        assert f"--kubelet-device-plugin-path {node_root}/kubelet" in text
        socket = node_root / "kubelet" / "kubelet.sock"
        assert socket.exists() and (node_root / "sim-control.sock").exists()
        assert serve.stop() == 0
        assert not socket.exists()  # the stub stopped; the node stays for inspection
        assert not (node_root / "sim-control.sock").exists()
        assert os.path.exists(node_root / "layout.json")
        assert serve.lines[-1] == f"stopped; the node stays under {node_root}\n"
    finally:
        serve.kill()


def test_serve_never_ignores_a_preset_for_an_existing_node(root: Path) -> None:
    node_root = root / "n"
    assert run("materialize", "--preset", "rebel-sriov", "--root", str(node_root)).returncode == 0
    other = run("serve", "--preset", "atom-max-8", "--root", str(node_root))
    assert other.returncode == 1
    assert f"{node_root} already holds a simulated node (rebel-sriov)" in other.stderr
    assert "pass --force to replace it with atom-max-8" in other.stderr
    for args in ((), ("--preset", "rebel-sriov")):
        serve = Serve(*args, "--root", str(node_root))
        try:
            assert "node rebel-sriov: 9 devices under" in serve.banner
            assert "reopened as it was left (--force rebuilds it)" in serve.banner
        finally:
            assert serve.stop() == 0
    serve = Serve("--preset", "atom-max-8", "--force", "--root", str(node_root))
    try:
        assert "replaced the rebel-sriov node; built" in serve.banner
        assert SimNode.open(node_root).layout.name == "atom-max-8"
    finally:
        assert serve.stop() == 0


def test_a_second_serve_on_one_root_is_refused(root: Path) -> None:
    node_root = root / "n"
    serve = Serve("--preset", "rebel-4", "--root", str(node_root))
    try:
        second = run("serve", "--root", str(node_root))
        forced = run("materialize", "--force", "--root", str(node_root))
    finally:
        assert serve.stop() == 0
    assert second.returncode == 1 and "already running on" in second.stderr
    assert forced.returncode == 1 and "stop it (Ctrl-C) before --force" in forced.stderr
    # A serve that died leaves its control socket; the next one replaces it.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(node_root / "sim-control.sock"))
    dead.close()
    again = Serve("--root", str(node_root))
    assert again.stop() == 0


def test_materialize_replaces_a_node_only_with_force(root: Path) -> None:
    node_root = root / "n"
    assert run("materialize", "--preset", "rebel-4", "--root", str(node_root)).returncode == 0
    (node_root / "notes.txt").write_text("mine")
    again = run("materialize", "--preset", "rebel-sriov-bad", "--root", str(node_root))
    assert again.returncode == 1
    assert "already holds a simulated node (rebel-4); pass --force" in again.stderr
    forced = run("materialize", "--force", "--preset", "rebel-sriov-bad", "--root", str(node_root))
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == (
        f"replaced the rebel-4 node; built rebel-sriov-bad (9 devices) under {node_root}\n"
    )
    assert SimNode.open(node_root).layout.name == "rebel-sriov-bad"
    assert (node_root / "notes.txt").read_text() == "mine"  # only the node's own files go


def test_every_command_that_changes_the_node_says_what_it_changed(root: Path) -> None:
    node_root = str(root / "n")
    assert run("materialize", "--preset", "rebel-sriov", "--root", node_root).returncode == 0
    device = json.dumps({"name": "rbln9", "npu": 9, "product": "RBLN-CR13",
                         "bus_id": "0000:99:00.0"})  # fmt: skip
    expected = {
        ("set-status", "rbln2", "4"): "rbln2: status file now reads 4 (FAULT)",
        ("set-status", "rbln2", "0"): "rbln2: status file now reads 0 (READY)",
        ("set-status", "rbln2", "--raw", "garbage"):
            "rbln2: status file now holds 'garbage' (not a status code: UNREADABLE)",
        ("set-status", "rbln2", "--delete"):
            "rbln2: status file deleted (the daemon reads it as UNREADABLE)",
        ("fault", "error", "--only", "list", "--times", "2"):
            "rbln-smi now fails (exit 1) on list, the next 2 time(s); undo with: ",
        ("fault", "slow", "--delay", "2"): "rbln-smi now answers after 2 s on every call",
        ("fault", "clear"): "rbln-smi behaves again (2 fault(s) cleared)",
        ("add-device", device): "added rbln9 (RBLN-CR13 at 0000:99:00.0, listed by rbln-smi)",
        ("repartition", "rbln3", "4"): "rbln3: 4 VF(s) rbln3-0 rbln3-1 rbln3-2 rbln3-3",
        ("remove-device", "rbln1"): "removed rbln1-0 rbln1",
    }  # fmt: skip
    for (command, *rest), said in expected.items():
        done = run(command, "--root", node_root, *rest)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(said), (command, rest, done.stdout)
    node = SimNode.open(Path(node_root))
    assert node.status_path("rbln2").exists() is False
    assert not node.store.read().faults


def test_kubelet_commands_without_a_serve_say_how_to_start_one(root: Path) -> None:
    node_root = root / "n"
    assert run("materialize", "--preset", "rebel-4", "--root", str(node_root)).returncode == 0
    for args in (("preferred", "--size", "1"), ("allocate", "rbln0"), ("restart-kubelet",)):
        done = run(args[0], "--root", str(node_root), *args[1:])
        assert done.returncode == 1
        assert f"no `serve` is running on {node_root}" in done.stderr
        assert f"serve --root {node_root}" in done.stderr
    both = run("allocate", "--root", str(node_root), "rbln0", "--size", "1")
    assert both.returncode == 2 and "device IDs or --size, not both" in both.stderr


def test_commands_are_spelled_the_way_the_simulator_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in (shell.SIM_PROG, shell.DAEMON_PROG):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    relative = f"venv/bin/{shell.SIM_PROG}"
    assert shell.program(shell.DAEMON_PROG, relative) == ["venv/bin/rbln-device-plugin"]
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    absolute = str(bin_dir / shell.SIM_PROG)
    assert shell.program(shell.DAEMON_PROG, absolute) == ["rbln-device-plugin"]
    assert shell.program(shell.DAEMON_PROG, "-c") == [sys.executable, "-m", "rbln_device_plugin"]
    wrapped = shell.wrap(["prog", *(f"--flag{i} /some/long/path/{i}" for i in range(6))])
    assert all(len(line) <= 90 for line in wrapped.splitlines())
    assert "\\\n" in wrapped


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_serve_banner_suggests_a_device_the_daemon_advertises(name: str, root: Path) -> None:
    node = materialize(preset(name), root / "n")
    banner = servecmd.banner(node, "built").replace(" \\\n", " ")
    fault = next(line for line in banner.splitlines() if " set-status " in line)
    device = fault.split(" set-status ")[1].split()[2]
    # The daemon's own inspect decides what is advertised (the simulator only guesses).
    done = subprocess.run(
        [sys.executable, "-m", "rbln_device_plugin", "inspect", "--output", "json",
         "--sysfs-root", str(node.sysfs_root), "--rbln-smi", str(node.smi_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    advertised = {d["device"]: d["resourceName"] for d in report["devices"] if d["resourceName"]}
    assert device in advertised, (device, advertised)
    allocate = next(line for line in banner.splitlines() if " allocate " in line)
    size = int(allocate.split("--size ")[1].split()[0])
    resource = allocate.split("--resource ")[1].split()[0] if "--resource" in allocate else None
    assert 0 < size <= sum(1 for r in advertised.values() if r == (resource or "rebellions.ai/npu"))


def test_kubelet_commands_through_serve_act_as_the_kubelet(root: Path) -> None:
    node_root = root / "n"
    serve = Serve("--preset", "rebel-sriov", "--root", str(node_root))
    node = SimNode.open(node_root)
    daemon = None
    try:
        idle = run("restart-kubelet", "--root", str(node_root), "--wait", "0")
        assert idle.returncode == 0 and "no plugin was registered before" in idle.stdout
        daemon = DaemonProcess(node.daemon_args("200ms"), level="info")
        daemon.wait_for("Registered device plugin with kubelet", count=3)
        node.set_status("rbln3", 4)  # Unhealthy: the kubelet offers only rbln2 now
        serve.wait_for("rebellions.ai/npu: 2 devices, 1 Healthy, 1 Unhealthy")
        first = run("allocate", "--root", str(node_root), "--size", "1")
        assert first.returncode == 0, first.stderr
        assert "GetPreferredAllocation rebellions.ai/npu, size 1 of 1 available: rbln2" in (
            first.stdout
        )
        assert re.search(r"/dev/rsd0[ \t]+-> ", first.stdout), first.stdout
        assert re.search(r"/dev/rbln2[ \t]+-> ", first.stdout), first.stdout
        # rbln2 is taken and rbln3 faulted: as the kubelet, nothing is left to offer.
        again = run("allocate", "--root", str(node_root), "--size", "1")
        assert again.returncode == 1
        assert "unavailable for rebellions.ai/npu. Requested: 1, Available: 0" in again.stderr
        unknown = run("allocate", "--root", str(node_root), "rbln9")
        assert unknown.returncode == 1
        assert "Allocate refused: INVALID_ARGUMENT: rebellions.ai/npu: unknown device" in (
            unknown.stderr
        )
        restart = run("restart-kubelet", "--root", str(node_root))
        assert restart.returncode == 0, restart.stdout
        assert "3 plugin socket(s) deleted" in restart.stdout
        for resource in ("rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"):
            assert f"  {resource}: registered again after " in restart.stdout
        vf4 = run("preferred", "--root", str(node_root), "--size", "2",
                  "--resource", "rebellions.ai/npu-vf4")  # fmt: skip
        assert "size 2 of 4 available: rbln0-0, rbln0-1" in vf4.stdout
    finally:
        if daemon is not None:
            assert daemon.stop(signal.SIGINT) == 0
        assert serve.stop() == 0
    events = "".join(serve.lines)
    assert "Allocate rebellions.ai/npu rbln2 -> rsd1" in events
    assert "kubelet restarted: cleaned (non-directories), new kubelet.sock" in events
