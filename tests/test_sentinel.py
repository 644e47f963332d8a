"""Sentinel: the client works through ``master_for`` and follows a failover, pub/sub included.

On a real local group (``aiolock.testing.redis_sentinel``): a primary, a replica and three
sentinels.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

import aiolock

from .helpers import wait_until
from .topologies import SentinelHandle, redis_sentinel

# Safety net only: every wait ends on an event or on Redis state.
LIMIT = 20.0


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelHandle]:
    with redis_sentinel() as handle:
        yield handle


@pytest.fixture
async def sentinel(group: SentinelHandle) -> AsyncIterator[Sentinel]:
    sentinel = Sentinel(group.sentinel_addresses, socket_timeout=5)  # type: ignore[no-untyped-call]
    yield sentinel
    for redis in sentinel.sentinels:
        await redis.aclose()


@pytest.fixture
async def make_client(group: SentinelHandle, sentinel: Sentinel, uid: str) -> AsyncIterator[Any]:
    """Clients over ``master_for``; all closed, then nothing of the test may remain."""
    made: list[tuple[aiolock.Client, Redis]] = []

    def make(**options: Any) -> aiolock.Client:
        redis = sentinel.master_for(group.master_name)
        client = aiolock.Client(redis, **options)
        made.append((client, redis))
        return client

    yield make
    for client, redis in made:
        await client.aclose()
        await redis.aclose()
    primary = sentinel.master_for(group.master_name, decode_responses=True)
    try:
        left = [
            key
            async for key in primary.scan_iter(match=f"*{uid}*")
            if not key.startswith("aiolock_acquire_cancel:")
        ]
        assert not left, f"keys left behind: {left}"
    finally:
        await primary.aclose()


async def test_locks_and_waiters_through_sentinel(make_client: Any, name: str) -> None:
    holder, waiting = make_client(), make_client()
    lock = holder.lock(name, owner="h")
    await lock.lock()
    task = asyncio.create_task(_hold_once(waiting.lock(name)))
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
    await lock.unlock()
    async with asyncio.timeout(LIMIT):
        await task


async def _hold_once(handle: aiolock.Lock) -> None:
    async with handle.acquired(wait=LIMIT):
        pass


async def test_failover_moves_commands_and_pubsub_to_the_new_primary(
    group: SentinelHandle, sentinel: Sentinel, make_client: Any, name: str
) -> None:
    """SENTINEL FAILOVER under a held lock and parked waiters: the client hears the switch,
    renews on the new primary, and its waiters (subscribed there anew) are served."""
    # A lease long enough to outlast the switch: the old primary's renewals stop reaching
    # the replica once it is promoted, and the client moves when the sentinels announce it.
    holder, waiting = make_client(watchdog_timeout=4), make_client()
    lock = holder.lock(name, owner="h")
    await lock.lock()
    served: list[int] = []

    async def wait_for(index: int) -> None:
        async with waiting.lock(name).acquired(wait=LIMIT):
            served.append(index)

    tasks = [asyncio.create_task(wait_for(index)) for index in range(3)]
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 3)
    assert holder._sentinel is not None
    assert waiting._sentinel is not None
    await wait_until(holder._sentinel.listening.is_set, what="watching")
    await wait_until(waiting._sentinel.listening.is_set, what="watching")
    new = await asyncio.to_thread(group.failover)
    await wait_until(
        lambda: holder._sentinel.switches == waiting._sentinel.switches == 1,
        limit=LIMIT,
        what="both clients heard the switch",
    )
    rounds = holder._renewal.rounds
    await wait_until(lambda: holder._renewal.rounds >= rounds + 2, limit=LIMIT, what="renewals")
    async with Redis(host="127.0.0.1", port=new.port, decode_responses=True) as primary:
        assert await primary.hget(name, f"{holder.id}:owner:h") == "1"
        assert await primary.pttl(name) > 0
    await lock.unlock()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*tasks)
    assert sorted(served) == [0, 1, 2]
    assert holder._transport._wire is not None
    assert holder._transport._wire.peer.endswith(f":{new.port}")
