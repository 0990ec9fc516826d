"""The package's shape: imports point down the layers and never form a cycle (imports
inside functions included), the daemon never reaches the simulator, and the runtime wheel
carries the daemon alone."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
SIM_SRC = REPO / "sim" / "src"
DAEMON = "rbln_device_plugin"
SIM = "rbln_device_plugin_sim"

# Each tier may import only from lower tiers; layers of one tier are independent of each
# other. Tier 0 holds leaf modules that anything may use (and that use each other).
TIERS: tuple[frozenset[str], ...] = (
    frozenset(
        {
            "__init__",
            "_version",
            "aiotasks",
            "_build_version",
            "api",
            "durations",
            "goints",
            "goflags",
            "processtweaks",
            "shorten",
            "signalcatch",
            "waits",
        }
    ),
    frozenset({"model"}),  # pure: plain data in, plain data out (the resources included)
    frozenset({"config"}),  # the frozen settings, naming the resources
    frozenset({"telemetry", "topology"}),
    frozenset({"host", "options"}),
    # The core: scan -> inventory -> per-resource device state. It knows no front end.
    frozenset({"core"}),
    # The front ends (the device plugin's kubelet/, DRA's dra/): independent.
    frozenset({"kubelet", "dra"}),
    # The daemon's lifecycle, and inspect (which reports what either front end would do).
    frozenset({"runtime", "inspect"}),
    frozenset({"cli"}),
    frozenset({"entry"}),  # the signal catcher first, then cli
    frozenset({"__main__"}),
)
TIER_OF: Mapping[str, int] = {layer: rank for rank, tier in enumerate(TIERS) for layer in tier}


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``root``."""
    modules: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """Every module ``name`` imports, anywhere in the file (functions, TYPE_CHECKING)."""
    known = set(known)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            # `from pkg import module` depends on the module, not only on pkg.
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
    return found


