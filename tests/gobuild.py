"""Go programs the tests run as peers, built once into a cache keyed by what they depend on.

A ``GoTarget`` names a Go module directory of this repository (its ``go.mod``/``go.sum``
pin every version) and the binaries to build from it. ``build`` returns the directory
holding them: from the cache when a build with the same digest (the Go version, the
module's files, the packages, tags and environment) exists, otherwise built now into a
temporary directory that is renamed into place only when every binary linked, so an
interrupted build never leaves a half-filled cache entry. Go's own module and build
caches make a rebuild after a pin change fast. A cold build takes minutes on 2 cores,
so it prints a progress line at least every 30 s: the packages compiled of those the build
plans (``go build -n`` lists them, ``go build -v`` names each as it is done) and the time
left, estimated from the last build of the same binary (``timings.json`` in the cache).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

BUILD_TIMEOUT_S: Final = 3600.0
PROGRESS_EVERY_S: Final = 25.0
# How every target builds: static, paths trimmed. The kubelet peer compiles ~1200 of the
# real node's kubelet's packages of the same release; Go's build cache serves them to
# both only when the settings agree (-trimpath is hashed into every package's action ID;
# CGO_ENABLED changes net and os/user and so everything importing them).
STATIC_ENV: Final[Mapping[str, str]] = {"CGO_ENABLED": "0"}
TRIM: Final = ("-trimpath",)
# The release builds' linker flags: Kubernetes' (hack/lib/golang.sh unless DBG=1) and
# containerd's (its Makefile unless GODEBUG) leave out the symbol table and DWARF. That
# halves each link (the kubelet's: 6-8 s -> 4 s), and ldflags only reach the linker, so
# the compiled packages shared between targets stay the same.
STRIP_LDFLAGS: Final = "-s -w"

Say = Callable[[str], None]


@dataclass(frozen=True)
class GoBinary:
    """One ``go build -o <name> <package>`` of a target."""

    package: str  # an import path, or "." for the module's own main package
    name: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class GoTarget:
    name: str  # the cache entry's stem
    module: Path  # the directory holding go.mod
    binaries: tuple[GoBinary, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    # Other directories whose Go files the module builds (local ``replace`` targets).
    sources: tuple[Path, ...] = ()


class GoBuildError(RuntimeError):
    """``go build`` failed; the message ends with its output."""


def cache_root(kind: str, override_env: str) -> Path:
    """``$<override_env>``, else ``$XDG_CACHE_HOME/rbln-device-plugin/<kind>``."""
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rbln-device-plugin" / kind


def go_version() -> str:
    done = subprocess.run(["go", "version"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def digest(target: GoTarget) -> str:
    """Everything the binaries depend on besides the module proxy's (immutable) content."""
    h = hashlib.sha256(go_version().encode())
    h.update(repr((target.binaries, sorted(target.env.items()), target.flags)).encode())
    for directory in (target.module, *target.sources):
        for path in sorted(directory.iterdir()):
            if path.suffix in (".go", ".mod", ".sum", ".c"):
                h.update(f"{path.name}\0".encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def entry(target: GoTarget, root: Path) -> Path:
    return root / f"{target.name}-{digest(target)}"


def cached(target: GoTarget, root: Path) -> Path | None:
    directory = entry(target, root)
    if all((directory / b.name).is_file() for b in target.binaries):
        return directory
    return None


Progress = Callable[[float], str]  # seconds since start -> the progress line


def _run_with_progress(
    argv: list[str], cwd: Path, env: Mapping[str, str], progress: Progress, say: Say, log: Path
) -> None:
    """Run ``argv`` with its output in ``log``, saying ``progress(elapsed)`` every
    ``PROGRESS_EVERY_S``; the first line of the progress text names the step in errors."""
    what = progress(0.0).split(":")[0]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
        last = started
        try:
            while proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
                now = time.monotonic()
                if now - started > BUILD_TIMEOUT_S:
                    proc.kill()
                    proc.wait()
                    raise GoBuildError(f"{what}: no result within {BUILD_TIMEOUT_S:g} s")
                if now - last >= PROGRESS_EVERY_S:
                    last = now
                    say(progress(now - started))
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
    if proc.returncode != 0:
        output = log.read_text(errors="replace")[-4000:]
        raise GoBuildError(f"{what} failed (exit {proc.returncode}):\n{output}")


# `go build -n` prints, without running them, the commands a build still needs: one
# compiler run per package that Go's build cache does not hold.
_COMPILE_MARK: Final = "/compile -o "
_TIMINGS: Final = "timings.json"


def compiles_planned(dry_run_output: str) -> int:
    """How many packages a ``go build -n`` transcript would compile."""
    return sum(1 for line in dry_run_output.splitlines() if _COMPILE_MARK in line)


def compiled_so_far(verbose_output: str) -> int:
    """Packages ``go build -v`` has compiled: it names each one on a line of its own as it
    is compiled (cached packages are not named); ``go:`` lines are the tool's notes."""
    return sum(
        1 for line in verbose_output.splitlines() if line and not line.startswith(("go:", "#"))
    )


@dataclass(frozen=True)
class LastBuild:
    """A finished build of one binary: its wall time and how many packages it compiled."""

    seconds: float
    compiled: int


def load_timings(root: Path) -> dict[str, LastBuild]:
    try:
        raw = json.loads((root / _TIMINGS).read_text())
        return {k: LastBuild(float(v["seconds"]), int(v["compiled"])) for k, v in raw.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # no record (or one this code cannot read): no estimate, never a failure


def save_timing(root: Path, key: str, last: LastBuild) -> None:
    timings = load_timings(root)
    timings[key] = last
    data = {k: {"seconds": round(v.seconds, 1), "compiled": v.compiled} for k, v in timings.items()}
    tmp = root / f".{_TIMINGS}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(root / _TIMINGS)


def progress_line(
    what: str, elapsed: float, done: int, planned: int, last: LastBuild | None
) -> str:
    """``what: <done> of <planned> packages compiled (<elapsed> s[, about <n> s left])``.

    The estimate scales the last build of the same binary by the packages this one plans
    (a build after a pin change compiles fewer); without a last build, by this build's own
    pace once a tenth of it is done."""
    if planned == 0:
        return f"{what}: linking ({elapsed:.0f} s)"
    text = f"{what}: {min(done, planned)} of {planned} packages compiled ({elapsed:.0f} s"
    expected: float | None = None
    basis = ""
    if last is not None and last.compiled > 0:
        expected, basis = last.seconds * planned / last.compiled, "the last build's pace"
    elif done >= max(1, planned // 10):
        expected, basis = elapsed * planned / done, "this build's pace"
    if expected is not None and expected - elapsed >= 0.5:
        text += f"; about {expected - elapsed:.0f} s left by {basis}"
    elif expected is not None:
        text += f"; past the {expected:.0f} s expected by {basis}"
    return text + ")"


def _build_env(target: GoTarget) -> dict[str, str]:
    return {
        **os.environ,
        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=readonly".strip(),
        **target.env,
    }


def _build_argv(target: GoTarget, binary: GoBinary, output: Path, mode: str) -> list[str]:
    """``go build <mode> ...``: ``-n`` plans (and fetches), ``-v`` builds naming packages."""
    argv = ["go", "build", mode, *target.flags]
    if binary.tags:
        argv += ["-tags", ",".join(binary.tags)]
    return [*argv, "-o", str(output), binary.package]


def prefetch_modules(targets: Sequence[GoTarget], root: Path) -> list[str]:
    """Fetch the modules the targets' builds will need, as each build's own dry run would
    (``go build -n`` loads every package, downloading what the module cache lacks), so
    that a later build's downloads happen while an earlier one keeps the cores busy.
    Go's module cache takes concurrent downloads. Targets already built are skipped; a
    failure is left for the build itself to report. Returns what it fetched for."""
    fetched = []
    for target in targets:
        if cached(target, root) is not None:
            continue
        for binary in target.binaries:
            subprocess.run(
                _build_argv(target, binary, Path(os.devnull), "-n"),
                cwd=target.module,
                env=_build_env(target),
                capture_output=True,
                check=False,
                timeout=BUILD_TIMEOUT_S,
            )
            fetched.append(f"{target.name}/{binary.name}")
    return fetched


def build(target: GoTarget, root: Path, say: Say = print) -> tuple[Path, float, bool]:
    """The directory with the target's binaries, the seconds spent building, and whether
    it came from the cache."""
    found = cached(target, root)
    if found is not None:
        return found, 0.0, True
    final = entry(target, root)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{final.name}.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    env = _build_env(target)
    started = time.monotonic()
    try:
        timings = load_timings(root)
        for binary in target.binaries:
            output = partial / binary.name
            what = f"go build {binary.name} ({target.name})"
            key = f"{target.name}/{binary.name}"
            say(f"{what}: building ({go_version()})")
            # The dry run also fetches any module the build needs, which takes minutes
            # on an empty module cache: it reports progress like the build.
            plan = partial / ".plan.log"
            _run_with_progress(
                _build_argv(target, binary, output, "-n"), target.module, env,
                lambda s, w=what: f"{w}: fetching modules, listing packages ({s:.0f} s)",
                say, plan,
            )  # fmt: skip
            planned = compiles_planned(plan.read_text(errors="replace"))
            log = partial / ".build.log"
            log.write_text("")  # the last binary's log must not count for this one
            line = functools.partial(_build_progress, what, log, planned, timings.get(key))
            say(line(0.0))
            begun = time.monotonic()
            argv = _build_argv(target, binary, output, "-v")
            _run_with_progress(argv, target.module, env, line, say, log)
            if planned:
                save_timing(root, key, LastBuild(time.monotonic() - begun, planned))
        for scratch in (".build.log", ".plan.log"):
            (partial / scratch).unlink(missing_ok=True)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    # Older builds of the target (other pins, another Go) only take disk space.
    for stale in root.glob(f"{target.name}-*"):
        if stale != final and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return final, time.monotonic() - started, False


def _build_progress(
    what: str, log: Path, planned: int, last: LastBuild | None, elapsed: float
) -> str:
    try:
        done = compiled_so_far(log.read_text(errors="replace"))
    except OSError:
        done = 0
    return progress_line(what, elapsed, done, planned, last)
