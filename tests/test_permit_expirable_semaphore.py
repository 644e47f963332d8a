"""The permit-expirable semaphore: Redisson's layout (raw 16-byte ids scored with their
expiry), permits coming back when their lease runs out, waits bounded by the earliest
expiry, and every change made once under cancellation and resends."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, script
from .helpers import FAST, cancel_at, quiesce, wait_until

LIMIT = 10.0
NEVER = 922337203685477

# Redisson's acquire of one permit, restated from redisson-spec-2.md 3.3 (without the
# reclaim step): a Java service taking a permit with its own id and clock.
_REDISSON_ACQUIRE = """
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= 1 then
    redis.call('decrby', KEYS[1], 1)
    redis.call('zadd', KEYS[2], ARGV[1], ARGV[2])
    return 'OK'
end
return nil
"""


def timeouts(name: str) -> str:
    return f"{{{name}}}:timeout"


@pytest.fixture
async def raw_bytes(redis_url: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


async def server_ms(raw: Redis) -> int:
    seconds, micros = await raw.time()
    return seconds * 1000 + micros // 1000


async def test_layout(client: aiolock.Client, raw: Redis, raw_bytes: Redis, name: str) -> None:
    """Ids are 16 raw bytes in {name}:timeout, scored with the expiry (server clock) or
    Redisson's never-expires score; the count of available permits is RSemaphore's."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(3)
    before = await server_ms(raw)
    leased = await psem.acquire(lease=60)
    forever = await psem.acquire()
    assert len(leased) == len(forever) == 32
    assert await raw.get(name) == "1"
    members: dict[Any, Any] = dict(
        await raw_bytes.zrange(timeouts(name), 0, -1, withscores=True)  # type: ignore[arg-type]
    )
    assert set(members) == {bytes.fromhex(leased), bytes.fromhex(forever)}
    assert members[bytes.fromhex(forever)] == NEVER
    assert before + 60_000 <= members[bytes.fromhex(leased)] <= before + 61_000
    assert await psem.available_permits() == 1
    await psem.release(leased)
    await psem.release(forever)
    assert await psem.available_permits() == 3
    assert await raw.exists(timeouts(name)) == 0
    await raw.delete(name)


