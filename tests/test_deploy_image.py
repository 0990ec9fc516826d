"""The container image, checked without a Docker engine.

hadolint lints the Dockerfile; the Makefile runs against a stand-in `docker` that records its
arguments; the static `check` target and its pieces (lock freshness, labels, no pip) are run
for real and against broken copies; the entrypoint wrapper is run as PID 1 in a PID
namespace; and the image's application virtualenv is rebuilt outside Docker exactly as the
Dockerfile's first stage builds it (locked, hash-checked requirements; VERSION as the
package version), then run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rbln_device_plugin import _build_version

REPO = Path(__file__).resolve().parents[1]
CONTAINER = REPO / "deployments" / "container"
DOCKERFILE = CONTAINER / "Dockerfile"
MAKEFILE = CONTAINER / "Makefile"
LOCK = CONTAINER / "requirements.lock"
ENTRYPOINT = CONTAINER / "entrypoint.sh"
IMAGE_DAEMON = "/opt/rbln-device-plugin/bin/rbln-device-plugin"  # the wrapper's target
VENV_BIN = Path(sys.executable).parent  # the tools of the venv running these tests
HADOLINT = VENV_BIN / "hadolint"
if not DOCKERFILE.is_file():  # e.g. a source tree without deployments/
    pytest.skip("the container sources are not in this source tree", allow_module_level=True)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        cmd, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, words) per instruction; continuation lines joined."""
    lines = path.read_text().replace("\\\n", " ").splitlines()
    return [
        (line.split()[0].upper(), line.split()[1:])
        for line in lines
        if line.strip() and not line.lstrip().startswith("#")
    ]


def stages(path: Path = DOCKERFILE) -> list[list[tuple[str, list[str]]]]:
    """The instructions grouped by stage (the global ARGs before the first FROM left out)."""
    result: list[list[tuple[str, list[str]]]] = []
    for op, words in instructions(path):
        if op == "FROM":
            result.append([])
        if result:
            result[-1].append((op, words))
    return result


def copied_sources() -> list[str]:
    """Paths the Dockerfile copies from the build context (not from another stage)."""
    sources: list[str] = []
    for stage in stages():
        for op, words in stage:
            if op == "COPY" and not any(w.startswith("--from") for w in words):
                sources += [w for w in words[:-1] if not w.startswith("--")]
    return sources


