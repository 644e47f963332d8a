"""docs/architecture.md's inventory of the package matches the tree (issue 39).

The check is derived from the doc itself, so that rewriting a table keeps it working:

- the module tables are those under the doc's "The modules, layer by layer"; a table's
  folder is the one its heading names in backticks (``### objects (`_objects/`)``), else
  the package's top. Each backticked name in a row's first cell (``lock.py``, ``cli/``,
  ``lua/``) must exist in that folder;
- every module of the package must be named by a table: in a first cell, or, for a module
  of a folder a first cell names (``integrations/``), in backticks anywhere in that row. A
  subpackage's ``__init__.py`` is named by its folder;
- the layer drawing at the top of the doc: every ``.py`` file or folder it names exists,
  each "N modules" is the count of modules (``__init__.py`` aside) of the folder named last
  before it, and "(N scripts, M fragments)" counts ``_net/lua/`` and its ``fragments/``.

``_MOVING`` lists what this finds wrong about ``aiolock/_engine/`` and ``aiolock/_net/``
while they are restructured (each entry the start of a finding's line, so a count can
change meanwhile); it is to be emptied, and an entry no longer found fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "aiolock"
DOC = ROOT / "docs" / "architecture.md"

#: Findings about the two packages under restructuring, each the start of a line
#: ``problems()`` gives; emptied by whoever finishes the move.
_MOVING: frozenset[str] = frozenset()

_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    """One row of a module table: its folder (relative to aiolock/, "" for the top), the
    names its first cell gives, and the backticked names anywhere in it."""

    folder: str
    names: tuple[str, ...]
    mentioned: tuple[str, ...]


def rows(text: str) -> list[Row]:
    """The rows of the module tables of the doc's "The modules, layer by layer"."""
    found: list[Row] = []
    section = text.split("## The modules, layer by layer", 1)[1].split("\n## ", 1)[0]
    folder = ""
    for line in section.splitlines():
        if line.startswith("### "):
            folders = [name for name in _TICKED.findall(line) if name.endswith("/")]
            folder = folders[0] if folders else ""
        elif line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            names = tuple(_TICKED.findall(cells[0]))
            if cells[0] != "module":
                found.append(Row(folder, names, tuple(_TICKED.findall(line))))
    return found


def drawing(text: str) -> str:
    """The layer drawing: the doc's first fenced block."""
    return text.split("```", 2)[1]


def _modules(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.py") if path.name != "__init__.py")


def _tree() -> list[str]:
    """Every module of the package, relative to aiolock/, a subpackage's ``__init__.py``
    aside."""
    return sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent == PACKAGE
    )


def problems(text: str) -> list[str]:
    """What the doc says of the tree that the tree does not bear out."""
    found: list[str] = []
    covered: set[str] = set()
    for row in rows(text):
        folders = [f"{row.folder}{name}" for name in row.names if name.endswith("/")]
        for name in row.names:
            path = f"{row.folder}{name}"
            covered.add(path)
            if not (PACKAGE / path).exists():
                found.append(f"{path}: in a table of the doc, not in the tree")
        covered.update(f"{folder}{name}" for folder in folders for name in row.mentioned)
    found += [
        f"{path}: in the tree, in no table of the doc" for path in _tree() if path not in covered
    ]
    found += _drawing_problems(drawing(text))
    return sorted(set(found))


def _drawing_problems(block: str) -> list[str]:
    found: list[str] = []
    folder = ""
    for line in block.splitlines():
        for token in re.findall(r"(?<![\w/.])([\w/.]+\.py|\w+/)(?![\w/])", line):
            name = token.removeprefix("aiolock/")
            if not (PACKAGE / name).exists() and not any(
                path.relative_to(PACKAGE).as_posix().endswith(f"/{name.rstrip('/')}")
                for path in PACKAGE.rglob(name.rstrip("/").rsplit("/", 1)[-1])
            ):
                found.append(f"{name}: in the drawing of the doc, not in the tree")
            if token.startswith("_") and token.endswith("/"):
                folder = token
        for said in re.findall(r"(\d+) modules", line):
            have = len(_modules(PACKAGE / folder))
            if int(said) != have:
                found.append(f"{folder}: the doc says {said} modules, the tree has {have}")
        for scripts, fragments in re.findall(r"\((\d+) scripts, (\d+) fragments\)", line):
            lua = PACKAGE / "_net" / "lua"
            for said, kind, have in (
                (scripts, "scripts", len(list(lua.glob("*.lua")))),
                (fragments, "fragments", len(list((lua / "fragments").glob("*.lua")))),
            ):
                if int(said) != have:
                    found.append(f"_net/lua/: the doc says {said} {kind}, the tree has {have}")
    return found


def test_the_doc_names_the_tree() -> None:
    """Each module the doc's tables name exists, each module of the package is in a table,
    and the drawing's names and counts match the tree (``_MOVING`` aside)."""
    wrong = [
        line
        for line in problems(DOC.read_text("utf-8"))
        if not any(line.startswith(entry) for entry in _MOVING)
    ]
    assert not wrong, "docs/architecture.md against the tree:\n" + "\n".join(wrong)


def test_moving_is_current() -> None:
    """Each entry of ``_MOVING`` is still found: remove the entries this fails for."""
    found = problems(DOC.read_text("utf-8"))
    stale = sorted(e for e in _MOVING if not any(line.startswith(e) for line in found))
    assert not stale, f"fixed now, remove from _MOVING: {stale}"


def test_the_check_reads_the_doc() -> None:
    """The tables and the drawing are where the check looks for them, and a wrong count or
    a missing module is found."""
    text = DOC.read_text("utf-8")
    assert {row.folder for row in rows(text)} >= {"", "_objects/", "_engine/", "_net/"}
    assert "modules" in drawing(text)
    altered = re.sub(r"(_objects/ .*?)\d+ modules", r"\g<1>1 modules", text)
    altered = altered.replace("`spin.py`", "`spun.py`")
    found = problems(altered)
    assert "_objects/spun.py: in a table of the doc, not in the tree" in found
    assert "_objects/spin.py: in the tree, in no table of the doc" in found
    assert any(line.startswith("_objects/: the doc says 1 modules") for line in found)
