"""Every shell command the documentation shows for the demo, the simulator, troubleshooting
and checking the chart (docs/simulator.md, docs/troubleshooting.md, docs/deployment.md)
runs as printed, in a fresh directory, and prints what the page shows.

The fresh directory holds what a clone has at its top (the Makefile, the two
pyproject files, ``deployments/``, and the clone's ``.venv`` and ``.tools``), nothing else.
Commands run through bash, in README order, one shell per command as a reader would
paste them; ``serve`` and the daemon run in the background like the README's second and
third shells. Only two things are changed: the README's node roots under /tmp become
fresh directories of the same length (parallel runs never share a node, and long lines
wrap exactly as printed), and the demo's random temporary name, times, durations and
process IDs are compared as placeholders. The kubectl commands need a cluster and
are the only ones not run; the test fails if any other command is left out.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .readme_blocks import Command, commands, mismatch, readme, sections

REPO = Path(__file__).resolve().parent.parent
# (page, section title): None is the whole page. The chart check comes first.
SECTIONS = (
    ("docs/deployment.md", "## Checking the chart without a cluster"),
    ("docs/simulator.md", None),
    ("docs/troubleshooting.md", None),
)
# Sections whose commands another test runs against a node of their own: the simulator
# page's metrics and health ports (tests/test_simulator_observability.py).
RUN_ELSEWHERE = {"docs/simulator.md": "## Metrics and health on the simulated node"}
ROOTS = ("/tmp/rbln-sim", "/tmp/rbln-bad", "/tmp/rbln-readme")
NEEDS_A_CLUSTER = {
    "kubectl -n k8s-device-plugin get pods -o wide --field-selector spec.nodeName=<node>",
    "kubectl -n k8s-device-plugin exec <pod> -- rbln-device-plugin inspect",
    "kubectl -n k8s-device-plugin exec <pod> -- rbln-device-plugin inspect --output json"
    " > node.json",
    "kubectl -n k8s-device-plugin exec <pod> -- rbln-device-plugin inspect | grep -i cdi",
}
BANNER_END = "Kubelet stand-in events follow; Ctrl-C stops it (the node stays)."
# What the daemon registers on the README's rebel-sriov node, as serve reports it.
REGISTERED = (
    "rebellions.ai/npu: 2 devices",
    "rebellions.ai/npu-vf1: 1 devices",
    "rebellions.ai/npu-vf4: 4 devices",
)
# Bounds on processes that do finish; generous on a loaded 2-core machine (a slow run
# only waits longer, the test never depends on how fast a command is).
COMMAND_TIMEOUT_S = 300.0
WAIT_S = 60.0


@dataclass
class Background:
    """A command left running, its output collected line by line."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, *texts: str) -> list[str]:
        """The output so far, once every text has appeared in it."""
        deadline = time.monotonic() + WAIT_S
        with self.changed:
            while not all(any(t in line for line in self.lines) for t in texts):
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None, (
                    f"{texts} not printed; exit {self.proc.poll()}; output: {self.lines}"
                )
                self.changed.wait(min(left, 1.0))
            return list(self.lines)

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT to the command's process group, as a terminal sends it."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(WAIT_S)


@pytest.fixture
def fresh() -> Iterator[Path]:
    """A directory laid out like the top of a clone, with this clone's environments."""
    if not (REPO / ".venv" / "bin" / "rbln-device-plugin-sim").exists():
        pytest.skip("needs the clone's .venv (make install)")
    path = Path(f"/tmp/rbln-readme-run-{secrets.token_hex(4)}")
    path.mkdir()
    try:
        # copy2 keeps the times, so make sees the environment as up to date.
        shutil.copy2(REPO / "Makefile", path / "Makefile")
        shutil.copy2(REPO / "pyproject.toml", path / "pyproject.toml")
        (path / "sim").mkdir()
        shutil.copy2(REPO / "sim" / "pyproject.toml", path / "sim" / "pyproject.toml")
        for shared in (".venv", ".tools", "deployments"):
            if (REPO / shared).exists():
                (path / shared).symlink_to(REPO / shared)
        (path / "home").mkdir()
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def same_length_roots() -> dict[str, str]:
    """Each README root -> a new directory of the same length."""
    out: dict[str, str] = {}
    for root in ROOTS:
        while True:
            candidate = "/tmp/" + secrets.token_hex(16)[: len(root) - len("/tmp/")]
            try:
                os.mkdir(candidate)
            except FileExistsError:
                continue
            out[root] = candidate
            break
    return out


def environment(fresh: Path) -> dict[str, str]:
    """The reader's shell: no daemon settings, this clone's venv not on PATH."""
    venv_bin = (REPO / ".venv" / "bin").resolve()
    path = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != venv_bin
    ]
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RBLN_", "OTEL_", "KUBELET_", "CDI_", "HEALTHCHECK_", "VIRTUAL_"))
        and key not in ("SYSFS_ROOT", "DEV_ROOT", "RSD_LOCK_PATH", "NODE_NAME", "PYTHONPATH")
        # Under `make test` these would make the README's `make demo` a sub-make, which
        # announces the directories it enters: a reader's shell has none of them.
        and key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")
    }
    env.update(PATH=os.pathsep.join(path), TMPDIR="/tmp", HOME=str(fresh / "home"))
    return env


