"""The reentrant lock in Redisson's RLock layout: keys, fields, TTLs, messages and scripts."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

import aiolock
from aiolock._keys import lock_channel, unlock_latch_key
from aiolock._net.scripts import load_script

from . import inside
from .helpers import Gate, gated_redis, subscribe_confirmed, wait_until

LIMIT = 10.0
ClientFactory = Callable[..., aiolock.Client]
UUID4 = "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"

# Redisson's RLock acquire and unlock (redisson-spec.md 2.2 and 2.3, without the latch), as
# a Java service would run them: the "foreign" side of the interop tests.
JAVA_ACQUIRE = """
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
"""
JAVA_UNLOCK = """
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local count = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
"""


def channel_of(name: str) -> str:
    """Redisson's RLock channel for ``name`` (a name without braces)."""
    return f"redisson_lock__channel:{{{name}}}"


@pytest.fixture
async def listen(raw: Redis) -> AsyncIterator[PubSub]:
    """A raw pub/sub connection, closed (and so unsubscribed) before the leak check."""
    pubsub = raw.pubsub(ignore_subscribe_messages=True)
    yield pubsub
    await pubsub.aclose()  # type: ignore[no-untyped-call]


async def next_message(pubsub: PubSub, limit: float = LIMIT) -> str:
    """The next message's data on ``pubsub``; fail if none arrives within ``limit`` s."""
    deadline = time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is not None and message["type"] == "message":
            data: str = message["data"]
            return data
    raise AssertionError(f"no message within {limit} s")


async def wait_for_waiters(handle: aiolock.Lock, count: int) -> None:
    """Until ``count`` local tasks are blocked acquiring ``handle``'s name."""
    await wait_until(
        lambda: handle.statistics().tasks_waiting == count, what=f"{count} task(s) waiting"
    )


async def test_client_id_is_uuid4(client: aiolock.Client) -> None:
    """client.id is a UUID4 in Java's text form (lower case, hyphenated)."""
    parsed = uuid.UUID(client.id)
    assert parsed.version == 4
    assert str(parsed) == client.id


async def test_hash_layout(client: aiolock.Client, raw: Redis, name: str) -> None:
    """The lock is a hash {"<client.id>:<n>": count} under the raw name, as Redisson's."""
    lock = client.lock(name)
    await lock.lock(lease=10)
    assert await raw.type(name) == "hash"
    fields = await raw.hgetall(name)
    assert len(fields) == 1
    (holder,) = fields
    assert isinstance(holder, str)
    assert re.fullmatch(f"{UUID4}:[0-9]+", holder)
    assert holder.startswith(f"{client.id}:")
    assert fields == {holder: "1"}
    assert 0 < await raw.pttl(name) <= 10_000

    await lock.lock(lease=10)
    assert await raw.hgetall(name) == {holder: "2"}
    await lock.unlock()
    assert await raw.hgetall(name) == {holder: "1"}
    await lock.unlock()
    assert not await raw.exists(name)


