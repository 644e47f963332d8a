"""The package's layout rules (docs/architecture.md), checked on its source.

The package is in layers, each a folder that names it, and a module imports (even for type
checking only) from its own layer or one below, never above: data flows handle -> engine ->
network -> server, and pub/sub reaches the engine's waiting room through a protocol only.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import aiolock

PACKAGE = Path(aiolock.__file__).parent


def _module_name(path: Path) -> str:
    """The dotted name of a module of the package, relative to the package ("_net.wire")."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
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
    cycles: list[list[str]] = []
    # Depth first, each module once: on the current path (a cycle if met again), or done.
    path: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                cycles.append([*path[path.index(imported) :], imported])
            elif imported in graph and imported not in done:
                visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    assert not cycles, f"import cycles: {cycles[:3]}"


def _engine_calls() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """Per engine module: the functions and methods it defines, the names it calls, and
    the method names its Protocol classes declare (calls through them do not count)."""
    defined: dict[str, set[str]] = {}
    called: dict[str, set[str]] = {}
    declared: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / "_engine").glob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        defines: set[str] = set()
        calls: set[str] = set()
        protocol: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(base, ast.Name) and base.id == "Protocol" for base in node.bases
            ):
                protocol.update(
                    item.name for item in node.body if isinstance(item, ast.FunctionDef)
                )
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("__"):
                    defines.add(node.name)
                # A call of a parameter is a callback, handed down by whoever called.
                params = {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
                for call in ast.walk(node):
                    if not isinstance(call, ast.Call):
                        continue
                    func = call.func
                    if isinstance(func, ast.Name) and func.id not in params:
                        calls.add(func.id)
                    elif isinstance(func, ast.Attribute) and not (
                        isinstance(func.value, ast.Name) and func.value.id == "dataclasses"
                    ):
                        calls.add(func.attr)
        defined[path.stem], called[path.stem], declared[path.stem] = defines, calls, protocol
    return defined, called, declared


def test_no_two_engine_modules_call_each_other() -> None:
    """Calls between the engine's modules go one way: none calls back into one that calls it.

    A function or method name defined in exactly one engine module identifies it; a call
    through a Protocol the calling module declares (the guard told by the hold registry),
    or of a callback handed in as a parameter, is not a call back.
    """
    defined, called, declared = _engine_calls()
    owners: dict[str, set[str]] = {}
    for module, names in defined.items():
        for name in names:
            owners.setdefault(name, set()).add(module)
    # A name the rest of the package defines too (the emitter's lost(), say) says nothing.
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name != "_engine":
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    owners.setdefault(node.name, set()).add(str(path))
    into: dict[tuple[str, str], set[str]] = {}
    for module, names in called.items():
        for name in names - declared[module]:
            owner = owners.get(name, set())
            if len(owner) == 1 and (callee := next(iter(owner))) in called and callee != module:
                into.setdefault((module, callee), set()).add(name)
    both = [
        f"{a} -> {b} ({', '.join(sorted(into[a, b]))}) and back ({', '.join(sorted(into[b, a]))})"
        for a, b in sorted(into)
        if a < b and (b, a) in into
    ]
    assert not both, "engine modules calling each other back and forth:\n" + "\n".join(both)


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


#: The layers, lowest first: a module's layer is its folder (or, at the top of the
#: package, its name). The foundation is what every layer shares (errors, options, names,
#: events); the top composes the layers (the client) and faces the user.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("foundation", frozenset({"events", "_emitter", "_exceptions", "_config", "_keys", "_timing"})),
    ("network", frozenset({"_net"})),
    ("engine", frozenset({"_engine"})),
    ("objects", frozenset({"_objects"})),
    (
        "top",
        frozenset(
            {"", "__main__", "_client", "_services", "_otel", "testing"}
            | {"integrations", "cli", "sync"}
        ),
    ),
)


def _rank(module: str) -> int:
    head = module.split(".", maxsplit=1)[0]
    for rank, (_, names) in enumerate(LAYERS):
        if head in names:
            return rank
    raise AssertionError(f"{module}: in no layer (add it to LAYERS in tests/test_layout.py)")


def test_imports_go_down_the_layers() -> None:
    """No module imports from a layer above its own."""
    upward = [
        f"{module} ({LAYERS[_rank(module)][0]}) imports {imported} ({LAYERS[_rank(imported)][0]})"
        for module, imports in sorted(_imports().items())
        for imported in sorted(imports)
        if _rank(imported) > _rank(module)
    ]
    assert not upward, upward


def test_every_layer_is_a_folder() -> None:
    """The network, engine and object layers' modules live in their folders."""
    for folder in ("_net", "_engine", "_objects"):
        assert (PACKAGE / folder / "__init__.py").is_file(), folder
    assert (PACKAGE / "_net" / "lua" / "fragments").is_dir()


def test_the_renewal_names_no_lock_kind() -> None:
    """Each primitive supplies its renewal (``primitive.Renewing``); the renewal service
    batches holds by it and names no kind of lock nor any kind's script (issue 39)."""
    source = (PACKAGE / "_engine" / "renewal.py").read_text("utf-8")
    scripts = sorted(p.stem for p in (PACKAGE / "_net" / "lua").glob("*.lua"))
    named = [name for name in scripts if name in source]
    assert not named, named
    for word in ("ReadPrimitive", "FairPrimitive", "permit", "rwlock", "fair_rw"):
        assert word not in source, word


#: Test helpers' own private attributes that share a name with one tests/inside.py reads
#: (file, attribute): a fault proxy's delay is held by its own ``_hold``; the redis-py
#: connection the embedded-server fixture closes has its own ``_reader``.
OWN_PRIVATES = frozenset({("faultproxy.py", "_hold"), ("conftest.py", "_reader")})


def _read_inside() -> set[str]:
    """The private attribute names tests/inside.py reads of aiolock's objects."""
    tree = ast.parse((Path(__file__).parent / "inside.py").read_text("utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    }


def _reaches_inside(tests: Path) -> list[str]:
    """The lines of the test modules under ``tests`` that read aiolock's private attributes."""
    names = _read_inside()
    covered = re.compile(r"(?<![\w.])(\w+)(?:\[[^\]]*\]|\.\w+|\([^()]*\))*\.(_[a-z]\w*)\b")
    a_client = re.compile(r"(?<![\w.])\w*client\w*(?:\[[^\]]*\])?\._[a-z]", re.IGNORECASE)
    found = []
    for path in sorted(tests.rglob("*.py")):
        if path.name == "inside.py":
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if re.match(r"\s*(from|import)\s", line):
                continue
            reads = {
                match[2]
                for match in covered.finditer(line)
                if match[2] in names
                # a test class's own attribute, or a module named in a string
                and match[0] not in {f"self.{match[2]}", f"aiolock.{match[2]}"}
            }
            reads -= {attr for file, attr in OWN_PRIVATES if file == path.name}
            if reads or a_client.search(line):
                found.append(f"{path.relative_to(tests)}:{number}: {line.strip()}")
    return found


def test_tests_reach_internals_only_through_inside() -> None:
    """Only tests/inside.py reads aiolock's private attributes (a client's, whatever the name).

    The next move of an internal piece then changes one test module, not forty.
    """
    assert {"_services", "_engine", "_key", "_primitive"} <= _read_inside()
    found = _reaches_inside(Path(__file__).parent)
    assert not found, "read through tests/inside.py instead:\n" + "\n".join(found)
