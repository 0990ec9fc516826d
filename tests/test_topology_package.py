"""The topology package stays pure and layered: no gRPC, imports in one direction."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rbln_device_plugin.topology as topology

PACKAGE = Path(topology.__file__).parent
# Each module may only import the ones before it.
LAYERS = ["model", "classes", "plan", "tables", "search", "request"]


def _project_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("rbln_device_plugin")}


def test_importing_the_package_does_not_import_grpc() -> None:
    probe = (
        "import sys, rbln_device_plugin.topology\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')"
        " or m.startswith('rbln_device_plugin.api')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_modules_import_in_one_direction() -> None:
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted([*LAYERS, "__init__"])
    for position, name in enumerate(LAYERS):
        allowed = {f"rbln_device_plugin.topology.{earlier}" for earlier in LAYERS[:position]}
        allowed.add("rbln_device_plugin.model.inventory")  # Device and the SID rule (pure)
        imports = _project_imports(PACKAGE / f"{name}.py")
        assert imports <= allowed, f"{name} imports {sorted(imports - allowed)}"


def test_every_module_says_what_it_decides() -> None:
    for path in PACKAGE.glob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.split()) >= 30, path.name
