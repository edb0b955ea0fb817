"""The layers of docs/architecture.md, beside the import contracts that
``make lint`` checks. No broker: the first tests import the public API in a
fresh interpreter (nothing else imported before); the others read the
import graph of the source (grimp, import-linter's), where a contract
cannot say it: no module circle across packages (``acyclic_siblings`` sees
those inside one), and no private client module (``settlement._*``, a
pattern import-linter's wildcards cannot spell) imported by the engine or
Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grimp
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


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_no_module_imports_itself_through_others() -> None:
    assert circles(graph()) == []


def test_a_circle_is_found() -> None:
    made = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        made.add_import(importer=importer, imported=imported)
    assert circles(made) == [["a", "b", "c"]]


def private(module: str) -> bool:
    return module.startswith("settlement.") and any(
        part.startswith("_") and not part.startswith("__") for part in module.split(".")[1:])


def test_the_engine_and_spark_import_no_private_client_module() -> None:
    imports = graph()
    found = sorted(f"{importer} -> {imported}"
                   for package in ("streams", "spark")
                   for importer in imports.find_descendants(package)
                   for imported in imports.find_modules_directly_imported_by(importer)
                   if private(imported))
    assert found == []
    assert private("settlement._engine_link") and private("settlement.aio._client")
    assert not private("settlement.management") and not private("settlement.__init__")