def readme_commands(*where: tuple[str, str | None]) -> list[Command]:
    found: list[Command] = []
    for page, title in where:
        text = readme(REPO / page)
        if title is None:
            elsewhere = RUN_ELSEWHERE.get(page)
            if elsewhere is not None:
                text = text.replace(sections(text, (elsewhere,))[elsewhere], "\n")
            found += commands(text, page)
        else:
            found += [c for t, body in sections(text, (title,)).items() for c in commands(body, t)]
    return found


def test_only_the_cluster_commands_are_left_out() -> None:
    found = {c.text for c in readme_commands(*SECTIONS)}
    assert found >= NEEDS_A_CLUSTER, "the pages' cluster commands changed"
    assert len(found) >= 25


@pytest.mark.slow  # runs the demo and every simulator command the README shows
def test_simulator_demo_and_troubleshooting_commands_run_as_printed(fresh: Path) -> None:
    found = [c for c in readme_commands(*SECTIONS[1:]) if c.text not in NEEDS_A_CLUSTER]
    kept = run_in_order(found, fresh)
    assert kept, "demo --keep said where the node stays"


def test_chart_commands_run_as_printed(fresh: Path) -> None:
    if not (REPO / ".tools" / "helm" / "helm").exists():
        pytest.skip("needs helm in .tools (make tools)")
    found = readme_commands(SECTIONS[0])
    assert len(found) == 4
    run_in_order(found, fresh)


def run_in_order(found: list[Command], fresh: Path) -> list[str]:
    """Run each command as a reader would; returns the demo roots that --keep left."""
    roots = same_length_roots()
    env = environment(fresh)
    background: list[Background] = []
    kept: list[str] = []

    def mapped(text: str) -> str:
        for readme_root, root in roots.items():
            text = text.replace(readme_root, root)
        return text

    try:
        for command in found:
            script = mapped(command.text)
            shown = tuple(mapped(line) for line in command.shown or ())
            if " serve " in script:
                serve = start(script, fresh, env)
                background.append(serve)
                banner = serve.wait_for(BANNER_END)
                assert shown[-1] == "...", "serve keeps running: its README output ends ..."
                problem = mismatch(shown, "\n".join(banner[: banner.index(BANNER_END) + 1]))
                assert problem is None, f"$ {script}\n{problem}"
            elif script.startswith(".venv/bin/rbln-device-plugin ") and " inspect " not in script:
                daemon = start(script, fresh, env)
                background.append(daemon)
                background[0].wait_for(*REGISTERED)  # the daemon registered with serve
            else:
                done = subprocess.run(
                    ["bash", "-c", script],
                    cwd=fresh,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=COMMAND_TIMEOUT_S,
                    check=False,
                )
                assert done.returncode == command.expected_exit, f"$ {script}\n{done.stdout}"
                if shown:
                    problem = mismatch(shown, done.stdout)
                    assert problem is None, f"$ {script}\n{problem}"
                kept += re.findall(r"^  rm -r (/tmp/rbln-demo-\w+)$", done.stdout, re.M)
        # The daemon, then serve: both stop cleanly on Ctrl-C.
        for process in reversed(background):
            assert process.interrupt() == 0, process.lines[-20:]
        if background:
            assert background[0].lines[-1] == (f"stopped; the node stays under {roots[ROOTS[0]]}")
    finally:
        for process in background:
            if process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()
        for root in [*roots.values(), *kept]:
            shutil.rmtree(root, ignore_errors=True)
    return kept


def start(script: str, cwd: Path, env: dict[str, str]) -> Background:
    # Not `exec`: bash's exec would hand the program an absolute path to itself, and the
    # simulator spells its suggestions the way it was started.
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return Background(proc)


def test_the_readme_parser_reads_prompts_continuations_and_ellipses() -> None:
    text = "\n".join([
        "```console",
        "$ echo a \\",
        "    b",
        "a b",
        "$ false  # exit 1",
        "```",
        "```sh",
        "# a comment",
        "one \\",
        "  two",
        "```",
    ])  # fmt: skip
    first, second, third = commands(text, "t")
    assert first.text == "echo a \\\n    b" and first.shown == ("a b",)
    assert second.expected_exit == 1 and second.shown == ()
    assert third.text == "one \\\n  two" and third.shown is None
    assert mismatch(("x", "...", "z"), "x\ny1\ny2\nz\n") is None
    assert mismatch(("x", "...", "z"), "x\nz\n") is None
    assert mismatch(("x", "z"), "x\ny\nz\n") is not None
    assert mismatch(("ok (0.4 s) at 12:00:01",), "ok (12.9 s) at 23:59:59") is None
    assert isinstance(first, Command)
