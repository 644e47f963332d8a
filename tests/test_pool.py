"""The bounded command pool of a client built from a URL, on a real server."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock._pool import BoundedPool

from .helpers import wait_until


@pytest.fixture
async def pool(redis_url: str) -> AsyncIterator[BoundedPool]:
    made = BoundedPool.from_url(redis_url, max_connections=2, timeout=5.0)
    yield made
    await made.disconnect()


# redis-py before 5.3 requires a command name for a checkout; later ones deprecate it.
_NEEDS_COMMAND_NAME = (
    inspect.signature(ConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
)


async def _checkout(pool: BoundedPool) -> Any:
    if _NEEDS_COMMAND_NAME:
        return await pool.get_connection("PING")
    return await pool.get_connection()


def test_from_url_builds_a_bounded_pool(redis_url: str) -> None:
    """Client.from_url bounds its command connections instead of failing past a limit."""
    client = aiolock.Client.from_url(redis_url)
    assert isinstance(client._redis.connection_pool, BoundedPool)


async def test_checkout_beyond_the_bound_waits_for_a_release(pool: BoundedPool) -> None:
    """The third checkout of a pool of two waits, then gets the released connection."""
    first, second = await _checkout(pool), await _checkout(pool)
    third = asyncio.create_task(_checkout(pool))
    await wait_until(lambda: len(pool._queue) == 1, what="the third checkout queued")
    assert not third.done()
    await pool.release(first)
    assert await asyncio.wait_for(third, 5) is first
    for connection in (second, first):
        await pool.release(connection)


async def test_waiting_checkouts_are_served_in_order(pool: BoundedPool) -> None:
    """Waiters get connections in the order they asked, ahead of later newcomers."""
    held = [await _checkout(pool), await _checkout(pool)]
    order: list[int] = []

    async def ask(index: int) -> None:
        connection = await _checkout(pool)
        order.append(index)
        await pool.release(connection)

    waiters = [asyncio.create_task(ask(index)) for index in range(4)]
    await wait_until(lambda: len(pool._queue) == 4, what="all four checkouts queued")
    for connection in held:
        await pool.release(connection)
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert order == [0, 1, 2, 3]


async def test_checkout_that_waits_too_long_is_a_connection_error(redis_url: str) -> None:
    """Past its timeout a checkout raises redis-py's ConnectionError, which retries see."""
    pool = BoundedPool.from_url(redis_url, max_connections=1, timeout=0.05)
    held = await _checkout(pool)
    with pytest.raises(RedisConnectionError, match="no connection free in the pool of 1"):
        await _checkout(pool)
    assert not pool._queue
    await pool.release(held)
    # The pool is usable again at once.
    await pool.release(await asyncio.wait_for(_checkout(pool), 5))
    await pool.disconnect()


async def test_cancelled_waiter_passes_its_turn_on(pool: BoundedPool) -> None:
    """A waiter cancelled just as it was handed a connection passes it to the next one."""
    held = [await _checkout(pool), await _checkout(pool)]
    first = asyncio.create_task(_checkout(pool))
    second = asyncio.create_task(_checkout(pool))
    await wait_until(lambda: len(pool._queue) == 2, what="both checkouts queued")
    await pool.release(held[0])  # hands the turn to `first`, which has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 5) is held[0]
    await pool.release(held[0])
    await pool.release(held[1])


async def test_a_client_over_a_small_pool_serves_a_burst(redis_url: str, name: str) -> None:
    """A burst of acquires far beyond the pool size all succeed, one connection at a time."""
    redis = Redis.from_pool(BoundedPool.from_url(redis_url, max_connections=1, timeout=5.0))
    async with aiolock.Client(redis) as client:

        async def take(index: int) -> None:
            async with client.lock(f"{name}:{index}"):
                pass

        await asyncio.wait_for(asyncio.gather(*(take(index) for index in range(50))), 10)
    assert len(redis.connection_pool._in_use_connections) == 0
    await redis.aclose()