def make(target: str, *assignments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Run from elsewhere, the way the README invokes it from the repository root.
    return run(
        ["make", "-s", "-f", str(MAKEFILE), target, f"VENV_BIN={VENV_BIN}", *assignments], cwd=cwd
    )


def test_dockerfile_passes_hadolint() -> None:
    done = run([str(HADOLINT), str(DOCKERFILE)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_flags_an_unpinned_base_image(tmp_path: Path) -> None:
    # Proves the lint step has teeth: the same file with a floating tag must fail.
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("FROM ${BASE}", "FROM python:latest"))
    done = run([str(HADOLINT), str(bad)])
    assert done.returncode != 0
    assert "DL3007" in done.stdout


def test_runtime_stage_runs_the_plugin_under_tini() -> None:
    build, runtime = stages()
    # Both stages start from BASE, whose default is the pinned official image (the
    # real-node tests pass a local Debian base instead).
    assert [w[0] for op, w in (build[0], runtime[0])] == ["${BASE}"] * 2
    assert ("ARG", ["BASE=python:3.11-slim-bookworm"]) in instructions()[
        : instructions().index(("FROM", build[0][1]))
    ]
    runs = " ".join(" ".join(words) for op, words in runtime if op == "RUN")
    assert "apt-get install -y --no-install-recommends 'tini=0.19.0-1*'" in runs
    copies = [words for op, words in runtime if op == "COPY"]
    assert ["--chmod=0755", "deployments/container/entrypoint.sh",
            "/usr/local/bin/rbln-device-plugin"] in copies  # fmt: skip
    assert [words for op, words in runtime if op == "ENTRYPOINT"] == [['["rbln-device-plugin"]']]


def test_no_pip_or_setuptools_reaches_the_runtime_stage() -> None:
    build, runtime = stages()
    runs = " ".join(" ".join(words) for op, words in runtime if op == "RUN")
    assert "python -m pip uninstall -y pip setuptools wheel" in runs
    assert "rm -rf /usr/local/lib/python3.11/ensurepip/_bundled" in runs
    # The application virtualenv copied in is created without pip.
    build_runs = " ".join(" ".join(words) for op, words in build if op == "RUN")
    assert "python -m venv --without-pip /opt/rbln-device-plugin" in build_runs
    assert ["--from=build", "/opt/rbln-device-plugin", "/opt/rbln-device-plugin"] in [
        words for op, words in runtime if op == "COPY"
    ]


def test_build_context_allow_list_covers_every_copied_path() -> None:
    ignore = (CONTAINER / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = copied_sources()
    assert "deployments/container/requirements.lock" in sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: missing from the repository"
        assert source.rstrip("/") in allowed, f"COPY {source}: excluded by the dockerignore"


def test_dockerfile_and_makefile_default_to_the_package_version(tmp_path: Path) -> None:
    version_args = [
        words[0] for stage in stages() for op, words in stage if op == "ARG"
        if words[0].startswith("VERSION=")
    ]  # fmt: skip
    assert version_args == [f"VERSION={_build_version.DEFAULT}"] * 2
    done, calls = make_build(tmp_path, "IMAGE_NAME=k8s-device-plugin")
    assert done.returncode == 0, done.stderr
    assert f"k8s-device-plugin:{_build_version.DEFAULT}" in calls[0]


# ---------------------------------------------------------------- the Makefile's build target


def fake_docker(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "docker-calls"
    script = tmp_path / "docker"
    script.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\n')
    script.chmod(0o755)
    return script, log


def make_build(
    tmp_path: Path, *assignments: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    docker, log = fake_docker(tmp_path)
    done = run(
        [
            "make",
            "-s",
            "-f",
            str(MAKEFILE),
            "build",
            f"DOCKER={docker}",
            f"VENV_BIN={VENV_BIN}",
            *assignments,
        ],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def build_args(words: list[str]) -> dict[str, str]:
    pairs = [words[i + 1] for i, w in enumerate(words) if w == "--build-arg"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_build_defaults_to_linux_amd64_with_every_label_argument(tmp_path: Path) -> None:
    done, calls = make_build(
        tmp_path, "IMAGE_NAME=registry.example.com/k8s-device-plugin", "VERSION=1.2.3"
    )
    assert done.returncode == 0, done.stderr
    (words,) = calls
    assert words[0] == "build"
    assert words[words.index("--file") + 1] == str(DOCKERFILE)
    assert words[words.index("--platform") + 1] == "linux/amd64"
    assert words[words.index("--tag") + 1] == "registry.example.com/k8s-device-plugin:1.2.3"
    args = build_args(words)
    assert args["VERSION"] == "1.2.3"
    assert args["RELEASE"] == "1"
    head = run(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    assert args["REVISION"] == (head.stdout.strip() if head.returncode == 0 else "unknown")
    assert args["SOURCE"]
    assert words[-1] == str(REPO)


def test_source_label_drops_credentials_from_the_remote_url(tmp_path: Path) -> None:
    if run(["git", "-C", str(REPO), "rev-parse", "HEAD"]).returncode != 0:
        pytest.skip("not a git checkout")
    remote = {  # git reads extra configuration from these variables
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "remote.origin.url",
        "GIT_CONFIG_VALUE_0": "https://ci-bot:s3cret@git.example.com/npu/rbln-device-plugin.git",
    }
    done, calls = make_build(tmp_path, "IMAGE_NAME=x", "VERSION=1", env=remote)
    assert done.returncode == 0, done.stderr
    assert build_args(calls[0])["SOURCE"] == "https://git.example.com/npu/rbln-device-plugin.git"


def test_build_with_push_pushes_the_built_tag(tmp_path: Path) -> None:
    done, calls = make_build(
        tmp_path, "IMAGE_NAME=registry.example.com/k8s-device-plugin", "VERSION=1.2.3",
        "PUSH_ON_BUILD=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    build, push = calls
    assert build[0] == "build"
    assert push == ["push", "registry.example.com/k8s-device-plugin:1.2.3"]


def test_multi_platform_build_goes_through_buildx_and_pushes(tmp_path: Path) -> None:
    done, calls = make_build(
        tmp_path, "IMAGE_NAME=registry.example.com/k8s-device-plugin", "VERSION=1.2.3",
        "PLATFORM=linux/amd64,linux/arm64", "PUSH_ON_BUILD=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (words,) = calls
    assert words[:2] == ["buildx", "build"]
    assert words[words.index("--platform") + 1] == "linux/amd64,linux/arm64"
    assert "--push" in words


def test_multi_platform_build_without_push_is_refused_before_docker_runs(tmp_path: Path) -> None:
    done, calls = make_build(tmp_path, "IMAGE_NAME=x", "PLATFORM=linux/amd64,linux/arm64")
    assert done.returncode != 0
    assert "PUSH_ON_BUILD=true" in done.stderr
    assert not calls


def test_bad_push_flag_fails_before_docker_runs(tmp_path: Path) -> None:
    done, calls = make_build(tmp_path, "IMAGE_NAME=x", "VERSION=1", "PUSH_ON_BUILD=yes")
    assert done.returncode != 0
    assert "PUSH_ON_BUILD must be true or false" in done.stderr
    assert not calls


# ------------------------------------------------------------------- static checks, no engine


@pytest.mark.slow  # installs the image's virtualenv or builds the wheel
def test_static_check_target_passes_without_a_docker_engine(tmp_path: Path) -> None:
    done = make("check", "DOCKER=/nonexistent", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "requirements.lock: " in done.stdout and "current with pyproject.toml" in done.stdout
    assert "sets all 14 required labels" in done.stdout
    assert "ships without pip or setuptools" in done.stdout
    assert f"rbln_device_plugin-{_build_version.DEFAULT}-py3-none-any.whl" in done.stdout


def test_check_without_the_development_tools_says_what_to_install(tmp_path: Path) -> None:
    done = run(
        ["make", "-s", "-f", str(MAKEFILE), "check", f"VENV_BIN={tmp_path / 'none'}"],
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "hadolint: not found" in done.stderr and "run 'make install'" in done.stderr
    assert "No such file or directory" not in done.stderr


def test_lock_pins_every_runtime_dependency_with_hashes() -> None:
    text = LOCK.read_text().replace("\\\n", " ")
    pins = [line.split()[0] for line in text.splitlines() if line and not line.startswith(" ")
            and not line.startswith("#")]  # fmt: skip
    assert pins and all(re.fullmatch(r"[a-z0-9._-]+==\S+", pin) for pin in pins), pins
    names = {pin.split("==")[0] for pin in pins}
    assert {"grpcio", "protobuf", "grpcio-health-checking", "structlog", "opentelemetry-sdk",
            "opentelemetry-exporter-otlp-proto-grpc", "pyyaml"} <= names  # fmt: skip
    for line in text.splitlines():
        if "==" in line and not line.startswith("#"):
            assert "--hash=sha256:" in line, f"unhashed pin: {line.split()[0]}"


def test_stale_lock_fails_the_check(tmp_path: Path) -> None:
    # As if pyproject.toml's requirements changed after the lock was generated.
    stale = tmp_path / "requirements.lock"
    stale.write_text(re.sub(r"(# inputs-sha256: )\w+", r"\g<1>" + "0" * 64, LOCK.read_text()))
    done = make("check-lock", f"LOCK={stale}", cwd=tmp_path)
    assert done.returncode != 0
    assert "make -f deployments/container/Makefile lock" in done.stderr


def test_lock_with_an_unhashed_pin_fails_the_check(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK.read_text() + "six==1.17.0\n")
    done = make("check-lock", f"LOCK={lock}", cwd=tmp_path)
    assert done.returncode != 0
    assert "six==1.17.0 has no sha256 hash" in done.stderr


def test_lock_target_writes_a_lock_the_check_accepts(tmp_path: Path) -> None:
    # A stand-in uv that "resolves" to the committed pins, so this runs offline.
    body = "".join(
        line + "\n" for line in LOCK.read_text().splitlines() if not line.startswith("# ")
    )
    (tmp_path / "resolved.txt").write_text(body)
    uv = tmp_path / "uv"
    uv.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/uv-args\ncat {tmp_path}/resolved.txt\n')
    uv.chmod(0o755)
    lock = tmp_path / "requirements.lock"
    done = make("lock", f"UV={uv}", f"LOCK={lock}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "uv-args").read_text().split()
    assert args[:3] == ["pip", "compile", "pyproject.toml"]
    assert "--generate-hashes" in args
    assert args[args.index("--python-version") + 1] == "3.11"
    assert lock.read_text() == LOCK.read_text()
    assert make("check-lock", f"LOCK={lock}", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("label", ["org.opencontainers.image.revision", "release", "summary"])
def test_missing_label_fails_the_check(tmp_path: Path, label: str) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text(re.sub(rf'\s{re.escape(label)}=("[^"]*"|\S+)', " ", DOCKERFILE.read_text()))
    done = make("check-labels", f"DOCKERFILE={broken}", cwd=tmp_path)
    assert done.returncode != 0
    assert label in done.stderr


def test_runtime_stage_keeping_pip_fails_the_check(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace("pip uninstall -y pip setuptools", "true"))
    done = make("check-no-pip", f"DOCKERFILE={broken}", cwd=tmp_path)
    assert done.returncode != 0
    assert "does not uninstall pip" in done.stderr


# ------------------------------------------------------------------------ entrypoint wrapper


def wrapper_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The real wrapper with its two absolute paths pointed at recording stand-ins."""
    record = tmp_path / "exec-record"
    for name in ("tini", "daemon"):
        stub = tmp_path / name
        stub.write_text(f'#!/bin/sh\necho "{name} $$ $*" >> {record}\n')
        stub.chmod(0o755)
    text = ENTRYPOINT.read_text()
    assert "/usr/bin/tini" in text and IMAGE_DAEMON in text
    text = text.replace("/usr/bin/tini", str(tmp_path / "tini"))
    text = text.replace(IMAGE_DAEMON, str(tmp_path / "daemon"))
    wrapper = tmp_path / "rbln-device-plugin"
    wrapper.write_text(text)
    wrapper.chmod(0o755)
    return wrapper, record


def test_wrapper_started_normally_runs_the_daemon_itself(tmp_path: Path) -> None:
    wrapper, record = wrapper_copy(tmp_path)
    done = run([str(wrapper), "--device-scan-interval", "10s"])
    assert done.returncode == 0, done.stderr
    (line,) = record.read_text().splitlines()
    name, _, args = line.split(" ", 2)
    assert (name, args) == ("daemon", "--device-scan-interval 10s")


def test_wrapper_as_pid_1_runs_the_daemon_under_tini(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare not available")
    wrapper, record = wrapper_copy(tmp_path)
    done = run([unshare, "--pid", "--fork", str(wrapper), "--healthcheck-port", "1"])
    if done.returncode != 0 and not record.exists():
        pytest.skip(f"cannot create a PID namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    (line,) = record.read_text().splitlines()
    # tini was exec'd in place of the wrapper (still PID 1), with the daemon after `--`.
    assert line == f"tini 1 -- {tmp_path / 'daemon'} --healthcheck-port 1"


# --------------------------------------------- the image's virtualenv, built outside Docker


def test_build_version_mapping() -> None:
    build = _build_version.build_version
    default = _build_version.DEFAULT
    assert build(None) == build("") == build("  ") == default
    assert build("1.2.0") == "1.2.0"
    assert build("v1.2.0") == "1.2.0"
    assert build("1.2.0-rc.1") == "1.2.0rc1"
    assert build("latest") == f"{default}+latest"
    assert build("main-3F2C1D") == f"{default}+main.3f2c1d"
    assert build("---") == default


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/opt/rbln-device-plugin as the Dockerfile's first stage makes it, VERSION=v2.3.4-rc.1.

    Built from exactly the files the Dockerfile copies, with the build's own commands.
    """
    context = tmp_path_factory.mktemp("image-context")
    for source in copied_sources():
        origin = REPO / source
        target = context / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, target)
    venv = tmp_path_factory.mktemp("opt") / "rbln-device-plugin"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    done = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert done.returncode == 0, done.stderr
    done = run(
        [*pip, "install", "--no-deps", "--require-hashes", "--only-binary=:all:", "-r",
         str(context / "deployments/container/requirements.lock")],
        env=env,
    )  # fmt: skip
    if done.returncode != 0 and ("No matching distribution" in done.stderr or
                                 "connection" in done.stderr.lower()):  # fmt: skip
        pytest.skip(f"PyPI unreachable from this machine: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    dist = tmp_path_factory.mktemp("dist")
    done = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), "."],
        cwd=context,
        env={**env, "RBLN_DEVICE_PLUGIN_VERSION": "v2.3.4-rc.1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = dist.glob("*.whl")
    done = run([*pip, "install", "--no-deps", str(wheel)], env=env)
    assert done.returncode == 0, done.stderr
    return venv


@pytest.mark.slow  # installs the image's virtualenv or builds the wheel
def test_image_venv_has_no_pip_and_satisfies_its_requirements(image_venv: Path) -> None:
    python = str(image_venv / "bin" / "python")
    listing = (
        "import importlib.metadata as m; print([d.metadata['Name'] for d in m.distributions()])"
    )
    names = run([python, "-c", listing])
    assert names.returncode == 0, names.stderr
    installed = {name.lower() for name in json.loads(names.stdout.replace("'", '"'))}
    assert "rbln-device-plugin" in installed
    assert not installed & {"pip", "setuptools", "wheel"}
    # Every declared requirement of every installed distribution is met from the lock.
    check = run([sys.executable, "-m", "pip", "--python", python, "check"])
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.slow  # installs the image's virtualenv or builds the wheel
def test_image_build_version_reaches_version_start_record_and_traces(
    image_venv: Path, short_tmp: Path
) -> None:
    daemon = image_venv / "bin" / "rbln-device-plugin"
    done = run([str(daemon), "--version"], cwd=short_tmp)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "rbln-device-plugin 2.3.4rc1"

    proc = subprocess.Popen(
        [str(daemon), "--kubelet-device-plugin-path", str(short_tmp / "kubelet"),
         "--cdi-root", str(short_tmp / "cdi"), "--sysfs-root", str(short_tmp / "sys"),
         "--dev-root", str(short_tmp / "dev"), "--rbln-smi", str(short_tmp / "no-smi"),
         "--rsd-lock-path", str(short_tmp / "rsd.lock"), "--healthcheck-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=short_tmp,
        env={"PATH": os.environ.get("PATH", ""), "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "info"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        start = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert start["msg"] == "Starting rbln-device-plugin"
    assert start["version"] == "2.3.4rc1"

    # service.version on the traces' resource.
    probe = (
        "import os\n"
        "from rbln_device_plugin.telemetry import tracing\n"
        "t = tracing._build(tracing.Endpoint('127.0.0.1:9', insecure=True), 'node-a')\n"
        "print(t._provider.resource.attributes['service.version'], flush=True)\n"
        "os._exit(0)\n"
    )
    done = run([str(image_venv / "bin" / "python"), "-c", probe], cwd=short_tmp)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.3.4rc1"


ORPHAN_MAKER = """#!{python}
# Leaves orphans behind the way a forking rbln-smi helper does, then counts the zombies.
# Like the daemon, it waits only for its own children.
import os, subprocess, time
def state(pid):
    try:
        with open(f"/proc/{{pid}}/status") as status:
            return next(line.split()[1] for line in status if line.startswith("State:"))
    except (OSError, StopIteration):
        return None  # reaped
orphans = [
    int(subprocess.run(["sh", "-c", "sleep 0.05 >/dev/null 2>&1 & echo $!"],
                       capture_output=True, text=True, check=True).stdout)
    for _ in range(5)
]
# Wait for the orphans themselves to end: as PID 1 we never reap them, so they stay
# zombies; under an init that reaps, they are gone. The deadline is only a hang guard.
ended = "Z" if os.getpid() == 1 else None
deadline = time.monotonic() + 60
while any(state(pid) != ended for pid in orphans) and time.monotonic() < deadline:
    time.sleep(0.01)
open("{out}", "w").write(str(sum(state(pid) == "Z" for pid in orphans)))
"""


@pytest.mark.parametrize("under_wrapper", [False, True])
def test_orphans_are_reaped_only_under_tini(tmp_path: Path, under_wrapper: bool) -> None:
    """With Debian's tini installed here, the real wrapper as PID 1 leaves no zombies; the
    same process started as PID 1 without it does (the control case)."""
    unshare, tini = shutil.which("unshare"), Path("/usr/bin/tini")
    if unshare is None or not tini.is_file():
        pytest.skip("needs unshare and Debian's tini at /usr/bin/tini (apt-get install tini)")
    out = tmp_path / "zombies"
    daemon = tmp_path / "daemon"
    daemon.write_text(ORPHAN_MAKER.format(python=sys.executable, out=out))
    daemon.chmod(0o755)
    wrapper = tmp_path / "rbln-device-plugin"
    wrapper.write_text(ENTRYPOINT.read_text().replace(IMAGE_DAEMON, str(daemon)))
    wrapper.chmod(0o755)
    first = wrapper if under_wrapper else daemon
    done = run([unshare, "--pid", "--fork", "--mount-proc", str(first)])
    if not out.exists():
        pytest.skip(f"cannot create PID and mount namespaces here: {done.stderr.strip()}")
    zombies = int(out.read_text())
    assert (zombies == 0) if under_wrapper else (zombies > 0), f"{zombies} zombies"


def test_readme_build_command_builds_and_pushes_the_tag_the_chart_uses(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```$", readme, flags=re.S | re.M)
    lines = [line.strip() for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    (command,) = [line for line in lines if line.startswith("make -f deployments/container")]
    command = command.replace("<registry>", "registry.example.com").replace("<tag>", "1.2.0")
    argv = shlex.split(command)
    assert argv[:4] == ["make", "-f", "deployments/container/Makefile", "build"]
    done, calls = make_build(tmp_path, *argv[4:])
    assert done.returncode == 0, done.stderr
    build, push = calls
    assert build[build.index("--tag") + 1] == "registry.example.com/k8s-device-plugin:1.2.0"
    assert push == ["push", "registry.example.com/k8s-device-plugin:1.2.0"]