async def test_holder_ids_differ_per_task(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Each task holds under its own "<client.id>:<n>" field."""
    lock = client.lock(name)
    seen: list[str] = []

    async def take() -> None:
        async with lock:
            (holder,) = await raw.hkeys(name)
            seen.append(str(holder))

    await asyncio.create_task(take())
    await asyncio.create_task(take())
    assert len(set(seen)) == 2
    assert all(re.fullmatch(f"{re.escape(client.id)}:[0-9]+", h) for h in seen)


async def test_owner_field(client: aiolock.Client, raw: Redis, name: str) -> None:
    """With owner=, the hash field is "<client.id>:owner:<owner>" (API.md)."""
    lock = client.lock(name, owner="job-1")
    await lock.lock()
    assert await raw.hgetall(name) == {f"{client.id}:owner:job-1": "1"}
    await lock.unlock()


async def test_reentry_resets_ttl(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Re-entry sets the TTL to the new lease; it does not add to the old one."""
    lock = client.lock(name)
    await lock.lock(lease=100)
    assert await raw.pttl(name) > 50_000
    await lock.lock(lease=5)
    assert 0 < await raw.pttl(name) <= 5_000
    await lock.lock(lease=100)
    assert 50_000 < await raw.pttl(name) <= 100_000
    for _ in range(3):
        await lock.unlock()
    assert not await raw.exists(name)


async def test_full_release_publishes_zero(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """Unlock publishes "0" on redisson_lock__channel:{name} only when fully released."""
    await subscribe_confirmed(listen, channel_of(name))
    lock = client.lock(name)
    await lock.lock()
    await lock.lock()
    await lock.unlock()
    # Messages arrive in the order the server ran the commands: had the partial release
    # published, its message would come before this marker.
    await raw.publish(channel_of(name), "marker")
    await lock.unlock()
    assert await next_message(listen) == "marker"
    assert await next_message(listen) == "0"
    await raw.publish(channel_of(name), "end")
    assert await next_message(listen) == "end"


async def test_force_unlock_publishes_zero(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """force_unlock() deletes the hash and publishes "0"; on a free lock it publishes nothing."""
    await subscribe_confirmed(listen, channel_of(name))
    lock = client.lock(name)
    await lock.lock()
    assert await lock.force_unlock()
    assert not await raw.exists(name)
    assert await next_message(listen) == "0"
    assert not await lock.force_unlock()
    await raw.publish(channel_of(name), "end")
    assert await next_message(listen) == "end"
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()


async def test_java_holder_excludes_aiolock(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A hold written Java-style (HSET "<uuid>:1" 1 + PEXPIRE) shuts aiolock out."""
    java = f"{uuid.uuid4()}:1"
    await raw.hset(name, java, 1)
    await raw.pexpire(name, 30_000)
    lock = client.lock(name)
    assert await lock.is_locked()
    assert not await lock.try_lock(0)
    assert not await lock.is_held_by_current_task()
    assert await lock.hold_count() == 0
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    assert await raw.hgetall(name) == {java: "1"}
    await raw.delete(name)


async def test_java_unlock_wakes_aiolock_waiter(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """An aiolock waiter acquires when a Java holder unlocks with Redisson's script."""
    java = f"{uuid.uuid4()}:7"
    keys_args: list[Any] = [name, 30_000, java]
    assert await raw.eval(JAVA_ACQUIRE, 1, *keys_args) is None
    lock = client.lock(name)
    acquired = asyncio.Event()

    async def waiter() -> None:
        async with lock:
            acquired.set()

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(waiter())
        await wait_for_waiters(lock, 1)
        assert not acquired.is_set()
        assert await raw.eval(JAVA_UNLOCK, 2, name, channel_of(name), "0", 30_000, java) == 1
        await acquired.wait()
    assert not await raw.exists(name)


async def test_aiolock_holder_excludes_java(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Redisson's acquire script fails (returns the PTTL) while aiolock holds the lock."""
    java = f"{uuid.uuid4()}:1"
    lock = client.lock(name)
    await lock.lock(lease=20)
    pttl = await raw.eval(JAVA_ACQUIRE, 1, name, 30_000, java)
    assert isinstance(pttl, int)
    assert 0 < pttl <= 20_000
    assert not await raw.hexists(name, java)
    await lock.unlock()
    # Free again: the Java side gets it.
    assert await raw.eval(JAVA_ACQUIRE, 1, name, 30_000, java) is None
    assert await raw.hgetall(name) == {java: "1"}
    assert not await lock.try_lock(0)
    await raw.delete(name)


async def test_key_prefix(
    make_client: ClientFactory, raw: Redis, listen: PubSub, name: str
) -> None:
    """key_prefix="svc:" puts the hash at svc:<name> and the channel at ...:{svc:<name>}."""
    client = make_client(key_prefix="svc:")
    await subscribe_confirmed(listen, channel_of(f"svc:{name}"))
    lock = client.lock(name)
    assert lock.name == name
    await lock.lock()
    assert not await raw.exists(name)
    fields = await raw.hgetall(f"svc:{name}")
    assert list(fields.values()) == ["1"]
    assert await lock.is_locked()
    assert await lock.hold_count() == 1
    await lock.unlock()
    assert not await raw.exists(f"svc:{name}")
    assert await next_message(listen) == "0"


async def test_unlock_latch_deleted_in_background(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The unlock latch redisson_unlock_latch:{name}:<id> is deleted soon after unlock."""
    lock = client.lock(name)
    await lock.lock()
    await lock.lock()
    await lock.unlock()
    await lock.unlock()

    async def no_latch() -> bool:
        return not [k async for k in raw.scan_iter(match=f"redisson_unlock_latch:{{{name}}}:*")]

    await wait_until(no_latch, what="latches deleted")


async def test_unlock_latch_deleted_at_close(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """After aclose() no unlock latch of the client's unlocks remains."""
    client = make_client()
    lock = client.lock(name)
    for _ in range(3):
        await lock.lock()
        await lock.unlock()
    await client.aclose()
    latches = [k async for k in raw.scan_iter(match=f"redisson_unlock_latch:{{{name}}}:*")]
    assert latches == []


async def test_release_replays_from_latch(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A resent release with the same request id replays its result and decrements once."""
    field = f"{client.id}:direct"
    acquire = load_script("lock_acquire")
    release = load_script("lock_release")
    tombstone = f"aiolock_acquire_cancel:{{{name}}}:direct"
    for target in (1, 2):
        await inside.runner(client).run(acquire, [name, tombstone], [30_000, field, target])
    assert await raw.hget(name, field) == "2"

    def release_args(latch: str) -> tuple[list[str], list[str | int]]:
        return [name, channel_of(name), latch], ["0", 30_000, field, "PUBLISH", 20_000]

    first = unlock_latch_key(name, "a" * 32)
    assert first == f"redisson_unlock_latch:{{{name}}}:{'a' * 32}"
    assert await inside.runner(client).run(release, *release_args(first)) == 0
    assert await inside.runner(client).run(release, *release_args(first)) == 0
    assert await raw.hget(name, field) == "1"
    assert await raw.get(first) == "0"
    assert 0 < await raw.pttl(first) <= 20_000

    second = unlock_latch_key(name, "b" * 32)
    assert await inside.runner(client).run(release, *release_args(second)) == 1
    assert not await raw.exists(name)
    # The resend finds the latch, not the missing hold: it replays 1 instead of failing.
    assert await inside.runner(client).run(release, *release_args(second)) == 1
    assert await raw.get(second) == "1"
    # A new request id for the same holder now finds nothing to release.
    third = unlock_latch_key(name, "c" * 32)
    assert await inside.runner(client).run(release, *release_args(third)) is None
    assert not await raw.exists(third)
    await raw.delete(first, second)


async def test_resent_acquire_counts_once(client: aiolock.Client, raw: Redis, name: str) -> None:
    """An acquire resent with the same target count takes the hold once."""
    field = f"{client.id}:direct"
    acquire = load_script("lock_acquire")
    tombstone = f"aiolock_acquire_cancel:{{{name}}}:direct"
    for _ in range(2):
        assert await inside.runner(client).run(acquire, [name, tombstone], [30_000, field, 1]) == [
            1,
            1,
        ]
    assert await raw.hgetall(name) == {field: "1"}
    for _ in range(2):
        assert await inside.runner(client).run(acquire, [name, tombstone], [30_000, field, 2]) == [
            1,
            2,
        ]
    assert await raw.hgetall(name) == {field: "2"}
    # Another holder is refused with the PTTL of the current lease.
    status, pttl = await inside.runner(client).run(
        acquire, [name, tombstone], [30_000, f"{client.id}:other", 1]
    )
    assert status == 0
    assert 0 < pttl <= 30_000
    await raw.delete(name)


async def test_noscript_fallback(client: aiolock.Client, raw: Redis, name: str) -> None:
    """After SCRIPT FLUSH, lock and unlock load their scripts again and work."""
    lock = client.lock(name)
    await raw.script_flush()
    await lock.lock()
    await raw.script_flush()
    await lock.lock()
    await raw.script_flush()
    await lock.unlock()
    assert await lock.hold_count() == 1
    await raw.script_flush()
    await lock.unlock()
    assert not await raw.exists(name)
    await raw.script_flush()
    assert not await lock.force_unlock()


@pytest.mark.parametrize("call", ["lock", "try_lock", "unlock", "hold_count", "is_held"])
async def test_wrong_type_raises_lock_error(
    client: aiolock.Client, raw: Redis, name: str, call: str
) -> None:
    """A name holding another type raises LockError naming the lock, not a ResponseError."""
    await raw.set(name, "x")
    lock = client.lock(name)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "lock": lock.lock,
        "try_lock": lock.try_lock,
        "unlock": lock.unlock,
        "hold_count": lock.hold_count,
        "is_held": lock.is_held_by_current_task,
    }
    with pytest.raises(aiolock.LockError, match=re.escape(repr(name))) as info:
        async with asyncio.timeout(LIMIT):
            await calls[call]()
    assert type(info.value) is aiolock.LockError
    assert await raw.get(name) == "x"
    assert lock.statistics().hold_count == 0
    await raw.delete(name)


async def test_statistics(client: aiolock.Client, name: str) -> None:
    """statistics() reports the calling task's local hold and the local waiters."""
    lock = client.lock(name)
    assert lock.statistics() == aiolock.LockStatistics(
        name=name, held_by_current_task=False, hold_count=0, tasks_waiting=0
    )
    await lock.lock()
    await lock.lock()
    assert lock.statistics() == aiolock.LockStatistics(
        name=name, held_by_current_task=True, hold_count=2, tasks_waiting=0
    )

    async def other() -> aiolock.LockStatistics:
        return lock.statistics()

    seen = await asyncio.create_task(other())
    assert not seen.held_by_current_task
    assert seen.hold_count == 0

    acquired = asyncio.Event()

    async def waiter() -> None:
        async with lock:
            acquired.set()

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(waiter())
        await wait_for_waiters(lock, 1)
        # Any handle of the same name on the same client sees the waiter.
        assert client.lock(name).statistics().tasks_waiting == 1
        await lock.unlock()
        await lock.unlock()
        await acquired.wait()
    assert lock.statistics() == aiolock.LockStatistics(
        name=name, held_by_current_task=False, hold_count=0, tasks_waiting=0
    )


async def test_repr(client: aiolock.Client, name: str) -> None:
    """repr() names the type, the lock, its owner if any, and the local waiters."""
    lock = client.lock(name)
    assert repr(lock) == f"<aiolock.Lock {name!r}, 0 waiting>"
    assert (
        repr(client.lock(name, owner="job-1"))
        == f"<aiolock.Lock {name!r} owner='job-1', 0 waiting>"
    )
    await lock.lock()

    async def waiter() -> None:
        async with lock:
            pass

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(waiter())
        await wait_for_waiters(lock, 1)
        assert repr(lock) == f"<aiolock.Lock {name!r}, 1 waiting>"
        await lock.unlock()


# -- local waiters in line (no barging) -------------------------------------------------

# Well under the lease-bounded wait of a waiter nobody wakes (watchdog_timeout, 30 s).
PROMPT = 5.0


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> AsyncIterator[tuple[aiolock.Client, Gate]]:
    """A client (default options) whose chosen script call can be held back."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    yield client, gate
    await client.aclose()
    await redis.aclose()


async def test_waiter_cut_off_mid_attempt_hands_its_turn_on(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A waiter cancelled before its attempt was answered wakes the one queued behind it.

    The newcomer queued without trying (no barging), counting on that attempt; the lock
    is free, so no release message will ever come to wake it.
    """
    client, gate = gated
    # Subscribed with nobody waiting, as a hot lock's channel is for a moment after its
    # last waiter left: the next acquire joins it and registers before its first attempt.
    keep = await inside.dispatcher(client).subscribe(lock_channel(name), None)
    assert keep is not None
    gate.arm("lock_acquire", before_send=True)
    cut_off = asyncio.create_task(client.lock(name).lock())
    await asyncio.wait_for(gate.sent.wait(), LIMIT)

    async def newcomer() -> None:
        async with client.lock(name):
            pass

    queued = asyncio.create_task(newcomer())
    await wait_for_waiters(client.lock(name), 1)
    cut_off.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut_off
    async with asyncio.timeout(PROMPT):
        await queued
    keep.release()
    assert await raw.exists(name) == 0


async def test_waiter_past_its_deadline_hands_an_unused_wake_on(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A try_lock whose deadline passes with a wake-up it did not use wakes the next one.

    Its last attempt lost to the holder, whose release then woke it (the oldest local
    waiter) rather than the newcomer queued behind it without trying.
    """
    client, gate = gated
    holder = client.lock(name, owner="holder")
    await holder.lock()
    keep = await inside.dispatcher(client).subscribe(lock_channel(name), None)
    assert keep is not None
    gate.arm("lock_acquire")
    loop = asyncio.get_running_loop()
    wait = 0.1
    deadline = loop.time() + wait
    late = asyncio.create_task(client.lock(name).try_lock(wait))
    await asyncio.wait_for(gate.sent.wait(), LIMIT)

    async def newcomer() -> None:
        async with client.lock(name):
            pass

    queued = asyncio.create_task(newcomer())
    await wait_for_waiters(client.lock(name), 1)
    await holder.unlock()
    first = inside.waiting_room(client).waiters(lock_channel(name))[0]
    await wait_until(first.event.is_set, what="the release woke the oldest waiter")
    await wait_until(lambda: loop.time() > deadline, what="the try_lock deadline passed")
    gate.release.set()
    async with asyncio.timeout(PROMPT):
        assert not await late
        await queued
    keep.release()
    assert await raw.exists(name) == 0
