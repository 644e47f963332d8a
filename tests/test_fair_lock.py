"""The fair lock in Redisson's RFairLock layout: queue, deadlines, per-waiter wake-ups."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import cast

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

import aiolock
from aiolock._engine.primitive import Call
from aiolock._net.scripts import load_script

from . import inside
from .conftest import ClientFactory
from .helpers import (
    Gate,
    gated_redis,
    subscribe_confirmed,
    subscriptions_confirmed,
    wait_until,
)

# Safety net only. It is well below the 30 s a waiter sleeps when no message wakes it
# (the watchdog lease, or the cap while another waiter's turn), so a test that passes was
# woken by the wake-up it checks, not rescued by a timer.
LIMIT = 10.0
W_DEFAULT = 300_000

# Redisson's RFairLock acquire (waiting variant) and unlock, without the latch
# (redisson-spec.md 5.2, 5.3 and 5.6), as a Java service runs them: the foreign side of the
# interop tests. KEYS: name, queue, timeouts[, channel base]. Acquire ARGV: lease, holder,
# W, now. Unlock ARGV: "0", lease, holder, now.
JAVA_PURGE = """
while true do
    local first = redis.call('lindex', KEYS[2], 0)
    if first == false then break end
    local timeout = tonumber(redis.call('zscore', KEYS[3], first))
    if timeout ~= nil and timeout <= tonumber(ARGV[4]) then
        redis.call('zrem', KEYS[3], first)
        redis.call('lpop', KEYS[2])
    else
        break
    end
end
"""
JAVA_FAIR_ACQUIRE = (
    JAVA_PURGE
    + """
if (redis.call('exists', KEYS[1]) == 0) and ((redis.call('exists', KEYS[2]) == 0)
        or (redis.call('lindex', KEYS[2], 0) == ARGV[2])) then
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], ARGV[2])
    local keys = redis.call('zrange', KEYS[3], 0, -1)
    for i = 1, #keys, 1 do
        redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), keys[i])
    end
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('zscore', KEYS[3], ARGV[2]) ~= false then
    return math.max(0, redis.call('pttl', KEYS[1]))
end
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) ~= false then
    ttl = tonumber(redis.call('zscore', KEYS[3], last)) - tonumber(ARGV[4])
else
    ttl = redis.call('pttl', KEYS[1])
end
local deadline = ttl + tonumber(ARGV[3]) + tonumber(ARGV[4])
if redis.call('zadd', KEYS[3], deadline, ARGV[2]) == 1 then
    redis.call('rpush', KEYS[2], ARGV[2])
end
return ttl
"""
)
JAVA_FAIR_UNLOCK = (
    JAVA_PURGE
    + """
if redis.call('exists', KEYS[1]) == 0 then
    local head = redis.call('lindex', KEYS[2], 0)
    if head ~= false then
        redis.call('publish', KEYS[4] .. ':' .. head, ARGV[1])
    end
    return 1
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
local head = redis.call('lindex', KEYS[2], 0)
if head ~= false then
    redis.call('publish', KEYS[4] .. ':' .. head, ARGV[1])
end
return 1
"""
)


def queue_key(name: str) -> str:
    """Redisson's fair-lock queue for ``name`` (a name without braces)."""
    return f"redisson_lock_queue:{{{name}}}"


def timeout_key(name: str) -> str:
    """Redisson's fair-lock deadline zset for ``name``."""
    return f"redisson_lock_timeout:{{{name}}}"


def channel_of(name: str, holder: str) -> str:
    """The channel of one fair-lock waiter."""
    return f"redisson_lock__channel:{{{name}}}:{holder}"


def now_ms() -> int:
    """The wall clock in epoch ms, as the scripts get it."""
    return time.time_ns() // 1_000_000


async def queue_of(raw: Redis, name: str) -> list[str]:
    """The waiting holder ids, head first."""
    return [str(holder) for holder in await raw.lrange(queue_key(name), 0, -1)]


async def deadlines(raw: Redis, name: str) -> dict[str, float]:
    """Each waiting holder's eviction deadline."""
    pairs = await raw.zrange(timeout_key(name), 0, -1, withscores=True)
    return dict(cast("list[tuple[str, float]]", pairs))


