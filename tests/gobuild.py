"""Go programs the tests run as peers, built once into a cache keyed by what they depend on.

A ``GoTarget`` names a Go module directory of this repository (its ``go.mod``/``go.sum``
pin every version) and the binaries to build from it. ``build`` returns the directory
holding them: from the cache when a build with the same digest (the Go version, the
module's files, the packages, tags and environment) exists, otherwise built now into a
temporary directory that is renamed into place only when every binary linked, so an
interrupted build never leaves a half-filled cache entry. Go's own module and build
caches make a rebuild after a pin change fast. A cold build takes minutes on 2 cores,
so it prints a progress line at least every 30 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
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


def _run_with_progress(
    argv: list[str], cwd: Path, env: Mapping[str, str], what: str, say: Say, log: Path
) -> None:
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
                    say(f"{what}: still building ({now - started:.0f} s)")
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
    if proc.returncode != 0:
        output = log.read_text(errors="replace")[-4000:]
        raise GoBuildError(f"{what} failed (exit {proc.returncode}):\n{output}")


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
    env = {
        **os.environ,
        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=readonly".strip(),
        **target.env,
    }
    started = time.monotonic()
    try:
        for binary in target.binaries:
            argv = ["go", "build", *target.flags]
            if binary.tags:
                argv += ["-tags", ",".join(binary.tags)]
            argv += ["-o", str(partial / binary.name), binary.package]
            what = f"go build {binary.name} ({target.name})"
            say(f"{what}: building ({go_version()})")
            _run_with_progress(argv, target.module, env, what, say, partial / ".build.log")
        (partial / ".build.log").unlink(missing_ok=True)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    # Older builds of the target (other pins, another Go) only take disk space.
    for stale in root.glob(f"{target.name}-*"):
        if stale != final and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return final, time.monotonic() - started, False
