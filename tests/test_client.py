"""The client: wrapping a redis client you own, closing, and what waits when it closes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock

from . import inside
from .faultproxy import FaultProxy
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
    redis = inside.redis_of(client)
    assert isinstance(redis, Redis)
    assert redis.connection_pool._in_use_connections == set()


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

    task = inside.background(client).spawn(job())
    await asyncio.sleep(0)  # job ends in this loop iteration; its done-callback runs in the next
    assert task.done()
    assert task in inside.background(client).tasks
    await client.aclose()
    assert not inside.background(client)


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


# -- aclose() whatever the caller's cancel state (c09) ------------------------------------


async def _stale_cancel_count(how: str) -> None:
    """Leave the calling task counting a cancel request that was already handled.

    ``taskgroup``: a TaskGroup whose child failed (on Python 3.11/3.12 the parent's count
    stays at 1: a CPython quirk, fixed in 3.13). ``swallowed``: a task that caught a
    CancelledError without ``uncancel()``, the same on every version.
    """
    if how == "taskgroup":

        async def fails() -> None:
            raise ValueError("one child fails")

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.sleep(10))
                group.create_task(fails())
        except* ValueError:
            pass
    else:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)
        assert task.cancelling() == 1


async def _in_full_use(client: aiolock.Client, name: str) -> asyncio.Task[bool]:
    """A watchdog hold (the renewal task runs) and a waiter parked on it (pub/sub)."""
    await client.lock(name).lock()
    waiter = asyncio.create_task(client.lock(name).try_lock(wait=30))
    await wait_until(lambda: subscriptions_confirmed(client), what="the waiter parked")
    return waiter


async def _closed_everything(client: aiolock.Client, proxy: FaultProxy) -> None:
    """No task of the client runs and no connection of it is open."""
    await wait_until(lambda: not inside.background(client).tasks, what="the client's tasks ended")
    await wait_until(lambda: proxy.connections == 0, what="the client's connections closed")


@pytest.mark.parametrize("how", ["taskgroup", "swallowed"])
async def test_aclose_after_a_handled_cancel_closes_everything(
    proxy: FaultProxy, raw: Redis, name: str, how: str
) -> None:
    """c09: aclose() from a task still counting a handled cancel request returns normally
    and closes every task and connection (it raised CancelledError halfway, leaving the
    pub/sub reader and both connections open, and a second aclose() did nothing)."""
    client = aiolock.Client.from_url(proxy.url)
    waiter = await _in_full_use(client, name)
    await _stale_cancel_count(how)
    await client.aclose()
    assert client.closed
    with pytest.raises(aiolock.ClientClosedError):
        await waiter
    await _closed_everything(client, proxy)
    await client.aclose()  # and again: nothing left to do
    await raw.delete(name)


async def test_aclose_cancelled_at_every_step_still_closes_everything(
    proxy: FaultProxy, raw: Redis, name: str
) -> None:
    """A sweep over aclose(), with a handled cancel counted beforehand: cancelled at the
    k-th loop iteration for k = 0, 1, ... until it completes first, it raises
    CancelledError exactly when the cancel was delivered, and every task and connection is
    closed either way."""
    # Every k up to 16, then doubling: a reply awaited spans many iterations.
    k = 0
    while await _aclose_cancelled_at(k, proxy, raw, name):
        k = k + 1 if k < 16 else k * 2
        assert k < 2**16, "aclose() never completed before its cancel"


async def _aclose_cancelled_at(k: int, proxy: FaultProxy, raw: Redis, name: str) -> bool:
    """One case of the aclose() sweep; whether the cancel was delivered."""
    loop = asyncio.get_running_loop()
    client = aiolock.Client.from_url(proxy.url)
    waiter = await _in_full_use(client, name)
    second = client.lock(f"{name}:2", owner="any task")
    await second.lock()
    delivered = False

    def hop(i: int) -> None:
        nonlocal delivered
        if task.done():
            return
        if i >= k:
            delivered = task.cancel()
            return
        loop.call_soon(hop, i + 1)

    async def close() -> None:
        await _stale_cancel_count("swallowed")
        loop.call_soon(hop, 0)
        await client.aclose()

    # A release in flight too (it starts while close() counts its handled cancel):
    # aclose() waits for it, and flushes its latch.
    releasing = asyncio.create_task(second.unlock())
    task = asyncio.create_task(close())
    try:
        async with asyncio.timeout(10):
            await task
        cancelled = False
    except asyncio.CancelledError:
        cancelled = True
    assert cancelled == delivered, f"k={k}: cancel delivered {delivered}, raised {cancelled}"
    with pytest.raises(aiolock.ClientClosedError):
        await waiter
    await asyncio.gather(releasing, return_exceptions=True)  # done, or failed at the close
    await _closed_everything(client, proxy)
    # A cancelled aclose() leaves the release's latch to its expiry.
    latches = [key async for key in raw.scan_iter(match=f"redisson_unlock_latch:{{{name}:2}}:*")]
    await raw.delete(name, f"{name}:2", *latches)
    return delivered
