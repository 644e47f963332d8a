"""aiolock.sync through the fault proxy: a blocking call whose connections are cut mid-wait.

The sync calls run in worker threads (``asyncio.to_thread``) while this test's loop runs the
proxy; the sync client's own loop thread runs its async client, as in production.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
import aiolock.sync

from .conftest import ClientFactory
from .faultproxy import FaultProxy
from .helpers import wait_until

LIMIT = 10.0


@pytest.fixture
async def sync_via_proxy(proxy: FaultProxy, raw: Redis) -> AsyncIterator[aiolock.sync.Client]:
    """A sync client whose every connection goes through ``proxy``; closed before the leak
    check (``raw``'s). A socket timeout bounds each round trip, as in production."""
    client = aiolock.sync.Client.from_url(proxy.url + "?socket_timeout=0.3", retry_interval=0.05)
    yield client
    await asyncio.to_thread(client.close)


async def test_connections_killed_mid_wait_the_call_recovers(
    sync_via_proxy: aiolock.sync.Client,
    proxy: FaultProxy,
    make_client: ClientFactory,
    raw: Redis,
    name: str,
) -> None:
    """Its command and pub/sub connections die while the thread waits; a release after that
    still wakes it within its wait, and it holds the lock, once."""
    holder = make_client().fair_lock(name)
    await holder.lock()
    waiting = sync_via_proxy.fair_lock(name)
    queue = f"redisson_lock_queue:{{{name}}}"

    def take_and_release() -> tuple[bool, int]:
        acquired = waiting.try_lock(LIMIT)
        count = waiting.hold_count()  # per Redis: a fresh round trip, after the cut
        if acquired:
            waiting.unlock()
        return acquired, count

    call = asyncio.create_task(asyncio.to_thread(take_and_release))
    await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="the thread waits")

    async def queued_and_subscribed() -> bool:
        # The subscription can follow the queued attempt: both connections must be up
        # before the cut, or the test cuts only one.
        subscribed = await raw.pubsub_channels(f"redisson_lock__channel:{{{name}}}*")
        return await raw.llen(queue) == 1 and len(subscribed) == 1

    await wait_until(queued_and_subscribed, what="it queued and subscribed")
    assert await proxy.kill_connections() >= 2  # its command and pub/sub connections
    released = time.monotonic()
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        assert await call == (True, 1)
    assert time.monotonic() - released < LIMIT / 2  # bounded: well within its wait
    assert await raw.exists(name, queue) == 0


async def test_partition_outlasting_the_wait_ends_the_call_and_leaves_nothing(
    sync_via_proxy: aiolock.sync.Client,
    proxy: FaultProxy,
    make_client: ClientFactory,
    raw: Redis,
    name: str,
) -> None:
    """The link is partitioned while the thread waits and stays so past its wait: the call
    ends (False, or a clear aiolock/connection error) in bounded time; once the link is
    back and the holder has released, nobody holds the lock."""
    holder = make_client().lock(name)
    await holder.lock()
    waiting = sync_via_proxy.lock(name)
    call = asyncio.create_task(asyncio.to_thread(waiting.try_lock, 0.3))
    await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="the thread waits")
    started = time.monotonic()
    proxy.cut()
    try:
        async with asyncio.timeout(LIMIT):
            outcome = await asyncio.gather(call, return_exceptions=True)
    finally:
        await proxy.restore()
    assert time.monotonic() - started < LIMIT
    result = outcome[0]
    clear = (aiolock.LockError, RedisConnectionError, RedisTimeoutError)
    assert result is False or isinstance(result, clear), repr(result)
    await holder.unlock()
    # Nothing of the sync thread's was left behind, and the client works again.
    assert await raw.exists(name) == 0

    def take_and_release() -> bool:
        acquired = waiting.try_lock(LIMIT)
        waiting.unlock()
        return acquired

    assert await asyncio.to_thread(take_and_release)
    assert await raw.exists(name) == 0
