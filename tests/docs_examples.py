"""The Python blocks of README.md and docs/*.md: found, run against a server, type-checked.

A block fenced as ```` ```python ```` is an example: it runs. Blocks of any other language
(``sh``, ``text``, ``pycon``) are shell commands or output and are left alone. The blocks
of one page run in order in one namespace, with top-level ``await`` (as in ``python -m
asyncio``), on one event loop kept for the page, so a page can set up a client in its
first block and use it in the next. The URL every example uses, ``redis://localhost:6379/0``,
is replaced by the test server's.

An HTML comment on the line before a fence marks a block (invisible on the site):

- ``<!-- docs-test: requires aiolock.sync -->``: runs only where that module exists;
- ``<!-- docs-test: skip -->``: never runs, but is still type-checked.

Type-checking (``python -m tests.docs_examples --mypy``, run by ``nox -s docs``): each page's
blocks become the body of one ``async def`` in a module of their own under a temporary
directory, checked with ``mypy --strict`` (mypy refuses top-level ``async with``).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_URL = "redis://localhost:6379/0"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^\n`]*)$")
_SNIPPET = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>\w+))?"$')
_MARK = re.compile(r"<!--\s*docs-test:\s*(?P<what>skip|requires\s+(?P<module>[\w.]+))\s*-->")


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: Path
    line: int  # of its first code line, 1-based
    code: str
    skip: bool = False
    requires: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def missing(self) -> str | None:
        """Why this block cannot run here, or None."""
        if self.skip:
            return "marked docs-test: skip"
        if self.requires is not None and importlib.util.find_spec(self.requires) is None:
            return f"needs {self.requires}"
        return None


def pages() -> list[Path]:
    """README.md and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The ```python blocks of ``page`` with their marks, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    at = 0
    while at < len(lines):
        opening = _FENCE.match(lines[at])
        if opening is None:
            at += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = opening["info"].split(" ")[0].strip("{}. ")
        end = at + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if language == "python":
            mark = _MARK.search(lines[at - 1]) if at else None
            body = "\n".join(_expand(line[indent:]) for line in lines[at + 1 : end])
            found.append(
                Block(
                    page,
                    at + 2,
                    body + "\n",
                    skip=mark is not None and mark["what"] == "skip",
                    requires=mark["module"] if mark is not None else None,
                )
            )
        at = end + 1
    return found


def _expand(line: str) -> str:
    """A pymdownx.snippets line (``--8<-- "path:section"``) as the lines it includes."""
    snippet = _SNIPPET.match(line.strip())
    if snippet is None:
        return line
    text = (ROOT / snippet["path"]).read_text()
    if snippet["section"]:
        start = f"# --8<-- [start:{snippet['section']}]\n"
        text = text[
            text.index(start) + len(start) : text.index(f"# --8<-- [end:{snippet['section']}]")
        ]
    return text.rstrip("\n")


def _compile(block: Block, url: str) -> Any:
    # Blank lines keep tracebacks on the page's own line numbers.
    source = "\n" * (block.line - 1) + block.code.replace(EXAMPLE_URL, url)
    return compile(source, str(block.page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def run_page(page_blocks: list[Block], url: str) -> list[str]:
    """Run one page's blocks in order in one namespace; return the ones skipped and why."""
    skipped: list[str] = []
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    loop = asyncio.new_event_loop()
    # Examples that read REDIS_URL (the framework quick starts, aiolock.testing) find the
    # test server there.
    saved = os.environ.get("REDIS_URL")
    os.environ["REDIS_URL"] = url
    try:
        for block in page_blocks:
            why = block.missing()
            if why is not None:
                skipped.append(f"{block.where}: {why}")
                continue
            result = eval(_compile(block, url), namespace)  # the docs' own code
            if asyncio.iscoroutine(result):
                loop.run_until_complete(result)
        loop.run_until_complete(_close_clients(namespace))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        if saved is None:
            del os.environ["REDIS_URL"]
        else:
            os.environ["REDIS_URL"] = saved
    return skipped


async def _close_clients(namespace: dict[str, Any]) -> None:
    """Close any client a page left open (a page should close its own; this is a backstop)."""
    import aiolock  # noqa: PLC0415 - the runner imports nothing of aiolock at import time

    for value in namespace.values():
        if isinstance(value, aiolock.Client):
            await value.aclose()
        elif type(value).__module__.startswith("aiolock.sync") and hasattr(value, "close"):
            value.close()


def as_module(page_blocks: list[Block]) -> str:
    """A page's blocks as one module for mypy: the body of one ``async def``."""
    body = "".join(f"# {block.where}\n{block.code}" for block in page_blocks) or "pass\n"
    return (
        "# Generated from the page's ```python blocks by tests/docs_examples.py.\n"
        "async def _page() -> None:\n" + textwrap.indent(body, "    ", lambda line: True)
    )


def type_check(extra_args: list[str]) -> int:
    """mypy --strict over every page's blocks; the exit status of mypy."""
    with tempfile.TemporaryDirectory(prefix="aiolock-docs-") as tmp:
        files: list[str] = []
        for page in pages():
            # A block needing a module this environment lacks cannot be checked either.
            page_blocks = [b for b in blocks(page) if b.requires is None or not b.missing()]
            if not page_blocks:
                continue
            stem = re.sub(r"\W", "_", str(page.relative_to(ROOT).with_suffix("")))
            path = Path(tmp) / f"docs_{stem}.py"
            path.write_text(as_module(page_blocks))
            files.append(str(path))
        command = [sys.executable, "-m", "mypy", "--strict", "--config-file", ""]
        # One page is one function: the README's FastAPI and aiohttp quick starts both
        # name their ``app``. redis-py's Sentinel() has no annotations.
        command += ["--allow-redefinition", "--untyped-calls-exclude", "redis"]
        # The examples are checked against aiolock's types, not aiolock itself (the mypy
        # session does that, with its own configuration and the test dependencies).
        command += ["--follow-imports", "silent"]
        command += [*extra_args, *files]
        return subprocess.run(command, check=False).returncode


def main() -> int:
    """``python -m tests.docs_examples --mypy``: type-check the docs' examples."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--mypy", action="store_true", help="type-check every page's blocks")
    args, rest = parser.parse_known_args()
    if args.mypy:
        return type_check(rest)
    for page in pages():
        for block in blocks(page):
            print(block.where, block.missing() or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
