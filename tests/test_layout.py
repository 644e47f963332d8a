"""The package's layout rules (docs/architecture.md), checked on its source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import aiolock

PACKAGE = Path(aiolock.__file__).parent


def _module_name(path: Path) -> str:
    """The dotted name of a module of the package, relative to the package ("_net.wire")."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (type-only too)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = package[: len(package) - (node.level - 1)]
                if node.module:
                    names.add(".".join([*base, node.module]))
                else:
                    names.update(".".join([*base, alias.name]) for alias in node.names)
        graph[name] = names
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
        for path in PACKAGE.rglob("*.py")
        if path.name != "_client.py"
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if reach.search(line)
    ]
    assert not found, found
