"""The spin lock: Redisson's RSpinLock layout, no messages, waiters that poll.

The lock methods are in the conformance suite; here is what sets it apart: nothing is
ever published (a Java service's RLock waiters are not woken by it, as with Redisson),
waiters of other clients get it by polling, without a subscription, and aclose() still
wakes a polling waiter at once.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

import aiolock

from .conftest import ClientFactory
from .helpers import wait_until

LIMIT = 10.0


async def test_nothing_is_published(client: aiolock.Client, raw: Redis, name: str) -> None:
    """unlock, re-entrant unlock, force_unlock and a rollback publish nothing on RLock's
    channel: the first message a subscriber gets there is the one the test sends last."""
    channel = f"redisson_lock__channel:{{{name}}}"
    async with raw.pubsub() as pubsub:
        await pubsub.subscribe(channel)
        assert (await pubsub.get_message(timeout=LIMIT))["type"] == "subscribe"
        spin = client.spin_lock(name)
        await spin.lock()
        await spin.lock()
        await spin.unlock()
        await spin.unlock()
        await spin.lock()
        assert await spin.force_unlock()
        await raw.publish(channel, "end")
        message = await pubsub.get_message(timeout=LIMIT)
    assert message is not None
    assert message["data"] == "end"
    assert await raw.exists(name) == 0


async def test_a_waiter_of_another_client_polls_without_a_subscription(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Another client's waiter gets the lock after the release, with no pub/sub at all."""
    holder, waiting = make_client(), make_client()
    spin = holder.spin_lock(name)
    await spin.lock()
    other = waiting.spin_lock(name, owner="w")
    waiter = asyncio.create_task(other.try_lock(wait=LIMIT))
    await wait_until(lambda: other.statistics().tasks_waiting == 1)
    assert await raw.pubsub_numsub(f"redisson_lock__channel:{{{name}}}") == [
        (f"redisson_lock__channel:{{{name}}}", 0)
    ]
    await spin.unlock()
    async with asyncio.timeout(LIMIT):
        assert await waiter
    assert await raw.hgetall(name) == {f"{waiting.id}:owner:w": "1"}
    await other.unlock()


async def test_a_spin_lock_and_a_lock_exclude_each_other(
    make_client: ClientFactory, name: str
) -> None:
    """One name, one lock: the same hash as RLock's."""
    a, b = make_client(), make_client()
    await a.lock(name).lock()
    assert not await b.spin_lock(name).try_lock()
    await a.lock(name).unlock()
    assert await b.spin_lock(name).try_lock()
    assert not await a.lock(name).try_lock()
    await b.spin_lock(name).unlock()


async def test_aclose_wakes_a_polling_waiter(make_client: ClientFactory, name: str) -> None:
    """A waiter between two polls fails with ClientClosedError when its client closes."""
    holder, waiting = make_client(), make_client()
    await holder.spin_lock(name).lock()
    other = waiting.spin_lock(name)
    waiter = asyncio.create_task(other.lock())
    await wait_until(lambda: other.statistics().tasks_waiting == 1)
    await waiting.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        async with asyncio.timeout(LIMIT):
            await waiter
    await holder.spin_lock(name).unlock()


async def test_a_polling_waiter_cancelled_leaves_nothing(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Cancelled between polls: CancelledError, no hold, no waiter left counted."""
    holder, waiting = make_client(), make_client()
    await holder.spin_lock(name).lock()
    other = waiting.spin_lock(name)
    waiter = asyncio.create_task(other.lock())
    await wait_until(lambda: other.statistics().tasks_waiting == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert other.statistics().tasks_waiting == 0
    await holder.spin_lock(name).unlock()
    assert await raw.exists(name) == 0
