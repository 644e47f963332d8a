"""extend(lease): what the conformance suite does not cover for every kind.

The read-write lock's sides (per-hold timeout keys, Redisson's layout), a watchdog hold
that stays renewed, explicit leases a reentrant unlock re-applies, and arguments refused
before any I/O.
"""

from __future__ import annotations

import math

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, script
from .helpers import FAST


async def test_read_lock_extend_sets_every_read_hold(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Each of the holder's read holds (its own timeout key) and the hash get the lease."""
    read = client.read_write_lock(name).read_lock()
    await read.lock(lease=2)
    await read.lock(lease=3)
    await read.extend(60)
    timeouts = [key async for key in raw.scan_iter(match=f"*{name}*:rwlock_timeout:*")]
    assert len(timeouts) == 2
    for key in timeouts:
        assert 30_000 < await raw.pttl(key) <= 60_000
    assert 30_000 < await raw.pttl(name) <= 60_000
    await read.unlock()
    await read.unlock()
    assert not await raw.exists(name)


async def test_write_lock_extend(client: aiolock.Client, raw: Redis, name: str) -> None:
    write = client.read_write_lock(name).write_lock()
    await write.lock(lease=2)
    await write.extend(60)
    assert 30_000 < await raw.pttl(name) <= 60_000
    await write.unlock()


async def test_extend_shortens(client: aiolock.Client, raw: Redis, name: str) -> None:
    lock = client.lock(name)
    await lock.lock(lease=60)
    await lock.extend(2)
    assert 0 < await raw.pttl(name) <= 2_000
    await lock.unlock()


async def test_watchdog_hold_stays_renewed(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A watchdog hold's expiry moves, and the watchdog's next renewal gives it the
    watchdog's lease again: extend() never turns renewal off."""
    client = make_client(watchdog_timeout=20)
    lock = client.lock(name)
    await lock.lock()
    await lock.extend(120)
    assert 60_000 < await raw.pttl(name) <= 120_000
    assert await inside.renewal(client).renew_once()
    assert 10_000 < await raw.pttl(name) <= 20_000
    await lock.unlock()


async def test_reentrant_unlock_reapplies_the_extended_lease(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Explicit leases become the extended one: an unlock of one of two holds re-applies it
    (not the lease the holds were taken with)."""
    lock = client.lock(name)
    await lock.lock(lease=2)
    await lock.lock(lease=2)
    await lock.extend(60)
    await lock.unlock()
    assert 30_000 < await raw.pttl(name) <= 60_000
    await lock.unlock()


@pytest.mark.parametrize(
    ("lease", "error"),
    [
        (None, TypeError),
        (0, ValueError),
        (-1, ValueError),
        (math.inf, ValueError),
        ("5", TypeError),
    ],
)
async def test_bad_lease_refused_before_io(
    offline: aiolock.Client, lease: object, error: type[Exception]
) -> None:
    """Checked before any I/O: the offline client would fail with a ConnectionError."""
    handles = [
        offline.lock("x"),
        offline.read_write_lock("x").read_lock(),
        aiolock.MultiLock(offline.lock("a"), offline.lock("b")),
    ]
    for handle in handles:
        with pytest.raises(error, match="lease"):
            await handle.extend(lease)  # type: ignore[arg-type]


async def test_extend_whose_reply_is_lost(proxy: FaultProxy, name: str) -> None:
    """An extend() the server ran but whose reply never came: the caller gets redis-py's
    error (after the client's retries, which resend it: harmless, it only moves an
    expiry), the hold is still believed and held, and unlock() works."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=0)
    try:
        lock = client.lock(name)
        await lock.lock(lease=5)
        drop = proxy.drop_reply(script("lock_renew"), then="close")
        with pytest.raises((RedisConnectionError, RedisTimeoutError)):
            await lock.extend(60)
        assert drop.executed.is_set()
        assert lock.statistics().hold_count == 1
        lease = await lock.remaining_lease()
        assert lease is not None
        assert lease > 30
        await lock.unlock()
    finally:
        await client.aclose()
