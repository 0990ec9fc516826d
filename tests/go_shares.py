"""make test runs the Go-built layers' test modules in two pytest processes side by side.

Each module of those layers (the kubelet peers, one real cluster per module) spends most
of its time waiting: on pods, on the kubelet's back-offs and sync periods, on helm. Two
modules waiting at once finish in about half the time, and they share nothing: each real
cluster has its own mount, PID and network namespaces and its own cgroup root (named
after its pytest process), each kubelet peer its own mount namespace.

``--go-share=K/N`` keeps the K-th of N shares. The split is by whole module (a module's
tests share its cluster), longest first onto the share with the least so far, from the
seconds each module took alone (``pytest --durations=0``, 2026-12-06, warm caches). A
module missing from the table counts as ``UNKNOWN_MODULE_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Iterable

# The markers of the Go-built layers' tests (tests/conftest.py; make test's runs select by them).
GO_LAYER_MARKERS = ("kubelet_peer", "realnode")

# Seconds of setup, calls and teardown per module, one process alone on the 2-core machine.
MODULE_SECONDS = {
    "test_realnode_dra.py": 94,
    "test_realnode.py": 88,
    "test_realnode_cdi_containerd16.py": 66,
    "test_realnode_cdi.py": 58,
    "test_realnode_dra_health.py": 45,
    "test_realnode_switch.py": 33,
    "test_kubelet_peer.py": 32,
}
UNKNOWN_MODULE_SECONDS = 60


class ShareError(ValueError):
    """A ``--go-share`` value that is not K/N with 1 <= K <= N."""


def parse(text: str) -> tuple[int, int]:
    """``"K/N"`` as (K, N)."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit()) or not 1 <= int(index) <= int(count):
        raise ShareError(f"--go-share={text!r}: expected K/N with 1 <= K <= N, as 1/2")
    return int(index), int(count)


def module_name(nodeid: str) -> str:
    return nodeid.split("::")[0].rsplit("/", 1)[-1]


def split(modules: Iterable[str], count: int) -> list[set[str]]:
    """``modules`` in ``count`` shares of about equal seconds; the same modules always
    give the same shares, whatever order they come in."""
    shares: list[set[str]] = [set() for _ in range(count)]
    totals = [0] * count

    def seconds(module: str) -> int:
        return MODULE_SECONDS.get(module, UNKNOWN_MODULE_SECONDS)

    for module in sorted(set(modules), key=lambda m: (-seconds(m), m)):
        lightest = min(range(count), key=lambda i: (totals[i], i))
        shares[lightest].add(module)
        totals[lightest] += seconds(module)
    return shares


def keep(nodeids: Iterable[str], share: tuple[int, int]) -> set[str]:
    """The node IDs of ``nodeids`` in share ``share`` (K, N)."""
    ids = list(nodeids)
    index, count = share
    mine = split((module_name(n) for n in ids), count)[index - 1]
    return {n for n in ids if module_name(n) in mine}
