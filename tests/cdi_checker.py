"""The CDI library containerd 2.x uses, as a test oracle: build it, ask it about directories.

``tests/cdi-checker/`` is a small Go program around ``tags.cncf.io/container-device-interface``
at the version containerd v2.4.2 pins (its ``go.mod``/``go.sum`` pin every module as
containerd's own ``go.sum`` does). It is built once into a cache directory outside the
repository through ``tests/gobuild.py`` (the kubelet peer's machinery) and answers, per
set of spec directories, the library's verdict on each file (``cdi.ReadSpec``) and the
devices its cache resolves. ``python -m tests.cdi_checker`` builds it with progress lines
(``make test`` does so before the suite runs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from . import gobuild

MODULE: Final = Path(__file__).parent / "cdi-checker"
NAME: Final = "cdi-checker"
# Diagnosis only: how long one answer may take before the test says what it was asking.
REPLY_TIMEOUT_S: Final = 60.0


def cache_root() -> Path:
    return gobuild.cache_root("cdi-checker", "RBLN_CDI_CHECKER_CACHE")


def target() -> gobuild.GoTarget:
    return gobuild.GoTarget(name=NAME, module=MODULE, binaries=(gobuild.GoBinary(".", NAME),))


def unavailable() -> str:
    """Why the checker cannot be built here, or "" when it can."""
    if shutil.which("go") is None:
        return "Go toolchain not found on PATH (the CDI checker builds the Go CDI library)"
    return ""


@dataclass(frozen=True)
class Build:
    binary: Path | None = None
    skip: str = ""
    error: str = ""
    seconds: float = 0.0
    cached: bool = False


def build(say: gobuild.Say = print) -> Build:
    reason = unavailable()
    if reason:
        return Build(skip=reason)
    try:
        directory, seconds, was_cached = gobuild.build(target(), cache_root(), say)
    except gobuild.GoBuildError as exc:
        return Build(error=str(exc))
    return Build(directory / NAME, seconds=seconds, cached=was_cached)


@dataclass(frozen=True)
class FileVerdict:
    ok: bool
    error: str
    panic: bool  # the library panicked on the file (containerd's refresh would too)
    devices: frozenset[str]


@dataclass(frozen=True)
class Answer:
    files: dict[str, FileVerdict]
    devices: frozenset[str]  # what the library's cache resolves
    errors: dict[str, tuple[str, ...]]  # per file, what the cache recorded
    panic: str  # the cache's refresh itself panicked


class CdiChecker:
    """One ``cdi-checker -serve`` process: one question and answer per line."""

    def __init__(self, binary: Path) -> None:
        self.proc = subprocess.Popen(
            [str(binary), "-serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            encoding="utf-8",
        )  # fmt: skip

    def ask(self, dirs: Sequence[str | Path]) -> Answer:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([str(d) for d in dirs]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"cdi-checker ended (exit {self.proc.wait(10)}) asking about {dirs}")
        raw: dict[str, Any] = json.loads(line)
        files = {
            path: FileVerdict(v["ok"], v.get("error", ""), v.get("panic", False),
                              frozenset(v["devices"]))
            for path, v in raw["files"].items()
        }  # fmt: skip
        errors = {path: tuple(texts) for path, texts in raw["errors"].items()}
        return Answer(files, frozenset(raw["devices"]), errors, raw.get("panic", ""))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: Sequence[str]) -> int:
    """Build (or find) the checker, saying what happens; exit 0 also when Go is missing."""
    del argv
    print(f"cdi checker: looking for a cached build in {cache_root()}", flush=True)
    result = build(lambda text: print(text, flush=True))
    if result.skip:
        print(f"cdi checker: skipped: {result.skip}")
        return 0
    if result.error:
        print(f"cdi checker: BUILD FAILED:\n{result.error}")
        return 1
    how = "cached" if result.cached else f"built in {result.seconds:.0f} s:"
    print(f"cdi checker: {how} {result.binary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
