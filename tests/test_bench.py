"""The benchmarks still run: `make bench` is where speed and memory are measured, so a
benchmark broken by a change in the daemon must fail here rather than on the day someone
wants the figures. Nothing is asserted about the figures themselves."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
AREAS = {
    "scan", "preferred", "daemon", "lean", "idle", "fast", "metrics", "load", "cdi", "k8sclient",
    "dra", "dra-scale",
}  # fmt: skip


@pytest.mark.slow  # the quick run of every benchmark takes minutes
@pytest.mark.timeout(1800)  # a hang guard, well past the 2-4 min the quick run takes
def test_every_benchmark_runs_and_reports_its_area() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=REPO, capture_output=True, text=True, timeout=1700, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    areas = {line.split("|")[1].strip() for line in table[1:]}
    assert areas == AREAS, done.stdout[-4000:]


@pytest.mark.timeout(300)
def test_the_allocate_breakdown_runs_and_reports_every_step() -> None:
    # Its hooks wrap daemon functions by name: a renamed step must fail here, not when
    # someone next profiles an Allocate.
    done = subprocess.run(
        [sys.executable, "-m", "bench.allocate_steps", "--calls", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    steps = {line.split()[0] for line in done.stdout.splitlines()[2:] if line.strip()}
    expected = {"gRPC", "checks", "lock", "spawn", "tool", "reap", "parse", "node", "rest"}
    assert expected | {"handler", "total", "share"} <= steps, done.stdout
    assert "thread hops 2" in done.stdout, done.stdout


@pytest.mark.timeout(300)
def test_the_idle_scan_breakdown_sees_every_part_run() -> None:
    # It wraps daemon methods by name: a part renamed or no longer on the idle scan's
    # path reports no calls, and must fail here rather than print zeros.
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_idle_parts", "--quick"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [ast.literal_eval(line) for line in done.stdout.splitlines() if line.startswith("{")]
    parts = {r["metric"]: r["note"] for r in rows if "calls per scan" in r["note"]}
    assert len(parts) == 7, done.stdout
    idle = {metric: note for metric, note in parts.items() if "; 0.00 calls per scan" in note}
    assert not idle, idle


@pytest.mark.apiserver
@pytest.mark.timeout(300)
def test_the_scale_benchmark_runs_every_scenario() -> None:
    # A few simulated nodes through the hour and the upgrade: every scenario's row is
    # printed (the counts themselves are asserted in tests/test_dra_scale.py).
    from tests import kubeapi

    if kubeapi.missing() is not None:
        pytest.skip(str(kubeapi.missing()))
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_dra_scale", "--quick", "--nodes", "4"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = {line.split("  ")[0] for line in done.stdout.splitlines()}
    for scenario in (
        "steady node: writes per node-hour", "flapping node: writes per flap (FAULT, READY)",
        "flapping node: writes per node-hour", "upgrade: writes per node",
        "upgrade: requests per node", "floor: one GET of a slice",
    ):  # fmt: skip
        assert scenario in metrics, done.stdout


BENCH_MODULES = [
    "bench", "bench.allocate_steps", "bench.bench_cdi", "bench.bench_cdidirs", "bench.bench_daemon",
    "bench.bench_dra_scale", "bench.bench_fast", "bench.bench_http", "bench.bench_idle_parts",
    "bench.bench_k8sclient", "bench.bench_lean",
    "bench.bench_load", "bench.bench_metrics", "bench.bench_preferred", "bench.bench_scan",
    "bench.bench_topology", "bench.bench_tweaks",
]  # fmt: skip


def main_block(module: ModuleType) -> list[ast.stmt]:
    """The body of the module's ``if __name__ == "__main__":``: what ``python -m`` runs."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(), module.__file__)
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "__name__ == '__main__'", "'__main__' == __name__",
        ):  # fmt: skip
            return node.body
    raise AssertionError(f"{module.__name__} has no `if __name__ == '__main__':` block")


def forbid_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every function of every benchmark module, bar the command-line parsing, raises."""

    def forbidden(name: str) -> Callable[..., NoReturn]:
        def called(*_args: object, **_kwargs: object) -> NoReturn:
            raise AssertionError(f"{name} was called: a run started")

        return called

    for name, loaded in list(sys.modules.items()):
        if not (name == "bench" or name.startswith("bench.")) or name == "bench.cli":
            continue
        for attr, value in vars(loaded).items():
            if inspect.isfunction(value) and value.__module__ == name and attr != "main":
                monkeypatch.setattr(loaded, attr, forbidden(f"{name}.{attr}"))


@pytest.mark.parametrize("module_name", BENCH_MODULES)
def test_help_and_a_mistyped_flag_never_start_a_run(
    module_name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, each benchmark looked for its flags in sys.argv by hand: `--help` or a
    # mistyped flag started a run of several minutes with the defaults. In process: the
    # module's own `__main__` block runs in its namespace against a patched sys.argv, with
    # every function that could start a run made to raise; the test below shows
    # `python -m` reaching that block.
    module = importlib.import_module("bench.__main__" if module_name == "bench" else module_name)
    block = compile(ast.Module(main_block(module), []), f"<{module_name} __main__>", "exec")
    forbid_every_run(monkeypatch)
    for argv, code in ((["--help"], 0), (["--qiuck"], 2)):
        monkeypatch.setattr(sys, "argv", [str(module.__file__), *argv])
        with pytest.raises(SystemExit) as exited:
            exec(block, vars(module))
        out, err = capsys.readouterr()
        assert exited.value.code == code, (argv, out[-2000:], err[-2000:])
        assert "usage:" in (out if code == 0 else err), (argv, out[-2000:], err[-2000:])
        if code == 2:
            assert "unrecognized arguments: --qiuck" in err, err[-2000:]


@pytest.mark.parametrize(
    ("module", "argv", "code"), [("bench", ["--help"], 0), ("bench.bench_fast", ["--qiuck"], 2)]
)
def test_python_dash_m_reaches_the_parser(module: str, argv: list[str], code: int) -> None:
    # The wiring end to end, for the package's table and one benchmark: a real process.
    done = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == code, (argv, done.stdout[-2000:], done.stderr[-2000:])
    assert "usage:" in (done.stdout if code == 0 else done.stderr)