async def wait_queued(raw: Redis, name: str, count: int) -> list[str]:
    """Wait until ``count`` holders are queued, and return the queue."""

    async def enough() -> bool:
        return bool(await raw.llen(queue_key(name)) == count)

    await wait_until(enough, what=f"{count} queued")
    return await queue_of(raw, name)


async def no_queue(raw: Redis, name: str) -> bool:
    """Whether neither the queue nor the deadline zset exists."""
    return await raw.exists(queue_key(name), timeout_key(name)) == 0


def cleanup_done(client: aiolock.Client) -> bool:
    """Whether every background task but the watchdog and the pub/sub reader has finished."""
    return inside.background(client).tasks <= {
        inside.task_of(inside.renewal(client)),
        inside.reader_of(inside.dispatcher(client)),
    }


@pytest.fixture
async def listen(raw: Redis) -> AsyncIterator[PubSub]:
    """A raw pub/sub connection, closed (and so unsubscribed) before the leak check."""
    pubsub = raw.pubsub(ignore_subscribe_messages=True)
    yield pubsub
    await pubsub.aclose()  # type: ignore[no-untyped-call]


async def next_message(pubsub: PubSub, limit: float = LIMIT) -> tuple[str, str]:
    """The next (channel, data) on ``pubsub``; fail if none arrives within ``limit`` s."""
    deadline = time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is not None and message["type"] == "message":
            return message["channel"], message["data"]
    raise AssertionError(f"no message within {limit} s")


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> AsyncIterator[tuple[aiolock.Client, Gate]]:
    """A client whose chosen script reply can be held back after the command was sent."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    yield client, gate
    await client.aclose()
    await redis.aclose()


# -- layout ---------------------------------------------------------------------------------


async def test_layout_matches_redisson(make_client: ClientFactory, raw: Redis, name: str) -> None:
    """Hash, queue list and deadline zset (now + ttl + W, then tail + W) as Redisson's."""
    client = make_client(fair_lock_wait_timeout=60)
    holder = client.fair_lock(name, owner="holder")
    await holder.lock(lease=10)
    assert await raw.type(name) == "hash"
    assert await raw.hgetall(name) == {f"{client.id}:owner:holder": "1"}
    assert await no_queue(raw, name)

    before = now_ms()
    first = asyncio.create_task(client.fair_lock(name).lock())
    (a,) = await wait_queued(raw, name, 1)
    after = now_ms()
    second = asyncio.create_task(client.fair_lock(name).try_lock(wait=30))
    _, b = await wait_queued(raw, name, 2)
    third = asyncio.create_task(client.fair_lock(name).lock())
    *_, c = await wait_queued(raw, name, 3)
    assert [a, b, c] == await queue_of(raw, name)
    assert all(h.startswith(f"{client.id}:") for h in (a, b, c))
    assert await raw.type(queue_key(name)) == "list"
    assert await raw.type(timeout_key(name)) == "zset"
    # Neither has a TTL in Redisson: stale entries go by the purge.
    assert await raw.pttl(queue_key(name)) == -1
    assert await raw.pttl(timeout_key(name)) == -1

    scores = await deadlines(raw, name)
    # The first waiter: the holder's PTTL + W (the client default, 60 s) from now.
    assert before + 60_000 < scores[a] <= after + 10_000 + 60_000
    # Then each waiter: the tail's deadline + its own W (the try_lock wait: 30 s).
    assert scores[b] == scores[a] + 30_000
    assert scores[c] == scores[b] + 60_000

    # The head acquires: it leaves the queue, and everyone moves up by its W.
    await holder.unlock()
    await wait_until(first.done, what="head acquired")
    assert await raw.hkeys(name) == [a]
    assert await queue_of(raw, name) == [b, c]
    assert await deadlines(raw, name) == {b: scores[b] - 60_000, c: scores[c] - 60_000}
    for task in (first, second, third):
        task.cancel()
    await asyncio.gather(first, second, third, return_exceptions=True)
    await wait_until(lambda: cleanup_done(client), what="cleanup")
    await raw.delete(name)
    assert await no_queue(raw, name)


