"""Guarded holds (issue 22): the body runs only while the lock is known held.

Each loss the guard reacts to, on a real server: found gone (force_unlock from another
client, seen by the renewal), no longer confirmed (the server frozen: the body stops at
confirmed_until, before anyone else can take the lock), an explicit lease ending; and the
cancel-scope rules (an outside cancel wins; nested asyncio.timeout, anyio, TaskGroup).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aiolock
from aiolock._engine.guard import Guarded, Hold, drift_margin

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, script
from .helpers import wait_until

LIMIT = 5.0
# A short watchdog lease: the renewal runs every 0.3 s, a frozen server is noticed in 0.9 s.
FAST_LEASE = 0.9

Kind = Callable[[aiolock.Client, str], Any]

KINDS: dict[str, Kind] = {
    "lock": lambda c, n: c.lock(n),
    "fair": lambda c, n: c.fair_lock(n),
    "read": lambda c, n: c.read_write_lock(n).read_lock(),
    "write": lambda c, n: c.read_write_lock(n).write_lock(),
    "fair-read": lambda c, n: c.fair_read_write_lock(n).read_lock(),
    "fair-write": lambda c, n: c.fair_read_write_lock(n).write_lock(),
    "fenced": lambda c, n: c.fenced_lock(n),
    "spin": lambda c, n: c.spin_lock(n),
}


async def forever() -> None:
    await asyncio.Event().wait()


async def lose_inside(guarded: Guarded, lose: Callable[[], Awaitable[object]]) -> Hold:
    """Enter ``guarded``, lose the hold by ``lose()``, wait to be cancelled."""
    async with guarded as hold:
        await lose()
        await forever()
    return hold  # pragma: no cover - never reached


@pytest.mark.parametrize("kind", KINDS)
async def test_guarded_holds_and_releases(make_client: ClientFactory, name: str, kind: str) -> None:
    """Every lock kind: a guarded body runs holding the lock, confirmed ahead; then released."""
    client = make_client(watchdog_timeout=FAST_LEASE)
    lock = KINDS[kind](client, name)
    loop = asyncio.get_running_loop()
    async with lock.guarded(wait=1) as hold:
        assert isinstance(hold, aiolock.Hold)
        assert not hold.lost
        assert await lock.is_held_by_current_task()
        assert loop.time() < hold.confirmed_until < loop.time() + FAST_LEASE
        assert (hold.token is not None) == (kind == "fenced")
        # Renewals move the confirmation on: the body outlives the first lease.
        first = hold.confirmed_until
        await wait_until(lambda: hold.confirmed_until > first + 0.1, limit=LIMIT)
    assert not hold.lost
    assert not await lock.is_locked()
    await hold.wait_lost()  # over: returns


@pytest.mark.parametrize("kind", ["lock", "read", "fair-write", "fenced"])
async def test_taken_by_another_client_cancels_the_body(
    make_client: ClientFactory, name: str, kind: str
) -> None:
    """force_unlock() from elsewhere: the renewal finds it gone, the body is cancelled."""
    client, other = make_client(watchdog_timeout=FAST_LEASE), make_client()
    lock = KINDS[kind](client, name)
    reached = asyncio.Event()

    async def body() -> None:
        async with lock.guarded() as hold:
            reached.set()
            await forever()
        del hold

    task = asyncio.create_task(body())
    await reached.wait()
    assert await KINDS[kind](other, name).force_unlock()
    async with asyncio.timeout(LIMIT):
        with pytest.raises(aiolock.LockLostError) as caught:
            await task
    assert isinstance(caught.value.__context__, asyncio.CancelledError)
    assert not await KINDS[kind](client, name).is_locked()


async def test_same_client_force_unlock_cancels_at_once(client: aiolock.Client, name: str) -> None:
    lock = client.lock(name)
    guarded = lock.guarded()

    async def lose() -> None:
        assert await lock.force_unlock()
        hold = inside.hold_of(guarded)
        assert hold is not None
        assert hold.lost

    with pytest.raises(aiolock.LockLostError):
        await lose_inside(guarded, lose)


async def test_wait_runs_out(make_client: ClientFactory, name: str) -> None:
    other = make_client()
    await other.lock(name).lock()
    with pytest.raises(aiolock.LockTimeoutError):
        async with make_client().lock(name).guarded(wait=0.05):
            pytest.fail("entered")  # pragma: no cover
    await other.lock(name).unlock()


async def test_explicit_lease_ends_the_body(make_client: ClientFactory, name: str) -> None:
    """guarded(lease=...) is never renewed: the body is cancelled as the lease ends."""
    client = make_client()
    loop = asyncio.get_running_loop()
    started = loop.time()
    stopped = 0.0
    guarded = client.lock(name).guarded(lease=0.3)

    async def body() -> None:
        nonlocal stopped
        async with guarded as hold:
            assert hold.confirmed_until <= started + 0.3 + 0.05
            try:
                await forever()
            finally:
                stopped = loop.time()

    with pytest.raises(aiolock.LockLostError):
        await body()
    hold = inside.hold_of(guarded)
    assert hold is not None
    assert hold.lost
    # Cancelled when the lease was no longer confirmed, not before (bounded, not hung).
    assert hold.confirmed_until <= stopped < started + LIMIT
    await wait_until(lambda: asyncio.sleep(0, not client.lock(name).statistics().hold_count))


async def test_frozen_server_stops_the_body_before_anyone_can_take_it(
    make_client: ClientFactory, proxy: FaultProxy, name: str
) -> None:
    """Cut off from Redis, the body stops at confirmed_until: before the lease ends there.

    A second client, straight to the server, waits for the lock meanwhile: it gets it only
    after the body stopped. The block raises at once, the server still unreachable.
    """
    cut_off = aiolock.Client.from_url(proxy.url + "?socket_timeout=10", watchdog_timeout=FAST_LEASE)
    other = make_client()
    loop = asyncio.get_running_loop()
    stopped = raised = taken = 0.0
    reached = asyncio.Event()

    async def holder() -> None:
        nonlocal stopped, raised
        try:
            async with cut_off.lock(name).guarded() as hold:
                reached.set()
                try:
                    await forever()
                finally:
                    stopped = loop.time()
        finally:
            raised = loop.time()
            assert hold.lost
            assert hold.confirmed_until <= stopped

    async def rival() -> None:
        nonlocal taken
        await other.lock(name).lock()
        taken = loop.time()
        await other.lock(name).unlock()

    try:
        task = asyncio.create_task(holder())
        await reached.wait()
        proxy.cut()
        rival_task = asyncio.create_task(rival())
        async with asyncio.timeout(LIMIT):
            with pytest.raises(aiolock.LockLostError):
                await task
            await rival_task
        assert 0 < stopped <= raised < taken
        assert raised - stopped < 0.1  # not waited on, the server unreachable
    finally:
        await proxy.restore("resume")
        await cut_off.aclose()


async def test_outside_cancel_wins(client: aiolock.Client, name: str) -> None:
    """A cancel from outside in the same iteration as a loss still raises CancelledError."""
    lock = client.lock(name)
    reached = asyncio.Event()

    async def body() -> None:
        async with lock.guarded():
            reached.set()
            await forever()

    task = asyncio.create_task(body())
    await reached.wait()
    assert await lock.force_unlock()  # lost: the guard's cancel is scheduled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # And a plain outside cancel releases as an unguarded block does.
    task = asyncio.create_task(body())
    reached.clear()
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: asyncio.sleep(0, not lock.statistics().hold_count))
    assert not await lock.is_locked()


async def test_nested_in_asyncio_timeout(client: aiolock.Client, name: str) -> None:
    lock = client.lock(name)
    async with asyncio.timeout(LIMIT):
        with pytest.raises(aiolock.LockLostError):
            await lose_inside(lock.guarded(), lock.force_unlock)
    # The outer timeout still works inside a guarded body that is not lost.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05), lock.guarded():
            await forever()
    assert not await lock.is_locked()


async def test_nested_in_anyio_cancel_scope(client: aiolock.Client, name: str) -> None:
    lock = client.lock(name)
    anyio = pytest.importorskip("anyio")  # with the fastapi extra's test dependencies
    with anyio.CancelScope(), pytest.raises(aiolock.LockLostError):
        await lose_inside(lock.guarded(), lock.force_unlock)
    with anyio.CancelScope() as scope:
        async with lock.guarded():
            scope.cancel()
            await forever()
    assert scope.cancelled_caught
    with anyio.move_on_after(0.05) as scope:
        async with lock.guarded():
            await forever()
    assert scope.cancelled_caught
    assert not await lock.is_locked()


async def test_task_group_in_and_around(client: aiolock.Client, name: str) -> None:
    lock = client.lock(name)

    async def in_body() -> None:
        async with lock.guarded(), asyncio.TaskGroup() as group:
            group.create_task(forever())
            await lock.force_unlock()
            await forever()

    # A TaskGroup in the body: its children are cancelled with it.
    with pytest.raises(aiolock.LockLostError):
        await in_body()

    # The guarded block in a TaskGroup's child: the group reports the loss.
    async def child() -> None:
        async with client.lock(name).guarded():
            await client.lock(name).force_unlock()
            await forever()

    async def around() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(child())
            group.create_task(forever())

    with pytest.raises(ExceptionGroup) as caught:
        await around()
    assert caught.group_contains(aiolock.LockLostError)


async def test_multilock_lost_with_any_member(client: aiolock.Client, name: str) -> None:
    a, b = client.lock(f"{name}:a"), client.lock(f"{name}:b")
    guarded = aiolock.MultiLock(a, b).guarded()
    with pytest.raises(aiolock.LockLostError):
        await lose_inside(guarded, b.force_unlock)
    hold = inside.hold_of(guarded)
    assert hold is not None
    assert hold.lost

    async def released() -> bool:
        return not await a.is_locked()

    await wait_until(released, limit=LIMIT)  # in the background


async def test_redlock_lost_below_a_majority(client: aiolock.Client, name: str) -> None:
    locks = [client.lock(f"{name}:{i}") for i in range(3)]
    guarded = aiolock.RedLock(*locks).guarded()

    async def lose() -> None:
        await locks[0].force_unlock()
        hold = inside.hold_of(guarded)
        assert hold is not None
        assert not hold.lost  # two of three still held
        await locks[1].force_unlock()
        assert hold.lost

    with pytest.raises(aiolock.LockLostError):
        await lose_inside(guarded, lose)

    async def released() -> bool:
        return not await locks[2].is_locked()

    await wait_until(released, limit=LIMIT)  # in the background


def test_drift_margin() -> None:
    assert drift_margin(30.0) == pytest.approx(0.312)


async def test_slow_renewals_stop_the_body_and_release_at_once(
    make_client: ClientFactory, proxy: FaultProxy, name: str
) -> None:
    """Renewals held up on the way (the link slow for them alone): the body stops at
    confirmed_until, and its release, not held up, frees the lock at once for a rival.

    The late renewal then finds the hold gone: nothing revives the guarded hold.
    """
    slow = aiolock.Client.from_url(proxy.url + "?socket_timeout=5", watchdog_timeout=FAST_LEASE)
    other = make_client()
    loop = asyncio.get_running_loop()
    stopped = taken = 0.0
    entered = asyncio.Event()
    delay = proxy.delay(FAST_LEASE * 2, script("lock_renew"))

    async def body() -> None:
        nonlocal stopped
        async with slow.lock(name).guarded() as hold:
            entered.set()
            try:
                await forever()
            finally:
                stopped = loop.time()
                assert hold.lost

    async def rival() -> None:
        nonlocal taken
        await other.lock(name).lock()
        taken = loop.time()
        await other.lock(name).unlock()

    try:
        task = asyncio.create_task(body())
        await entered.wait()
        rival_task = asyncio.create_task(rival())
        async with asyncio.timeout(LIMIT):
            with pytest.raises(aiolock.LockLostError):
                await task
            await rival_task
        assert 0 < stopped < taken
        # Released by the body's clean-up, not by the lease running out on the server.
        assert taken - stopped < FAST_LEASE / 2
    finally:
        delay.remove()
        await slow.aclose()


async def test_cancel_all_stops_every_guarded_body(client: aiolock.Client, name: str) -> None:
    """What aclose() calls first: every guarded body of the client is cancelled."""
    entered = [asyncio.Event(), asyncio.Event()]

    async def body(i: int) -> None:
        async with client.lock(f"{name}:{i}").guarded():
            entered[i].set()
            await forever()

    tasks = [asyncio.create_task(body(i)) for i in range(2)]
    for event in entered:
        await event.wait()
    guard = inside.engine(client).guard
    assert len(guard) == 2
    assert set(guard.cancel_all()) == set(tasks)
    for task in tasks:
        with pytest.raises(aiolock.LockLostError, match="closing"):
            await task
    assert not len(guard)

    async def released() -> bool:
        return not any([await client.lock(f"{name}:{i}").is_locked() for i in range(2)])

    await wait_until(released, limit=LIMIT)


async def test_handed_over_to_a_guarded_waiter(make_client: ClientFactory, name: str) -> None:
    """A guarded waiter handed the lock by a sibling's release is confirmed from that
    release's send time: it is not cancelled, and renewals carry it on."""
    client = make_client(watchdog_timeout=FAST_LEASE)
    loop = asyncio.get_running_loop()
    held, release = asyncio.Event(), asyncio.Event()

    async def sibling() -> None:
        async with client.lock(name):
            held.set()
            await release.wait()

    async def waiter() -> Hold:
        async with client.lock(name).guarded(wait=LIMIT) as hold:
            assert loop.time() < hold.confirmed_until
            first = hold.confirmed_until
            await wait_until(lambda: hold.confirmed_until > first, limit=LIMIT)
        return hold

    task = asyncio.create_task(sibling())
    await held.wait()
    guarded = asyncio.create_task(waiter())
    await wait_until(lambda: client.lock(name).statistics().tasks_waiting == 1)
    release.set()
    await task
    assert not (await guarded).lost


async def test_another_error_of_the_body_wins_with_the_loss_noted(
    client: aiolock.Client, name: str
) -> None:
    """Lost, and the body ends with an error of its own: that error goes on, the loss noted."""
    lock = client.lock(name)

    async def body() -> None:
        async with lock.guarded():
            try:
                await lock.force_unlock()  # lost: its watch hears the message at once
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise ValueError("the body's own") from None

    with pytest.raises(ValueError, match="the body's own") as caught:
        await body()
    assert any("was lost" in note for note in caught.value.__notes__)


async def test_a_guarded_block_is_entered_once(client: aiolock.Client, name: str) -> None:
    guarded = client.lock(name).guarded()
    async with guarded:
        with pytest.raises(RuntimeError, match="once"):
            await guarded.__aenter__()
    assert not await client.lock(name).is_locked()


async def test_bad_arguments_refused_before_io(offline: aiolock.Client, name: str) -> None:
    with pytest.raises(ValueError, match="wait"):
        offline.lock(name).guarded(wait=-1)
    with pytest.raises(ValueError, match="lease"):
        offline.lock(name).guarded(lease=0)
