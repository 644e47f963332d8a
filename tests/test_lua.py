"""The Lua scripts as the server gets them: each file with the fragments it includes."""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

import pytest

from aiolock._net import lua_source as _lua
from aiolock._net.scripts import load_script

if TYPE_CHECKING:
    from pathlib import Path

    from redis.asyncio import Redis

LUA = resources.files("aiolock._net") / "lua"
INCLUDE = re.compile(r"^--@include[ \t]+(\w+)", re.MULTILINE)
FUNCTION = re.compile(r"^local function (\w+)\(", re.MULTILINE)
SCRIPTS = sorted(f.name.removesuffix(".lua") for f in LUA.iterdir() if f.name.endswith(".lua"))
FRAGMENTS = sorted(
    f.name.removesuffix(".lua") for f in (LUA / "fragments").iterdir() if f.name.endswith(".lua")
)


def source(script: str) -> str:
    return (LUA / f"{script}.lua").read_text("utf-8")


def fragment_source(fragment: str) -> str:
    return (LUA / "fragments" / f"{fragment}.lua").read_text("utf-8")


def header(text: str) -> str:
    """The comment lines a file starts with (directives are not comments)."""
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("--") or line.startswith(_lua.DIRECTIVE):
            break
        lines.append(line)
    return "".join(lines)


def code(text: str) -> str:
    """Lua text without its comments (none of the scripts has '--' inside a string)."""
    return re.sub(r"--.*", "", text)


def test_scripts_and_fragments_found() -> None:
    assert "lock_acquire" in SCRIPTS
    assert "fair_purge" in FRAGMENTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_directive_left(script: str) -> None:
    """An assembled script has no include (or other directive) line left."""
    text = load_script(script).text
    assert not [line for line in text.splitlines() if line.lstrip().startswith(_lua.DIRECTIVE)]


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_starts_with_its_header(script: str) -> None:
    """The file's KEYS/ARGV/return header still opens the script, before any fragment."""
    own = header(source(script))
    assert re.search(r"KEYS\[", own)
    assert re.search(r"ARGV\[", own)
    assert load_script(script).text.startswith(own)


def test_every_fragment_is_included() -> None:
    """Every fragment is included by some script, and every include names a fragment."""
    included = {fragment for script in SCRIPTS for fragment in INCLUDE.findall(source(script))}
    assert included == set(FRAGMENTS)


@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_fragment_header(fragment: str) -> None:
    """A fragment names itself, says what it expects, and lists each function it defines."""
    text = fragment_source(fragment)
    own = header(text)
    assert own.startswith(f"-- Fragment {fragment}: ")
    assert "\n-- Expects: " in own
    assert "\n-- Defines:\n" in own
    functions = FUNCTION.findall(text)
    assert functions
    for function in functions:
        assert f"\n--   {function}(" in own, f"{function} is not in the header"


@pytest.mark.parametrize("script", SCRIPTS)
def test_fragment_functions_are_defined_before_use_and_used(script: str) -> None:
    """Each function a script's fragments bring is defined before any call (a call before
    would reach for a global, which the server refuses) and called at least once."""
    text = code(load_script(script).text)
    for fragment in INCLUDE.findall(source(script)):
        for function in FUNCTION.findall(fragment_source(fragment)):
            definition = text.index(f"local function {function}(") + len("local function ")
            uses = [m.start() for m in re.finditer(rf"\b{function}\(", text)]
            assert uses[0] == definition, f"{function} ({fragment}) is called before defined"
            assert len(uses) > 1, f"{script} never calls {function} ({fragment})"


def test_unknown_include_raises() -> None:
    """An include of a fragment that does not exist names the script, line and fragment."""
    with pytest.raises(ValueError, match=r"probe\.lua line 2 includes unknown fragment 'nope'"):
        _lua.assemble("probe", "-- KEYS[1] ARGV[1]\n--@include nope\nreturn 1\n")


@pytest.mark.parametrize(
    "line",
    [
        "--@inclde latch",
        "--@include",
        "--@include latch hold",
        "--@include ../latch",
        "  --@include latch",
        "--@ include latch",
    ],
)
def test_malformed_directive_raises(line: str) -> None:
    """A line that looks like a directive and is not a well-formed include is refused."""
    with pytest.raises(ValueError, match=r"probe\.lua line 2: .* is not a directive"):
        _lua.assemble("probe", f"-- KEYS[1] ARGV[1]\n{line}\nreturn 1\n")


def test_fragment_included_twice_raises() -> None:
    with pytest.raises(ValueError, match=r"probe\.lua line 3: fragment 'latch' is already"):
        _lua.assemble("probe", "-- KEYS[1] ARGV[1]\n--@include latch\n--@include latch\n")


def test_assembly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The include line, and only it, is replaced by the fragment's text (a last newline is
    added if it has none); a fragment that includes another is refused."""
    (tmp_path / "fragments").mkdir()
    (tmp_path / "fragments" / "one.lua").write_text("local function one()\n    return 1\nend")
    (tmp_path / "fragments" / "nested.lua").write_text("--@include one\n")
    (tmp_path / "probe.lua").write_text("-- KEYS[1] ARGV[1]\n--@include one\nreturn one()\n")
    monkeypatch.setattr(_lua, "_lua_dir", lambda: tmp_path)

    assert _lua.read_script("probe") == (
        "-- KEYS[1] ARGV[1]\nlocal function one()\n    return 1\nend\nreturn one()\n"
    )
    with pytest.raises(ValueError, match=r"'nested', which has a directive of its own"):
        _lua.assemble("probe", "--@include nested\n")


async def test_server_loads_every_script(raw: Redis) -> None:
    """Each assembled script compiles on the server, which names it by the SHA-1 we send."""
    for script in SCRIPTS:
        loaded = load_script(script)
        assert await raw.script_load(loaded.text) == loaded.sha, script