async def test_reentrancy(client: aiolock.Client, raw: Redis, name: str) -> None:
    """The holder re-enters without queueing; the waiter gets it only after the last unlock."""
    lock = client.fair_lock(name)
    await lock.lock()
    assert await lock.try_lock(0)
    await lock.lock()
    (holder,) = await raw.hkeys(name)
    assert await raw.hgetall(name) == {holder: "3"}
    assert await no_queue(raw, name)
    assert await lock.hold_count() == 3

    waiter = asyncio.create_task(client.fair_lock(name).lock())
    (queued,) = await wait_queued(raw, name, 1)
    await lock.unlock()
    await lock.unlock()
    assert await raw.hgetall(name) == {holder: "1"}
    assert await queue_of(raw, name) == [queued]
    assert not waiter.done()
    await lock.unlock()
    async with asyncio.timeout(LIMIT):
        await waiter
    assert await raw.hgetall(name) == {queued: "1"}
    assert await no_queue(raw, name)
    await raw.delete(name)


async def test_try_lock_no_wait_does_not_queue(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """try_lock(wait=0) by another task fails without touching the queue."""
    lock = client.fair_lock(name)
    await lock.lock()

    async def attempt() -> bool:
        other = client.fair_lock(name)
        if not await other.try_lock(0):
            return False
        await other.unlock()
        return True

    assert not await asyncio.create_task(attempt())
    assert await no_queue(raw, name)
    await lock.unlock()
    assert await asyncio.create_task(attempt())
    assert await raw.exists(name) == 0


# -- FIFO and wake-ups ----------------------------------------------------------------------


async def test_fifo_across_two_clients(make_client: ClientFactory, raw: Redis, name: str) -> None:
    """Six waiters alternating between two clients acquire in exactly the order they queued."""
    clients = [make_client(), make_client()]
    holder = clients[0].fair_lock(name, owner="holder")
    await holder.lock()
    queued: list[str] = []
    order: list[int] = []

    async def worker(i: int) -> None:
        async with clients[i % 2].fair_lock(name):
            order.append(i)
            # The one holding is the i-th to queue, and everyone after it still waits.
            assert await raw.hkeys(name) == [queued[i]]
            assert await queue_of(raw, name) == queued[i + 1 :]

    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(worker(i)))
        queued.append((await wait_queued(raw, name, i + 1))[-1])
    assert len(set(queued)) == 6
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*tasks)
    assert order == list(range(6))
    assert await raw.exists(name) == 0
    assert await no_queue(raw, name)


async def test_unlock_publishes_only_to_the_head(
    make_client: ClientFactory, raw: Redis, listen: PubSub, name: str
) -> None:
    """A release sends "0" to the head waiter's own channel and to nobody else."""
    client = make_client()
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    release_first = asyncio.Event()

    async def first() -> None:
        async with client.fair_lock(name):
            await release_first.wait()

    async def second() -> None:
        async with make_client().fair_lock(name):
            pass

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(first())
        await wait_queued(raw, name, 1)
        tg.create_task(second())
        head, behind = await wait_queued(raw, name, 2)
        await subscribe_confirmed(listen, channel_of(name, head), channel_of(name, behind))
        await holder.unlock()
        assert await next_message(listen) == (channel_of(name, head), "0")
        await wait_until(lambda: _holds(raw, name, head), what="head acquired")
        # Had the second waiter been sent anything, it would arrive before this marker.
        await raw.publish(channel_of(name, behind), "marker")
        assert await next_message(listen) == (channel_of(name, behind), "marker")
        release_first.set()
        assert await next_message(listen) == (channel_of(name, behind), "0")
    assert await raw.exists(name) == 0
    assert await no_queue(raw, name)


async def _holds(raw: Redis, name: str, holder: str) -> bool:
    return bool(await raw.hexists(name, holder))


