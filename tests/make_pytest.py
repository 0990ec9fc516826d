"""``make pytest``: the suite in three pytest runs, two of them beside the first.

1. The first share of the Go-built layers' modules (``--go-share=1/2``). Its collection
   builds every Go binary the Go-built layers need (their progress lines are on the
   terminal as they come), then touches the file named by ``RBLN_GO_BUILDS_DONE``;
   its tests' output follows live.
2. Once that file exists (or the first run ended), the second share (``--go-share=2/2``)
   and the rest of the suite on ``--workers`` pytest-xdist workers start beside it,
   each with its output in a file, printed when that run ends (after the first's).

Every run always runs to its end; the exit status is the first failure's (a Go share that
selected nothing, pytest's 5, is no failure: ``PYTEST_ARGS`` may name other tests). A
Ctrl-C or a SIGTERM reaches each run once, as a SIGINT (pytest's own clean stop: the
real clusters are torn down), and after ``STOP_GRACE_S`` anything left is killed.

    python -m tests.make_pytest --workers 4 -- [pytest arguments]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from .go_shares import GO_LAYER_MARKERS

GO_LAYERS = " or ".join(GO_LAYER_MARKERS)
NOTHING_SELECTED = 5
STOP_GRACE_S = 120.0
POLL_S = 0.5


def commands(pytest: str, workers: int, extra: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(name, argv) of the three runs, the foreground one first."""
    go = [pytest, "-q", "-m", f"({GO_LAYERS}) and not soak"]
    parallel = [
        pytest,
        "-q",
        "-n",
        str(workers),
        "--dist",
        "loadgroup",
        "--no-loadscope-reorder",
        "--max-worker-restart=0",
        "-m",
        f"not ({GO_LAYERS}) and not soak",
    ]
    return [
        ("the Go-built layers, first share", [*go, "--go-share=1/2", *extra]),
        ("the Go-built layers, second share", [*go, "--go-share=2/2", *extra]),
        ("the parallel run", [*parallel, *extra]),
    ]


@dataclass
class Run:
    name: str
    argv: list[str]
    may_select_nothing: bool
    output: IO[bytes] | None = None  # None: on the terminal
    process: subprocess.Popen[bytes] | None = None
    shown: bool = False
    started: float = field(default_factory=time.monotonic)

    def start(self, env: dict[str, str]) -> None:
        print(shlex.join(self.argv), flush=True)
        self.started = time.monotonic()
        # A session of its own: a Ctrl-C on the terminal reaches make and this runner,
        # which passes it on once (a second SIGINT would cut pytest's teardown short).
        self.process = subprocess.Popen(
            self.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT if self.output else None,
            start_new_session=True,
        )

    def poll(self) -> bool:
        """True once the run has ended."""
        return self.process is not None and self.process.poll() is not None

    def interrupt(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def failed(self) -> int:
        """This run's exit status when it counts as a failure, else 0."""
        code = self.process.poll() if self.process is not None else None
        if code is None:
            return 1
        if code < 0:  # ended by a signal: the shell's way of saying so
            return 128 - code
        if code == NOTHING_SELECTED and self.may_select_nothing:
            return 0
        return code

    def show(self) -> None:
        """The output of a run kept in a file, once it has ended."""
        if self.output is None or self.shown:
            return
        self.shown = True
        minutes, seconds = divmod(int(time.monotonic() - self.started), 60)
        print(f"make test: {self.name} ended ({minutes} min {seconds} s): {shlex.join(self.argv)}")
        self.output.seek(0)
        sys.stdout.flush()
        sys.stdout.buffer.write(self.output.read())
        sys.stdout.buffer.flush()


class Stop:
    """The first signal asked every run to stop; later ones are passed on again."""

    def __init__(self) -> None:
        self.signal = 0
        self.pending: list[int] = []

    def handle(self, sig: int, _frame: FrameType | None) -> None:
        self.signal = self.signal or sig
        self.pending.append(sig)


def run_all(runs: list[Run], built: Path, env: dict[str, str], stop: Stop) -> int:
    foreground, background = runs[0], runs[1:]
    foreground.start({**env, "RBLN_GO_BUILDS_DONE": str(built)})
    background_started = False
    deadline = float("inf")
    while True:
        while stop.pending:
            stop.pending.pop()
            deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
            for run in runs:
                run.interrupt(signal.SIGINT)
        if time.monotonic() > deadline:
            for run in runs:
                run.interrupt(signal.SIGKILL)
        foreground_done = foreground.poll()
        if not background_started and not stop.signal and (built.exists() or foreground_done):
            background_started = True
            print(
                "make test: the second share of the Go-built layers and the parallel run have "
                "started beside the first; their output follows when each ends",
                flush=True,
            )
            for run in background:
                run.start(env)
        if foreground_done:
            for run in background:
                if run.poll():
                    run.show()
        if all(run.poll() or run.process is None for run in runs):
            break
        time.sleep(POLL_S)
    for run in background:
        run.show()
    if stop.signal:
        return 128 + stop.signal
    return next((code for run in runs if run.process and (code := run.failed())), 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.make_pytest", description=__doc__)
    parser.add_argument("--workers", type=int, default=4, help="the parallel run's workers")
    parser.add_argument("--pytest", default=str(Path(sys.executable).with_name("pytest")))
    parser.add_argument("pytest_args", nargs="*", help="after --: given to every run")
    args = parser.parse_args(argv)
    stop = Stop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop.handle)
    with tempfile.TemporaryDirectory(prefix="rbln-make-pytest-") as scratch:
        runs = []
        planned = commands(args.pytest, args.workers, args.pytest_args)
        for index, (name, command) in enumerate(planned):
            output = None if index == 0 else (Path(scratch) / f"run{index}.out").open("w+b")
            runs.append(Run(name, command, may_select_nothing=index < 2, output=output))
        try:
            return run_all(runs, Path(scratch) / "go-builds-done", dict(os.environ), stop)
        finally:
            for run in runs:
                if run.output is not None:
                    run.output.close()


if __name__ == "__main__":
    sys.exit(main())
