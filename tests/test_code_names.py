"""The code names that aiolock's comments and docstrings cite exist (issue 39).

A comment that names a function which has since moved sends the reader nowhere, so every
citation is resolved against the package's source, read with ``ast`` (nothing is imported,
so the check holds while a module is half-moved).

What counts as a citation, in a docstring or a ``#`` comment of a module of aiolock: a span
between single or double backticks that is a dotted Python name of two parts or more
(``holds.HoldRegistry.mark_lost``, `WaitingRoom.deliver()`; a trailing ``()`` is dropped),
and any path ending in ``.py`` or ``.lua``, in backticks or not (``_net/barrier.py``). A
lone name, or a call with arguments, is not checked.

How a dotted name resolves (a module of the package cited by its name, or a capitalised
name defined in it, must resolve by the first two rules):

- its first part is a module of the package, relative to the citing module's package or
  one of its parents (``holds`` from ``_engine/``, ``_net.scripts``), or ``aiolock``
  itself, or any module of the package by its own name (``renewal``); or a name defined in
  the citing module; or a name defined at the top of any module of the package;
- each further part is then a member of what the part before it names: a module's
  top-level name or submodule, a class's body names, ``self.x`` attributes and
  ``__slots__``, with those of its bases in the package (an imported name is followed to
  where it is defined);
- an attribute whose type the source does not say (``Engine.guard``) ends what can be
  followed: each part after it must be a member of some class of the package;
- the whole name is a string literal of the package (a metric, span or logger name:
  ``aiolock.renewal.duration``);
- its first part is a module of the standard library or an installed package (``asyncio``,
  ``redis``): the rest is looked up by importing it;
- its first part is in ``OTHERS`` (another project's object, such as Redisson's, or a
  variable of a library's type, such as ``loop``);
- its first part is a lower-case variable, not a module of the package (``hold.lost``,
  ``runner.send``): each further part must be a member of some class of the package.

A path resolves when a file of the package, or of the repository, ends with it.

Failures are listed as ``file:line: name``. ``_MOVING`` lists the citations in
``aiolock/_engine/`` and ``aiolock/_net/`` left unresolved while those two packages are
restructured; it is to be emptied, and an entry that resolves again fails the test.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "aiolock"
ROOT = PACKAGE.parent

#: Other projects' names, and variables of other libraries' types, by their first part:
#: the rest of the name is looked up on the importable object given, or not checked (None).
OTHERS: dict[str, str | None] = {
    "SentinelConnectionManager": None,  # Redisson's
    "Handle": "asyncio.Handle",
    "StreamWriter": "asyncio.StreamWriter",
    "Task": "asyncio.Task",
    "loop": "asyncio.AbstractEventLoop",
    "request": None,  # a web framework's request, in the integrations
    "app": None,  # a web framework's application
}

#: Unresolved citations in the two packages under restructuring (file, name); emptied by
#: whoever finishes the move.
_MOVING: frozenset[tuple[str, str]] = frozenset()

_SPAN = re.compile(r"``([^`\n]+?)``|(?<!`)`([^`\n]+?)`(?!`)")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"[\w./-]*\w\.(?:py|lua)")
_BARE_PATH = re.compile(r"(?<![\w./-])[\w./-]*\w\.(?:py|lua)(?![\w-])")


@dataclass
class _Class:
    """A class of the package: its own member names, its bases as written, its module."""

    module: str
    members: dict[str, ast.AST] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)


@dataclass
class _Module:
    """A module of the package: its top-level names and where its imported names come from."""

    path: Path
    names: dict[str, ast.AST] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    classes: dict[str, _Class] = field(default_factory=dict)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in _flatten(target)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for element in target.elts for t in _flatten(element)]
    return [target]


def _class(node: ast.ClassDef, module: str) -> _Class:
    found = _Class(module, bases=[ast.unparse(base) for base in node.bases])
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.members[item.name] = item
        for target in _targets(item):
            if isinstance(target, ast.Name):
                found.members[target.id] = item
                if target.id == "__slots__" and isinstance(item, ast.Assign | ast.AnnAssign):
                    for slot in ast.walk(item.value) if item.value else ():
                        if isinstance(slot, ast.Constant) and isinstance(slot.value, str):
                            found.members.setdefault(slot.value, item)
    for inner in ast.walk(node):
        for target in _targets(inner):
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found.members.setdefault(target.attr, inner)
    return found


@functools.cache
def _modules() -> dict[str, _Module]:
    """Every module of the package by its dotted name, read from its source."""
    modules: dict[str, _Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        module = _Module(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.names[node.name] = node
            elif isinstance(node, ast.ClassDef):
                module.names[node.name] = node
                module.classes[node.name] = _class(node, name)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
                source = ".".join(filter(None, [base, node.module or ""]))
                for alias in node.names:
                    module.names[alias.asname or alias.name] = node
                    module.imports[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    module.names[bound] = node
                    module.imports[bound] = alias.name if alias.asname else bound
            for target in _targets(node):
                if isinstance(target, ast.Name):
                    module.names[target.id] = node
        modules[name] = module
    return modules


@functools.cache
def _literals() -> frozenset[str]:
    """Every string constant of the package's code."""
    return frozenset(
        node.value
        for module in _modules().values()
        for node in ast.walk(ast.parse(module.path.read_text("utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


@functools.cache
def _class_members() -> frozenset[str]:
    """Every member name of every class of the package."""
    return frozenset(
        member
        for module in _modules().values()
        for found in module.classes.values()
        for member in found.members
    )


def _members_anywhere(parts: list[str]) -> bool:
    return all(part in _class_members() for part in parts)


def _external(dotted: str) -> bool:
    """``dotted`` names an object of the standard library or of an installed package."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True
    return False


def _in_class(found: _Class, parts: list[str], seen: frozenset[str] = frozenset()) -> bool:
    """``parts`` (at least one) resolve as members of the class ``found``."""
    head, rest = parts[0], parts[1:]
    node = found.members.get(head)
    if node is None:
        module = _modules()[found.module]
        for base in found.bases:
            owner = _resolve_class(module, base)
            if owner is not None and base not in seen and _in_class(owner, parts, seen | {base}):
                return True
        return False
    if not rest:
        return True
    if isinstance(node, ast.ClassDef):
        return _in_class(_class(node, found.module), rest)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        # a property's value, of a type the source states only as an annotation
        return _members_anywhere(rest)
    return _members_anywhere(rest)


def _resolve_class(module: _Module, name: str) -> _Class | None:
    """The class of the package that ``name`` (as written in ``module``) refers to."""
    if name in module.classes:
        return module.classes[name]
    origin = module.imports.get(name)
    if origin and origin.startswith("aiolock."):
        where, _, defined = origin.rpartition(".")
        if where in _modules():
            return _resolve_class(_modules()[where], defined)
    return None


def _in_module(name: str, parts: list[str]) -> bool:
    """``parts`` resolve inside the module (or package) named ``name``."""
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if f"{name}.{head}" in _modules():
        return _in_module(f"{name}.{head}", rest)
    module = _modules()[name]
    if head not in module.names or not rest:
        return head in module.names
    if head in module.classes:
        return _in_class(module.classes[head], rest)
    if head in module.imports:
        return _imported(module.imports[head], rest)
    function = isinstance(module.names[head], ast.FunctionDef | ast.AsyncFunctionDef)
    return not function and _members_anywhere(rest)


def _imported(origin: str, rest: list[str]) -> bool:
    """``rest`` resolve on what an import names (``origin``, its dotted name)."""
    if origin in _modules():
        return _in_module(origin, rest)
    where, _, defined = origin.rpartition(".")
    if where in _modules():
        return _in_module(where, [defined, *rest])
    return _external(".".join([origin, *rest]))


def _in_package(head: str, rest: list[str], citing: str) -> bool:
    """The name ``head.rest`` resolves in the package, read from the module ``citing``."""
    modules = _modules()
    places = citing.split(".")
    relative = [".".join([*places[:cut], head]) for cut in range(len(places), 0, -1)]
    own = [name for name in modules if name.rsplit(".", 1)[-1] == head]
    defined = [name for name, module in modules.items() if head in module.names]
    return any(_in_module(name, rest) for name in [*relative, *own] if name in modules) or any(
        _in_module(name, [head, *rest]) for name in defined
    )


def _resolves(dotted: str, citing: str) -> bool:
    """``dotted`` names something, read from the module named ``citing``."""
    head, *rest = dotted.split(".")
    if _in_package(head, rest, citing) or dotted in _literals():
        return True
    modules = _modules()
    if any(name.rsplit(".", 1)[-1] == head for name in modules) or (
        head[0].isupper() and any(head in module.names for module in modules.values())
    ):
        return False
    if head in OTHERS:
        other = OTHERS[head]
        return other is None or _external(".".join([other, *rest]))
    if importlib.util.find_spec(head) is not None:
        return _external(dotted)
    return head[0].islower() and _members_anywhere(rest)


def _path_resolves(cited: str) -> bool:
    cited = cited.removeprefix("./").removeprefix("aiolock/")
    if (ROOT / cited).exists():
        return True
    return any(
        path.relative_to(ROOT).as_posix().endswith(f"/{cited}")
        for suffix in ("*.py", "*.lua")
        for path in PACKAGE.rglob(suffix)
    )


def _prose(path: Path) -> list[tuple[int, str]]:
    """The lines of the docstrings and ``#`` comments of a module, with their numbers."""
    source = path.read_text("utf-8")
    lines = source.splitlines()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
            ):
                found.extend(
                    (number, lines[number - 1])
                    for number in range(first.lineno, first.end_lineno + 1)
                )
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    found.extend((t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT)
    return found


def citations() -> list[tuple[str, int, str]]:
    """Every citation in the package: (file relative to aiolock/, line, name)."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, text in _prose(path):
            names = {match[0] for match in _BARE_PATH.finditer(text)}
            for match in _SPAN.finditer(text):
                span = (match[1] or match[2]).strip().removesuffix("()")
                if _DOTTED.fullmatch(span):
                    names.add(span)
            file = path.relative_to(PACKAGE).as_posix()
            found.extend((file, number, name) for name in sorted(names))
    return found


def unresolved() -> list[tuple[str, int, str]]:
    """The citations that name nothing that exists."""
    return [
        (file, number, name)
        for file, number, name in citations()
        if not (
            _path_resolves(name)
            if _PATH.fullmatch(name)
            else _resolves(name, _module_name(PACKAGE / file))
        )
    ]


def test_cited_code_names_exist() -> None:
    """Each code name a comment or docstring cites is a module, class, function, method or
    attribute of the package (or of a library it names), outside ``_MOVING``."""
    missing = [
        f"aiolock/{file}:{number}: {name}"
        for file, number, name in unresolved()
        if (file, name) not in _MOVING
    ]
    assert not missing, "cited names that do not exist:\n" + "\n".join(missing)


def test_moving_lists_only_what_is_unresolved() -> None:
    """Each entry of ``_MOVING`` is still unresolved and in a package being restructured:
    remove the entries this fails for."""
    left = {(file, name) for file, _, name in unresolved()}
    stale = sorted(entry for entry in _MOVING if entry not in left)
    outside = sorted(e for e in _MOVING if not e[0].startswith(("_engine/", "_net/")))
    assert not stale, f"resolved now, remove from _MOVING: {stale}"
    assert not outside, f"_MOVING is for _engine/ and _net/ only: {outside}"


def test_citations_are_found() -> None:
    """The scan sees the kinds of citation it is meant to check."""
    names = {name for _, _, name in citations()}
    assert any(name.endswith(".py") for name in names)
    assert any(re.fullmatch(r"[a-z_]+\.[A-Z]\w*", name) for name in names)


def test_the_rules() -> None:
    """Names that exist resolve, and a name gone, a member gone or a file gone does not."""
    citing = "aiolock._objects.leader"
    for name in (
        "LockHandle.lock",
        "aiolock.Client.from_url",
        "_keys.lock_channel",
        "asyncio.timeout",
    ):
        assert _resolves(name, citing), name
    for name in ("LockHandle.gone", "Client.gone", "gone_module.Name", "asyncio.gone"):
        assert not _resolves(name, citing), name
    assert _path_resolves("_net/barrier.py")
    assert not _path_resolves("_net/gone.py")
