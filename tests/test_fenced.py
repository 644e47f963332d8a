"""The fenced lock: Redisson's RFencedLock layout, and tokens that only ever grow.

The lock methods are in the conformance suite; here is what the token adds: one per
acquisition (re-entrant ones too), shared with Redisson's counter (never given an expiry,
as Redisson's), never lower after the counter is deleted, and an explicit lease honoured
(Redisson ignores it).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

import aiolock

from . import inside
from .conftest import ClientFactory
from .helpers import wait_until

LIMIT = 10.0

# Redisson's fenced acquire, restated from redisson-spec-2.md 5.2 (a Java service's view):
# the hash absent or held by this holder: INCR the token, take a hold, {-1, token}; else
# {pttl, -1}.
_REDISSON_FENCED_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local token = redis.call('incr', KEYS[2])
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
"""
# Redisson's RLock unlock, the part a Java holder runs to free a lock it holds once.
_REDISSON_UNLOCK = """
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '0')
return 1
"""


def token_key(name: str) -> str:
    return f"redisson_lock_token:{{{name}}}"


async def counter(raw: Redis, name: str) -> int:
    """The token counter as stored."""
    value = await raw.get(token_key(name))
    assert value is not None
    return int(value)


async def test_every_acquisition_takes_a_larger_token(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Re-entry takes a token too; the next holder's is larger still; the hash is RLock's."""
    fenced = client.fenced_lock(name)
    first = await fenced.lock_and_get_token()
    again = await fenced.lock_and_get_token()
    assert again == first + 1
    holder = f"{client.id}:1"
    assert await raw.hgetall(name) == {holder: "2"}
    assert await counter(raw, name) == again
    await fenced.unlock()
    await fenced.unlock()

    async def other_task() -> int | None:
        token = await fenced.try_lock_and_get_token()
        await fenced.unlock()
        return token

    later = await asyncio.create_task(other_task())
    assert later is not None
    assert later == again + 1
    assert await raw.exists(name) == 0


async def test_a_held_lock_gives_no_token(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """try_lock_and_get_token answers None while another holder has it, and takes no token."""
    holder, other = make_client(), make_client()
    token = await holder.fenced_lock(name).lock_and_get_token()
    assert await other.fenced_lock(name).try_lock_and_get_token() is None
    assert await other.fenced_lock(name).try_lock_and_get_token(wait=0.05) is None
    assert await counter(raw, name) == token
    await holder.fenced_lock(name).unlock()


async def test_tokens_shared_with_a_redisson_client(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A Java service's fenced acquisitions and aiolock's advance one counter and exclude
    each other; aiolock waiting on the lock is woken by the Java unlock's message."""
    client = make_client()
    java_holder = "5a0c5e0e-0000-4000-8000-000000000001:7"
    acquire = raw.register_script(_REDISSON_FENCED_ACQUIRE)
    unlock = raw.register_script(_REDISSON_UNLOCK)
    pttl, java_token = await acquire(keys=[name, token_key(name)], args=[30000, java_holder])
    assert pttl == -1
    fenced = client.fenced_lock(name, owner="service")
    assert await fenced.try_lock_and_get_token() is None
    waiter = asyncio.create_task(fenced.try_lock_and_get_token(wait=LIMIT))
    await wait_until(lambda: fenced.statistics().tasks_waiting == 1)
    await unlock(keys=[name, f"redisson_lock__channel:{{{name}}}"])
    async with asyncio.timeout(LIMIT):
        token = await waiter
    assert token is not None
    assert token == java_token + 1
    # And the other way round: the Java client is shut out, then takes the next token.
    pttl, _ = await acquire(keys=[name, token_key(name)], args=[30000, java_holder])
    assert pttl > 0
    await fenced.unlock()
    _, java_next = await acquire(keys=[name, token_key(name)], args=[30000, java_holder])
    assert java_next == token + 1
    await raw.delete(name)


async def test_the_counter_never_expires_and_tokens_still_grow(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The counter is Redisson's key, which Java clients INCR and never give a TTL: aiolock
    sets none either (one would end the counter under them and restart their tokens at 1).
    A counter that is gone (deleted by hand) starts again above every earlier token."""
    fenced = client.fenced_lock(name)
    # A counter a Redisson client left (small, no TTL): continued, and left without a TTL.
    await raw.set(token_key(name), 41)
    assert await fenced.lock_and_get_token() == 42
    await fenced.unlock()
    assert await raw.pttl(token_key(name)) == -1
    # A fresh counter has no TTL either.
    await raw.delete(token_key(name))
    before_us = int(time.time() * 1_000_000)
    token = await fenced.lock_and_get_token()
    await fenced.unlock()
    assert await raw.pttl(token_key(name)) == -1
    # It came from the server's clock (microseconds), so it is larger than any token a
    # counter advanced one by one could have reached.
    assert token > 42
    assert abs(token - before_us) < 60 * 1_000_000


async def test_an_explicit_lease_is_honoured(client: aiolock.Client, raw: Redis, name: str) -> None:
    """lock_and_get_token(lease=...) keeps that lease, unrenewed (Redisson ignores it)."""
    fenced = client.fenced_lock(name)
    await fenced.lock_and_get_token(lease=2.0)
    assert 0 < await raw.pttl(name) <= 2000
    await fenced.unlock()


async def test_a_fenced_lock_and_a_lock_exclude_each_other(
    make_client: ClientFactory, name: str
) -> None:
    """One name, one lock: RLock acquisitions shut fenced ones out (and take no token)."""
    plain, fenced = make_client(), make_client()
    await plain.lock(name).lock()
    assert await fenced.fenced_lock(name).try_lock_and_get_token() is None
    await plain.lock(name).unlock()
    assert await fenced.fenced_lock(name).try_lock_and_get_token() is not None
    assert not await plain.lock(name).try_lock()
    await fenced.fenced_lock(name).unlock()


async def test_token_methods_check_their_arguments(client: aiolock.Client, name: str) -> None:
    """Bad waits and leases are refused before any I/O, as for the lock methods."""
    fenced = client.fenced_lock(name)
    with pytest.raises(ValueError, match="lease"):
        await fenced.lock_and_get_token(lease=0)
    with pytest.raises(ValueError, match="wait"):
        await fenced.try_lock_and_get_token(wait=-1)
    with pytest.raises(ValueError, match="lease"):
        await fenced.try_lock_and_get_token(lease=float("inf"))
    with pytest.raises(TypeError, match="wait"):
        await fenced.try_lock_and_get_token(wait="1")  # type: ignore[arg-type]


async def test_an_acquisition_without_a_token_is_given_back(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A fenced acquire answered without a token (its hold found already taken, as by an
    earlier send, and the counter deleted by hand) is refused with a LockError and given
    back, never returned as held: lock_and_get_token() used to raise IndexError."""
    fenced = client.fenced_lock(name)
    await fenced.lock_and_get_token()
    field = next(iter(await raw.hgetall(name)))
    # What a re-entry's first send would have left, its reply lost: the hold at count 2.
    await raw.hset(name, field, 2)
    await raw.delete(token_key(name))
    with pytest.raises(aiolock.LockError, match="no token"):
        await fenced.lock_and_get_token()
    await wait_until(
        lambda: inside.background(client).tasks <= {inside.task_of(inside.renewal(client))},
        what="given back",
    )
    assert await raw.hgetall(name) == {field: "1"}
    assert fenced.statistics().hold_count == 1
    await fenced.unlock()
    assert await raw.exists(name) == 0
