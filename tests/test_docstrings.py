"""Every public name has a docstring: the API reference (docs/reference.md) is built from them.

Public names are those of ``__all__`` in aiolock, aiolock.events, aiolock.testing and each
module of aiolock.integrations, and the public methods and properties of their classes.
A constant or type alias is documented by a ``#:`` comment above it or a string below it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import aiolock.integrations

MODULES = [
    "aiolock",
    "aiolock.events",
    "aiolock.testing",
    "aiolock.sync",
    "aiolock.integrations",
    *(
        f"aiolock.integrations.{info.name}"
        for info in pkgutil.iter_modules(aiolock.integrations.__path__)
        if not info.name.startswith("_")
    ),
]


def _documented_data(module: ModuleType, name: str) -> bool:
    """``name`` is assigned in ``module`` with a ``#:`` comment above or a string below."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    body = ast.parse(source).body
    for at, node in enumerate(body):
        targets = (
            [node.target]
            if isinstance(node, ast.AnnAssign)
            else node.targets
            if isinstance(node, ast.Assign)
            else []
        )
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        below = body[at + 1] if at + 1 < len(body) else None
        return above.startswith("#:") or (
            isinstance(below, ast.Expr)
            and isinstance(below.value, ast.Constant)
            and isinstance(below.value.value, str)
        )
    return False


def _undocumented(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    missing = [] if module.__doc__ else [module_name]
    for name in getattr(module, "__all__", ()):
        value = getattr(module, name)
        if isinstance(value, ModuleType):
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            if not _documented_data(module, name):
                missing.append(f"{module_name}.{name}")
            continue
        if not value.__doc__:
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(value):
            for attribute, member in vars(value).items():
                function = member.fget if isinstance(member, property) else member
                if attribute.startswith("_") or not (
                    isinstance(member, property) or callable(function)
                ):
                    continue
                if not inspect.getdoc(getattr(value, attribute)) and not function.__doc__:
                    missing.append(f"{module_name}.{name}.{attribute}")
    return missing


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_a_docstring(module_name: str) -> None:
    assert _undocumented(module_name) == []


def test_no_sphinx_role_in_the_package() -> None:
    """Docstrings and comments are Markdown (the site and REFERENCE.md render them as
    such): a Sphinx role (``:meth:`x```) would show raw."""
    role = re.compile(r":(meth|class|func|attr|mod|exc|data|obj):`")
    package = Path(aiolock.integrations.__file__).parents[1]
    found = [
        f"{path.relative_to(package.parent)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if role.search(line)
    ]
    assert not found, found