async def test_force_unlock_wakes_only_the_head(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """force_unlock() deletes the hash, keeps the queue and sends "0" to the head only."""
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    a = f"{uuid.uuid4()}:1"
    b = f"{uuid.uuid4()}:2"
    await raw.rpush(queue_key(name), a, b)
    await raw.zadd(timeout_key(name), {a: now_ms() + 60_000, b: now_ms() + 120_000})
    await subscribe_confirmed(listen, channel_of(name, a), channel_of(name, b))
    assert await client.fair_lock(name).force_unlock()
    assert await next_message(listen) == (channel_of(name, a), "0")
    assert await queue_of(raw, name) == [a, b]
    assert not await client.fair_lock(name).force_unlock()
    await raw.publish(channel_of(name, b), "end")
    assert await next_message(listen) == (channel_of(name, b), "end")
    with pytest.raises(aiolock.LockLostError):
        await holder.unlock()
    await raw.delete(queue_key(name), timeout_key(name))


# -- leaving the queue ----------------------------------------------------------------------


async def test_timed_out_waiter_leaves_at_once(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A try_lock(wait=) that runs out leaves the queue before it returns; those behind move up."""
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    gave_up = asyncio.create_task(client.fair_lock(name).try_lock(wait=1))
    (quitter,) = await wait_queued(raw, name, 1)
    behind = asyncio.create_task(client.fair_lock(name).lock())
    _, waiter = await wait_queued(raw, name, 2)
    before = (await deadlines(raw, name))[waiter]

    async with asyncio.timeout(LIMIT):
        assert not await gave_up
    assert await queue_of(raw, name) == [waiter]
    # Its deadline moves up by the W of the waiter that left: its try_lock wait, 1 s.
    assert await deadlines(raw, name) == {waiter: before - 1_000}
    assert quitter != waiter

    # It does not delay the next one: the release goes straight to the new head.
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        await behind
    assert await raw.hkeys(name) == [waiter]
    assert await no_queue(raw, name)
    await raw.delete(name)


async def test_cancelled_waiter_leaves_at_once(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A cancelled waiter (head or not) leaves the queue at once; the rest go in order."""
    client = make_client()
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    order: list[int] = []

    async def worker(i: int, wait: float | None) -> None:
        lock = client.fair_lock(name)
        assert await lock.try_lock(wait=wait)
        order.append(i)
        await lock.unlock()

    tasks = []
    for i, wait in enumerate([20.0, None, 40.0, None]):
        tasks.append(asyncio.create_task(worker(i, wait)))
        await wait_queued(raw, name, i + 1)
    queued = await queue_of(raw, name)
    scores = await deadlines(raw, name)

    # Cancel the head (W = its wait, 20 s): everyone behind moves up by 20 s.
    tasks[0].cancel()
    await asyncio.wait([tasks[0]])
    await wait_until(lambda: cleanup_done(client), what="left the queue")
    assert await queue_of(raw, name) == queued[1:]
    assert await deadlines(raw, name) == {h: scores[h] - 20_000 for h in queued[1:]}
    # Cancel one in the middle (W = 40 s): only the one behind it moves up by 40 s more.
    tasks[2].cancel()
    await asyncio.wait([tasks[2]])
    await wait_until(lambda: cleanup_done(client), what="left the queue")
    assert await queue_of(raw, name) == [queued[1], queued[3]]
    assert await deadlines(raw, name) == {
        queued[1]: scores[queued[1]] - 20_000,
        queued[3]: scores[queued[3]] - 60_000,
    }

    # The release goes to the new head, not to the cancelled one: no delay.
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in results] == [
        asyncio.CancelledError,
        type(None),
        asyncio.CancelledError,
        type(None),
    ]
    assert order == [1, 3]
    assert await raw.exists(name) == 0
    assert await no_queue(raw, name)


async def test_leaving_head_wakes_the_next_when_free(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """A head that gives up while the lock is free wakes the waiter behind it at once."""
    # A head that was sent the release but gives up before taking the lock: the waiter
    # behind it, on a free lock, would otherwise sleep until its capped bound (30 s).
    head = f"{client.id}:slow"
    await raw.rpush(queue_key(name), head)
    await raw.zadd(timeout_key(name), {head: now_ms() + 120_000})
    lock = client.fair_lock(name)
    waiter = asyncio.create_task(lock.lock())
    _, queued = await wait_queued(raw, name, 2)
    await wait_until(lambda: lock.statistics().tasks_waiting == 1, what="waiting")
    await wait_until(lambda: subscriptions_confirmed(client), what="subscribed")
    await subscribe_confirmed(listen, channel_of(name, head), channel_of(name, queued))

    # What the engine sends for a waiter of holder `head` that gives up.
    slow = inside.primitive_of(client.fair_lock(name, owner="slow"))
    leave = slow.leave(
        Call(head, None, head, inside.settings(client).lease_ms, None, None, None, 0)
    )
    assert leave is not None
    await inside.runner(client).run(*leave[0])
    assert await next_message(listen) == (channel_of(name, queued), "0")
    async with asyncio.timeout(LIMIT):
        await waiter
    assert await raw.hkeys(name) == [queued]
    assert await no_queue(raw, name)
    await raw.delete(name)


async def test_stale_waiter_is_purged(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A dead waiter at the head blocks until its deadline; then the next acquire purges it."""
    dead = f"{uuid.uuid4()}:9"
    await raw.rpush(queue_key(name), dead)
    await raw.zadd(timeout_key(name), {dead: now_ms() + 60_000})
    lock = client.fair_lock(name)
    # The lock is free, but it is the dead waiter's turn until its deadline.
    assert not await lock.try_lock(0)
    assert await queue_of(raw, name) == [dead]

    # Its deadline passes (set in the past rather than waited for).
    await raw.zadd(timeout_key(name), {dead: now_ms() - 1}, xx=True)
    assert await lock.try_lock(0)
    assert await no_queue(raw, name)
    await lock.unlock()
    assert await raw.exists(name) == 0


async def test_stale_waiters_are_purged_for_a_waiter(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Dead waiters with past deadlines ahead of a live one are purged as it reaches them."""
    client = make_client()
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    waiter = asyncio.create_task(client.fair_lock(name).lock())
    (live,) = await wait_queued(raw, name, 1)
    dead = [f"{uuid.uuid4()}:{i}" for i in range(2)]
    # Two dead waiters pushed ahead of it (as a crashed Java client would have left them).
    await raw.lpush(queue_key(name), *dead)
    await raw.zadd(timeout_key(name), dict.fromkeys(dead, now_ms() - 1))
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        await waiter
    assert await raw.hkeys(name) == [live]
    assert await no_queue(raw, name)
    await raw.delete(name)


# -- unlock ---------------------------------------------------------------------------------


async def test_unlock_of_absent_lock_raises_and_wakes_the_head(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """Unlock of an absent lock raises (Redisson says 1) but still wakes the head."""
    lock = client.fair_lock(name)
    await lock.lock(lease=30)
    java = f"{uuid.uuid4()}:1"
    await raw.rpush(queue_key(name), java)
    await raw.zadd(timeout_key(name), {java: now_ms() + 60_000})
    await subscribe_confirmed(listen, channel_of(name, java))
    await raw.delete(name)  # the lease ran out: nobody was told

    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    assert await next_message(listen) == (channel_of(name, java), "0")
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    assert await next_message(listen) == (channel_of(name, java), "0")
    # No latch recorded a success that did not happen.
    assert not [k async for k in raw.scan_iter(match=f"redisson_unlock_latch:{{{name}}}:*")]
    assert await queue_of(raw, name) == [java]
    await raw.delete(queue_key(name), timeout_key(name))


async def test_unlock_of_lock_held_by_another_publishes_nothing(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """Unlock by a non-holder of a held lock raises LockNotOwnedError and wakes nobody."""
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    java = f"{uuid.uuid4()}:1"
    await raw.rpush(queue_key(name), java)
    await raw.zadd(timeout_key(name), {java: now_ms() + 60_000})
    await subscribe_confirmed(listen, channel_of(name, java))
    with pytest.raises(aiolock.LockNotOwnedError):
        await client.fair_lock(name).unlock()
    await raw.publish(channel_of(name, java), "marker")
    assert await next_message(listen) == (channel_of(name, java), "marker")
    await holder.unlock()
    assert await next_message(listen) == (channel_of(name, java), "0")
    await raw.delete(queue_key(name), timeout_key(name))


# -- Java interop ---------------------------------------------------------------------------


async def test_aiolock_waiter_on_java_holder(client: aiolock.Client, raw: Redis, name: str) -> None:
    """An aiolock waiter queues behind a Java holder and acquires on Redisson's unlock."""
    java = f"{uuid.uuid4()}:1"
    keys = [name, queue_key(name), timeout_key(name)]
    assert await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, java, W_DEFAULT, now_ms()) is None
    lock = client.fair_lock(name, owner="w")
    waiter = asyncio.create_task(lock.lock())
    (queued,) = await wait_queued(raw, name, 1)
    assert queued == f"{client.id}:owner:w"
    # A second Java thread queues behind it, by Redisson's own rules.
    java2 = f"{uuid.uuid4()}:2"
    ttl = await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, java2, W_DEFAULT, now_ms())
    assert isinstance(ttl, int)
    assert ttl > W_DEFAULT
    assert await queue_of(raw, name) == [queued, java2]
    scores = await deadlines(raw, name)
    assert scores[java2] == scores[queued] + W_DEFAULT

    unlocked = await raw.eval(
        JAVA_FAIR_UNLOCK,
        4,
        *keys,
        f"redisson_lock__channel:{{{name}}}",
        "0",
        30_000,
        java,
        now_ms(),
    )
    assert unlocked == 1
    async with asyncio.timeout(LIMIT):
        await waiter
    assert await raw.hkeys(name) == [queued]
    assert await deadlines(raw, name) == {java2: scores[java2] - W_DEFAULT}
    # Java's acquire is refused while aiolock holds it.
    assert await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, java2, W_DEFAULT, now_ms()) >= 0
    await lock.unlock()
    # Now it is the Java waiter's turn: Redisson's acquire gets it.
    assert await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, java2, W_DEFAULT, now_ms()) is None
    assert await raw.hgetall(name) == {java2: "1"}
    assert await no_queue(raw, name)
    await raw.delete(name)


async def test_aiolock_unlock_wakes_java_waiter(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """A Java waiter queued behind aiolock gets "0" on its own channel at aiolock's unlock."""
    lock = client.fair_lock(name)
    await lock.lock()
    java = f"{uuid.uuid4()}:5"
    keys = [name, queue_key(name), timeout_key(name)]
    await subscribe_confirmed(listen, channel_of(name, java))
    ttl = await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, java, W_DEFAULT, now_ms())
    assert isinstance(ttl, int)
    assert 0 < ttl <= 30_000
    assert await queue_of(raw, name) == [java]
    # aiolock's no-wait try from another task does not overtake it once it is free.
    await lock.unlock()
    assert await next_message(listen) == (channel_of(name, java), "0")

    async def attempt() -> bool:
        return await client.fair_lock(name).try_lock(0)

    assert not await asyncio.create_task(attempt())
    assert await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, java, W_DEFAULT, now_ms()) is None
    assert await raw.hgetall(name) == {java: "1"}
    assert await no_queue(raw, name)
    await raw.delete(name)


