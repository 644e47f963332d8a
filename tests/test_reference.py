"""REFERENCE.md, the API reference generated from the docstrings, is current.

It is committed so the reference reads on a code host; this test regenerates it in memory
(tests/reference.py) and fails when the committed file differs, so a docstring or a
signature changed without ``nox -s reference`` fails the test run, in CI too.
"""

from __future__ import annotations

import difflib

import pytest

from .reference import OUTPUT, ROOT, render


def test_reference_md_is_current() -> None:
    if not OUTPUT.exists() and not (ROOT / ".git").exists():
        pytest.skip("not a checkout (an sdist has no REFERENCE.md)")
    committed = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
    fresh = render()
    if committed != fresh:
        diff = difflib.unified_diff(
            committed.splitlines(), fresh.splitlines(), "REFERENCE.md", "regenerated", lineterm=""
        )
        shown = "\n".join(list(diff)[:60])
        pytest.fail(f"REFERENCE.md is stale: run `nox -s reference` and commit it\n{shown}")


def test_reference_names_every_public_name() -> None:
    """A name of a module's __all__ missing from the file would go undocumented."""
    import importlib  # noqa: PLC0415

    from .reference import MODULES  # noqa: PLC0415

    text = render()
    for module_name, _ in MODULES:
        for name in importlib.import_module(module_name).__all__:
            assert f"`{name}" in text, f"{module_name}.{name} is not in REFERENCE.md"
