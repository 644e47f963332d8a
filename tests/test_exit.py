"""The end of ``async with lock:`` and ``acquired()``: the body's exception is never hidden.

A lost lock or a failed release at exit is a note on the body's exception (and a
WARNING); with no body exception it is raised, a failed release as ``ReleaseError`` (the
redis-py error its cause), while ``unlock()`` called directly raises what it always did.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock

from .conftest import ClientFactory
from .faultproxy import FaultProxy
from .helpers import FAST, quiesce

Block = Callable[[aiolock.Lock], AbstractAsyncContextManager[Any]]
BLOCKS = [
    pytest.param(lambda lock: lock, id="async_with"),
    pytest.param(lambda lock: lock.acquired(wait=5), id="acquired"),
]
# A guarded block's normal exit (its hold not lost) follows the same rules.
RELEASING_BLOCKS = [*BLOCKS, pytest.param(lambda lock: lock.guarded(wait=5), id="guarded")]


class Boom(Exception):
    pass


async def failing_body(cm: AbstractAsyncContextManager[Any], during: Callable[[], Any]) -> None:
    """A block whose body calls ``during()`` (awaited if it returns an awaitable), then
    raises Boom."""
    async with cm:
        result = during()
        if inspect.isawaitable(result):
            await result
        raise Boom


@pytest.mark.parametrize("block", BLOCKS)
async def test_lost_at_exit_is_a_note_on_the_body_error(
    block: Block, make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_client(), make_client()
    lock = a.lock(name)
    with pytest.raises(Boom) as info, caplog.at_level(logging.WARNING, "aiolock"):
        await failing_body(block(lock), b.lock(name).force_unlock)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1
    assert "LockLostError" in notes[0]
    assert name in notes[0]
    assert any("releasing" in r.getMessage() and "Boom" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("block", BLOCKS)
async def test_lost_at_exit_without_body_error_raises(
    block: Block, make_client: ClientFactory, name: str
) -> None:
    a, b = make_client(), make_client()
    with pytest.raises(aiolock.LockLostError):
        async with block(a.lock(name)):
            assert await b.lock(name).force_unlock()


@pytest.mark.parametrize("block", RELEASING_BLOCKS)
async def test_failed_release_raises_release_error(
    block: Block, proxy: FaultProxy, name: str
) -> None:
    """The work was done, the release failed: ReleaseError, not the acquire's error."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=0)
    try:
        lock = client.lock(name)
        with pytest.raises(aiolock.ReleaseError) as info:
            async with block(lock):
                proxy.cut()
        assert isinstance(info.value, aiolock.LockError)
        assert isinstance(info.value.__cause__, (RedisConnectionError, RedisTimeoutError))
        assert name in str(info.value)
        await proxy.restore()
        await quiesce(client)
        assert not await lock.is_locked()
    finally:
        await client.aclose()


@pytest.mark.parametrize("block", RELEASING_BLOCKS)
async def test_failed_release_is_a_note_on_the_body_error(
    block: Block, proxy: FaultProxy, name: str
) -> None:
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=0)
    try:
        with pytest.raises(Boom) as info:
            await failing_body(block(client.lock(name)), proxy.cut)
        notes = getattr(info.value, "__notes__", [])
        assert len(notes) == 1
        assert "ReleaseError" in notes[0]
        await proxy.restore()
        await quiesce(client)
    finally:
        await client.aclose()


async def test_unlock_keeps_raising_the_redis_error(proxy: FaultProxy, name: str) -> None:
    """Only the exit path changes: unlock() itself leaves redis-py's errors as they are."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=0)
    try:
        lock = client.lock(name)
        await lock.lock()
        proxy.cut()
        with pytest.raises((RedisConnectionError, RedisTimeoutError)):
            await lock.unlock()
        await proxy.restore()
        await quiesce(client)
    finally:
        await client.aclose()


async def test_composite_exit_keeps_the_body_error(make_client: ClientFactory, name: str) -> None:
    a, b = make_client(), make_client()
    multi = aiolock.MultiLock(a.lock(f"{name}:1"), a.lock(f"{name}:2"))
    with pytest.raises(Boom) as info:
        await failing_body(multi, b.lock(f"{name}:1").force_unlock)
    assert "LockLostError" in getattr(info.value, "__notes__", [""])[0]
