"""Cancellation at every await point of acquire and release leaves a consistent state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._keys import lock_channel, prefixed
from aiolock._net.scripts import load_script

from . import inside
from .helpers import Gate, gated_redis, wait_until


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> AsyncIterator[tuple[aiolock.Client, Gate]]:
    """A client whose chosen script reply can be held back after the command was sent."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    yield client, gate
    await client.aclose()
    await redis.aclose()


async def _cancel_in_flight(task: asyncio.Task[object], gate: Gate) -> None:
    await asyncio.wait_for(gate.sent.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_acquire_cancelled_in_flight_leaves_lock_free(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A lock() cancelled after its script was sent, reply pending, leaves no hold."""
    client, gate = gated
    gate.arm("lock_acquire")
    task = asyncio.create_task(client.lock(name).lock())
    await _cancel_in_flight(task, gate)
    await wait_until(lambda: _absent(raw, name), what="rollback deleted the lock")
    assert len(inside.holds(client)) == 0
    assert len(inside.renewal(client)) == 0
    # The name is usable again at once.
    assert await client.lock(name).try_lock(0)
    await client.lock(name).unlock()


def _only_renewal_running(client: aiolock.Client) -> bool:
    return inside.background(client).tasks <= {inside.task_of(inside.renewal(client))}


async def _absent(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 0


async def _held(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 1


async def test_reentrant_cancel_undoes_exactly_one_hold(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A holder with count 1 whose re-entry is cancelled in flight ends with count 1."""
    client, gate = gated
    lock = client.lock(name, owner="worker")
    await lock.lock()
    gate.arm("lock_acquire")
    task = asyncio.create_task(lock.lock())
    await _cancel_in_flight(task, gate)
    await wait_until(lambda: _only_renewal_running(client), what="rollback finished")
    assert await raw.hget(name, f"{client.id}:owner:worker") == "1"
    assert lock.statistics().hold_count == 1
    await lock.unlock()
    assert await raw.exists(name) == 0


async def test_cancelled_acquire_that_lost_the_race_changes_nothing(
    gated: tuple[aiolock.Client, Gate], make_client: object, raw: Redis, name: str
) -> None:
    """An acquire cancelled in flight while another holder has the lock leaves that hold."""
    client, gate = gated
    await raw.hset(name, "someone-else:1", 1)
    await raw.pexpire(name, 30_000)
    gate.arm("lock_acquire")
    task = asyncio.create_task(client.lock(name).lock())
    await _cancel_in_flight(task, gate)
    await wait_until(lambda: len(inside.background(client)) == 0, what="rollback finished")
    assert await raw.hgetall(name) == {"someone-else:1": "1"}
    await raw.delete(name)


async def test_rollback_before_late_acquire_blocks_it(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """If the rollback reaches the server before the cancelled acquire, the acquire is void."""
    tombstone = f"{prefixed('aiolock_acquire_cancel', name)}:late-1"
    field = f"{client.id}:1"
    channel = lock_channel(name)
    undone = await inside.runner(client).run(
        load_script("lock_rollback"),
        [name, channel, tombstone],
        [field, 1, 30_000, "PUBLISH", 5_000],
    )
    assert int(undone) == 0
    reply = await inside.runner(client).run(
        load_script("lock_acquire"), [name, tombstone], [30_000, field, 1]
    )
    assert [int(x) for x in reply] == [-1, 0]
    assert await raw.exists(name) == 0
    await raw.delete(tombstone)


async def test_cancel_while_waiting_withdraws_the_waiter(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A lock() cancelled while it waits leaves no waiter and no subscription behind."""
    lock = client.lock(name)
    await lock.lock()
    waiter = asyncio.create_task(client.lock(name).lock())
    await wait_until(lambda: lock.statistics().tasks_waiting == 1, what="waiter waiting")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert lock.statistics().tasks_waiting == 0
    await wait_until(lambda: _no_subscribers(raw, lock_channel(name)), what="unsubscribed")
    await lock.unlock()


async def _no_subscribers(raw: Redis, channel: str) -> bool:
    return dict(await raw.pubsub_numsub(channel)).get(channel, 0) == 0


async def test_unlock_cancelled_in_flight_still_releases(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """An unlock() cancelled with its script in flight completes and clears bookkeeping."""
    client, gate = gated
    lock = client.lock(name, owner="o")
    await lock.lock()
    gate.arm("lock_release")
    task = asyncio.create_task(lock.unlock())
    await _cancel_in_flight(task, gate)
    # The release carries on shielded; let its reply through.
    gate.release.set()
    await wait_until(lambda: len(inside.holds(client)) == 0, what="bookkeeping cleared")
    assert await raw.exists(name) == 0
    assert len(inside.renewal(client)) == 0


async def test_async_with_body_cancelled_releases(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The async-with exit unlocks even when the body is cancelled."""
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock(name):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await raw.exists(name) == 0
    assert len(inside.holds(client)) == 0


async def test_async_with_exit_survives_a_second_cancel(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A second cancel during the async-with exit cannot cut the release in half."""
    client, gate = gated
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock(name, owner="w"):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await entered.wait()
    gate.arm("lock_release")
    task.cancel()
    await asyncio.wait_for(gate.sent.wait(), 5)
    task.cancel()  # the second cancel lands while the release reply is pending
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: len(inside.holds(client)) == 0, what="bookkeeping cleared")
    assert await raw.exists(name) == 0


async def test_rollback_of_a_cut_off_acquire_never_undoes_the_next_one(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A holder that acquires again while the rollback of its cancelled acquire is still on
    its way keeps the new hold: the rollback lands first (found by the fault suite, where
    the late rollback deleted the next hold and its unlock raised LockLostError)."""
    client, gate = gated
    lock = client.lock(name, owner="worker")
    for script in ("lock_acquire", "lock_rollback"):  # a NOSCRIPT reply would be gated
        await raw.script_load(load_script(script).text)
    gate.arm("lock_acquire")
    first = asyncio.create_task(lock.lock())
    await asyncio.wait_for(gate.sent.wait(), 5)
    await wait_until(lambda: _held(raw, name), what="the first acquire took the lock")
    gate.arm("lock_rollback", before_send=True)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(gate.sent.wait(), 5)  # the rollback is ready, not yet sent
    second = asyncio.create_task(lock.lock())
    # Give the second acquire every chance to overtake the rollback (it did, in a few ms,
    # before the fix); whether it finishes in this time or not, the outcome must be one hold.
    await asyncio.wait([second], timeout=1.0)
    gate.release.set()
    await asyncio.wait_for(second, 5)
    await wait_until(lambda: not len(inside.ordering(client)), what="the rollback landed")
    assert await raw.hgetall(name) == {f"{client.id}:owner:worker": "1"}
    await lock.unlock()
    assert await _absent(raw, name)


async def test_task_ending_with_its_unlock_in_flight_did_not_end_holding(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A task whose unlock() is cancelled in flight and that then ends let go of the lock:
    no "ended while holding" WARNING, and the release still lands (found by the fault
    suite, where a run's last cancelled exit was reported as a task that ended holding)."""
    client, gate = gated
    lock = client.lock(name)
    entered = asyncio.Event()

    async def body() -> None:
        async with lock:
            entered.set()
            gate.arm("lock_release")
            await asyncio.Event().wait()

    caplog.set_level(logging.WARNING, logger="aiolock")
    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    await asyncio.wait_for(gate.sent.wait(), 5)
    task.cancel()  # the exit's release is in flight: the task ends before its reply
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.release.set()
    await wait_until(lambda: len(inside.holds(client)) == 0, what="bookkeeping cleared")
    assert await _absent(raw, name)
    assert [r.getMessage() for r in caplog.records if r.name == "aiolock"] == []


async def test_task_ending_with_more_holds_than_unlocks_in_flight_is_reported(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that held twice and ends with one unlock() in flight still ended holding one."""
    client, gate = gated
    lock = client.lock(name)
    ready = asyncio.Event()

    async def body() -> None:
        await lock.lock()
        await lock.lock()
        gate.arm("lock_release")
        ready.set()
        await lock.unlock()

    caplog.set_level(logging.WARNING, logger="aiolock")
    task = asyncio.create_task(body())
    await ready.wait()
    await asyncio.wait_for(gate.sent.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.release.set()
    await wait_until(lambda: not len(inside.ordering(client)), what="the release landed")
    ended = [r.getMessage() for r in caplog.records if "ended while" in r.getMessage()]
    assert len(ended) == 1
    assert "(1 hold(s))" in ended[0]
    assert len(inside.holds(client)) == 0
    assert len(inside.renewal(client)) == 0
    # One hold is left on the server, unrenewed: it expires with its lease.
    assert await raw.hvals(name) == ["1"]
    assert 0 < await raw.pttl(name) <= inside.settings(client).lease_ms
    await raw.delete(name)
