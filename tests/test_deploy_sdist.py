"""The source distribution carries what the test suite reads, and the deployment tests skip
cleanly (no errors) in a source tree that lacks the deployment files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

# Builds and unpacks a source distribution.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Directories the tests read besides src/: the chart, the image sources and fetch-tools.sh,
# the example pods, the simulator project, the node layouts in bench/, and the tests.
NEEDED = ("deployments", "examples", "bench", "tests", "proto", "sim")
DEPLOY_TESTS = ("test_deploy_chart", "test_deploy_image", "test_deploy_examples",
                "test_deploy_tools")  # fmt: skip


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        cmd, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )


def tracked(*paths: str) -> set[str]:
    done = run(["git", "-C", str(REPO), "ls-files", "--", *paths])
    if done.returncode != 0:
        pytest.skip("not a git checkout (e.g. already an unpacked sdist)")
    return {line for line in done.stdout.splitlines() if (REPO / line).exists()}


def test_sdist_ships_every_file_the_tests_read(tmp_path: Path) -> None:
    needed = tracked(*NEEDED)
    done = run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(REPO)])
    if (
        done.returncode != 0
        and "hatchling" in done.stdout + done.stderr
        and ("No matching distribution" in done.stdout + done.stderr)
    ):
        pytest.skip("the build backend cannot be fetched from this machine")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = sorted(needed - members)
    assert not missing, f"missing from the sdist: {missing}"
    assert not {m for m in members if m.startswith((".tools/", ".venv/"))}


def test_deployment_tests_skip_cleanly_without_deployment_files(tmp_path: Path) -> None:
    # A tree with the tests and the project configuration but no deployments/ or examples/;
    # one ordinary test module runs alongside to show the rest of the suite is unaffected.
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO / "tests", tmp_path / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/test_config.py", *(f"tests/{name}.py" for name in DEPLOY_TESTS)],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert " passed, " in output and f"{len(DEPLOY_TESTS)} skipped" in output
    assert "error" not in output.lower()
    assert "is not in this source tree" in output
