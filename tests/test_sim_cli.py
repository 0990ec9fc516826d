"""The rbln-device-plugin-sim console script, run as a real process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_device_plugin_sim.layout import PRESETS
from rbln_device_plugin_sim.node import SimNode, short_tempdir

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


def test_serve_runs_a_kubelet_stub_until_interrupted(root: Path) -> None:
    node_root = root / "n"
    proc = subprocess.Popen(
        [*SIM, "serve", "--preset", "rebel-4", "--root", str(node_root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(lines)
        assert "-m rbln_device_plugin --sysfs-root" in text
        assert f"--kubelet-device-plugin-path {node_root}/kubelet" in text
        socket = node_root / "kubelet" / "kubelet.sock"
        deadline = time.monotonic() + 30  # a hang guard: the stub starts at once
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket.exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert not socket.exists()  # the stub stopped; the node stays for inspection
        assert os.path.exists(node_root / "layout.json")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
