"""Shared fixtures: short temporary directories (unix socket paths are limited to 107
bytes, so pytest's deep tmp_path is not always usable) and a loaded machine."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

# Before the imports below: the bytecode of what they import is cached too.
from . import bytecode

bytecode.cache_outside_the_tree()

from rbln_device_plugin.host.hostio import HostIO  # noqa: E402

from . import go_shares, kubelet_peer  # noqa: E402
from .realnode.fixtures import prepare_session, realnode, realnode_plugin  # noqa: E402

# The real-node cluster fixtures (tests/realnode/fixtures.py), for every test module.
__all__ = ["realnode", "realnode_plugin"]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rbln-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def hostio() -> Iterator[HostIO]:
    """A real runner of blocking host calls, as the daemon has one; its threads end after."""
    io = HostIO()
    try:
        yield io
    finally:
        io.close()


# gRPC's and asyncio's own Python log records (a cancelled RPC, a callback that failed)
# carry tracebacks whose frames hold gRPC's Cython objects. pytest's log capture keeps
# every record until the test's teardown ends, after the test's event loop has closed, and
# freeing gRPC's objects then crashes the process (a segfault in pytest's logging teardown:
# `pytest tests/test_stop_races.py -k any_point -o log_level=DEBUG` showed it every time,
# and `-p no:logging` never). So those two libraries' records are turned into text as they
# are made: the same message and traceback in pytest's reports, no live references.
_make_record = logging.getLogRecordFactory()


def _text_only_record(name: str, *args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _make_record(name, *args, **kwargs)
    if name.startswith(("grpc", "asyncio")):
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        record.stack_info = None if record.stack_info is None else str(record.stack_info)
    return record


logging.setLogRecordFactory(_text_only_record)


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """Tests that install the daemon's logger must not change what the next test sees."""
    yield
    structlog.reset_defaults()


# ---------------------------------------------------------------- parallel runs
# `make test` runs the suite on several pytest-xdist workers with `--dist loadgroup`: the
# tests of one group run on one worker, one after another; every other test is a unit of its
# own, sent to whichever worker is free. The groups (docs/testing.md) are decided here from
# the test IDs, by the scheduler below: xdist's own loadgroup reads `xdist_group` marks into
# a suffix of the test ID, which pytest 9.2 no longer lets a plugin change.
HOST_GLOBAL = "host-global"  # the kubelet peer and the real cluster: root, fixed host paths
HOST_GLOBAL_MODULES = ("test_kubelet_peer", "test_realnode")  # module name prefixes
MACHINE_LOAD = "machine-load"  # tests that load every core, or read resident memory under load
MACHINE_LOAD_TESTS = {
    "test_hostio.py::test_a_blocking_read_stalls_only_its_own_item",
    "test_hostio.py::test_a_slow_batch_of_healthy_calls_never_stalls",
    "test_stalls.py::test_slow_status_reads_on_a_loaded_machine_are_not_stalls",
    "test_load.py::test_resident_memory_levels_off_over_10000_calls",
}
# Modules whose tests share a fixture of the module wider than one test (a daemon, a Go
# build, the image's virtualenv, helm's renders), or read what the module's other tests left
# (test_hostile.py counts the outcomes its property tests saw): on one worker, set up once.
# test_every_shared_fixture_module_runs_on_one_worker checks that the list is complete.
SHARED_MODULES = {
    "test_allocate_e2e.py",  # the in-process modules' shared daemons (tests/inprocess.py)
    "test_preferred_e2e.py",
    "test_deploy_chart.py",
    "test_deploy_chart_metrics.py",
    "test_deploy_chart_dra.py",
    "test_deploy_chart_go.py",
    "test_doc_claims.py",  # helm's renders (the fixture of test_deploy_chart.py)
    "test_deploy_chart_dra_apiserver.py",  # one API server and scheduler (tests/kubeapi.py)
    "test_deploy_image.py",
    "test_cdi_library.py",  # one CDI checker process (a Go build)
    "test_goparse.py",
    "test_hostile.py",
    "test_prometheus_rules.py",
    "test_kubeapi_client.py",  # one real API server (tests/kubeapi.py)
    "test_dra_mode.py",  # one real API server (tests/kubeapi.py)
    "test_dra_publisher.py",  # the same, for the ResourceSlice publisher
    "test_dra_scale.py",  # the same, for the scale benchmark's counts
}


