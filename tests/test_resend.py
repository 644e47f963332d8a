"""Every resend path through a fault proxy: a dropped reply, a partition longer than every
timeout. Each test checks that Redis ends with exactly what the client believes, that no
resend counts twice, and that whatever could not be done is reported.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
from aiolock._keys import fair_queue_key, fair_timeout_key

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, command, script
from .helpers import quiesce, wait_until

LIMIT = 10.0
# Short socket timeouts, so that a dropped reply costs a fraction of a second.
FAST = "?socket_timeout=0.3&socket_connect_timeout=0.3"


@pytest.fixture
async def proxied(proxy: FaultProxy, raw: Redis) -> AsyncIterator[aiolock.Client]:
    """A client whose every connection goes through the proxy; retries on."""
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=10, retry_attempts=2, retry_interval=0.05
    )
    yield client
    await client.aclose()


def frw_keys(name: str) -> list[str]:
    """Every key of the fair read-write lock ``name``."""
    prefixes = ["aiolock_frw", "aiolock_frw_leases", "aiolock_frw_queue"]
    prefixes += ["aiolock_frw_deadlines", "aiolock_frw_admitted"]
    return [f"{prefix}:{{{name}}}" for prefix in prefixes]


def frw_side(
    client: aiolock.Client, name: str, side: str
) -> aiolock.FairReadLock | aiolock.FairWriteLock:
    frw = client.fair_read_write_lock(name, owner="o")
    return frw.read_lock() if side == "r" else frw.write_lock()


class Family(NamedTuple):
    """A lock of one script family, held by owner "o" of a client."""

    make: Callable[[aiolock.Client, str], Any]
    #: Its scripts' name prefix.
    scripts: str
    #: Its state on the server: (hash key, the holder's field).
    state: Callable[[aiolock.Client, str], tuple[str, str]]


FAMILIES = {
    "lock": Family(
        lambda client, name: client.lock(name, owner="o"),
        "lock",
        lambda client, name: (name, f"{client.id}:owner:o"),
    ),
    "fair_rw": Family(
        lambda client, name: frw_side(client, name, "w"),
        "frw",
        lambda client, name: (frw_keys(name)[0], f"w:{client.id}:owner:o"),
    ),
}


async def test_unlock_resent_after_a_partition_releases_once(
    proxy: FaultProxy, raw: Redis, make_client: ClientFactory, name: str
) -> None:
    """Defect 4: an unlock whose reply is lost, then a partition longer than every timeout
    of the call: the background resend finds the latch and never releases twice."""
    # No retries and a short retry_interval: before the fix the latch lived
    # (3 s + retry_interval) x (retries + 1) = 3.05 s, whatever the resends took.
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=10, retry_attempts=0, retry_interval=0.05
    )
    try:
        lock = client.lock(name, owner="o")
        await lock.lock()
        await lock.lock()
        drop = proxy.drop_reply(script("lock_release"))
        unlock = asyncio.create_task(lock.unlock())
        await asyncio.wait_for(drop.executed.wait(), LIMIT)
        proxy.cut()
        with pytest.raises(RedisTimeoutError):
            await unlock
        # The partition outlasts every timeout of the call, and the old latch.
        await asyncio.sleep(4)
        await proxy.restore()
        await quiesce(client)
        assert await lock.hold_count() == 1  # the server's count
        assert lock.statistics().hold_count == 1
        assert not await make_client().lock(name).try_lock(wait=0)
        await lock.unlock()
        assert await raw.exists(name) == 0
    finally:
        await client.aclose()


async def test_acquire_whose_reply_was_lost_counts_once(
    proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """A lock() resent after its reply was lost takes one hold, not two."""
    lock = proxied.lock(name, owner="o")
    drop = proxy.drop_reply(script("lock_acquire"))
    await lock.lock()
    assert drop.executed.is_set()
    assert await raw.hget(name, f"{proxied.id}:owner:o") == "1"
    assert lock.statistics().hold_count == 1
    await lock.unlock()
    assert await raw.exists(name) == 0


async def test_fenced_acquire_whose_reply_was_lost_takes_one_token(
    proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """A resent fenced acquire answers the token its first send took, and takes no other."""
    fenced = proxied.fenced_lock(name, owner="o")
    before = await fenced.lock_and_get_token()
    await fenced.unlock()
    drop = proxy.drop_reply(script("lock_acquire"))
    token = await fenced.lock_and_get_token()
    assert drop.executed.is_set()
    assert token == before + 1
    assert await raw.get(f"redisson_lock_token:{{{name}}}") == str(token)
    assert await raw.hget(name, f"{proxied.id}:owner:o") == "1"
    await fenced.unlock()
    assert await raw.exists(name) == 0


async def test_unlock_whose_reply_was_lost_releases_once(
    proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """An unlock() resent after its reply was lost releases one hold of two."""
    lock = proxied.lock(name, owner="o")
    await lock.lock()
    await lock.lock()
    drop = proxy.drop_reply(script("lock_release"))
    await lock.unlock()
    assert drop.executed.is_set()
    assert await raw.hget(name, f"{proxied.id}:owner:o") == "1"
    await lock.unlock()
    assert await raw.exists(name) == 0


@pytest.mark.parametrize("family", FAMILIES)
async def test_rollback_whose_reply_was_lost_is_resent(
    family: str, proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """An acquire cancelled in flight, then its rollback's reply lost: the lock ends free."""
    make, scripts, state = FAMILIES[family]
    lock = make(proxied, name)
    acquire_drop = proxy.drop_reply(script(f"{scripts}_acquire"))
    rollback_drop = proxy.drop_reply(script(f"{scripts}_rollback"))
    acquire = asyncio.create_task(lock.lock())
    await asyncio.wait_for(acquire_drop.executed.wait(), LIMIT)
    acquire.cancel()
    with pytest.raises(asyncio.CancelledError):
        await acquire
    await asyncio.wait_for(rollback_drop.executed.wait(), LIMIT)
    await quiesce(proxied)
    assert await raw.exists(state(proxied, name)[0]) == 0
    assert lock.statistics().hold_count == 0
    assert await lock.try_lock(wait=0)
    await lock.unlock()


