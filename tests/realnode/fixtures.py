"""pytest glue: build the real node's artifacts before any test runs, one cluster per session.

``tests/conftest.py`` calls ``prepare_session`` from ``pytest_collection_finish`` (so a
cold build, many minutes, counts against no test's timeout) and re-exports the
``realnode`` fixture: any test module marked ``realnode`` gets a running ``Cluster``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import artifacts, cluster, layouts, workloads


@dataclass(frozen=True)
class Prepared:
    arts: artifacts.Artifacts | None = None
    skip: str = ""
    error: str = ""


PREPARED = pytest.StashKey[Prepared]()


def wants_legacy_runtime(marker: pytest.Mark | None) -> bool:
    """``pytest.mark.realnode(legacy_runtime=True)``: the module's node runs the 1.34
    kubelet with containerd 1.6 (``cluster.Cluster.legacy``)."""
    return bool(marker is not None and marker.kwargs.get("legacy_runtime"))


def prepare_session(
    session: pytest.Session, items: Sequence[pytest.Item], say: Callable[[str], None]
) -> None:
    """Build (or find cached) what the real-node tests among ``items`` need."""
    markers = [m for item in items if (m := item.get_closest_marker("realnode"))]
    if not markers:
        return
    reason = cluster.unavailable()
    if reason:
        say(f"real node: skipped: {reason}")
        session.config.stash[PREPARED] = Prepared(skip=reason)
        return
    say(f"real node: looking for cached builds in {artifacts.cache_root()}")
    try:
        arts = cluster.prepare(say, legacy=any(wants_legacy_runtime(m) for m in markers))
    except Exception as exc:  # reported by every realnode test instead of one crash
        say("real node: BUILD FAILED (its tests will fail)")
        session.config.stash[PREPARED] = Prepared(error=f"{type(exc).__name__}: {exc}")
        return
    built = ", ".join(arts.built) or "nothing (all cached)"
    say(f"real node: built {built}")
    session.config.stash[PREPARED] = Prepared(arts=arts)


def _du(path: Path) -> int:
    """MiB under ``path``; du exits 1 when a file vanished under it (a container's, as the
    cluster runs) yet still prints its total."""
    done = subprocess.run(["du", "-sxm", str(path)], capture_output=True, text=True, check=False)
    fields = done.stdout.split()
    return int(fields[0]) if fields and fields[0].isdigit() else -1


@pytest.fixture(scope="module")
def realnode(request: pytest.FixtureRequest) -> Iterator[cluster.Cluster]:
    """A running one-node cluster (simulated node ``layouts.mixed``) for one test module.

    Per module, not per session: the cluster (some 750 MiB and a steady trickle of CPU)
    is gone before the suite's other modules run. Within the module tests share it. A
    module marked ``realnode(legacy_runtime=True)`` gets the 1.34 kubelet and containerd 1.6.
    """
    prepared = request.config.stash.get(PREPARED, Prepared(skip="not prepared"))
    if prepared.skip:
        pytest.skip(f"real node: {prepared.skip}")
    if prepared.error or prepared.arts is None:
        pytest.fail(f"real node artifacts: {prepared.error}")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say(text: str) -> None:
        """A line on the terminal now (capture is on during fixtures), and in the report."""
        report = os.environ.get("RBLN_REALNODE_REPORT")
        if report:
            with Path(report).open("a") as out:
                out.write(text + "\n")
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(text)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(text)

    legacy = wants_legacy_runtime(request.node.get_closest_marker("realnode"))
    with cluster.running_cluster(layouts.mixed(), say, prepared.arts, legacy) as running:
        yield running
        running.note_memory()
        memory = running.peak_memory
        top = ", ".join(f"{name} {mib:.0f}" for name, mib in list(memory.items())[:10])
        say(f"real node: peak resident memory {sum(memory.values()):.0f} MiB ({top})")
        state, caches = _du(running.state), _du(artifacts.cache_root())
        say(f"real node: state directory {state} MiB, caches {caches} MiB")


@pytest.fixture
def realnode_plugin(realnode: cluster.Cluster) -> Iterator[cluster.Cluster]:
    """The cluster with the chart installed and serving (``workloads.install``), the
    kubelet running. Installed once and kept for the next test that asks."""
    if "kubelet" not in realnode.processes:  # a failed test left it stopped
        realnode.start_kubelet()
        cluster.wait_for("Ready node", realnode.node_ready)
    if not workloads.ready_plugin_pods(realnode) or realnode.allocatable() != layouts.EXPECTED:
        workloads.install(realnode)
    yield realnode
    realnode.note_memory()  # after the test: its pods still run
