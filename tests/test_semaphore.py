"""The semaphore: Redisson's RSemaphore layout and messages, waiting, and every mutation made
exactly once under cancellation and resends.

The cancellation sweep here cancels each call at every event-loop iteration it spans (as
``sweep.py`` does for the locks) and checks, once the client is quiet, that the permits in
Redis are exactly what the calls that returned took and gave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.waiting import WaitingRoom
from aiolock._net.scripts import Script
from aiolock._objects.semaphore import SemaphoreState

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, script
from .helpers import FAST, cancel_at, gated_redis, quiesce, wait_until, watch_script_runs

LIMIT = 10.0

# Redisson's release, restated from redisson-spec-2.md 2.2 (a Java service's view).
_REDISSON_RELEASE = """
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call('publish', KEYS[2], value)
"""


def channel(name: str) -> str:
    return f"redisson_sc:{{{name}}}"


async def permits(raw: Redis, name: str) -> int:
    value = await raw.get(name)
    return int(value) if value is not None else 0


async def test_layout_and_messages(client: aiolock.Client, raw: Redis, name: str) -> None:
    """The value is a decimal string of available permits; every increase publishes the new
    count on redisson_sc:{name}; taking publishes nothing."""
    sem = client.semaphore(name)
    async with raw.pubsub() as pubsub:
        await pubsub.subscribe(channel(name))
        assert (await pubsub.get_message(timeout=LIMIT))["type"] == "subscribe"
        assert await sem.try_set_permits(3)
        assert not await sem.try_set_permits(5)
        assert await raw.get(name) == "3"
        assert await sem.try_acquire(2)
        await sem.release()
        await sem.add_permits(4)
        await raw.publish(channel(name), "end")
        seen = []
        while (message := await pubsub.get_message(timeout=LIMIT)) is not None:
            seen.append(message["data"])
            if message["data"] == "end":
                break
    assert seen == ["3", "2", "6", "end"]
    assert await sem.available_permits() == 6
    await raw.delete(name)


async def test_take_and_give(client: aiolock.Client, raw: Redis, name: str) -> None:
    """try_acquire takes only what is there; several permits at once; an unset semaphore
    has none."""
    sem = client.semaphore(name)
    assert await sem.available_permits() == 0
    assert not await sem.try_acquire()
    assert await sem.try_set_permits(2)
    assert not await sem.try_acquire(3)
    assert await sem.try_acquire(2)
    assert not await sem.try_acquire(wait=0.05)
    await sem.release(2)
    assert await permits(raw, name) == 2
    async with sem:
        assert await permits(raw, name) == 1
    assert await permits(raw, name) == 2
    await raw.delete(name)


async def test_try_set_zero_then_release(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Permits may be set to 0 and released past what was set, as in Redisson."""
    sem = client.semaphore(name)
    assert await sem.try_set_permits(0)
    await sem.release(2)
    assert await sem.available_permits() == 2
    await sem.add_permits(-3)
    assert await sem.available_permits() == -1
    await raw.delete(name)


async def test_a_waiter_is_woken_by_another_clients_release(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A waiter subscribed to the channel gets the permit a release of another client (or
    of a Java service, restated) gives."""
    a, b = make_client(), make_client()
    assert await a.semaphore(name).try_set_permits(0)
    waiting = b.semaphore(name)
    first = asyncio.create_task(waiting.try_acquire(wait=LIMIT))
    await wait_until(lambda: inside.waiting_room(b).waiting(name) == 1)
    await a.semaphore(name).release()
    async with asyncio.timeout(LIMIT):
        assert await first
    second = asyncio.create_task(waiting.try_acquire(wait=LIMIT))
    await wait_until(lambda: inside.waiting_room(b).waiting(name) == 1)
    java_release = raw.register_script(_REDISSON_RELEASE)
    await java_release(keys=[name, channel(name)], args=[1])
    async with asyncio.timeout(LIMIT):
        assert await second
    assert await permits(raw, name) == 0
    await raw.delete(name)


async def test_a_wake_up_too_small_for_one_waiter_goes_to_the_next(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A release of 1 wakes the oldest waiter, which needs 3: it passes the wake-up on to
    the waiter that needs 1, instead of both waiting for the next re-check."""
    sem = client.semaphore(name)
    assert await sem.try_set_permits(0)
    big = asyncio.create_task(sem.try_acquire(3, wait=LIMIT * 3))
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)
    small = asyncio.create_task(sem.try_acquire(1, wait=LIMIT * 3))
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 2)
    await sem.release()
    async with asyncio.timeout(LIMIT):
        assert await small
    assert not big.done()
    await sem.release(3)
    async with asyncio.timeout(LIMIT):
        assert await big
    assert await permits(raw, name) == 0
    await raw.delete(name)


