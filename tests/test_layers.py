"""The client library stands apart from its apps, and its modules import
each other in one direction. No broker: the first tests import the public
API in a fresh interpreter (nothing else imported before), the last reads
the import statements of the source."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ["settlement", "settlement.aio", "settlement.management", "settlement.exceptions"]
#: what the public API must not load: the apps built on the library, the
#: engine and the Spark jobs
APPS = ("settlement.cli", "settlement.testing", "settlement.demo", "streams", "spark")
PACKAGES = ("settlement", "topics", "streams", "spark")


@pytest.mark.parametrize("module", PUBLIC)
def test_the_public_api_loads_no_app(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if m.startswith(tuple(f"{app}." for app in APPS))
            or m in APPS] == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project's modules ``path`` imports, wherever the import statement
    stands (inside a function or an ``if TYPE_CHECKING:`` too). As grimp
    counts them: ``from package import module`` imports the module, not the
    package's ``__init__`` (which every submodule's import runs first)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(named & modules)
            if named - modules:  # names defined in the module itself
                found.add(node.module)
    return found & modules


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_circles_through_the_client_or_its_apps() -> None:
    paths = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}
    ours = [c for c in _cycles(graph)
            if any(m.startswith("settlement") or m in ("spark.cli", "streams.worker") for m in c)]
    assert ours == []