async def test_release_of_an_unknown_permit(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Unknown or released twice: LockNotOwnedError, and no permit comes back twice."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(1)
    permit = await psem.acquire()
    await psem.release(permit)
    with pytest.raises(aiolock.LockNotOwnedError, match="no permit has that id"):
        await psem.release(permit)
    with pytest.raises(aiolock.LockNotOwnedError):
        await psem.release("0" * 32)
    assert await psem.available_permits() == 1
    await raw.delete(name)


async def test_an_expired_permit_comes_back_once(
    client: aiolock.Client, raw: Redis, raw_bytes: Redis, name: str
) -> None:
    """A permit whose lease ran out: its release raises LockLostError and gives it back
    once; another one's expiry ends a waiter's wait (the wait is bounded by it, not by a
    message, which nobody sends)."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(1)
    short = await psem.acquire(lease=0.2)
    score = await raw_bytes.zscore(timeouts(name), bytes.fromhex(short))
    assert score is not None
    await wait_until(lambda: _past(raw, score), what="the lease ran out on the server")
    with pytest.raises(aiolock.LockLostError, match="lease had run out"):
        await psem.release(short)
    assert await psem.available_permits() == 1
    await psem.acquire(lease=0.2)
    async with asyncio.timeout(LIMIT):
        waited = await psem.try_acquire(wait=LIMIT * 2)
    assert waited is not None
    await psem.release(waited)
    assert await psem.available_permits() == 1
    await raw.delete(name)


async def _past(raw: Redis, score: float) -> bool:
    return await server_ms(raw) > score


async def test_permits_shared_with_a_redisson_client(
    client: aiolock.Client, raw: Redis, raw_bytes: Redis, name: str
) -> None:
    """A Java service's permit (its own raw id) is released by aiolock by its hex id, and
    wakes an aiolock waiter; aiolock's ids are what Java reads."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(1)
    java_id = bytes(range(16))
    acquire = raw_bytes.register_script(_REDISSON_ACQUIRE)
    assert await acquire(keys=[name, timeouts(name)], args=[NEVER, java_id]) == b"OK"
    waiter = asyncio.create_task(psem.try_acquire(wait=LIMIT))
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)
    await client.permit_expirable_semaphore(name).release(java_id.hex())
    async with asyncio.timeout(LIMIT):
        permit = await waiter
    assert permit is not None
    assert await raw_bytes.zscore(timeouts(name), bytes.fromhex(permit)) == NEVER
    await psem.release(permit)
    await raw.delete(name)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p: p.release(None), TypeError, "permit_id must be a str, not NoneType"),
        (lambda p: p.release("xyz"), ValueError, "permit_id must be 32 hex characters"),
        (lambda p: p.release("A" * 32), ValueError, "permit_id must be 32 hex characters"),
        (lambda p: p.acquire(lease=0), ValueError, "lease must be > 0"),
        (lambda p: p.try_acquire(wait=-1), ValueError, "wait must be >= 0"),
        (lambda p: p.try_set_permits(-1), ValueError, "permits must be >= 0"),
        (lambda p: p.add_permits(1.5), TypeError, "permits must be an int, not float"),
    ],
)
async def test_bad_input_is_refused_before_any_io(
    offline: aiolock.Client, call: Callable[[Any], Awaitable[object]], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        await call(offline.permit_expirable_semaphore("p"))


async def test_resends_take_and_give_once(proxy: FaultProxy, raw: Redis, name: str) -> None:
    """An acquire and a release whose replies were lost are resent and count once: the
    release is not then reported as unknown."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=2, retry_interval=0.05)
    try:
        psem = client.permit_expirable_semaphore(name)
        assert await psem.try_set_permits(2)
        drop = proxy.drop_reply(script("psem_acquire"))
        permit = await psem.acquire()
        assert drop.executed.is_set()
        assert await raw.get(name) == "1"
        assert await raw.zcard(timeouts(name)) == 1
        drop = proxy.drop_reply(script("psem_release"))
        await psem.release(permit)
        assert drop.executed.is_set()
        assert await raw.get(name) == "2"
    finally:
        await client.aclose()
    await raw.delete(name)


async def test_cancellation_sweep(client: aiolock.Client, raw: Redis, name: str) -> None:
    """try_acquire (free, and woken by a release) and release, cancelled at every loop
    iteration: a cancelled acquire keeps no permit, a release is made once."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(100)
    cases = 0

    async def total() -> tuple[int, int]:
        return int(await raw.get(name) or 0), await raw.zcard(timeouts(name))

    for k in range(400):
        task = asyncio.create_task(psem.try_acquire())
        cancel_at(task, k)
        try:
            permit = await task
        except asyncio.CancelledError:
            permit = None
        await quiesce(client)
        available, taken = await total()
        assert (available, taken) == ((99, 1) if permit else (100, 0)), f"k={k}"
        cases += 1
        if permit:
            break
    assert permit is not None
    await psem.release(permit)
    for k in range(400):
        permit = await psem.acquire()
        task = asyncio.create_task(psem.release(permit))
        cancel_at(task, k)
        cancelled = False
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        await quiesce(client)
        assert await total() == (100, 0), f"k={k}"
        cases += 1
        if not cancelled:
            break
    for k in range(400):
        # One permit, taken: the release of it wakes the waiter.
        await raw.delete(name, timeouts(name))
        await raw.set(name, 1)
        given = await psem.acquire()

        async def woken(given: str = given) -> str | None:
            releaser = asyncio.create_task(psem.release(given))
            try:
                return await psem.try_acquire(wait=LIMIT)
            finally:
                await releaser

        task = asyncio.create_task(woken())
        cancel_at(task, k)
        try:
            permit = await task
        except asyncio.CancelledError:
            permit = None
        await quiesce(client)
        assert await total() == ((0, 1) if permit else (1, 0)), f"k={k}"
        cases += 1
        if permit:
            await psem.release(permit)
            break
    assert cases >= 6
    await raw.delete(name)


# Redisson's setPermits, restated from redisson-spec-2.md 3.4 (a Java service's view).
_REDISSON_SET_PERMITS = """
local value = redis.call('get', KEYS[1])
if value == false then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call('publish', KEYS[2], ARGV[1])
    return
end
local max = redis.call('zcount', KEYS[3], 0, '+inf') + tonumber(value)
if max ~= tonumber(ARGV[1]) then
    redis.call('incrby', KEYS[1], tonumber(ARGV[1]) - max)
    redis.call('publish', KEYS[2], ARGV[1])
end
"""


def channel(name: str) -> str:
    return f"redisson_sc:{{{name}}}"


async def _messages(pubsub: Any) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    while (message := await pubsub.get_message(timeout=0.05)) is not None:
        seen.setdefault(message["channel"], []).append(message["data"])
    return seen


@pytest.mark.parametrize("case", [(None, 0, 3), (2, 1, 5), (2, 2, 1), (2, 1, 3), (0, 0, 0)])
async def test_set_permits_as_redisson(
    client: aiolock.Client,
    raw: Redis,
    raw_bytes: Redis,
    name: str,
    case: tuple[int | None, int, int],
) -> None:
    """set_permits(total) leaves the count Redisson's setPermits leaves (the total less the
    permits taken, which may go below 0; a never-set semaphore gets the total), keeps a
    TTL as Redisson's INCRBY does, and publishes the total only when it changed."""
    available, taken, total = case
    twin = f"{name}:java"
    for key in (name, twin):
        if available is not None:
            await raw.set(key, available, px=60_000)
        for _ in range(taken):
            await raw_bytes.zadd(timeouts(key), {os.urandom(16): NEVER})
    java_set = raw.register_script(_REDISSON_SET_PERMITS)
    psem = client.permit_expirable_semaphore(name)
    async with raw.pubsub() as pubsub:
        await pubsub.subscribe(channel(name), channel(twin))
        for _ in range(2):
            assert (await pubsub.get_message(timeout=LIMIT))["type"] == "subscribe"
        await psem.set_permits(total)
        await java_set(keys=[twin, channel(twin), timeouts(twin)], args=[total])
        seen = await _messages(pubsub)
    assert seen.get(channel(name)) == seen.get(channel(twin))
    changed = available is None or available + taken != total
    assert seen.get(channel(name)) == ([str(total)] if changed else None)
    assert await raw.get(name) == await raw.get(twin)
    assert (await raw.pttl(name) > 0) == (await raw.pttl(twin) > 0)
    assert await raw.zcard(timeouts(name)) == taken
    await raw.delete(name, timeouts(name), twin, timeouts(twin))


async def test_delete(client: aiolock.Client, raw: Redis, name: str) -> None:
    """delete() removes both keys and answers whether anything was there; a renewed permit
    of this client is then lost: its block's exit raises LockLostError."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.delete() is False
    assert await psem.try_set_permits(2)

    async def block() -> None:
        async with psem.acquired():
            assert await psem.delete() is True
            assert len(inside.renewal(client)) == 0

    with pytest.raises(aiolock.LockLostError, match="delete"):
        await block()
    assert await raw.exists(name, timeouts(name)) == 0
    assert await psem.delete() is False
    await raw.delete(name)


async def test_acquired_renews_the_permit(
    make_client: ClientFactory, raw: Redis, raw_bytes: Redis, name: str
) -> None:
    """lease=None: the permit is scored with the watchdog's lease from the server's clock,
    each renewal moves its score forward (a Java client sees it live), and the exit gives
    it back; an explicit lease is never renewed; a wait that runs out raises."""
    client = make_client(watchdog_timeout=30)
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(2)
    before = await server_ms(raw)
    async with psem.acquired() as permit:
        member = bytes.fromhex(permit)
        first = await raw_bytes.zscore(timeouts(name), member)
        assert first is not None
        assert before + 30_000 <= first <= before + 31_000
        await wait_until(lambda: _past(raw, first - 30_000 + 1))
        assert await inside.renewal(client).renew_once()
        renewed = await raw_bytes.zscore(timeouts(name), member)
        assert renewed is not None
        assert renewed > first
        async with psem.acquired(lease=60) as leased:
            assert len(inside.renewal(client)) == 1  # only the first
            with pytest.raises(aiolock.LockTimeoutError):
                async with psem.acquired(wait=0):
                    pass
        assert await raw_bytes.zscore(timeouts(name), bytes.fromhex(leased)) is None
    assert len(inside.renewal(client)) == 0
    assert await raw.zcard(timeouts(name)) == 0
    assert await psem.available_permits() == 2
    await raw.delete(name)


async def test_a_renewed_permit_found_gone_is_reported_lost(
    client: aiolock.Client,
    raw: Redis,
    raw_bytes: Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewed permit taken away behind the holder's back (reclaimed by a Java client
    after its expiry, say) is reported once (WARNING), no longer renewed, and the block's
    exit raises LockLostError, as a lock's does; the body's own error wins over it."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(1)

    async def block() -> None:
        async with psem.acquired() as permit:
            await raw_bytes.zrem(timeouts(name), bytes.fromhex(permit))
            await raw.incr(name)
            await inside.renewal(client).renew_once()
            assert len(inside.renewal(client)) == 0

    with pytest.raises(aiolock.LockLostError, match="watchdog found its hold gone"):
        await block()
    assert sum("was lost" in r.getMessage() for r in caplog.records) == 1
    assert await psem.available_permits() == 1
    await raw.delete(name)


_HOLDER = """
import asyncio, sys
import aiolock

async def main():
    client = aiolock.Client.from_url(sys.argv[1], watchdog_timeout=1)
    psem = client.permit_expirable_semaphore(sys.argv[2])
    async with psem.acquired() as permit:
        print(permit, flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_killed_holders_permit_comes_back(
    client: aiolock.Client, raw: Redis, raw_bytes: Redis, redis_url: str, name: str
) -> None:
    """A process holding a renewed permit (watchdog_timeout=1 s) keeps it past its first
    lease; SIGKILLed, its permit comes back by itself within the watchdog timeout."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, redis_url, name, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(LIMIT):
            permit = (await proc.stdout.readline()).decode().strip()
        member = bytes.fromhex(permit)
        first = await raw_bytes.zscore(timeouts(name), member)
        assert first is not None
        # Renewed: its score moved while the process lives.
        await wait_until(
            lambda: _moved(raw_bytes, name, member, first), what="the permit was renewed"
        )
        assert await psem.try_acquire() is None
    finally:
        proc.kill()
        await proc.wait()
    killed = asyncio.get_running_loop().time()
    async with asyncio.timeout(LIMIT):
        back = await psem.try_acquire(wait=LIMIT)
    assert back is not None
    # Bounded by the watchdog timeout (1 s) and its last renewal, with slack for the CI.
    assert asyncio.get_running_loop().time() - killed < 3.0
    await psem.release(back)
    await raw.delete(name)


async def _moved(raw_bytes: Redis, name: str, member: bytes, first: float) -> bool:
    score = await raw_bytes.zscore(timeouts(name), member)
    return score is not None and score > first


async def test_a_lost_renewal_reply_keeps_the_permit_once(
    proxy: FaultProxy, raw: Redis, raw_bytes: Redis, name: str
) -> None:
    """A renewal whose reply was lost is resent: the permit stays taken, once, renewed."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=2, retry_interval=0.05)
    try:
        psem = client.permit_expirable_semaphore(name)
        assert await psem.try_set_permits(2)
        async with psem.acquired() as permit:
            first = await raw_bytes.zscore(timeouts(name), bytes.fromhex(permit))
            assert first is not None
            await wait_until(
                lambda: _past(raw, first - inside.engine(client).settings.lease_ms + 1)
            )
            drop = proxy.drop_reply(script("psem_renew"))
            assert await inside.renewal(client).renew_once()
            assert drop.executed.is_set()
            assert len(inside.renewal(client)) == 1
            assert (await raw.get(name), await raw.zcard(timeouts(name))) == ("1", 1)
            assert await _moved(raw_bytes, name, bytes.fromhex(permit), first)
        assert (await raw.get(name), await raw.zcard(timeouts(name))) == ("2", 0)
    finally:
        await client.aclose()
    await raw.delete(name)


async def test_lifecycle_cancellation_sweep(client: aiolock.Client, raw: Redis, name: str) -> None:
    """An acquired() block (renewed permit) cancelled at every loop iteration, in its
    acquire, body or exit, leaves every permit back and nothing renewed; set_permits,
    cancelled anywhere, is made once."""
    psem = client.permit_expirable_semaphore(name)
    assert await psem.try_set_permits(3)

    async def block() -> None:
        async with psem.acquired():
            await asyncio.sleep(0)

    async def total() -> tuple[int, int]:
        return int(await raw.get(name) or 0), await raw.zcard(timeouts(name))

    cases = 0
    for call, after in ((block, (3, 0)), (lambda: psem.set_permits(5), (5, 0))):
        for k in range(400):
            await raw.set(name, 3)
            task = asyncio.create_task(call())
            cancel_at(task, k)
            cancelled = False
            try:
                await task
            except asyncio.CancelledError:
                cancelled = True
            await quiesce(client)
            assert await total() == after, f"k={k}"
            assert len(inside.renewal(client)) == 0, f"k={k}: a permit left renewed"
            cases += 1
            if not cancelled:
                break
    assert cases >= 6
    await raw.delete(name)