async def test_releases_in_a_row_wake_only_as_many_as_permits_left(offline: aiolock.Client) -> None:
    """Redisson's release publishes the count available after it: releases of one permit
    in a row publish "1", "2", "3". Each message wakes only the waiters its count leaves
    for, less those woken already and yet to try: three in all, not 1 + 2 + 3 (each one
    woken for nothing costs a script)."""
    state = SemaphoreState(inside.settings(offline), "s")
    room = WaitingRoom()
    waiters = [
        room.add(state.chan, state.wake_count, shared=False, counts_available=True)
        for _ in range(8)
    ]
    for count in (b"1", b"2", b"3"):
        room.deliver(state.chan, count)
    assert [w.event.is_set() for w in waiters] == [True] * 3 + [False] * 5
    # One of them has tried (its waiter gone), and the count available is 3 again.
    room.remove(state.chan, waiters[0], leaving=False)
    room.deliver(state.chan, b"3")
    assert [w.event.is_set() for w in waiters[1:]] == [True] * 3 + [False] * 4


def _runs(monkeypatch: pytest.MonkeyPatch, name: str) -> list[str]:
    """The scripts sent on ``name`` from now on: a list that grows as they are sent."""
    sent: list[str] = []

    def started(script: Script, keys: list[str]) -> None:
        if keys and keys[0] == name:
            sent.append(script.name)

    watch_script_runs(monkeypatch, started)
    return sent


