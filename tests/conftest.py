"""Shared fixtures: short temporary directories (unix socket paths are limited to 107
bytes, so pytest's deep tmp_path is not always usable) and a loaded machine."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from . import kubelet_peer
from .realnode.fixtures import prepare_session, realnode, realnode_plugin

# The real-node cluster fixtures (tests/realnode/fixtures.py), for every test module.
__all__ = ["realnode", "realnode_plugin"]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rbln-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """Tests that install the daemon's logger must not change what the next test sees."""
    yield
    structlog.reset_defaults()


# ---------------------------------------------------------------- parallel runs
# `make test` runs the suite on several pytest-xdist workers with `--dist loadgroup`: the
# tests of one xdist_group run on one worker, one after another; every other test is a unit
# of its own, sent to whichever worker is free. The groups (docs/testing.md):
HOST_GLOBAL = "host-global"  # the kubelet peer and the real cluster: root, fixed host paths
MACHINE_LOAD = "machine-load"  # tests that load every core, or read resident memory under load
LOAD_SENSITIVE = {"test_load.py::test_resident_memory_levels_off_over_10000_calls"}


def xdist_group_of(item: pytest.Item) -> str | None:
    if item.get_closest_marker("kubelet_peer") or item.get_closest_marker("realnode"):
        return HOST_GLOBAL
    fixtures = getattr(item, "fixturenames", ())
    if "loaded_machine" in fixtures or item.nodeid.split("/")[-1] in LOAD_SENSITIVE:
        return MACHINE_LOAD
    # A module whose tests share a fixture of its own wider than one test (a daemon, a Go
    # build, the image's virtualenv, helm's renders): on one worker, set up once.
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    for definitions in getattr(info, "name2fixturedefs", {}).values():
        if any(d.baseid == module and d.scope != "function" for d in definitions):
            return module.rsplit("/", 1)[-1]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    parallel = config.getoption("dist", "no") != "no" or hasattr(config, "workerinput")
    if parallel:
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
    go_layers = any(
        item.get_closest_marker("kubelet_peer") or item.get_closest_marker("realnode")
        for item in session.items
    )
    if not go_layers or not hasattr(session.config, "workerinput"):
        _prepare_go_layers(session)
        return
    # Under pytest-xdist every worker collects every test and comes here: one builds at a
    # time, and the others then find its cached binaries. (make test runs these layers
    # without xdist, where the builds' progress lines are seen.)
    with open(Path(tempfile.gettempdir()) / "rbln-device-plugin-go-builds.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _prepare_go_layers(session)


def _prepare_go_layers(session: pytest.Session) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    prepare_session(session, reporter.write_line if reporter is not None else print)
    wanted = sorted(
        {
            item.callspec.params["kube"]
            for item in session.items
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
