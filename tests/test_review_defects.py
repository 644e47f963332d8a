"""One named test per defect of the outside review (issue #10), each failing on the code
before its fix. The cancellation sweep (test_cancel_sweep.py), the fault-proxy tests
(test_resend.py) and the model tests (test_model.py) are what look for the next ones; these
pin down the ones that were found.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._keys import fair_queue_key, rwlock_timeout_prefix
from aiolock._net.scripts import load_script

from . import inside
from .conftest import ClientFactory
from .helpers import Gate, gated_redis, quiesce, wait_until

LIMIT = 10.0


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> AsyncIterator[tuple[aiolock.Client, Gate]]:
    """A client whose chosen script call can be held back, before or after it is sent."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    yield client, gate
    gate.release.set()
    await client.aclose()
    await redis.aclose()


async def test_2_owner_id_never_equals_a_task_id(client: aiolock.Client, name: str) -> None:
    """owner="1" is not the task whose holder id ends in ":1": it must wait like anyone."""
    task_lock = client.lock(name)
    await task_lock.lock()  # this test's task is the client's first: "{client.id}:1"
    job = client.lock(name, owner="1")
    assert not await job.try_lock(wait=0)
    assert await job.hold_count() == 0
    await task_lock.unlock()


async def test_3_overlapping_calls_of_one_owner_count_twice(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Two lock() of one owner= at once leave count 2 in Redis, and two unlocks free it."""
    first, second = client.lock(name, owner="job"), client.lock(name, owner="job")
    await asyncio.gather(first.lock(), second.lock())
    assert await raw.hget(name, f"{client.id}:owner:job") == "2"
    assert first.statistics().hold_count == 2
    await first.unlock()
    assert await raw.hget(name, f"{client.id}:owner:job") == "1"
    await second.unlock()
    assert await raw.exists(name) == 0


async def test_3_acquire_cancelled_before_it_was_sent_undoes_nothing_else(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A second lock() of one owner, cancelled before it is sent, leaves the first's hold."""
    lock = client.lock(name, owner="job")
    first = asyncio.create_task(lock.lock())
    second = asyncio.create_task(lock.lock())
    await asyncio.sleep(0)  # both calls have started: one sends, the other waits its turn
    second.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    await quiesce(client)
    assert await raw.hget(name, f"{client.id}:owner:job") == "1"
    assert lock.statistics().hold_count == 1
    await lock.unlock()
    assert await raw.exists(name) == 0


async def test_5_unlock_cancelled_behind_a_cut_off_call_still_releases(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """An unlock() cancelled while an earlier call of its holder settles still releases."""
    client, gate = gated
    lock = client.lock(name, owner="w")
    await lock.lock()
    # A re-entry cut off in flight: its rollback is held back before it is sent.
    gate.arm("lock_acquire")
    reentry = asyncio.create_task(lock.lock())
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    rollback_gate = gate.release
    gate.arm("lock_rollback", before_send=True)
    rollback_gate.set()
    reentry.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reentry
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    # The unlock waits for the rollback to land; cancelled there, it must still release.
    unlock = asyncio.create_task(lock.unlock())
    await asyncio.sleep(0)
    unlock.cancel()
    with pytest.raises(asyncio.CancelledError):
        await unlock
    gate.release.set()
    await quiesce(client)
    assert await raw.exists(name) == 0
    assert len(inside.holds(client)) == 0
    assert len(inside.renewal(client)) == 0


async def test_6_a_fair_waiter_keeps_its_new_place_after_an_earlier_give_up(
    gated: tuple[aiolock.Client, Gate], make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A waiter's late queue exit, from a wait it gave up, never removes its next wait."""
    client, gate = gated
    holder = make_client().fair_lock(name, owner="holder")
    await holder.lock()
    me = f"{client.id}:owner:t"
    lock = client.fair_lock(name, owner="t")
    gate.arm("fair_leave", before_send=True)
    waiting = asyncio.create_task(lock.lock())
    await wait_until(lambda: lock.statistics().tasks_waiting == 1, what="waiting")
    await wait_until(lambda: _queued(raw, name, me), what="queued")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(gate.sent.wait(), LIMIT)  # the exit is held before it is sent
    again = asyncio.create_task(lock.lock())  # the same holder waits again at once
    gate.release.set()
    await quiesce(client)
    await wait_until(lambda: _queued(raw, name, me), limit=LIMIT, what="queued again")
    await holder.unlock()
    await asyncio.wait_for(again, LIMIT)
    await lock.unlock()


async def _queued(raw: Redis, name: str, holder: str) -> bool:
    return holder in await raw.lrange(fair_queue_key(name), 0, -1)


async def test_7_read_renewal_reports_a_read_hold_whose_timeout_key_ran_out(
    make_client: ClientFactory, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A read hold is judged by its own timeout key, not by its holder's field."""
    client = make_client()
    reader = client.read_write_lock(name, owner="r").read_lock()
    other = make_client().read_write_lock(name, owner="o").read_lock()
    await reader.lock()
    await other.lock()
    # The reader's hold dies (its lease ran out during a pause, say); its field remains.
    await raw.delete(f"{rwlock_timeout_prefix(name, f'{client.id}:owner:r')}:1")
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        assert await inside.renewal(client).renew_once()
    assert "was lost" in caplog.text
    with pytest.raises(aiolock.LockLostError):
        await reader.unlock()
    await other.unlock()
    assert await raw.exists(name) == 0


async def test_9_an_acquire_in_flight_at_aclose_is_undone(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """An acquire answered after aclose() began raises ClientClosedError and holds nothing."""
    client, gate = gated
    gate.arm("lock_acquire")
    acquire = asyncio.create_task(client.lock(name).lock())
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    closing = asyncio.create_task(client.aclose())
    await wait_until(lambda: client.closed, what="closing")
    gate.release.set()
    with pytest.raises(aiolock.ClientClosedError):
        await acquire
    await closing
    assert await raw.exists(name) == 0


async def test_10_plain_rollback_that_gave_a_hold_back_leaves_a_tombstone(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A duplicate of an undone acquire that reaches the server later takes nothing."""
    client, gate = gated
    await raw.script_load(load_script("lock_acquire").text)  # a NOSCRIPT reply would be gated
    gate.arm("lock_acquire")
    acquire = asyncio.create_task(client.lock(name, owner="o").lock())
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    await wait_until(lambda: _exists(raw, name), what="the script took the hold")
    acquire.cancel()  # the script ran and took the hold; the reply is held back
    with pytest.raises(asyncio.CancelledError):
        await acquire
    await quiesce(client)
    assert await raw.exists(name) == 0
    tombstones = [key async for key in raw.scan_iter(match=f"aiolock_acquire_cancel:*{name}*")]
    assert len(tombstones) == 1
    # The same call again, as a copy buffered on a dead connection would arrive.
    reply = await raw.evalsha(
        load_script("lock_acquire").sha, 2, name, tombstones[0], 30_000, f"{client.id}:owner:o", 1
    )
    assert [int(x) for x in reply] == [-1, 0]
    assert await raw.exists(name) == 0


async def test_10_read_and_write_rollbacks_leave_a_tombstone(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """The read-write lock's rollbacks also void a late copy of the acquire."""
    client, gate = gated
    rw = client.read_write_lock(name, owner="o")
    for side, script in (
        (rw.read_lock(), "rw_read_acquire"),
        (rw.write_lock(), "rw_write_acquire"),
    ):
        await raw.script_load(load_script(script).text)  # a NOSCRIPT reply would be gated
        gate.arm(script)
        acquire = asyncio.create_task(side.lock())
        await asyncio.wait_for(gate.sent.wait(), LIMIT)
        await wait_until(lambda: _exists(raw, name), what="the script took the hold")
        acquire.cancel()
        with pytest.raises(asyncio.CancelledError):
            await acquire
        gate.release.set()
        await quiesce(client)
        assert await raw.exists(name) == 0
    tombstones = [key async for key in raw.scan_iter(match=f"aiolock_acquire_cancel:*{name}*")]
    assert len(tombstones) == 2


async def test_11_no_task_ended_warning_for_a_hold_already_reported_lost(
    client: aiolock.Client, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A task ending with a hold known lost (force_unlock) is not reported a second time."""

    async def holder() -> None:
        await client.lock(name).lock()
        assert await client.lock(name).force_unlock()

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await asyncio.create_task(holder())
    assert "ended while" not in caplog.text


async def test_11_times_accept_timedelta(client: aiolock.Client, name: str) -> None:
    """lease and wait take a timedelta, as API.md says (and the annotations now say too)."""
    lock = client.lock(name)
    assert await lock.try_lock(wait=timedelta(seconds=1), lease=timedelta(seconds=5))
    remaining = await lock.remaining_lease()
    assert remaining is not None
    assert 0 < remaining <= 5
    await lock.unlock()


def test_11_no_asyncio_loop_gets_a_clear_error(client: aiolock.Client, name: str) -> None:
    """Driven by something that is not asyncio (trio, anyio on trio), the error says so."""
    coro = client.lock(name).lock()
    with pytest.raises(RuntimeError, match="aiolock runs on asyncio"):
        coro.send(None)
    coro.close()


async def test_unlock_latch_outlives_the_resends_of_its_call(client: aiolock.Client) -> None:
    """Defect 4's rule: every latch and tombstone outlives every resend of its call."""
    options, settings = inside.options(client), inside.settings(client)
    assert settings.resend_window_ms <= round(options.watchdog_timeout * 1000)
    # redis-py 8's default connection: 5 s socket and connect timeouts.
    one_send = 5 + 2 * 5
    foreground = (options.retry_attempts + 1) * one_send
    assert settings.latch_ttl_ms / 1000 > foreground + settings.resend_window_ms / 1000


async def _exists(raw: Redis, key: str) -> bool:
    return bool(await raw.exists(key))


# -- a cancel swallowed below aiolock, on every Python ------------------------------------
# The gate stands in for 3.11's wait_for: the cancel lands while the reply is pending and is
# swallowed there, so these run the same on 3.12 and 3.13, where wait_for no longer does it.


async def _swallowed(task: asyncio.Task[Any], gate: Gate) -> None:
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    task.cancel()
    await asyncio.sleep(0)  # the cancel lands in the held read and is swallowed there
    gate.release.set()


@pytest.mark.parametrize("how", ["lock", "try_lock", "async_with"])
async def test_1_acquire_whose_cancel_was_swallowed_raises_and_holds_nothing(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str, how: str
) -> None:
    """Defect 1: the acquire took the hold, its cancel was swallowed: it gives the hold back
    and raises CancelledError; an ``async with`` never enters its body."""
    client, gate = gated
    await raw.script_load(load_script("lock_acquire").text)
    gate.arm("lock_acquire", swallow_cancel=True)
    lock = client.lock(name)
    entered = False

    async def call() -> Any:
        nonlocal entered
        if how == "lock":
            return await lock.lock()
        if how == "try_lock":
            return await lock.try_lock(wait=5)
        async with lock:
            entered = True
        return None

    task = asyncio.create_task(call())
    await _swallowed(task, gate)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not entered
    await quiesce(client)
    assert await raw.exists(name) == 0
    assert len(inside.holds(client)) == 0


async def test_1_timeout_around_an_acquire_whose_cancel_was_swallowed(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """asyncio.timeout() around lock() ends in TimeoutError on time, holding nothing."""
    client, gate = gated
    await raw.script_load(load_script("lock_acquire").text)
    gate.arm("lock_acquire", swallow_cancel=True)

    async def call() -> None:
        async with asyncio.timeout(0.05):
            await client.lock(name).lock()

    task = asyncio.create_task(call())
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    await asyncio.sleep(0.1)  # the timeout fires while the reply is held, and is swallowed
    gate.release.set()
    with pytest.raises(TimeoutError):
        await task
    await quiesce(client)
    assert await raw.exists(name) == 0


async def test_1_unlock_whose_cancel_was_swallowed_raises_cancelled(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """Found by the model tests: an unlock() by a non-holder whose cancel was swallowed
    raised LockNotOwnedError; a cancel that came while a call ran always wins."""
    client, gate = gated
    await raw.script_load(load_script("lock_release").text)
    gate.arm("lock_release", swallow_cancel=True)
    task = asyncio.create_task(client.lock(name).unlock())
    await _swallowed(task, gate)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_model_found_overlapping_owner_calls_judge_the_upgrade_in_turn(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Found by the model tests: an owner= holding read and write locks made lock(r),
    unlock(w) and lock(w) at once from three tasks. In that order the last one asks to
    upgrade (LockUpgradeError); it was judged before its turn and waited for itself."""
    rw = client.read_write_lock(name, owner="o")
    read, write = rw.read_lock(), rw.write_lock()
    await write.lock()
    await read.lock()
    results = await asyncio.wait_for(
        asyncio.gather(read.lock(), write.unlock(), write.lock(), return_exceptions=True), LIMIT
    )
    assert list(results[:2]) == [None, None]
    assert isinstance(results[2], aiolock.LockUpgradeError)
    assert await read.hold_count() == 2
    assert await write.hold_count() == 0
    await read.unlock()
    await read.unlock()
    assert await raw.exists(name) == 0


@pytest.mark.parametrize("kind", ["lock", "fair_lock"])
async def test_1_contended_acquire_whose_cancel_was_swallowed_does_not_wait(
    gated: tuple[aiolock.Client, Gate],
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    kind: str,
) -> None:
    """Found by the model tests: a lost attempt whose cancel was swallowed went on to wait
    for the holder (a cancelled call that did not return); now it raises at once, and a
    fair waiter leaves no queue entry."""
    client, gate = gated
    holder = getattr(make_client(), kind)(name)
    await holder.lock()
    script = "lock_acquire" if kind == "lock" else "fair_acquire"
    await raw.script_load(load_script(script).text)
    gate.arm(script, swallow_cancel=True)
    task = asyncio.create_task(getattr(client, kind)(name).lock())
    await _swallowed(task, gate)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, LIMIT)
    await quiesce(client)
    assert await raw.llen(fair_queue_key(name)) == 0
    await holder.unlock()


async def test_model_found_acquire_after_an_unnoticed_loss_is_undone_when_cancelled(
    gated: tuple[aiolock.Client, Gate], make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Found by the model tests: a holder whose hold was force-unlocked by another client
    (unnoticed yet) re-acquired with a stale expected count; cancelled in flight, its
    rollback could not recognise the hold it took, which stayed. A script now takes a hold
    only from the count the holder believes, and the loss is reported."""
    client, gate = gated
    lock = client.lock(name, owner="o")
    await lock.lock()
    assert await make_client().lock(name).force_unlock()
    await raw.script_load(load_script("lock_acquire").text)
    gate.arm("lock_acquire")
    task = asyncio.create_task(lock.try_lock(wait=0))
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    task.cancel()
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await quiesce(client)
    assert await raw.exists(name) == 0
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()


async def test_model_found_read_and_write_calls_of_one_owner_take_turns(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Found by the model tests (on 3.13): lock(r) and lock(w) of one owner= at once ran
    side by side, each in its own line; the write lock then waited for the owner's own read
    hold. In the order made, the write lock is an upgrade: LockUpgradeError at once."""
    rw = client.read_write_lock(name, owner="o")
    read, write = rw.read_lock(), rw.write_lock()
    results = await asyncio.wait_for(
        asyncio.gather(read.lock(), write.lock(), return_exceptions=True), LIMIT
    )
    assert results[0] is None
    assert isinstance(results[1], aiolock.LockUpgradeError)
    await read.unlock()
    assert await raw.exists(name) == 0


async def test_model_found_force_unlock_marks_lost_only_the_holds_it_deleted(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """Found in review after the model tests: force_unlock() marked every hold of its client
    on the lock lost when its reply came, including one another holder took after the
    deletion (while the reply was on its way). That hold then lost its watchdog renewal and
    its unlock() raised LockLostError. Only holds begun before the call are marked now."""
    client, gate = gated
    before, after = client.lock(name, owner="before"), client.lock(name, owner="after")
    await before.lock()
    await raw.script_load(load_script("lock_force_unlock").text)
    gate.arm("lock_force_unlock")
    force = asyncio.create_task(client.lock(name).force_unlock())
    await asyncio.wait_for(gate.sent.wait(), LIMIT)
    # The force ran on the server; its reply is held back. Another holder takes the lock.
    assert await after.try_lock(wait=0)
    gate.release.set()
    assert await asyncio.wait_for(force, LIMIT)
    with pytest.raises(aiolock.LockLostError):
        await before.unlock()
    await after.unlock()
    assert await raw.exists(name) == 0
