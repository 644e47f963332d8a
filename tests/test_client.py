"""The client: wrapping a redis client you own, closing, and what waits when it closes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock

from .helpers import subscriptions_confirmed, wait_until


@pytest.mark.parametrize(
    "options",
    [{}, {"decode_responses": True}, {"protocol": 3}, {"protocol": 3, "decode_responses": True}],
    ids=["resp2", "resp2-decoded", "resp3", "resp3-decoded"],
)
async def test_wrapped_redis_in_any_reply_mode(
    redis_url: str, raw: Redis, name: str, options: dict[str, Any]
) -> None:
    """A wrapped redis client works whatever its protocol and decoding, waiters included."""
    redis = Redis.from_url(redis_url, **options)
    client = aiolock.Client(redis)
    lock = client.lock(name)
    await lock.lock()
    assert await lock.hold_count() == 1
    waiter = asyncio.create_task(client.lock(name).try_lock(wait=10))
    await wait_until(lambda: lock.statistics().tasks_waiting == 1, what="waiting")
    await wait_until(lambda: subscriptions_confirmed(client), what="subscribed")
    await lock.unlock()
    async with asyncio.timeout(5):
        assert await waiter
    await client.aclose()
    # The redis client belongs to the caller: still open, still usable.
    assert await redis.ping()
    await redis.delete(name)
    await redis.aclose()


async def test_from_url_owns_and_closes_its_redis(redis_url: str, raw: Redis) -> None:
    """A client built from a URL closes its own redis client."""
    async with aiolock.Client.from_url(redis_url) as client:
        assert await client.lock("x-unused").is_locked() in {True, False}
    assert client.closed
    assert isinstance(client._redis, Redis)
    assert client._redis.connection_pool._in_use_connections == set()


async def test_aclose_wakes_waiters_with_client_closed(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Closing the client wakes every waiter with ClientClosedError."""
    holder = client.lock(name, owner="holder")
    await holder.lock()
    waiters = [asyncio.create_task(client.lock(name).lock()) for _ in range(3)]
    await wait_until(lambda: holder.statistics().tasks_waiting == 3, what="three waiting")
    await client.aclose()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, aiolock.ClientClosedError) for r in results), results
    await raw.delete(name)


@pytest.mark.timeout(10)
async def test_aclose_right_after_a_background_task_ended(client: aiolock.Client) -> None:
    """aclose() returns when a background task ended in the same loop iteration and its
    done-callback has not run yet (on Python 3.12+, where gather() of tasks that are all done
    completes without yielding to the loop, aclose() spun there forever, blocking the loop;
    seen as hangs of test_renewal_is_batched and of the cancellation sweep)."""

    async def job() -> None:
        return None

    task = client._background.spawn(job())
    await asyncio.sleep(0)  # job ends in this loop iteration; its done-callback runs in the next
    assert task.done()
    assert task in client._background.tasks
    await client.aclose()
    assert not client._background


async def test_calls_after_aclose_raise(client: aiolock.Client, name: str) -> None:
    """Every call after aclose() raises ClientClosedError; aclose() itself is idempotent."""
    lock = client.lock(name)
    await client.aclose()
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await lock.lock()
    with pytest.raises(aiolock.ClientClosedError):
        await lock.try_lock()
    with pytest.raises(aiolock.ClientClosedError):
        await lock.unlock()
    with pytest.raises(aiolock.ClientClosedError):
        await lock.is_locked()
    with pytest.raises(aiolock.ClientClosedError):
        async with client:
            pass


async def test_client_id_is_a_uuid4(client: aiolock.Client) -> None:
    """client.id is a UUID4 in Java's text form: it is every holder id's first part."""
    import uuid  # noqa: PLC0415

    parsed = uuid.UUID(client.id)
    assert parsed.version == 4
    assert str(parsed) == client.id


async def test_cluster_without_a_node_fails_clearly() -> None:
    """A RedisCluster costs no I/O until the first call, which names the nodes it tried."""
    from redis.asyncio.cluster import RedisCluster  # noqa: PLC0415
    from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415

    cluster = RedisCluster(host="127.0.0.1", port=1)  # nothing listens there
    client = aiolock.Client(cluster, retry_attempts=0)
    try:
        with pytest.raises(RedisConnectionError, match=r"CLUSTER SLOTS \(127\.0\.0\.1:1: "):
            await client.lock("x").try_lock(wait=0)
    finally:
        await client.aclose()
        await cluster.aclose()
