"""The Go build cache of the test peers (``tests/gobuild.py``): what a cached build is keyed
by, and the kubelet peer sharing its compiled packages with the real node's kubelet."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import zipfile
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

    def compiler_flags(target: gobuild.GoTarget) -> list[str]:
        return [f for f in target.flags if not f.startswith("-ldflags")]

    assert compiler_flags(peer) == compiler_flags(kubelet)
    assert f"-ldflags={gobuild.STRIP_LDFLAGS}" in peer.flags
    (kubelet_binary,) = (b for b in kubelet.binaries if b.package == KUBELET)
    assert all(b.tags == kubelet_binary.tags for b in peer.binaries)


# ---------------------------------------------------------------- progress lines


def test_the_plan_counts_one_package_per_compiler_run() -> None:
    transcript = "\n".join(
        [
            "mkdir -p $WORK/b006/",
            "/usr/local/go/pkg/tool/linux_amd64/compile -o $WORK/b006/_pkg_.a -p internal/goarch",
            "cat >$WORK/b001/importcfg.link << 'EOF' # internal",
            "/usr/local/go/pkg/tool/linux_amd64/compile -o $WORK/b005/_pkg_.a -p internal/abi",
            "/usr/local/go/pkg/tool/linux_amd64/link -o $WORK/b001/exe/a.out",
        ]
    )
    assert gobuild.compiles_planned(transcript) == 2
    assert gobuild.compiles_planned("mkdir -p $WORK/b001/\n/x/link -o a.out\n") == 0


def test_the_verbose_build_counts_the_packages_it_names() -> None:
    log = "go: downloading k8s.io/klog/v2 v2.130.1\ninternal/goarch\nk8s.io/klog/v2\n\nm\n"
    assert gobuild.compiled_so_far(log) == 3


def test_the_progress_line_says_how_far_and_how_long() -> None:
    line = gobuild.progress_line
    assert line("go build kubelet (k)", 0, 0, 0, None) == "go build kubelet (k): linking (0 s)"
    # No last build: no estimate until a tenth is done, then by this build's pace.
    assert line("b", 30, 50, 1000, None) == "b: 50 of 1000 packages compiled (30 s)"
    assert line("b", 60, 200, 1000, None) == (
        "b: 200 of 1000 packages compiled (60 s; about 240 s left by this build's pace)"
    )
    # The last build compiled 1200 packages in 600 s; this one plans 600 of them.
    last = gobuild.LastBuild(600.0, 1200)
    assert line("b", 100, 300, 600, last) == (
        "b: 300 of 600 packages compiled (100 s; about 200 s left by the last build's pace)"
    )
    assert line("b", 400, 599, 600, last) == (
        "b: 599 of 600 packages compiled (400 s; past the 300 s expected by the last build's pace)"
    )


def test_a_timings_file_that_cannot_be_read_gives_no_estimate(tmp_path: Path) -> None:
    assert gobuild.load_timings(tmp_path) == {}
    for junk in ("", "[1]", '{"a": {"seconds": "x", "compiled": 1}}', '{"a": 3}'):
        (tmp_path / "timings.json").write_text(junk)
        assert gobuild.load_timings(tmp_path) == {}, junk
    gobuild.save_timing(tmp_path, "t/b", gobuild.LastBuild(12.34, 7))
    gobuild.save_timing(tmp_path, "t/c", gobuild.LastBuild(1.0, 1))
    assert gobuild.load_timings(tmp_path) == {
        "t/b": gobuild.LastBuild(12.3, 7),
        "t/c": gobuild.LastBuild(1.0, 1),
    }


@pytest.mark.skipif(shutil.which("go") is None, reason="Go toolchain not found on PATH")
def test_a_real_build_reports_its_plan_and_the_next_one_an_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds of a small module with its own package, each with an empty Go build
    cache: the first line names the packages to compile (the two of the module and the
    standard library's that it imports), the second build's lines estimate its time from
    the first's record."""
    module = tmp_path / "mod"
    (module / "greet").mkdir(parents=True)
    (module / "go.mod").write_text("module m\n\ngo 1.22\n")
    (module / "greet" / "greet.go").write_text("package greet\n\nconst Hello = 1\n")
    (module / "main.go").write_text(
        'package main\n\nimport "m/greet"\n\nfunc main() { _ = greet.Hello }\n'
    )
    (module / "other").mkdir()
    (module / "other" / "main.go").write_text("package main\n\nfunc main() {}\n")
    binaries = (gobuild.GoBinary(".", "m"), gobuild.GoBinary("./other", "other"))
    target = gobuild.GoTarget("m", module, binaries, env=gobuild.STATIC_ENV)
    root = tmp_path / "cache"
    for attempt in ("first", "second"):
        monkeypatch.setenv("GOCACHE", str(tmp_path / f"gocache-{attempt}"))
        said: list[str] = []
        directory, _, was_cached = gobuild.build(target, root, said.append)
        assert not was_cached and (directory / "m").is_file()
        first_count, other_first = [s for s in said if "packages compiled (0 s" in s]
        # Each binary starts from none done (not from the last binary's log).
        assert first_count.split(": ")[1].startswith("0 of "), said
        assert other_first.split(": ")[1].startswith("0 of "), said
        planned = int(first_count.split(" of ")[1].split()[0])
        assert planned >= 2, said  # at least m and m/greet; runtime's packages too
        if attempt == "first":
            assert "left by" not in first_count, said
            record = gobuild.load_timings(root)["m/m"]
            assert record.compiled == planned
        else:
            assert "by the last build's pace" in first_count, said
        (module / "main.go").write_text(
            'package main\n\nimport "m/greet"\n\nfunc main() { println(greet.Hello) }\n'
        )


