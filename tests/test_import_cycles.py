"""No import circles between modules, across the four packages.

import-linter's ``acyclic_siblings`` contract (``make lint``) finds circles
inside each package; this finds those that run through two of them (say
``settlement`` → ``streams`` → ``settlement``), module by module."""

from __future__ import annotations

import grimp

PACKAGES = ("settlement", "topics", "streams", "spark")


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


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [["a", "b", "c"]]
