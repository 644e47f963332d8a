"""The package's layout rules (docs/architecture.md), checked on its source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aiolock

PACKAGE = Path(aiolock.__file__).parent


def _imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (type-only too)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                names.add(node.module)
        graph[path.stem] = names
    return graph


def test_no_import_cycle() -> None:
    """No module imports, even for type checking only, one that imports it back."""
    graph = _imports()
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                cycles.append([*path[path.index(imported) :], imported])
            elif imported in graph:
                visit(imported, [*path, imported])

    for module in sorted(graph):
        visit(module, [module])
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_no_reach_into_the_client() -> None:
    """Outside _client.py no module touches the client's private attributes."""
    reach = re.compile(r"(self\._client|client)\._[a-z]")
    found = [
        f"{path.name}:{number}"
        for path in PACKAGE.glob("*.py")
        if path.name != "_client.py"
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if reach.search(line)
    ]
    assert not found, found