def _file_proxy(root: Path, module: str, version: str, files: dict[str, str]) -> str:
    """A GOPROXY directory serving one module version (Go's file:// proxy layout)."""
    at = root / module / "@v"
    at.mkdir(parents=True)
    (at / "list").write_text(f"{version}\n")
    (at / f"{version}.info").write_text(json.dumps({"Version": version}))
    (at / f"{version}.mod").write_text(files["go.mod"])
    with zipfile.ZipFile(at / f"{version}.zip", "w") as archive:
        for name, text in files.items():
            archive.writestr(f"{module}@{version}/{name}", text)
    return root.as_uri()


@pytest.mark.skipif(shutil.which("go") is None, reason="Go toolchain not found on PATH")
def test_prefetching_leaves_the_build_nothing_to_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module downloads of a later build, fetched beside an earlier one: afterwards
    the build succeeds with the module proxy switched off, and a built target is not
    fetched for again."""
    dep = "example.com/dep"
    proxy = _file_proxy(
        tmp_path / "proxy",
        dep,
        "v1.0.0",
        {"go.mod": f"module {dep}\n\ngo 1.22\n", "dep.go": "package dep\n\nconst N = 1\n"},
    )
    module = tmp_path / "mod"
    module.mkdir()
    (module / "go.mod").write_text(f"module m\n\ngo 1.22\n\nrequire {dep} v1.0.0\n")
    (module / "main.go").write_text(
        f'package main\n\nimport "{dep}"\n\nfunc main() {{ println(dep.N) }}\n'
    )
    monkeypatch.setenv("GOPROXY", proxy)
    monkeypatch.setenv("GOSUMDB", "off")
    monkeypatch.setenv("GOFLAGS", "-modcacherw")
    monkeypatch.setenv("GOCACHE", str(tmp_path / "gocache"))
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "tidy-modcache"))
    subprocess.run(["go", "mod", "tidy"], cwd=module, check=True, capture_output=True)
    assert dep in (module / "go.sum").read_text()

    modcache = tmp_path / "modcache"
    monkeypatch.setenv("GOMODCACHE", str(modcache))
    target = gobuild.GoTarget("m", module, (gobuild.GoBinary(".", "m"),), gobuild.STATIC_ENV)
    root = tmp_path / "cache"
    assert gobuild.prefetch_modules([target], root) == ["m/m"]
    assert (modcache / f"{dep}@v1.0.0" / "dep.go").is_file()

    monkeypatch.setenv("GOPROXY", "off")
    directory, _, was_cached = gobuild.build(target, root, lambda _: None)
    assert not was_cached and (directory / "m").is_file()
    assert gobuild.prefetch_modules([target], root) == []
