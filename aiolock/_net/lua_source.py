"""Assembly of the Lua scripts from their files and the fragments they share.

A script ``aiolock/_net/lua/<name>.lua`` may include a fragment
``aiolock/_net/lua/fragments/<fragment>.lua`` with a line of its own, at the start of the line::

    --@include <fragment>

The line is replaced by the fragment's text, so what is sent to the server (and hashed into
the script's SHA-1) is one self-contained script. A fragment defines local functions that
the scripts including it call, and its header says what it defines and what it expects in
scope. It includes nothing itself: one that calls another fragment's functions says so,
and the script includes that one first. A script includes each fragment once, after its
own KEYS/ARGV header. Anything else that looks like a directive (a line whose first
non-blank characters are ``--@``), an unknown fragment, or a fragment included twice is an
error when the script is first loaded: never a surprise on the server.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ("assemble", "read_script")

#: Where a script's directives begin: the Lua comment marker and "@".
DIRECTIVE = "--@"
_INCLUDE = re.compile(r"--@include[ \t]+(\w+)[ \t]*")


def read_script(name: str) -> str:
    """The text of the script ``aiolock/_net/lua/<name>.lua``, its includes replaced."""
    return assemble(name, (_lua_dir() / f"{name}.lua").read_text("utf-8"))


def assemble(name: str, text: str) -> str:
    """Replace each include directive of the script ``name`` (source ``text``) by its fragment.

    Raises ValueError, naming the script, the line and the fragment, for a malformed or
    unknown directive, a missing fragment, a fragment included twice, or one that includes.
    """
    parts: list[str] = []
    included: set[str] = set()
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if not line.lstrip().startswith(DIRECTIVE):
            parts.append(line)
            continue
        where = f"{name}.lua line {number}"
        match = _INCLUDE.fullmatch(line.rstrip("\r\n"))
        if match is None:
            raise ValueError(
                f"{where}: {line.strip()!r} is not a directive; the only one is"
                " '--@include <fragment>', alone at the start of a line"
            )
        fragment = match[1]
        if fragment in included:
            raise ValueError(f"{where}: fragment {fragment!r} is already included")
        included.add(fragment)
        parts.append(_fragment(fragment, where))
    return "".join(parts)


def _lua_dir() -> Traversable:
    return resources.files("aiolock._net") / "lua"


def _fragment(fragment: str, where: str) -> str:
    source = _lua_dir() / "fragments" / f"{fragment}.lua"
    if not source.is_file():
        raise ValueError(
            f"{where} includes unknown fragment {fragment!r}: no lua/fragments/{fragment}.lua"
        )
    body = source.read_text("utf-8")
    if any(line.lstrip().startswith(DIRECTIVE) for line in body.splitlines()):
        raise ValueError(
            f"{where} includes fragment {fragment!r}, which has a directive of its own;"
            " fragments include nothing (the script includes each one it needs)"
        )
    return body if body.endswith("\n") else body + "\n"
