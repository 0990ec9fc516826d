"""``make demo`` installs only what the demo needs, visibly, and ``make test`` still works
after it. The real Makefile runs in a scratch copy; the venv's python is a script that
records how it was called (a real install needs the registries and a minute)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECORDER = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls.log"
"""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy2(REPO / "Makefile", tmp_path / "Makefile")
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "sim").mkdir()
    shutil.copy2(REPO / "sim" / "pyproject.toml", tmp_path / "sim" / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "rbln-device-plugin-sim"):
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    return tmp_path


def make(clone: Path, *targets: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *targets],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def calls(clone: Path) -> list[str]:
    log = clone / ".venv" / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return lines


def test_demo_installs_the_runtime_only_with_pips_progress(clone: Path) -> None:
    out = make(clone, "demo")
    assert "Installing the daemon and the simulator into .venv (runtime only" in out
    installs = [c for c in calls(clone) if c.startswith("-m pip install")]
    assert installs == [
        "-m pip install --upgrade --progress-bar on pip",
        "-m pip install --progress-bar on -e . -e ./sim",
    ]
    assert (clone / ".venv" / ".runtime-stamp").exists()
    assert not (clone / ".venv" / ".installed-stamp").exists()
    # Once installed, the demo just runs.
    make(clone, "demo")
    assert calls(clone) == ["demo"]


def test_a_full_install_after_the_demo_adds_the_tools_and_covers_the_demo(clone: Path) -> None:
    make(clone, "demo")
    calls(clone)
    make(clone, "install")
    assert "-m pip install --quiet -e .[dev] -e ./sim" in calls(clone)
    make(clone, "demo")
    assert calls(clone) == ["demo"]


def test_an_older_full_install_serves_the_demo_without_installing(clone: Path) -> None:
    (clone / ".venv" / ".installed-stamp").touch()
    make(clone, "demo")
    assert calls(clone) == ["demo"]
    assert (clone / ".venv" / ".runtime-stamp").exists()


def test_test_says_how_long_it_takes_and_what_it_needs_before_anything_runs(
    clone: Path,
) -> None:
    planned = make(clone, "-n", "test").splitlines()
    banner = [i for i, line in enumerate(planned) if "make test:" in line]
    work = [i for i, line in enumerate(planned) if not line.startswith("echo ")]
    assert banner and work and banner[0] < work[0], planned
    said = make(clone, "test-banner")
    assert "minutes" in said and "Go 1.26+" in said and "Python 3.11+" in said
