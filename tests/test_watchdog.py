"""The watchdog renews leases in batches, and a lost lease is reported, never ignored."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock._engine.renewal import BATCH_SIZE

from . import inside
from .conftest import ClientFactory
from .helpers import wait_until


async def test_watchdog_keeps_lock_past_its_timeout(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A lock taken without a lease outlives several watchdog timeouts while held."""
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock(name)
    await lock.lock()
    # Ten renewal periods = more than three full leases.
    await wait_until(lambda: inside.renewal(client).calls >= 10, what="ten renewals")
    assert await lock.is_held_by_current_task()
    assert 0 < await raw.pttl(name) <= 300
    await lock.unlock()
    assert len(inside.renewal(client)) == 0


async def test_explicit_lease_is_never_renewed(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A lock taken with lease= expires after it; its unlock then raises LockLostError."""
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock(name)
    await lock.lock(lease=0.2)
    assert len(inside.renewal(client)) == 0
    await wait_until(lambda: _absent(raw, name), what="lease expired")
    assert inside.renewal(client).calls == 0
    with pytest.raises(aiolock.LockLostError, match=name):
        await lock.unlock()
    # The loss was reported once; the holder no longer believes it holds anything.
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()


async def _absent(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 0


@pytest.mark.parametrize("how", ["delete", "expire"])
async def test_lost_lease_is_logged_and_raised(
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A watchdog lock whose key vanishes is logged at WARNING and its unlock raises."""
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock(name)
    await lock.lock()
    holder = str(next(iter(await raw.hkeys(name))))
    if how == "delete":
        await raw.delete(name)
    else:
        await raw.pexpire(name, 1)
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await wait_until(lambda: len(inside.renewal(client)) == 0, what="watchdog noticed")
    lost = [r for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1
    assert name in lost[0].getMessage()
    assert holder in lost[0].getMessage()
    with pytest.raises(aiolock.LockLostError, match="watchdog"):
        await lock.unlock()


async def test_force_unlock_elsewhere_is_a_lost_lease(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Another client's force_unlock() makes the holder's unlock raise LockLostError."""
    holder_client, other = make_client(), make_client()
    lock = holder_client.lock(name)
    await lock.lock()
    assert await other.lock(name).force_unlock()
    assert await other.lock(name).try_lock(0)
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    # The other holder was not disturbed by the failed unlock.
    assert await other.lock(name).is_locked()
    await other.lock(name).unlock()


async def test_renewal_is_batched(make_client: ClientFactory, raw: Redis, uid: str) -> None:
    """Holding 250 watchdog locks costs ceil(250 / 100) renewal calls per period."""
    client = make_client(watchdog_timeout=3600)
    names = [f"test:{uid}:{i}" for i in range(250)]
    locks = [client.lock(n) for n in names]
    for lock in locks:
        await lock.lock()
    async with raw.pipeline(transaction=False) as pipe:
        for n in names:
            pipe.pexpire(n, 60_000)
        await pipe.execute()
    before = inside.renewal(client).calls
    await inside.renewal(client).renew_once()
    assert inside.renewal(client).calls - before == -(-250 // BATCH_SIZE)
    ttls = [await raw.pttl(n) for n in names]
    assert min(ttls) > 60_000
    for lock in locks:
        await lock.unlock()


async def test_renewal_round_is_one_round_trip_not_one_per_lock(
    make_client: ClientFactory, raw: Redis, uid: str
) -> None:
    """A round's renewals go out as one pipelined batch, so a burst of lock calls holds
    it up once, not once per lock (found by the fault suite, where a round of 100 calls
    queued 100 times and leases ran out while held); NOSCRIPT costs two more."""
    client = make_client(watchdog_timeout=3600)
    transport: Any = inside.transport(client)
    sends = 0
    call, call_many = transport.call, transport.call_many

    async def counted_call(command: bytes) -> Any:
        nonlocal sends
        sends += 1
        return await call(command)

    async def counted_call_many(commands: list[bytes]) -> Any:
        nonlocal sends
        sends += 1
        return await call_many(commands)

    transport.call, transport.call_many = counted_call, counted_call_many
    names = [f"test:{uid}:{i}" for i in range(250)]
    for name in names:
        await client.lock(name, owner="bulk").lock()
    await raw.script_flush()  # and the NOSCRIPT fallback resends the batch
    sends, before = 0, inside.renewal(client).calls
    assert await inside.renewal(client).renew_once()
    assert inside.renewal(client).calls - before == 3
    assert sends == 3  # the batch, SCRIPT LOAD, the batch again
    await raw.pexpire(names[-1], 60_000)
    sends = 0
    assert await inside.renewal(client).renew_once()
    assert sends == 1
    assert await raw.pttl(names[-1]) > 60_000
    for name in names:
        await client.lock(name, owner="bulk").unlock()


async def test_one_broken_key_does_not_stop_its_batch(
    make_client: ClientFactory, raw: Redis, uid: str
) -> None:
    """A renewed key turned into another type is lost alone; its batch-mates stay renewed."""
    client = make_client(watchdog_timeout=3600)
    good, bad = client.lock(f"test:{uid}:good"), client.lock(f"test:{uid}:bad")
    await good.lock()
    await bad.lock()
    await raw.delete(bad.name)
    await raw.set(bad.name, "not a hash")
    await raw.pexpire(good.name, 60_000)
    await inside.renewal(client).renew_once()
    assert await raw.pttl(good.name) > 60_000
    assert len(inside.renewal(client)) == 1
    await good.unlock()
    with pytest.raises(aiolock.LockError, match="another type"):
        await bad.unlock()
    await raw.delete(bad.name)


async def test_renewal_error_is_logged_and_retried(
    make_client: ClientFactory, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that fails is logged once per outage; its end is logged with the count.

    The next period renews again and the lock survives.
    """
    client = make_client(watchdog_timeout=0.3, retry_attempts=0)
    real_run_batch = inside.runner(client).run_batch
    failures = 0

    class FlakyRunner:
        shard = inside.runner(client).shard
        server = inside.runner(client).server
        passing = inside.runner(client).passing

        async def run_batch(self, script: Any, calls: list[Any]) -> list[Any]:
            nonlocal failures
            if failures < 2:
                failures += 1
                raise RedisConnectionError("injected renewal failure")
            return await real_run_batch(script, calls)

    # The renewal service's own view of the server fails twice, nothing else does.
    inside.replace_renewal_runner(client, FlakyRunner())
    lock = client.lock(name)
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await lock.lock()
        await wait_until(lambda: inside.renewal(client).calls >= 6, what="renewals after failures")
    assert failures == 2
    assert sum("could not renew" in r.getMessage() for r in caplog.records) == 1
    assert sum("works again after 2 failed" in r.getMessage() for r in caplog.records) == 1
    assert await lock.is_held_by_current_task()
    await lock.unlock()


async def test_task_ending_while_holding_stops_renewal(
    client: aiolock.Client, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that ends holding a lock is no longer renewed, and that is logged."""

    async def forgetful() -> None:
        await client.lock(name).lock()

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await asyncio.create_task(forgetful())
        await wait_until(lambda: len(inside.renewal(client)) == 0, what="renewal stopped")
    assert any("ended while" in r.getMessage() and name in r.getMessage() for r in caplog.records)
    assert await raw.exists(name) == 1  # it expires with its lease; clean up now
    await raw.delete(name)


async def test_aclose_warns_about_locks_still_held(
    make_client: ClientFactory, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """aclose() does not release held locks; it logs each of them at WARNING."""
    client = make_client()
    await client.lock(name, owner="keeper").lock()
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await client.aclose()
    assert any(
        "client closed while" in r.getMessage() and name in r.getMessage() for r in caplog.records
    )
    assert 0 < await raw.pttl(name) <= 30_000
    await raw.delete(name)


async def test_long_lived_task_keeps_no_released_holds(client: aiolock.Client, name: str) -> None:
    """A task that locks and unlocks many times keeps nothing of the released holds."""
    lock = client.lock(name)
    for _ in range(50):
        await lock.lock()
        await lock.unlock()
    task = asyncio.current_task()
    assert task is not None
    assert len(inside.holds(client)) == 0
    # The task's entry (weak by task) is there, and empty.
    assert not inside.tasks_holding(inside.holds(client))[weakref.ref(task)]


async def test_loss_found_by_unlock_is_logged_too(
    client: aiolock.Client, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease that ran out unseen by the watchdog (an explicit lease, or a starved event
    loop) is logged at WARNING by the unlock that finds it, not only raised (found by the
    fault suite's starved-loop scenario)."""
    lock = client.lock(name)
    await lock.lock(lease=30)
    await raw.delete(name)
    with caplog.at_level(logging.WARNING, logger="aiolock"), pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    lost = [r for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1
    assert name in lost[0].getMessage()
    assert "found by unlock()" in lost[0].getMessage()