def parallel_group(nodeid: str) -> str:
    """The unit of work a test belongs to in make test's parallel run."""
    module = nodeid.split("::")[0].rsplit("/", 1)[-1]
    if module.startswith(HOST_GLOBAL_MODULES):
        return HOST_GLOBAL
    if nodeid.rsplit("/", 1)[-1].split("[")[0] in MACHINE_LOAD_TESTS:
        return MACHINE_LOAD
    return module if module in SHARED_MODULES else nodeid


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once per run, before any worker starts
        bytecode.compile_sources()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return parallel_group(nodeid)

    return GroupScheduling(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--go-share",
        metavar="K/N",
        help="of the Go-built layers' test modules, run only the K-th of N shares "
        "(tests/go_shares.py); the Go builds still cover every selected module",
    )


# Every selected test of the Go-built layers, before --go-share kept one share of them:
# the builds are for all of them, so a share started after them finds everything built.
GO_LAYER_ITEMS = pytest.StashKey[list[pytest.Item]]()


def _in_go_layers(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(marker) for marker in go_shares.GO_LAYER_MARKERS)


@pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    share_option = config.getoption("go_share")
    if share_option:
        try:
            share = go_shares.parse(share_option)
        except go_shares.ShareError as exc:
            raise pytest.UsageError(str(exc)) from None
        go_items = config.stash[GO_LAYER_ITEMS] = [i for i in items if _in_go_layers(i)]
        kept = go_shares.keep((item.nodeid for item in go_items), share)
        dropped = {item.nodeid: item for item in go_items if item.nodeid not in kept}
        if dropped:
            config.hook.pytest_deselected(items=list(dropped.values()))
            items[:] = [item for item in items if item.nodeid not in dropped]
    if hasattr(config, "workerinput"):
        # The longest first (a test with its own long timeout, such as the benchmark run of
        # minutes, then the other slow ones): a worker that picks one up last would run
        # alone at the end. Stable, so every worker sorts alike; pytest-random-order, when
        # asked to, shuffles after this.
        items.sort(key=_longest_first)


def _longest_first(item: pytest.Item) -> tuple[bool, float]:
    timeout = item.get_closest_marker("timeout")
    own_timeout = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
    return item.get_closest_marker("slow") is None, -own_timeout


# ---------------------------------------------------------------- the kubelet peer
KUBELET_PEER_BUILDS = pytest.StashKey[dict[str, kubelet_peer.Build]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the kubelet peer for each version the selected tests use, before any test runs.

    Building here keeps a cold build (minutes: module download and compile) out of every
    test's timeout; later sessions reuse the cached binaries.
    """
    go_layers = any(_in_go_layers(item) for item in session.items)
    if not go_layers or not hasattr(session.config, "workerinput"):
        _prepare_go_layers(session)
        # make test starts its parallel run now: every Go binary it needs is cached.
        if built := os.environ.get("RBLN_GO_BUILDS_DONE"):
            Path(built).touch()
        return
    # Under pytest-xdist every worker collects every test and comes here: one builds at a
    # time, and the others then find its cached binaries. (make test runs these layers
    # without xdist, where the builds' progress lines are seen.)
    with open(Path(tempfile.gettempdir()) / "rbln-device-plugin-go-builds.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _prepare_go_layers(session)


def _prepare_go_layers(session: pytest.Session) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    items = session.config.stash.get(GO_LAYER_ITEMS, session.items)
    prepare_session(session, items, reporter.write_line if reporter is not None else print)
    wanted = sorted(
        {
            item.callspec.params["kube"]
            for item in items
            if item.get_closest_marker("kubelet_peer") and hasattr(item, "callspec")
        }
    )
    if not wanted:
        return
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(text: str) -> None:
        if reporter is not None:
            reporter.write_line(text)

    builds = config.stash.setdefault(KUBELET_PEER_BUILDS, {})
    for version in wanted:
        say(f"kubelet peer {version}: looking for a cached build in {kubelet_peer.cache_root()}")
        build = kubelet_peer.build(version, say)
        builds[version] = build
        if build.skip:
            say(f"kubelet peer {version}: skipped: {build.skip}")
        elif build.error:
            say(f"kubelet peer {version}: BUILD FAILED (its tests will fail)")
        elif build.cached:
            say(f"kubelet peer {version}: cached binary {build.binary}")
        else:
            say(f"kubelet peer {version}: built {build.binary} in {build.seconds:.0f} s")


@pytest.fixture
def loaded_machine() -> Iterator[int]:
    """One busy-loop process per core for the test's duration: timing bounds that only
    hold on an idle machine fail here. Yields the number of busy processes."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield len(busy)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
