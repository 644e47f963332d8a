"""Every ```python block of README.md and docs/ runs against the test server.

The blocks of one page run in order in one namespace (see tests/docs_examples.py); a page
leaves no lock behind. ``nox -s docs`` type-checks the same blocks with ``mypy --strict``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from .docs_examples import ROOT, blocks, pages, run_page

# Keys that outlive their call by design, each with a short TTL (or, for a fenced lock's
# token counter, none: tokens must keep growing after the lock is gone).
_TRANSIENT = ("aiolock_acquire_cancel:", "redisson_unlock_latch:", "redisson_lock_token:")

PAGES = [page for page in pages() if blocks(page)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_examples_run(page: Path, redis_url: str) -> None:
    server = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        before = set(server.scan_iter())
        skipped = run_page(blocks(page), redis_url)
        left = {k for k in set(server.scan_iter()) - before if not k.startswith(_TRANSIENT)}
        server.delete(*left) if left else None
    finally:
        server.close()
    assert not left, f"{page.name}'s examples left keys behind: {sorted(left)}"
    if skipped and len(skipped) == len(blocks(page)):
        pytest.skip("; ".join(skipped))


def test_the_runner_finds_the_pages_blocks() -> None:
    """A fence the extractor missed would silently go untested."""
    readme = blocks(ROOT / "README.md")
    assert len(readme) >= 4
    assert all(block.code.strip() for page in PAGES for block in blocks(page))
