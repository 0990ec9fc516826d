"""The container image, checked without a Docker engine.

hadolint lints the Dockerfile; the Makefile runs against a stand-in `docker` that records its
arguments; and the wheel the image installs is built from exactly the files the Dockerfile
copies, then installed with its dependencies into a fresh virtualenv.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTAINER = REPO / "deployments" / "container"
DOCKERFILE = CONTAINER / "Dockerfile"
MAKEFILE = CONTAINER / "Makefile"
HADOLINT = Path(sys.executable).with_name("hadolint")
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        cmd, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )


def instructions() -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, words) per Dockerfile instruction, continuation lines joined."""
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    result = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            words = line.split()
            result.append((words[0].upper(), words[1:]))
    return result


def copied_sources() -> list[str]:
    """Paths the Dockerfile copies from the build context (not from another stage)."""
    sources: list[str] = []
    for op, words in instructions():
        if op == "COPY" and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[:-1] if not w.startswith("--")]
    return sources


def test_dockerfile_passes_hadolint() -> None:
    done = run([str(HADOLINT), str(DOCKERFILE)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_flags_an_unpinned_base_image(tmp_path: Path) -> None:
    # Proves the lint step has teeth: the same file with a floating tag must fail.
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("python:3.11-slim-bookworm", "python:latest"))
    done = run([str(HADOLINT), str(bad)])
    assert done.returncode != 0
    assert "DL3007" in done.stdout


def test_image_runs_the_packaged_entry_point_on_python_311_slim() -> None:
    ops = instructions()
    entrypoints = [words for op, words in ops if op == "ENTRYPOINT"]
    assert entrypoints == [['["rbln-device-plugin"]']]
    assert "rbln-device-plugin" in PROJECT["scripts"]
    bases = [words[0] for op, words in ops if op == "FROM"]
    assert len(bases) == 2, "expected a wheel-building stage and a runtime stage"
    assert all(base.startswith("python:3.11-slim") for base in bases)


def test_build_context_allow_list_covers_every_copied_path() -> None:
    ignore = (CONTAINER / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = copied_sources()
    assert sources, "Dockerfile copies nothing from the context"
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: missing from the repository"
        assert source.rstrip("/") in allowed, f"COPY {source}: excluded by the dockerignore"


def fake_docker(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "docker-calls"
    script = tmp_path / "docker"
    script.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\n')
    script.chmod(0o755)
    return script, log


def make_build(tmp_path: Path, *assignments: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    docker, log = fake_docker(tmp_path)
    # Run from elsewhere, the way the README invokes it from the repository root.
    done = run(
        ["make", "-s", "-f", str(MAKEFILE), "build", f"DOCKER={docker}", *assignments],
        cwd=tmp_path,
    )
    return done, log


def test_build_without_push_only_builds_from_the_repo_root(tmp_path: Path) -> None:
    done, log = make_build(
        tmp_path, "IMAGE_NAME=registry.example.com/k8s-device-plugin", "VERSION=1.2.3"
    )
    assert done.returncode == 0, done.stderr
    (call,) = log.read_text().splitlines()
    words = call.split()
    assert words[0] == "build"
    assert words[words.index("--file") + 1] == str(DOCKERFILE)
    assert words[words.index("--tag") + 1] == "registry.example.com/k8s-device-plugin:1.2.3"
    assert "VERSION=1.2.3" in words
    assert words[-1] == str(REPO)


def test_build_with_push_pushes_the_built_tag(tmp_path: Path) -> None:
    done, log = make_build(
        tmp_path, "IMAGE_NAME=registry.example.com/k8s-device-plugin", "VERSION=1.2.3",
        "PUSH_ON_BUILD=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    build, push = log.read_text().splitlines()
    assert build.startswith("build ")
    assert push == "push registry.example.com/k8s-device-plugin:1.2.3"


def test_version_defaults_to_the_package_version(tmp_path: Path) -> None:
    done, log = make_build(tmp_path, "IMAGE_NAME=k8s-device-plugin")
    assert done.returncode == 0, done.stderr
    assert f"k8s-device-plugin:{PROJECT['version']}" in log.read_text().split()


def test_bad_push_flag_fails_before_docker_runs(tmp_path: Path) -> None:
    done, log = make_build(tmp_path, "IMAGE_NAME=x", "VERSION=1", "PUSH_ON_BUILD=yes")
    assert done.returncode != 0
    assert "PUSH_ON_BUILD must be true or false" in done.stderr
    assert not log.exists()


def test_static_check_target_passes_without_a_docker_engine(tmp_path: Path) -> None:
    done = run(["make", "-s", "-f", str(MAKEFILE), "check", "DOCKER=/nonexistent"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ".whl" in done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built the way the image's first stage builds it, from only what it copies."""
    context = tmp_path_factory.mktemp("image-context")
    for source in copied_sources():
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(
                origin, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(origin, context / source)
    dist = tmp_path_factory.mktemp("dist")
    done = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), "."],
        cwd=context,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = dist.glob("*.whl")
    return built


def test_wheel_installs_into_a_fresh_venv_with_a_working_cli(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = run([sys.executable, "-m", "venv", str(venv)])
    assert done.returncode == 0, done.stderr
    # A clean environment: nothing from this test run's venv may leak into the install.
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    done = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], env=env)
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip(f"dependencies unreachable from this machine: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr

    done = run([str(venv / "bin" / "rbln-device-plugin"), "--version"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", "stdout is reserved for the log stream"
    assert PROJECT["version"] in done.stderr