def import_graph(modules: Mapping[str, Path], prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for target in imports_of(name, path, modules):
            # An import of a submodule also runs its packages' __init__: only the deepest
            # known module counts as the edge.
            while target and target not in modules and target.startswith(prefixes):
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """Edges that leave their layer for one that is not in a lower tier."""
    wrong = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = layer(source), layer(target)
            if a == b or (TIER_OF[a] == 0 and TIER_OF[b] == 0):
                continue
            if TIER_OF[b] >= TIER_OF[a]:
                wrong.append(
                    f"{source} ({a}, tier {TIER_OF[a]}) imports {target} ({b}, tier {TIER_OF[b]})"
                )
    return wrong


# --------------------------------------------------------------------------- the checks
def test_every_layer_of_the_package_is_placed_in_a_tier() -> None:
    layers = {layer(name) for name in module_files(SRC, DAEMON)}
    assert layers <= set(TIER_OF), sorted(layers - set(TIER_OF))


def test_daemon_imports_point_down_the_layers_without_cycles() -> None:
    modules = module_files(SRC, DAEMON)
    graph = import_graph(modules, (DAEMON,))
    assert sum(len(targets) for targets in graph.values()) > 100, "the parser found no imports"
    assert cycles(graph) == []
    assert upward_imports(graph) == []


# Inside a layer: who may know whom. The Allocate path runs one way (servicer -> device
# state -> allocator), the plugin assembles the parts, the session drives the plugins,
# and no part reaches back up: the session's producers (servicer, plugin, watch) only
# know its events.
_KUBELET = f"{DAEMON}.kubelet"
_DRA = f"{DAEMON}.dra"
FORBIDDEN_WITHIN: Mapping[str, frozenset[str]] = {
    f"{_KUBELET}.allocate": frozenset(
        {f"{_KUBELET}.{m}" for m in ("plugin", "servicer", "session", "events", "preferred")}
    ),
    f"{_KUBELET}.servicer": frozenset({f"{_KUBELET}.{m}" for m in ("plugin", "session")}),
    f"{_KUBELET}.plugin": frozenset({f"{_KUBELET}.{m}" for m in ("session", "plugins")}),
    f"{_KUBELET}.plugins": frozenset({f"{_KUBELET}.session"}),
    f"{_KUBELET}.watch": frozenset({f"{_KUBELET}.{m}" for m in ("plugin", "servicer", "session")}),
    f"{_KUBELET}.events": frozenset(
        {f"{_KUBELET}.{m}" for m in ("plugin", "servicer", "session", "allocate", "watch")}
    ),
    f"{_KUBELET}.services": frozenset(
        {f"{_KUBELET}.{m}" for m in ("plugin", "servicer", "session", "allocate")}
    ),
    f"{DAEMON}.host.proc": frozenset(
        {f"{DAEMON}.host.{m}" for m in ("smi", "rsd", "scan", "sysfs", "devnodes")}
    ),
    f"{DAEMON}.inspect.facts": frozenset(
        {
            f"{DAEMON}.inspect.{m}"
            for m in ("report", "explain", "preferredreport", "command", "render")
        }
    ),
}


def test_modules_within_a_layer_keep_their_boundaries() -> None:
    modules = module_files(SRC, DAEMON)
    graph = import_graph(modules, (DAEMON,))
    wrong = {
        source: sorted(graph[source] & forbidden)
        for source, forbidden in FORBIDDEN_WITHIN.items()
        if source in graph and graph[source] & forbidden
    }
    assert wrong == {}
    # Nothing under kubelet/ or dra/ knows the scan loop, nothing in the core a front end;
    # the Allocate path's parts, the session and the shared RSD sequence exist.
    front_end_modules = [n for n in graph if n.startswith((_KUBELET, _DRA))]
    runtime = f"{DAEMON}.runtime"
    assert not [n for n in front_end_modules if any(t.startswith(runtime) for t in graph[n])]
    core = [name for name in graph if name.startswith(f"{DAEMON}.core")]
    front_ends = (_KUBELET, _DRA, f"{DAEMON}.inspect", f"{DAEMON}.runtime")
    assert not [n for n in core if any(t.startswith(front_ends) for t in graph[n])]
    assert {
        f"{_KUBELET}.allocate", f"{DAEMON}.core.devicestate", f"{_KUBELET}.session",
        f"{DAEMON}.core.rsdgroups", f"{_DRA}.prepare",
    } <= set(graph)  # fmt: skip
    # Both front ends run the RSD sequence from the core, not one from the other.
    assert f"{DAEMON}.core.rsdgroups" in graph[f"{_KUBELET}.allocate"]
    assert f"{DAEMON}.core.rsdgroups" in graph[f"{_DRA}.prepare"]


def test_simulator_imports_have_no_cycles() -> None:
    modules = module_files(SIM_SRC, SIM)
    assert cycles(import_graph(modules, (SIM,))) == []


def test_the_daemon_never_reaches_the_simulator() -> None:
    modules = module_files(SRC, DAEMON)
    for name, path in modules.items():
        text = path.read_text()
        assert SIM not in text, f"{name} mentions the simulator"
        assert not {i for i in imports_of(name, path, modules) if i.startswith(SIM)}


def test_checker_finds_a_cycle_hidden_in_a_function_and_an_upward_import(tmp_path: Path) -> None:
    package = tmp_path / DAEMON
    for sub in ("host", "kubelet", "model"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "host" / "a.py").write_text("def f():\n    from rbln_device_plugin.host import b\n")
    (package / "host" / "b.py").write_text("from rbln_device_plugin.host.a import f\n")
    (package / "model" / "pure.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from rbln_device_plugin.kubelet import plugin\n"
    )
    (package / "kubelet" / "plugin.py").write_text("from ..model import pure\n")
    graph = import_graph(module_files(tmp_path, DAEMON), (DAEMON,))
    assert cycles(graph) == [
        [f"{DAEMON}.host.a", f"{DAEMON}.host.b"],
        [f"{DAEMON}.kubelet.plugin", f"{DAEMON}.model.pure"],
    ]
    assert upward_imports(graph) == [
        f"{DAEMON}.model.pure (model, tier 1) imports {DAEMON}.kubelet (kubelet, tier 6)",
        f"{DAEMON}.model.pure (model, tier 1) imports {DAEMON}.kubelet.plugin (kubelet, tier 6)",
    ]


# --------------------------------------------------------------------------- the wheels
def build_wheel(project: Path, outdir: Path) -> zipfile.ZipFile:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
         str(outdir), str(project)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0 and "No matching distribution" in done.stdout + done.stderr:
        pytest.skip("the build backend cannot be fetched from this machine")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = outdir.glob("*.whl")
    return zipfile.ZipFile(wheel)


@pytest.mark.slow  # builds a wheel
def test_runtime_wheel_holds_the_daemon_and_nothing_of_the_simulator(tmp_path: Path) -> None:
    with build_wheel(REPO, tmp_path) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = wheel.read(entry_points).decode()
    code = {n for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    expected = {
        path.relative_to(SRC).as_posix()
        for path in (SRC / DAEMON).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert code == expected | {f"{DAEMON}/_version.py"}
    assert not [n for n in names if "sim" in n.lower().replace("simple", "")]
    assert "rbln-device-plugin = rbln_device_plugin.entry:main" in scripts
    assert "rbln-device-plugin-sim" not in scripts
    print(f"runtime wheel: {len(code)} files, {sum(1 for n in code if n.endswith('.py'))} modules")


@pytest.mark.slow  # builds a wheel
def test_simulator_wheel_holds_the_simulator_only(tmp_path: Path) -> None:
    with build_wheel(REPO / "sim", tmp_path) as wheel:
        code = {n for n in wheel.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}
    assert code and all(n.startswith(f"{SIM}/") for n in code), sorted(code)