@pytest.mark.parametrize("family", FAMILIES)
async def test_renewal_whose_reply_was_lost_keeps_the_lease(
    family: str, proxy: FaultProxy, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal round whose reply is lost is tried again well before the lease runs out."""
    make, scripts, state = FAMILIES[family]
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=1.5, retry_attempts=0, retry_interval=0.05
    )
    try:
        lock = make(client, name)
        await lock.lock()
        drop = proxy.drop_reply(script(f"{scripts}_renew"), then="close")
        with caplog.at_level(logging.WARNING, logger="aiolock"):
            await asyncio.wait_for(drop.executed.wait(), LIMIT)
            rounds = inside.renewal(client).rounds
            await wait_until(
                lambda: inside.renewal(client).rounds >= rounds + 3, what="3 more rounds"
            )
        assert "could not renew" in caplog.text
        assert "was lost" not in caplog.text
        assert await raw.hget(*state(client, name)) == "1"
        await lock.unlock()
    finally:
        await client.aclose()


async def test_fair_leave_whose_reply_was_lost_is_resent(
    proxy: FaultProxy, proxied: aiolock.Client, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A fair waiter that gives up leaves the queue even when the first exit's reply is lost."""
    holder = make_client().fair_lock(name)
    await holder.lock()
    drop = proxy.drop_reply(script("fair_leave"))
    assert not await proxied.fair_lock(name, owner="w").try_lock(wait=0.3)
    await quiesce(proxied)
    assert drop.executed.is_set()
    assert await raw.llen(fair_queue_key(name)) == 0
    assert await raw.zcard(fair_timeout_key(name)) == 0
    await holder.unlock()


async def test_partition_longer_than_the_lease_is_reported(
    proxy: FaultProxy,
    raw: Redis,
    make_client: ClientFactory,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cut off for longer than its lease, a holder loses the lock and is told, twice over."""
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=1, retry_attempts=0, retry_interval=0.05
    )
    try:
        lock = client.lock(name, owner="o")
        await lock.lock()
        other = make_client().lock(name)
        with caplog.at_level(logging.WARNING, logger="aiolock"):
            async with proxy.partition():
                # The lease runs out while the holder cannot renew it: another takes it.
                assert await other.try_lock(wait=LIMIT)
            await wait_until(lambda: "was lost" in caplog.text, what="the watchdog reports it")
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()
        await other.unlock()
        assert await raw.exists(name) == 0
    finally:
        await client.aclose()


# -- the fair read-write lock: its own scripts, the same resend rules ------------------------


@pytest.mark.parametrize("side", ["r", "w"], ids=["read", "write"])
async def test_fair_rw_acquire_and_release_whose_replies_were_lost_count_once(
    side: str, proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """A fair read-write lock() and unlock() resent after their replies were lost take and
    give back one hold each."""
    lock = frw_side(proxied, name, side)
    state, leases = frw_keys(name)[:2]
    field = f"{side}:{proxied.id}:owner:o"
    drop = proxy.drop_reply(script("frw_acquire"))
    await lock.lock()
    assert drop.executed.is_set()
    assert await raw.hget(state, field) == "1"
    await lock.lock()
    drop = proxy.drop_reply(script("frw_release"))
    await lock.unlock()
    assert drop.executed.is_set()
    assert await raw.hget(state, field) == "1"
    assert await raw.zrange(leases, 0, -1) == [field]
    assert lock.statistics().hold_count == 1
    await lock.unlock()
    assert await raw.exists(*frw_keys(name)) == 0


async def test_fair_rw_leave_whose_reply_was_lost_is_resent(
    proxy: FaultProxy, proxied: aiolock.Client, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A queued writer that gives up leaves the queue even when the exit's reply is lost, so
    a reader behind it is not held back by it."""
    holder = make_client().fair_read_write_lock(name).read_lock()
    await holder.lock()
    drop = proxy.drop_reply(script("frw_leave"))
    assert not await frw_side(proxied, name, "w").try_lock(wait=0.3)
    await quiesce(proxied)
    assert drop.executed.is_set()
    _, _, queue, deadlines, admitted = frw_keys(name)
    assert await raw.exists(queue, deadlines, admitted) == 0
    reader = make_client().fair_read_write_lock(name).read_lock()
    assert await reader.try_lock(wait=0)
    await reader.unlock()
    await holder.unlock()


async def test_write_hand_over_whose_reply_was_lost_hands_over_once(
    proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """A write unlock handing the lock to a parked writer of its client, its reply lost: the
    resend replays the hand-over from the latch, and the writer holds the lock once."""
    releaser = proxied.read_write_lock(name, owner="o").write_lock()
    await releaser.lock()
    got, done = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with proxied.read_write_lock(name).write_lock():
            got.set()
            await done.wait()

    task = asyncio.create_task(writer())
    channel = f"redisson_rwlock:{{{name}}}"
    await wait_until(
        lambda: any(w.parked is not None for w in inside.waiting_room(proxied).waiters(channel)),
        what="the writer parked",
    )
    published = await _publishes(raw)
    drop = proxy.drop_reply(script("rw_write_release"))
    await releaser.unlock()
    assert drop.executed.is_set()
    async with asyncio.timeout(LIMIT):
        await got.wait()
    # Handed over (nothing published: the lock was never free), once.
    assert await _publishes(raw) == published
    fields = await raw.hgetall(name)
    assert fields.pop("mode") == "write"
    assert list(fields.values()) == ["1"]
    assert f"{proxied.id}:owner:o:write" not in fields
    assert releaser.statistics().hold_count == 0
    done.set()
    await task
    await quiesce(proxied)
    assert await raw.exists(name) == 0


async def _publishes(raw: Redis) -> int:
    stats: dict[str, Any] = await raw.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


async def test_latch_unlink_refused_in_the_sweepers_pipeline_is_sent_again(
    proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """An UNLINK of the latch sweeper's pipeline answered with an error is sent again on
    its own: the latch is deleted now, not left to its expiry."""
    refuse = proxy.refuse("UNLINK", "TRYAGAIN", times=1)
    lock = proxied.lock(name, owner="o")
    await lock.lock()
    await lock.unlock()
    await inside.latches(proxied).flush()
    assert refuse.count == 1
    assert [k async for k in raw.scan_iter(match=f"redisson_unlock_latch:{{{name}}}:*")] == []


async def test_latch_unlinks_whose_connection_closed_before_the_reply_are_sent_again(
    proxy: FaultProxy, proxied: aiolock.Client, raw: Redis, name: str
) -> None:
    """The latch sweeper's pipeline whose connection closes before its reply: the flush
    sends its UNLINKs again through the retries (they may not have run), and returns."""
    seen = proxy.watch(command("UNLINK"))
    drop = proxy.drop_reply(command("UNLINK"), then="close")
    lock = proxied.lock(name, owner="o")
    await lock.lock()
    await lock.unlock()
    await inside.latches(proxied).flush()
    assert drop.executed.is_set()
    assert seen.count == 2  # the pipeline's, then its resend
    assert [k async for k in raw.scan_iter(match=f"redisson_unlock_latch:{{{name}}}:*")] == []