# -- leases ---------------------------------------------------------------------------------


async def test_watchdog_renews_and_reports_a_lost_lease(
    make_client: ClientFactory, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The watchdog renews a fair lock; a lease that vanishes is logged and unlock raises."""
    client = make_client(watchdog_timeout=0.3)
    lock = client.fair_lock(name)
    await lock.lock()
    # Four renewal periods = more than a full lease.
    await wait_until(lambda: inside.renewal(client).calls >= 4, what="four renewals")
    assert await lock.is_held_by_current_task()
    assert 0 < await raw.pttl(name) <= 300
    holder = str(next(iter(await raw.hkeys(name))))

    await raw.pexpire(name, 1)
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await wait_until(lambda: len(inside.renewal(client)) == 0, what="watchdog noticed")
    lost = [r for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1
    assert name in lost[0].getMessage()
    assert holder in lost[0].getMessage()
    with pytest.raises(aiolock.LockLostError, match="watchdog"):
        await lock.unlock()


async def test_explicit_lease_expiry_hands_over(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A waiter behind a lease that runs out (no release message) acquires after it."""
    holder = client.fair_lock(name, owner="holder")
    await holder.lock(lease=0.3)
    waiter = asyncio.create_task(client.fair_lock(name).lock())
    (queued,) = await wait_queued(raw, name, 1)
    async with asyncio.timeout(LIMIT):
        await waiter
    assert await raw.hkeys(name) == [queued]
    with pytest.raises(aiolock.LockLostError):
        await holder.unlock()
    await raw.delete(name)


async def test_aclose_takes_waiters_out_of_the_queue(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Closing a client wakes its fair waiters with ClientClosedError and dequeues them."""
    holder = make_client().fair_lock(name, owner="holder")
    await holder.lock()
    client = make_client()
    waiters = [asyncio.create_task(client.fair_lock(name).lock()) for _ in range(3)]
    await wait_queued(raw, name, 3)
    await client.aclose()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, aiolock.ClientClosedError) for r in results)
    assert await no_queue(raw, name)
    await holder.unlock()


async def test_key_prefix(make_client: ClientFactory, raw: Redis, name: str) -> None:
    """key_prefix="svc:" moves the hash, queue, deadlines and channels to svc:<name>."""
    client = make_client(key_prefix="svc:")
    holder = client.fair_lock(name, owner="holder")
    await holder.lock()
    waiter = asyncio.create_task(client.fair_lock(name, owner="w").lock())
    await wait_queued(raw, f"svc:{name}", 1)
    assert await raw.hkeys(f"svc:{name}") == [f"{client.id}:owner:holder"]
    assert await queue_of(raw, f"svc:{name}") == [f"{client.id}:owner:w"]
    channel = channel_of(f"svc:{name}", f"{client.id}:owner:w")
    await wait_until(lambda: channel in inside.dispatcher(client).channels(), what="subscribed")
    assert await raw.exists(name, queue_key(name), timeout_key(name)) == 0
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        await waiter
    await client.fair_lock(name, owner="w").unlock()
    assert await raw.exists(f"svc:{name}") == 0
    assert await no_queue(raw, f"svc:{name}")


async def test_pubsub_kill_while_waiting_keeps_the_order(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """CLIENT KILL TYPE pubsub while five fair waiters wait: all acquire, in queue order."""
    clients = [make_client(), make_client()]
    holder = clients[0].fair_lock(name, owner="holder")
    await holder.lock()
    order: list[int] = []

    async def worker(i: int) -> None:
        async with clients[i % 2].fair_lock(name):
            order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(worker(i)))
        await wait_queued(raw, name, i + 1)
    await wait_until(
        lambda: sum(len(inside.channels_of(inside.dispatcher(c))) for c in clients) == 5,
        what="subscribing",
    )
    await wait_until(lambda: all(subscriptions_confirmed(c) for c in clients), what="subscribed")
    await raw.client_kill_filter(_type="pubsub")
    # Release while the subscriptions are (probably) down: that message may be lost.
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*tasks)
    assert order == list(range(5))
    assert sum(inside.dispatcher(c).reconnects for c in clients) >= 1
    assert await raw.exists(name) == 0
    assert await no_queue(raw, name)


# -- scripts: idempotency and cancellation --------------------------------------------------


async def test_resent_acquire_counts_once(client: aiolock.Client, raw: Redis, name: str) -> None:
    """An acquire resent with the same target takes the hold once; a resent enqueue queues once."""
    acquire = load_script("fair_acquire")
    keys = [name, queue_key(name), timeout_key(name), f"aiolock_acquire_cancel:{{{name}}}:r"]
    me, other = f"{client.id}:direct", f"{client.id}:other"

    def args(holder: str, target: int, joins: str = "1") -> list[str | int]:
        return [30_000, holder, W_DEFAULT, now_ms(), target, joins, 30_000]

    for _ in range(2):
        assert await inside.runner(client).run(acquire, keys, args(me, 1)) == [1, 1]
    for _ in range(2):
        assert await inside.runner(client).run(acquire, keys, args(me, 2)) == [1, 2]
    assert await raw.hgetall(name) == {me: "2"}
    # The no-wait variant answers with the lease left and does not queue.
    status, ttl = await inside.runner(client).run(acquire, keys, args(other, 1, "0"))
    assert status == 0
    assert 0 < ttl <= 30_000
    assert await no_queue(raw, name)
    for _ in range(2):
        status, ttl = await inside.runner(client).run(acquire, keys, args(other, 1))
        assert status == 0
        assert 0 < ttl <= 30_000
    assert await queue_of(raw, name) == [other]
    await raw.delete(name, queue_key(name), timeout_key(name))


async def test_wait_bound_on_a_free_lock_is_the_heads_deadline(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Free lock, another waiter's turn: the reply bounds the wait by the head's deadline."""
    acquire = load_script("fair_acquire")
    keys = [name, queue_key(name), timeout_key(name), f"aiolock_acquire_cancel:{{{name}}}:b"]
    head = f"{uuid.uuid4()}:1"
    now = now_ms()
    await raw.rpush(queue_key(name), head)
    await raw.zadd(timeout_key(name), {head: now + 5_000})
    me = f"{client.id}:direct"
    reply = await inside.runner(client).run(
        acquire, keys, [30_000, me, W_DEFAULT, now, 1, "1", 30_000]
    )
    assert reply == [0, 5_000]
    # Capped: never longer than the cap (the client's watchdog timeout).
    reply = await inside.runner(client).run(
        acquire, keys, [30_000, me, W_DEFAULT, now, 1, "1", 2_000]
    )
    assert reply == [0, 2_000]
    assert await queue_of(raw, name) == [head, me]
    await raw.delete(queue_key(name), timeout_key(name))


async def test_rollback_before_late_acquire_voids_it(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A rollback that reaches the server first voids the acquire: no hold, no queue entry."""
    tombstone = f"aiolock_acquire_cancel:{{{name}}}:late"
    me = f"{client.id}:1"
    rolled = await inside.runner(client).run(
        load_script("fair_rollback"),
        [name, queue_key(name), timeout_key(name), f"redisson_lock__channel:{{{name}}}", tombstone],
        [me, 1, 30_000, W_DEFAULT, now_ms(), "0", "PUBLISH", 5_000, "1"],
    )
    assert rolled == 0
    reply = await inside.runner(client).run(
        load_script("fair_acquire"),
        [name, queue_key(name), timeout_key(name), tombstone],
        [30_000, me, W_DEFAULT, now_ms(), 1, "1", 30_000],
    )
    assert reply == [-1, 0]
    assert await raw.exists(name) == 0
    assert await no_queue(raw, name)
    await raw.delete(tombstone)


async def test_cancel_in_flight_gives_back_the_hold_and_wakes_the_head(
    gated: tuple[aiolock.Client, Gate], make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """An acquire that took the lock but whose reply was cut off gives it back to the head."""
    client, gate = gated
    gate.arm("fair_acquire")
    task = asyncio.create_task(client.fair_lock(name).lock())
    await asyncio.wait_for(gate.sent.wait(), 5)
    await wait_until(lambda: _exists(raw, name), what="the acquire ran")
    other = make_client()
    waiter = asyncio.create_task(other.fair_lock(name).lock())
    (queued,) = await wait_queued(raw, name, 1)
    await wait_until(lambda: subscriptions_confirmed(other), what="subscribed")

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The waiter's bound is the lease (30 s): only the rollback's message wakes it in time.
    async with asyncio.timeout(LIMIT):
        await waiter
    assert await raw.hkeys(name) == [queued]
    await wait_until(lambda: cleanup_done(client), what="rollback finished")
    assert len(inside.holds(client)) == 0
    assert len(inside.renewal(client)) == 0
    assert await no_queue(raw, name)
    await raw.delete(name)


async def _exists(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 1


async def test_cancel_in_flight_leaves_the_queue(
    gated: tuple[aiolock.Client, Gate], make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A first attempt that queued but whose reply was cut off leaves, moving others by its W."""
    client, gate = gated
    other = make_client()
    holder = other.fair_lock(name, owner="holder")
    await holder.lock()
    gate.arm("fair_acquire")
    task = asyncio.create_task(client.fair_lock(name).try_lock(wait=20))
    await asyncio.wait_for(gate.sent.wait(), 5)
    (cut_off,) = await wait_queued(raw, name, 1)
    behind = asyncio.create_task(other.fair_lock(name).lock())
    _, waiter = await wait_queued(raw, name, 2)
    before = (await deadlines(raw, name))[waiter]

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: cleanup_done(client), what="rollback finished")
    assert cut_off.startswith(f"{client.id}:")
    assert await queue_of(raw, name) == [waiter]
    assert await deadlines(raw, name) == {waiter: before - 20_000}
    await holder.unlock()
    async with asyncio.timeout(LIMIT):
        await behind
    assert await raw.hkeys(name) == [waiter]
    await raw.delete(name)
