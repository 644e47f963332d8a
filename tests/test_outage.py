"""A server that stops answering mid-call: calls cut off by the outage are completed once it
is back, so no lock stays held, or renewed, that nobody knows about.

Each test owns a private server with AOF (data survives the restart), so it can stop it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from functools import partial

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock._net.scripts import load_script
from aiolock.testing import LocalServer, start_local_server

from . import inside
from .helpers import gated_redis, wait_until


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with start_local_server(appendonly=True) as handle:
        yield handle


@pytest.fixture
async def raw(server: LocalServer) -> AsyncIterator[Redis]:
    redis = Redis.from_url(server.url, decode_responses=True)
    yield redis
    await redis.aclose()


async def _absent(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 0


async def _present(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 1


async def test_unlock_without_answer_is_finished_once_the_server_is_back(
    server: LocalServer, raw: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """An unlock() that gets no answer within the retries raises ConnectionError, stops the
    renewal at once and releases the lock in the background when the server returns (found
    by the fault suite: the hold stayed, renewed forever, and its task re-entered it)."""
    client = aiolock.Client.from_url(server.url, retry_attempts=0, retry_interval=0.05)
    lock = client.lock("outage")
    try:
        await lock.lock()
        await asyncio.to_thread(server.stop)
        with pytest.raises(RedisConnectionError):
            await lock.unlock()
        assert len(inside.renewal(client)) == 0, "a hold being released must not be renewed"
        await asyncio.to_thread(server.start)
        await raw.connection_pool.disconnect()  # its connections died with the server
        await wait_until(lambda: _absent(raw, "outage"), what="the release landed")
        await wait_until(lambda: not len(inside.ordering(client)), what="the bookkeeping followed")
        assert not lock.statistics().held_by_current_task
        # The name is free for everyone, this task included, with a count of one.
        await lock.lock()
        assert await lock.hold_count() == 1
        await lock.unlock()
    finally:
        await client.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_rollback_without_answer_is_retried_until_the_server_is_back(
    server: LocalServer, raw: Redis
) -> None:
    """An acquire cancelled in flight whose rollback cannot reach the server is rolled back
    once it is back, not left held until its lease runs out (found by the fault suite)."""
    redis, gate = gated_redis(server.url)
    client = gate.attach(aiolock.Client(redis, retry_attempts=0, retry_interval=0.05))
    lock = client.lock("outage")
    try:
        for script in ("lock_acquire", "lock_rollback"):  # a NOSCRIPT reply would be gated
            await raw.script_load(load_script(script).text)
        gate.arm("lock_acquire")
        acquire = asyncio.create_task(lock.lock())
        await asyncio.wait_for(gate.sent.wait(), 5)
        await wait_until(partial(_present, raw, "outage"), what="the acquire took the lock")
        await asyncio.to_thread(server.stop)
        acquire.cancel()
        with pytest.raises(asyncio.CancelledError):
            await acquire
        await asyncio.to_thread(server.start)
        await raw.connection_pool.disconnect()  # its connections died with the server
        await wait_until(lambda: _absent(raw, "outage"), what="the rollback landed")
        assert not lock.statistics().held_by_current_task
    finally:
        await client.aclose()
        await redis.aclose()
