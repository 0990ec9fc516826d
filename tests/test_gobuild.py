"""The Go build cache of the test peers (``tests/gobuild.py``): what a cached build is keyed
by, and the kubelet peer sharing its compiled packages with the real node's kubelet."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from . import gobuild, kubelet_peer
from .realnode import artifacts

KUBELET = "k8s.io/kubernetes/cmd/kubelet"


def _module(tmp_path: Path) -> gobuild.GoTarget:
    module = tmp_path / "mod"
    shared = tmp_path / "shared"
    module.mkdir()
    shared.mkdir()
    (module / "go.mod").write_text("module m\n\nrequire k8s.io/kubernetes v1.37.2\n")
    (module / "go.sum").write_text("k8s.io/kubernetes v1.37.2 h1:aaaa=\n")
    (module / "main.go").write_text("package main\n\nfunc main() {}\n")
    (shared / "protocol.go").write_text("package shared\n")
    return gobuild.GoTarget(
        name="m",
        module=module,
        binaries=(gobuild.GoBinary(".", "m"),),
        env=gobuild.STATIC_ENV,
        flags=gobuild.TRIM,
        sources=(shared,),
    )


def test_a_changed_build_description_misses_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any change of a pin, a source, a flag, the environment, the tags or Go itself names
    another cache entry, so the binaries are rebuilt; other files keep the entry."""
    monkeypatch.setattr(gobuild, "go_version", lambda: "go version go1.26.8 linux/amd64")
    target = _module(tmp_path)
    root = tmp_path / "cache"
    entry = gobuild.entry(target, root)
    entry.mkdir(parents=True)
    (entry / "m").write_bytes(b"binary")
    assert gobuild.cached(target, root) == entry

    (target.module / "README.md").write_text("not built\n")
    assert gobuild.cached(target, root) == entry

    binary = target.binaries[0]
    changed: dict[str, Any] = {
        "flags": lambda: dataclasses.replace(target, flags=()),
        "env": lambda: dataclasses.replace(target, env={"CGO_ENABLED": "1"}),
        "tags": lambda: dataclasses.replace(
            target, binaries=(dataclasses.replace(binary, tags=("netgo",)),)
        ),
    }
    seen = {gobuild.digest(target)}
    for what, variant in changed.items():
        other = variant()
        assert gobuild.cached(other, root) is None, what
        seen.add(gobuild.digest(other))
    for path, text in (
        (target.module / "go.mod", "module m\n\nrequire k8s.io/kubernetes v1.37.3\n"),
        (target.module / "go.sum", "k8s.io/kubernetes v1.37.3 h1:bbbb=\n"),
        (target.module / "main.go", "package main\n\nfunc main() { println() }\n"),
        (target.sources[0] / "protocol.go", "package shared // changed\n"),
    ):
        before = path.read_text()
        path.write_text(text)
        assert gobuild.cached(target, root) is None, path.name
        seen.add(gobuild.digest(target))
        path.write_text(before)
    assert gobuild.cached(target, root) == entry
    monkeypatch.setattr(gobuild, "go_version", lambda: "go version go1.26.9 linux/amd64")
    assert gobuild.cached(target, root) is None
    seen.add(gobuild.digest(target))
    assert len(seen) == 1 + len(changed) + 4 + 1


def _go_mod(module: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["go", "mod", "edit", "-json"], cwd=module, capture_output=True, text=True, check=True
    )
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def _requires(mod: dict[str, Any]) -> dict[str, str]:
    return {r["Path"]: r["Version"] for r in mod.get("Require") or []}


def _replaces(mod: dict[str, Any]) -> dict[str, str]:
    return {
        r["Old"]["Path"]: f"{r['New']['Path']}@{r['New'].get('Version', '')}"
        for r in mod.get("Replace") or []
    }


def _kubelet_target(kubernetes: str) -> gobuild.GoTarget:
    """The real node's target that builds the kubelet of that k8s.io/kubernetes version."""
    for target in (*artifacts.GO_TARGETS, *artifacts.LEGACY_TARGETS):
        builds_kubelet = any(b.package == KUBELET for b in target.binaries)
        if (
            builds_kubelet
            and _requires(_go_mod(target.module)).get("k8s.io/kubernetes") == kubernetes
        ):
            return target
    raise AssertionError(f"no real-node target builds the kubelet of {kubernetes}")


@pytest.mark.skipif(shutil.which("go") is None, reason="Go toolchain not found on PATH")
@pytest.mark.parametrize("version", list(kubelet_peer.VERSIONS))
def test_the_kubelet_peer_compiles_like_the_real_node_kubelet_of_its_release(
    version: str,
) -> None:
    """Go's build cache reuses a compiled package only for the same module version and the
    same settings: the peer's go.mod selects the kubelet module's version of every module
    both use (and replaces alike), and it builds with the kubelet's environment and flags
    (ldflags aside: they only reach the linker)."""
    peer = kubelet_peer.target(version)
    peer_mod = _go_mod(peer.module)
    kubernetes = _requires(peer_mod)["k8s.io/kubernetes"]
    assert kubernetes.startswith(f"v{version}."), kubernetes
    kubelet = _kubelet_target(kubernetes)
    kubelet_mod = _go_mod(kubelet.module)

    for pins in (_requires, _replaces):
        ours, theirs = pins(peer_mod), pins(kubelet_mod)
        differ = {
            p: (ours[p], theirs[p]) for p in ours.keys() & theirs.keys() if ours[p] != theirs[p]
        }
        assert not differ, f"{peer.module.name} vs {kubelet.module.name}: {differ}"
    assert dict(peer.env) == dict(kubelet.env)
    assert peer.flags == tuple(f for f in kubelet.flags if not f.startswith("-ldflags"))
    (kubelet_binary,) = (b for b in kubelet.binaries if b.package == KUBELET)
    assert all(b.tags == kubelet_binary.tags for b in peer.binaries)
