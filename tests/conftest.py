"""Shared fixtures: short temporary directories (unix socket paths are limited to 107
bytes, so pytest's deep tmp_path is not always usable) and a loaded machine."""

from __future__ import annotations

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


# ---------------------------------------------------------------- the kubelet peer
KUBELET_PEER_BUILDS = pytest.StashKey[dict[str, kubelet_peer.Build]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the kubelet peer for each version the selected tests use, before any test runs.

    Building here keeps a cold build (minutes: module download and compile) out of every
    test's timeout; later sessions reuse the cached binaries.
    """
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