async def test_a_task_that_gives_back_and_takes_again_queues_behind_a_waiter(
    client: aiolock.Client, raw: Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No barging: a task that releases and takes again at once goes after the task waiting,
    and no take runs for nothing (the woken waiter's finds the permit there)."""
    sem = client.semaphore(name)
    assert await sem.try_set_permits(1)
    await sem.acquire()
    order: list[str] = []

    async def waiter() -> None:
        async with sem:
            order.append("waiter")

    waiting = asyncio.create_task(waiter())
    await wait_until(
        lambda: inside.waiting_room(client).has_waiters(channel(name)), what="waiter in line"
    )
    await wait_until(lambda: not inside.waiting_room(client).waiters(channel(name))[0].trying)
    sent = _runs(monkeypatch, name)
    await sem.release()
    async with sem:  # straight back: before, it took the permit the release woke for
        order.append("releaser")
    await waiting
    assert order == ["waiter", "releaser"]
    # The release, the waiter's take and release, the releaser's take and release: no
    # take for nothing (before, the releaser's took the permit and the waiter's ran empty).
    assert sent == [
        "semaphore_add",
        "semaphore_acquire",
        "semaphore_add",
        "semaphore_acquire",
        "semaphore_add",
    ]
    assert await permits(raw, name) == 1
    await raw.delete(name)


async def test_a_take_that_leaves_permits_lets_in_the_call_queued_behind_it(
    make_client: ClientFactory, raw: Redis, redis_url: str, name: str
) -> None:
    """A call queued behind a waiter whose take is in flight, and the message of the permits
    came before it queued: the take's reply says what it left, and the call gets in without
    waiting for a message (none will come) or the re-check seconds later."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    try:
        sem = client.semaphore(name)
        assert await sem.try_set_permits(0)
        ahead = asyncio.create_task(sem.try_acquire(1, wait=LIMIT))
        await wait_until(
            lambda: inside.waiting_room(client).has_waiters(channel(name)), what="in line"
        )
        await wait_until(lambda: not inside.waiting_room(client).waiters(channel(name))[0].trying)
        gate.arm("semaphore_acquire")
        await make_client().semaphore(name).release(2)
        async with asyncio.timeout(LIMIT):
            await gate.sent.wait()
        await wait_until(lambda: _permits_now(raw, name, 1), what="the take ran")
        behind = asyncio.create_task(sem.try_acquire(1, wait=LIMIT))
        await wait_until(
            lambda: inside.waiting_room(client).waiting(name) == 2, what="queued behind"
        )
        gate.release.set()
        async with asyncio.timeout(3):  # the re-check is 5 s away
            assert await ahead
            assert await behind
        assert await permits(raw, name) == 0
    finally:
        await client.aclose()
        await redis.aclose()
    await raw.delete(name)


async def test_a_take_a_message_counted_on_passes_its_wake_up_on(
    make_client: ClientFactory, raw: Redis, redis_url: str, name: str
) -> None:
    """A release's message comes while a woken waiter's take is in flight, and counts on it
    for the permit; but the take ran before that release and took an earlier one. The
    waiter passes the wake-up on to the next waiter, which takes the permit at once."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    other = make_client().semaphore(name)
    try:
        sem = client.semaphore(name)
        assert await sem.try_set_permits(0)
        first = asyncio.create_task(sem.try_acquire(1, wait=LIMIT))
        await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1, what="first waits")
        await wait_until(lambda: _parked(client, name, 1), what="first parked")
        second = asyncio.create_task(sem.try_acquire(1, wait=LIMIT))
        await wait_until(lambda: _parked(client, name, 2), what="second parked")
        gate.arm("semaphore_acquire")
        await other.release()  # wakes the first, whose take is held
        async with asyncio.timeout(LIMIT):
            await gate.sent.wait()
        await wait_until(lambda: _permits_now(raw, name, 0), what="the take ran")
        await other.release()  # its message counts on the take in flight
        await wait_until(lambda: _counted_on(client, name), what="the message came")
        gate.release.set()
        async with asyncio.timeout(3):  # the re-check is 5 s away
            assert await first
            assert await second
        assert await permits(raw, name) == 0
    finally:
        await client.aclose()
        await redis.aclose()
    await raw.delete(name)


async def test_a_call_does_not_queue_behind_a_waiter_that_found_too_few(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Two permits, a waiter for three: a call for one takes one at once rather than queue
    behind it (no message would come to wake it)."""
    sem = client.semaphore(name)
    assert await sem.try_set_permits(2)
    big = asyncio.create_task(sem.try_acquire(3, wait=LIMIT))
    await wait_until(lambda: _parked(client, name, 1), what="the big waiter parked")
    async with asyncio.timeout(3):  # the re-check is 5 s away
        assert await sem.try_acquire(1, wait=LIMIT)
    assert not big.done()
    await sem.release(2)
    async with asyncio.timeout(LIMIT):
        assert await big
    assert await permits(raw, name) == 0
    await raw.delete(name)


async def _permits_now(raw: Redis, name: str, count: int) -> bool:
    return await permits(raw, name) == count


def _parked(client: aiolock.Client, name: str, count: int) -> bool:
    waiters = inside.waiting_room(client).waiters(channel(name))
    return len(waiters) == count and not any(w.trying for w in waiters)


def _counted_on(client: aiolock.Client, name: str) -> bool:
    return any(
        w.trying and w.event.is_set() for w in inside.waiting_room(client).waiters(channel(name))
    )


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda s: s.acquire(0), ValueError, "permits must be >= 1, got 0"),
        (lambda s: s.try_acquire(-1), ValueError, "permits must be >= 1, got -1"),
        (lambda s: s.release(0), ValueError, "permits must be >= 1, got 0"),
        (lambda s: s.try_set_permits(-1), ValueError, "permits must be >= 0, got -1"),
        (lambda s: s.acquire(True), TypeError, "permits must be an int, not bool"),
        (lambda s: s.release(1.0), TypeError, "permits must be an int, not float"),
        (lambda s: s.add_permits("2"), TypeError, "permits must be an int, not str"),
        (lambda s: s.try_acquire(1, wait=-1), ValueError, "wait must be >= 0"),
    ],
)
async def test_bad_input_is_refused_before_any_io(
    offline: aiolock.Client, call: Callable[[Any], Awaitable[object]], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        await call(offline.semaphore("s"))


async def test_resends_take_and_give_once(proxy: FaultProxy, raw: Redis, name: str) -> None:
    """A take, a release and a try_set whose replies were lost are resent, and each counts
    once (Redisson's release, resent, adds its permits twice)."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=2, retry_interval=0.05)
    try:
        sem = client.semaphore(name)
        drop = proxy.drop_reply(script("semaphore_try_set"))
        assert await sem.try_set_permits(3)
        assert drop.executed.is_set()
        drop = proxy.drop_reply(script("semaphore_acquire"))
        assert await sem.try_acquire(2)
        assert drop.executed.is_set()
        assert await permits(raw, name) == 1
        drop = proxy.drop_reply(script("semaphore_add"))
        await sem.release(2)
        assert drop.executed.is_set()
        assert await permits(raw, name) == 3
    finally:
        await client.aclose()
    await raw.delete(name)


async def sweep(
    client: aiolock.Client,
    raw: Redis,
    name: str,
    call: Callable[[], Coroutine[Any, Any, object]],
    effect: Callable[[object], int],
    *,
    before: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Cancel ``call`` at k = 0, 1, 2, ... until it completes first; after each case the
    permits must have moved by exactly ``effect(result)`` (``CANCELLED`` if it raised
    CancelledError). Returns how many cases ran.
    """
    for k in range(400):
        if before is not None:
            await before()
        start = await permits(raw, name)
        task = asyncio.create_task(call())
        cancel_at(task, k)
        try:
            result: object = await task
        except asyncio.CancelledError:
            result = CANCELLED
        await quiesce(client)
        assert await permits(raw, name) - start == effect(result), f"k={k}, result={result!r}"
        assert inside.waiting_room(client).waiting(name) == 0, f"k={k}: a waiter left counted"
        if result is not CANCELLED:
            return k + 1
    raise AssertionError("the call never completed before its cancel")


CANCELLED = object()


async def test_cancellation_sweep(client: aiolock.Client, raw: Redis, name: str) -> None:
    """try_acquire (free, and woken by a release), release, add_permits and try_set_permits,
    each cancelled at every loop iteration: a take cancelled keeps nothing, a release or an
    add is made once whether cancelled or not, and no waiter stays counted."""
    sem = client.semaphore(name)
    assert await sem.try_set_permits(1000)
    cases = await sweep(
        client, raw, name, lambda: sem.try_acquire(2), lambda r: -2 if r is True else 0
    )
    cases += await sweep(client, raw, name, lambda: sem.release(2), lambda r: 2)
    cases += await sweep(client, raw, name, lambda: sem.add_permits(3), lambda r: 3)

    # Woken: the semaphore is empty, another task releases one permit at once.
    await raw.set(name, 0)

    async def woken() -> bool:
        releaser = asyncio.create_task(sem.release(1))
        try:
            return await sem.try_acquire(1, wait=LIMIT)
        finally:
            await releaser

    async def reset() -> None:
        await raw.set(name, 0)

    cases += await sweep(client, raw, name, woken, lambda r: 0 if r is True else 1, before=reset)

    # Queued: a task of the client waits already, so the call queues behind it untried; a
    # release of two lets both in (the call through the take of the one ahead, or the
    # message). Cancelled, it takes nothing and its wake-up goes on: the one ahead gets in.
    ahead: list[asyncio.Task[bool]] = []

    async def waiter_ahead() -> None:
        await raw.set(name, 0)
        ahead.append(asyncio.create_task(sem.try_acquire(1, wait=LIMIT)))
        await wait_until(
            lambda: inside.waiting_room(client).has_waiters(channel(name)), what="in line"
        )

    async def queued() -> bool:
        releaser = asyncio.create_task(sem.release(2))
        try:
            return await sem.try_acquire(1, wait=LIMIT)
        finally:
            await releaser
            async with asyncio.timeout(LIMIT):
                assert await ahead[-1]

    cases += await sweep(
        client, raw, name, queued, lambda r: 0 if r is True else 1, before=waiter_ahead
    )
    assert cases >= 8
    await raw.delete(name)


# Redisson's drainPermits, restated from redisson-spec-2.md 2.2 (a Java service's view).
_REDISSON_DRAIN = """
local value = redis.call('get', KEYS[1])
if value == false then
    return 0
end
redis.call('set', KEYS[1], 0)
return tonumber(value)
"""


@pytest.mark.parametrize("start", [None, 5, -2, "ttl"])
async def test_drain_and_delete_as_redisson(
    client: aiolock.Client, raw: Redis, name: str, start: int | str | None
) -> None:
    """drain_permits answers and leaves what Redisson's does (an absent key stays absent, a
    TTL is dropped, a negative count is answered as it is); delete() answers whether the
    semaphore existed, and publishes nothing."""
    twin = f"{name}:java"
    for key in (name, twin):
        if start == "ttl":
            await raw.set(key, 7, px=60_000)
        elif start is not None:
            await raw.set(key, start)
    java_drain = raw.register_script(_REDISSON_DRAIN)
    expected = await java_drain(keys=[twin])
    sem = client.semaphore(name)
    assert await sem.drain_permits() == expected
    assert await raw.get(name) == await raw.get(twin)
    assert await raw.pttl(name) == await raw.pttl(twin)
    assert await sem.drain_permits() == 0
    async with raw.pubsub() as pubsub:
        await pubsub.subscribe(channel(name))
        assert (await pubsub.get_message(timeout=LIMIT))["type"] == "subscribe"
        assert await sem.delete() is (start is not None)
        assert await sem.delete() is False
        assert await pubsub.get_message(timeout=0.05) is None
    assert await raw.exists(name) == 0
    await raw.delete(twin)


async def test_acquired(client: aiolock.Client, raw: Redis, name: str) -> None:
    """acquired() takes its permits and gives them back on exit, also when the body raised;
    LockTimeoutError once its wait ran out, having taken nothing."""
    sem = client.semaphore(name)
    assert await sem.try_set_permits(3)
    async with sem.acquired(2) as held:
        assert held is sem
        assert await permits(raw, name) == 1
        with pytest.raises(aiolock.LockTimeoutError, match=r"within 0\.05 s"):
            async with sem.acquired(2, wait=0.05):
                pass
        assert await permits(raw, name) == 1
    assert await permits(raw, name) == 3
    seen = []

    async def body_raises() -> None:
        async with sem.acquired(3, wait=0):
            seen.append(await permits(raw, name))
            raise KeyError("body")

    with pytest.raises(KeyError):
        await body_raises()
    assert seen == [0]
    assert await permits(raw, name) == 3
    with pytest.raises(ValueError, match="permits must be >= 1, got 0"):
        sem.acquired(0)
    await raw.delete(name)


async def test_lifecycle_cancellation_sweep(client: aiolock.Client, raw: Redis, name: str) -> None:
    """drain_permits cancelled at every loop iteration takes nothing (what it drained comes
    back); an acquired() block cancelled anywhere, in its acquire, body or exit, leaves the
    permits as they were."""
    sem = client.semaphore(name)

    async def five() -> None:
        await raw.set(name, 5)

    cases = await sweep(
        client,
        raw,
        name,
        sem.drain_permits,
        lambda r: 0 if r is CANCELLED else -int(r),  # type: ignore[call-overload]
        before=five,
    )

    async def block() -> None:
        async with sem.acquired(2):
            await asyncio.sleep(0)

    cases += await sweep(client, raw, name, block, lambda r: 0, before=five)
    assert cases >= 6
    await raw.delete(name)
