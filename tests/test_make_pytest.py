"""``make pytest``'s three runs (tests/make_pytest.py) and the Go-built layers' shares
(tests/go_shares.py). The runner starts real processes: a stand-in ``pytest`` script that
plays each run's part (which run it is, from its arguments) and records what it saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import go_shares
from .make_pytest import commands

REPO = Path(__file__).resolve().parent.parent

# The runs wait on each other through files, never on time: the first share touches the
# builds-done file, then ends only once both others have started, so they ran beside it.
FAKE_PYTEST = """#!PYTHON
import os, signal, sys, time
from pathlib import Path
logs = Path(os.environ["FAKE_LOGS"])
args = sys.argv[1:]
shares = {"--go-share=1/2": "share1", "--go-share=2/2": "share2"}
name = next((shares[a] for a in args if a in shares), "parallel")
(logs / (name + ".args")).write_text("\\n".join(args))
signal.signal(signal.SIGINT, lambda *_: ((logs / (name + ".sigint")).open("a").write("x\\n")))
def wait(path):
    while not path.exists():
        time.sleep(0.05)
(logs / (name + ".started")).touch()
if name == "share1":
    print("share1: building", flush=True)
    if os.environ.get("FAKE_BUILD_FAILS"):
        sys.exit(2)  # before the builds were done: the others start all the same
    time.sleep(0.5)  # building: a runner that started the others already is caught below
    (logs / "built").touch()
    Path(os.environ["RBLN_GO_BUILDS_DONE"]).touch()
    wait(logs / "share2.started"); wait(logs / "parallel.started")
    print("share1: tests passed", flush=True)
else:
    if not (logs / "built").exists() and not os.environ.get("FAKE_BUILD_FAILS"):
        (logs / (name + ".early")).touch()
    print(name + ": first line"); print(name + ": last line")
if os.environ.get("FAKE_HANG"):
    while not (logs / (name + ".sigint")).exists():
        time.sleep(0.05)
    print(name + ": torn down", flush=True)
if os.environ.get("FAKE_KILLED_" + name.upper()):
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(os.environ.get("FAKE_RC_" + name.upper(), "0")))
"""


def runner(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    fake = tmp_path / "pytest"
    fake.write_text(FAKE_PYTEST.replace("PYTHON", sys.executable, 1))
    fake.chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir()
    own = ["--workers", "3", "--pytest", str(fake)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.make_pytest", *own, "--", "-k", "x y"],
        cwd=REPO,
        env={**os.environ, "FAKE_LOGS": str(logs), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = process.communicate(timeout=60)
    return process.returncode, out


def test_the_others_start_beside_the_first_once_its_builds_are_done(tmp_path: Path) -> None:
    code, out = finish(runner(tmp_path))
    assert code == 0, out
    # The first share's output is live and whole before either kept output is shown.
    assert out.index("share1: building") < out.index("share1: tests passed")
    for name in ("share2", "parallel"):
        first, last = out.index(f"{name}: first line"), out.index(f"{name}: last line")
        assert out.index("share1: tests passed") < first < last
        assert out[first:last].count("\n") == 1  # not interleaved with anything
    logs = tmp_path / "logs"
    assert not list(logs.glob("*.early"))
    assert (logs / "share1.args").read_text().split("\n")[-3:] == ["--go-share=1/2", "-k", "x y"]
    assert (logs / "share2.args").read_text().split("\n")[-3:] == ["--go-share=2/2", "-k", "x y"]
    parallel = (logs / "parallel.args").read_text().split("\n")
    assert parallel[:2] == ["-q", "-n"] and parallel[2] == "3" and "--go-share" not in str(parallel)


def test_a_failed_build_still_runs_the_others_and_fails(tmp_path: Path) -> None:
    code, out = finish(runner(tmp_path, FAKE_BUILD_FAILS="1"))
    assert code == 2, out
    assert "share2: last line" in out and "parallel: last line" in out


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FAKE_RC_SHARE2": "5"}, 0),  # a Go share that selected nothing
        ({"FAKE_RC_SHARE1": "5", "FAKE_RC_SHARE2": "5"}, 0),
        ({"FAKE_RC_PARALLEL": "5"}, 5),  # the rest of the suite selected nothing: wrong
        ({"FAKE_RC_SHARE2": "1"}, 1),
        ({"FAKE_RC_PARALLEL": "1"}, 1),
        ({"FAKE_RC_SHARE1": "1", "FAKE_RC_PARALLEL": "3"}, 1),  # the first failure's
        ({"FAKE_KILLED_SHARE2": "1"}, 128 + signal.SIGKILL),  # as a shell says it
    ],
)
def test_the_exit_status_is_the_first_failures(
    tmp_path: Path, env: dict[str, str], expected: int
) -> None:
    code, out = finish(runner(tmp_path, **env))
    assert code == expected, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_reaches_every_run_once_as_a_sigint_and_waits_for_its_teardown(
    tmp_path: Path, sig: signal.Signals
) -> None:
    process = runner(tmp_path, FAKE_HANG="1")
    logs = tmp_path / "logs"
    deadline = time.monotonic() + 30
    while not all((logs / f"{n}.started").exists() for n in ("share1", "share2", "parallel")):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(sig)
    code, out = finish(process)
    assert code == 128 + sig
    for name in ("share1", "share2", "parallel"):
        assert (logs / f"{name}.sigint").read_text() == "x\n", name
    # The kept outputs still come, with their teardown.
    assert "share2: torn down" in out and "parallel: torn down" in out


def test_the_three_runs_select_the_whole_suite_once() -> None:
    (_, go1), (_, go2), (_, parallel) = commands("pytest", 4, ["-x"])
    assert go1[go1.index("-m") + 1] == go2[go2.index("-m") + 1]
    go_marks, rest = go1[go1.index("-m") + 1], parallel[parallel.index("-m") + 1]
    assert go_marks == "(kubelet_peer or realnode) and not soak"
    assert rest == "not (kubelet_peer or realnode) and not soak"
    assert all(run[-1] == "-x" for run in (go1, go2, parallel))


# ---------------------------------------------------------------- the shares
def test_every_module_is_in_exactly_one_share_and_its_tests_stay_together() -> None:
    ids = [f"tests/{m}::test_{i}" for m in go_shares.MODULE_SECONDS for i in range(3)]
    ids += [f"tests/test_new_realnode_module.py::test_{x}" for x in "ab"]
    shares = [go_shares.keep(ids, (k, 2)) for k in (1, 2)]
    assert shares[0] | shares[1] == set(ids) and not shares[0] & shares[1]
    for share in shares:
        modules = {go_shares.module_name(n) for n in share}
        assert all(n in share for n in ids if go_shares.module_name(n) in modules)


def test_the_shares_are_about_even_and_the_same_in_any_order() -> None:
    modules = list(go_shares.MODULE_SECONDS)
    first = go_shares.split(modules, 2)
    assert go_shares.split(reversed(modules), 2) == first
    totals = [sum(go_shares.MODULE_SECONDS[m] for m in share) for share in first]
    # Within the smallest module's seconds of each other.
    assert abs(totals[0] - totals[1]) <= min(go_shares.MODULE_SECONDS.values())
    assert go_shares.split(modules, 1) == [set(modules)]


@pytest.mark.parametrize("text", ["", "1", "0/2", "3/2", "a/b", "1/2/3", "-1/2"])
def test_a_share_that_is_not_k_of_n_is_refused(text: str) -> None:
    with pytest.raises(go_shares.ShareError, match="expected K/N"):
        go_shares.parse(text)
    assert go_shares.parse("2/2") == (2, 2)
