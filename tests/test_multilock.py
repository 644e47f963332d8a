"""MultiLock and RedLock: all or nothing, a majority on independent servers, members given
back on every failure and cancellation, and a fixed order that never deadlocks.

The lock methods are in the conformance suite; here is what a composite adds.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

import aiolock
import aiolock._objects.members as aiolock_members
from aiolock._net.scripts import load_script
from aiolock.testing import LocalServer, start_local_server

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, script
from .helpers import FAST, Gate, cancel_at, gated_redis, quiesce, wait_until

LIMIT = 10.0


@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
async def test_bad_members_are_refused_at_once(offline: aiolock.Client, kind: Any) -> None:
    """No members, a non-handle, or one lock twice (one handle, or two of one lock)."""
    with pytest.raises(ValueError, match="needs at least one lock"):
        kind()
    with pytest.raises(TypeError, match="members must be lock handles, not str"):
        kind(offline.lock("a"), "b")
    lock = offline.lock("a")
    with pytest.raises(ValueError, match="got the lock 'a' twice"):
        kind(lock, lock)
    with pytest.raises(ValueError, match="got the lock 'a' twice"):
        kind(offline.lock("a"), offline.lock("a"))
    # The same name as another lock type, or for another owner, is another lock.
    kind(offline.lock("a"), offline.fair_lock("a"), offline.lock("a", owner="o"))
    composite = kind(offline.lock("a"), offline.lock("b"))
    with pytest.raises(ValueError, match="wait must be >= 0"):
        await composite.try_lock(wait=-1)
    with pytest.raises(ValueError, match="lease must be > 0"):
        await composite.lock(lease=0)


async def test_all_or_nothing(make_client: ClientFactory, raw: Redis, name: str) -> None:
    """One member held elsewhere: try_lock fails and keeps none of the others; members on
    different clients are taken by the calling task."""
    mine, other = make_client(), make_client()
    multi = aiolock.MultiLock(
        mine.lock(f"{name}:a"), other.lock(f"{name}:b"), mine.lock(f"{name}:c")
    )
    blocker = other.lock(f"{name}:c", owner="blocker")
    await blocker.lock()
    assert not await multi.try_lock()
    assert not await multi.try_lock(wait=0.05)
    assert await raw.exists(f"{name}:a", f"{name}:b") == 0
    await blocker.unlock()
    async with multi.acquired(wait=LIMIT):
        assert await raw.exists(f"{name}:a", f"{name}:b", f"{name}:c") == 3
        assert await multi.is_held_by_current_task()
    assert await raw.exists(f"{name}:a", f"{name}:b", f"{name}:c") == 0


async def test_opposite_orders_never_deadlock(client: aiolock.Client, name: str) -> None:
    """Two MultiLocks over the same locks, listed in opposite orders, taken by many tasks:
    the fixed order lets them all through (Redisson's MultiLock can deadlock here)."""
    a, b = f"{name}:a", f"{name}:b"
    forward = aiolock.MultiLock(client.lock(a), client.lock(b))
    backward = aiolock.MultiLock(client.lock(b), client.lock(a))
    done = 0

    async def worker(multi: aiolock.MultiLock) -> None:
        nonlocal done
        for _ in range(5):
            async with multi:
                await asyncio.sleep(0)
                done += 1

    async with asyncio.timeout(LIMIT * 3), asyncio.TaskGroup() as tg:
        for i in range(8):
            tg.create_task(worker(forward if i % 2 else backward))
    assert done == 40


async def test_unlock_tries_every_member(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A member lost meanwhile: unlock raises LockLostError, and still releases the others
    (Redisson's sync unlock stops at the first failure and leaves them locked)."""
    multi = aiolock.MultiLock(*(client.lock(f"{name}:{i}") for i in range(3)))
    await multi.lock()
    assert await client.lock(f"{name}:0").force_unlock()
    with pytest.raises(aiolock.LockLostError):
        await multi.unlock()
    assert await raw.exists(f"{name}:1", f"{name}:2") == 0


@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
async def test_a_cancelled_acquire_gives_back_what_it_took(
    kind: Any, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Cancelled at every loop iteration while taking its members at once (a MultiLock's
    last member, a RedLock's last two, are taken only once another client lets them go):
    CancelledError, and nothing kept, or enough held (all; a majority)."""
    mine, other = make_client(), make_client()
    names = [f"{name}:{i}" for i in range(3)]
    # owner=: the test task releases what the acquiring task took.
    composite: aiolock.MultiLock | aiolock.RedLock = kind(
        *(mine.lock(n, owner="multi") for n in names)
    )
    blocked = names[2:] if kind is aiolock.MultiLock else names[1:]
    blockers = [other.lock(n, owner="blocker") for n in blocked]
    for k in range(400):
        for blocker in blockers:
            await blocker.lock()

        letting_go: list[asyncio.Task[None]] = []

        async def take(letting_go: list[asyncio.Task[None]] = letting_go) -> bool:
            # The blockers let go as the acquire starts, in its first step; their unlocks
            # are awaited outside the task cancelled, so that the cancel lands in the
            # acquire or nowhere (one landing in a wait for them, after the acquire had
            # returned, would hide a completed acquire).
            letting_go.extend(asyncio.create_task(blocker.unlock()) for blocker in blockers)
            return await composite.try_lock(wait=LIMIT)

        task = asyncio.create_task(take())
        cancel_at(task, k)
        try:
            taken = await task
        except asyncio.CancelledError:
            taken = False
        for unlocking in letting_go:
            await unlocking
        await quiesce(mine)
        held = await raw.exists(*names)
        believed = sum(bool(m.statistics().hold_count) for m in inside.members_of(composite))
        assert held == believed, f"k={k}: {held} member(s) held, {believed} believed"
        if taken:
            assert held >= (3 if kind is aiolock.MultiLock else 2), f"k={k}"
            await composite.unlock()
            break
        assert held == 0, f"k={k}: {held} member(s) kept by a cancelled acquire"
    else:
        raise AssertionError("the acquire never completed before its cancel")
    assert k > 3


@pytest.fixture(scope="module")
def servers() -> Iterator[list[LocalServer]]:
    """Three independent servers for RedLock."""
    started = [start_local_server() for _ in range(3)]
    try:
        yield started
    finally:
        for server in started:
            server.close()


@pytest.fixture
async def red_clients(servers: list[LocalServer]) -> AsyncIterator[list[aiolock.Client]]:
    clients = [
        aiolock.Client.from_url(server.url, retry_attempts=0, retry_interval=0.01)
        for server in servers
    ]
    yield clients
    for client in clients:
        await client.aclose()


async def test_redlock_needs_a_majority(red_clients: list[aiolock.Client], uid: str) -> None:
    """One server's lock held by someone else: the RedLock holds the other two. Two held:
    it fails, and gives back the one it took."""
    name = f"red:{uid}"
    red = aiolock.RedLock(*(client.lock(name) for client in red_clients))
    first = red_clients[0].lock(name, owner="other")
    await first.lock()
    async with red.acquired(wait=LIMIT):
        assert await red.is_held_by_current_task()
        assert await red.hold_count() == 1
        assert not await red_clients[0].lock(name).is_held_by_current_task()
    second = red_clients[1].lock(name, owner="other")
    await second.lock()
    assert not await red.try_lock(wait=0.1)
    # A member's try still under way when the round failed was cancelled: its engine
    # undoes what it took, in the background.
    for client in red_clients:
        await quiesce(client)
    assert not await red_clients[2].lock(name).is_locked()
    await first.unlock()
    await second.unlock()


async def test_redlock_survives_a_server_down(
    servers: list[LocalServer], red_clients: list[aiolock.Client], uid: str
) -> None:
    """With one of three servers stopped, the RedLock is taken and released on the other
    two; its unlock does not fail for the member it never had."""
    name = f"red:{uid}"
    red = aiolock.RedLock(*(client.lock(name) for client in red_clients))
    servers[2].stop()
    try:
        async with red.acquired(wait=LIMIT):
            assert await red_clients[0].lock(name).is_held_by_current_task()
            assert await red_clients[1].lock(name).is_held_by_current_task()
        assert not await red_clients[0].lock(name).is_locked()
    finally:
        servers[2].start()


async def test_redlock_excludes_across_clients(
    servers: list[LocalServer], red_clients: list[aiolock.Client], uid: str
) -> None:
    """Two services with RedLocks over the same three servers never hold it at once."""
    name = f"red:{uid}"
    others = [aiolock.Client.from_url(server.url) for server in servers]
    try:
        mine = aiolock.RedLock(*(client.lock(name) for client in red_clients))
        theirs = aiolock.RedLock(*(client.lock(name) for client in others))
        inside = most = total = 0

        async def worker(red: aiolock.RedLock) -> None:
            nonlocal inside, most, total
            for _ in range(5):
                async with red:
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0)
                    total += 1
                    inside -= 1

        async with asyncio.timeout(LIMIT * 3), asyncio.TaskGroup() as tg:
            for i in range(6):
                tg.create_task(worker(mine if i % 2 else theirs))
        assert (total, most) == (30, 1)
    finally:
        for client in others:
            await client.aclose()


# -- through the fault proxy: one member's server unreachable, or a reply lost -------------


@pytest.fixture
async def proxied(proxy: FaultProxy, raw: Redis) -> AsyncIterator[aiolock.Client]:
    """A client whose connections go through the proxy; short timeouts, few retries.

    It takes ``raw`` so that it is closed (its unlock latches swept) before the leak check.
    """
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=1, retry_interval=0.05)
    yield client
    await client.aclose()


def three(direct: aiolock.Client, proxied: aiolock.Client, name: str) -> list[aiolock.Lock]:
    """Three members, the middle one (in the composites' order) through the proxy."""
    return [
        direct.lock(f"{name}:a", owner="c"),
        proxied.lock(f"{name}:b", owner="c"),
        direct.lock(f"{name}:c", owner="c"),
    ]


async def test_multilock_with_a_member_cut_off_fails_and_keeps_nothing(
    proxy: FaultProxy, proxied: aiolock.Client, client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A member's server unreachable for longer than every timeout: the acquire raises its
    error, the member taken before it is given back, and once the server is reachable
    again nothing of the attempt is left there either."""
    members = three(client, proxied, name)
    multi = aiolock.MultiLock(*members)
    async with proxy.partition():
        with pytest.raises((RedisError, OSError)):
            await multi.try_lock(wait=LIMIT)
        assert await raw.exists(f"{name}:a", f"{name}:c") == 0
    await quiesce(proxied)
    assert await raw.exists(f"{name}:b") == 0
    assert [m.statistics().hold_count for m in members] == [0, 0, 0]
    assert await multi.try_lock(wait=LIMIT)
    await multi.unlock()


async def test_redlock_waits_for_members_in_order_holding_none_after(
    client: aiolock.Client, name: str
) -> None:
    """Fewer than a majority free: the RedLock waits for the members not free one after
    another in the fixed order, holding none after the one it waits for (the free one
    after it is given back, and stays free meanwhile). Members waited for at once could
    make two tasks each hold one and wait for the other's for good: lock() has no bound."""
    names = [f"{name}:{i}" for i in range(3)]
    red = aiolock.RedLock(*(client.lock(n) for n in names))
    first, last = client.lock(names[0], owner="h"), client.lock(names[2], owner="h")
    await first.lock()
    await last.lock()

    async def take() -> bool:
        await red.lock()
        held = await red.is_held_by_current_task()
        await red.unlock()
        return held

    taking = asyncio.create_task(take())
    await wait_until(
        lambda: client.lock(names[0]).statistics().tasks_waiting == 1,
        what="the RedLock waiting for its first member",
    )
    middle = client.lock(names[1], owner="c")
    assert await middle.try_lock(wait=0)
    await middle.unlock()
    await first.unlock()
    async with asyncio.timeout(LIMIT):
        assert await taking
    await last.unlock()


async def test_multilock_lock_with_a_member_cut_off_raises_its_error(
    proxy: FaultProxy, proxied: aiolock.Client, client: aiolock.Client, raw: Redis, name: str
) -> None:
    """lock() with neither a wait nor a lease bounds no member's call: a member that fails
    still ends the round, at once, and the call raises its error holding nothing (it does
    not wait for the round's other members, nor for a bound there is none of)."""
    members = three(client, proxied, name)
    multi = aiolock.MultiLock(*members)
    async with proxy.partition():
        # The bound only turns a hang into a failure: the error comes after the proxied
        # client's own timeouts (0.3 s, one retry).
        async with asyncio.timeout(LIMIT):
            with pytest.raises((RedisError, OSError)):
                await multi.lock()
        assert await raw.exists(f"{name}:a", f"{name}:c") == 0
    await quiesce(proxied)
    assert await raw.exists(f"{name}:b") == 0
    assert [m.statistics().hold_count for m in members] == [0, 0, 0]


async def test_redlock_with_a_member_cut_off_holds_the_majority(
    proxy: FaultProxy, proxied: aiolock.Client, client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The same partition under a RedLock: held on the two reachable members, released
    without an error; the unreachable one is left with nothing once it answers again."""
    members = three(client, proxied, name)
    red = aiolock.RedLock(*members)
    async with proxy.partition():
        assert await red.try_lock(wait=LIMIT)
        assert await raw.exists(f"{name}:a", f"{name}:c") == 2
        await red.unlock()
        assert await raw.exists(f"{name}:a", f"{name}:c") == 0
    await quiesce(proxied)
    assert await raw.exists(f"{name}:b") == 0
    assert members[1].statistics().hold_count == 0


@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
async def test_a_members_lost_replies_count_once(
    kind: Any,
    *,
    proxy: FaultProxy,
    proxied: aiolock.Client,
    client: aiolock.Client,
    raw: Redis,
    name: str,
) -> None:
    """A member's acquire and release whose replies were lost are resent: one hold taken,
    one given back, nothing left."""
    members = three(client, proxied, name)
    composite = kind(*members)
    drop = proxy.drop_reply(script("lock_acquire"))
    assert await composite.try_lock(wait=LIMIT)
    assert drop.executed.is_set()
    assert await raw.hget(f"{name}:b", f"{proxied.id}:owner:c") == "1"
    drop = proxy.drop_reply(script("lock_release"))
    await composite.unlock()
    assert drop.executed.is_set()
    await quiesce(proxied)
    assert await raw.exists(*(m.name for m in members)) == 0


@pytest.mark.parametrize("cancel", [False, True], ids=["resent", "cancelled"])
@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
async def test_members_are_taken_at_once_for_the_calling_task(
    kind: Any,
    cancel: bool,
    *,
    proxy: FaultProxy,
    proxied: aiolock.Client,
    client: aiolock.Client,
    raw: Redis,
    name: str,
) -> None:
    """The members are asked at once: while the reply to one member's acquire is lost (its
    client resends after its socket timeout), the members after it are taken already.
    Then either the resend lands, and the calling task holds all three (its own holds: it
    releases them), or the call is cancelled mid-acquire, and nothing is left once the
    lost acquire has been undone."""
    names = [f"{name}:a", f"{name}:b", f"{name}:c"]
    members = [client.lock(names[0]), proxied.lock(names[1]), client.lock(names[2])]
    composite = kind(*members)
    drop = proxy.drop_reply(script("lock_acquire"))

    async def take() -> bool:
        if not await composite.try_lock(wait=LIMIT):
            return False
        # The calling task's holds, whichever task took each member.
        assert await composite.is_held_by_current_task()
        assert [m.statistics().hold_count for m in members] == [1, 1, 1]
        await composite.unlock()
        return True

    taking = asyncio.create_task(take())
    async with asyncio.timeout(LIMIT):
        await drop.executed.wait()
        # The member after the lost reply, in the composite's order, was not waited for.
        await wait_until(lambda: _exist(raw, names[2]), what="the last member taken")
    assert not taking.done()
    if cancel:
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
    else:
        assert await taking
    await quiesce(proxied)
    await quiesce(client)
    assert await raw.exists(*names) == 0
    assert [m.statistics().hold_count for m in members] == [0, 0, 0]


async def _exist(raw: Redis, key: str) -> bool:
    return bool(await raw.exists(key))


@pytest.fixture
async def hung(proxy: FaultProxy, raw: Redis) -> AsyncIterator[aiolock.Client]:
    """A client through the proxy with the defaults (no socket timeout given): while the
    proxy is cut, its server is as a frozen one, and a call to it waits for a long time."""
    client = aiolock.Client.from_url(proxy.url)
    yield client
    await client.aclose()


@pytest.mark.parametrize(("kind", "taken"), [(aiolock.RedLock, True), (aiolock.MultiLock, False)])
async def test_a_hung_member_costs_no_more_than_the_wait(
    kind: Any,
    taken: bool,
    *,
    proxy: FaultProxy,
    hung: aiolock.Client,
    client: aiolock.Client,
    raw: Redis,
    name: str,
) -> None:
    """One member's server frozen (connected, never answering): try_lock(wait=1, lease=5)
    returns within its bounds, a RedLock held on the other two, a MultiLock not held; the
    frozen member's acquire, cut off, is undone once the server answers again (s06)."""
    members = three(client, hung, name)
    composite = kind(*members)
    # Connected first: the freeze catches a live connection, not a connection attempt.
    assert not await members[1].is_locked()
    async with proxy.partition(mode="resume"):
        # A generous bound that proves "bounded, not hung": the call used to wait for the
        # frozen server until its connection gave up (30 s a try, by default).
        async with asyncio.timeout(LIMIT / 2):
            assert await composite.try_lock(wait=1, lease=5) is taken
        assert await raw.exists(f"{name}:a", f"{name}:c") == (2 if taken else 0)
        assert members[1].statistics().hold_count == 0
        if taken:
            await composite.unlock()
    # The frozen acquire arrives now, late, and is undone after it.
    await quiesce(hung)
    assert await raw.exists(*(m.name for m in members)) == 0
    assert await composite.try_lock(wait=LIMIT)
    await composite.unlock()


@pytest.fixture
def short_bound(monkeypatch: pytest.MonkeyPatch) -> float:
    """The composites' bound on a member's query or unlock, shortened to keep CI fast."""
    bound = 0.4
    monkeypatch.setattr(aiolock_members, "QUERY_CALL", bound)
    return bound


@pytest.mark.parametrize(("kind", "held"), [(aiolock.RedLock, True), (aiolock.MultiLock, False)])
async def test_a_hung_member_costs_queries_and_unlock_no_more_than_the_bound(
    kind: Any,
    held: bool,
    *,
    proxy: FaultProxy,
    hung: aiolock.Client,
    client: aiolock.Client,
    raw: Redis,
    name: str,
    short_bound: float,
) -> None:
    """Taken, then one member's server frozen: the queries answer within the bound, the
    frozen member counting as not held (a RedLock still held on the other two, a MultiLock
    not confirmed held); an outer cancel still raises; unlock() returns within the bound,
    and the frozen member's release lands once its server answers again (used to wait for
    the frozen server until its connection gave up: 30 s a try, by default)."""
    members = three(client, hung, name)
    composite = kind(*members)
    assert await composite.try_lock(lease=LIMIT * 3)
    async with proxy.partition(mode="resume"):
        async with asyncio.timeout(LIMIT / 2):
            assert await composite.is_held_by_current_task() is held
            assert await composite.is_locked() is held
            assert await composite.hold_count() == (1 if held else 0)
            lease = await composite.remaining_lease()
            assert lease is not None
            assert 0 < lease <= LIMIT * 3
            # Cancelled while it waits for the frozen member: CancelledError, nothing left.
            asking = asyncio.create_task(composite.hold_count())
            cancel_at(asking, 3)
            with pytest.raises(asyncio.CancelledError):
                await asking
            await composite.unlock()
        assert await raw.exists(f"{name}:a", f"{name}:c") == 0
    # The frozen member's release arrives now and is finished in the background.
    await quiesce(hung)
    assert await raw.exists(*(m.name for m in members)) == 0
    assert members[1].statistics().hold_count == 0
    assert await composite.try_lock(wait=LIMIT)
    assert await composite.is_held_by_current_task()
    assert await composite.hold_count() == 1
    await composite.unlock()


async def test_queries_ask_about_the_calling_tasks_holds(client: aiolock.Client, name: str) -> None:
    """The members are asked at once, each in a task of its own, about the caller's holds:
    held by the task that took it, by no other task, and by an owner= holder."""
    red = aiolock.RedLock(*(client.lock(f"{name}:{n}") for n in "abc"))
    assert await red.try_lock()
    await red.lock()
    assert await red.is_held_by_current_task()
    assert await red.hold_count() == 2
    assert not await asyncio.create_task(red.is_held_by_current_task())
    assert await asyncio.create_task(red.hold_count()) == 0
    owned = aiolock.MultiLock(*(client.lock(f"{name}:o{n}", owner="o") for n in "ab"))
    await owned.lock()
    assert await asyncio.create_task(owned.is_held_by_current_task())
    await owned.unlock()
    await red.unlock()
    await red.unlock()
    assert not await red.is_locked()


async def test_a_query_every_member_fails_leaves_no_error_unread(
    offline: aiolock.Client, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every member's query fails (no server): the first error is raised and every other
    member's is read too. An error never read is logged as "Task exception was never
    retrieved" whenever its task is collected, and on Python 3.11 that log, formatted
    inside a collection that ``ast.parse`` triggered, broke every later ``ast.parse`` of the
    process (pytest's assertion rewriting: "AST constructor recursion depth mismatch")."""
    multi = aiolock.MultiLock(offline.lock(f"{name}:a"), offline.lock(f"{name}:b"))
    with pytest.raises(RedisError):
        await multi.is_locked()
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> AsyncIterator[tuple[aiolock.Client, Gate]]:
    """A client whose chosen script call's reply can be held back."""
    # Loaded beforehand: a held NOSCRIPT reply would hold back the wrong send.
    await raw.script_load(load_script("lock_release").text)
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    yield client, gate
    await client.aclose()
    await redis.aclose()


@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
@pytest.mark.parametrize("cancel", [False, True])
async def test_unlock_gives_back_the_members_at_once(
    kind: Any,
    cancel: bool,
    *,
    gated: tuple[aiolock.Client, Gate],
    client: aiolock.Client,
    raw: Redis,
    name: str,
) -> None:
    """One member's release held unanswered: the others are released meanwhile (members
    far apart cost one round trip, not one each). Cancelled then, unlock() raises
    CancelledError and the held release still lands: nothing is left held or believed."""
    slow, gate = gated
    # owner=: the unlock runs in a task of its own.
    members = [
        client.lock(f"{name}:a", owner="c"),
        client.lock(f"{name}:b", owner="c"),
        slow.lock(f"{name}:c", owner="c"),  # released first, when one after another
    ]
    composite = kind(*members)
    assert await composite.try_lock()
    gate.arm("lock_release")
    unlocking = asyncio.create_task(composite.unlock())
    async with asyncio.timeout(LIMIT):
        await gate.sent.wait()
    await wait_until(
        lambda: _none_exist(raw, f"{name}:a", f"{name}:b"), what="the other members released"
    )
    assert not unlocking.done()
    if cancel:
        unlocking.cancel()
    gate.release.set()
    if cancel:
        with pytest.raises(asyncio.CancelledError):
            await unlocking
    else:
        await unlocking
    await quiesce(slow)
    assert await raw.exists(*(m.name for m in members)) == 0
    assert all(m.statistics().hold_count == 0 for m in members)
    assert await composite.try_lock()
    await composite.unlock()


async def _none_exist(raw: Redis, *keys: str) -> bool:
    return await raw.exists(*keys) == 0


@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
async def test_unlock_cancelled_at_every_iteration_still_releases_every_member(
    kind: Any, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Cancelled at any loop iteration, unlock() raises CancelledError or returns, and every
    member is released all the same, as this client believes."""
    mine, other = make_client(), make_client()
    # owner=: the unlock runs in a task of its own.
    members = [
        mine.lock(f"{name}:a", owner="c"),
        other.lock(f"{name}:b", owner="c"),
        mine.lock(f"{name}:c", owner="c"),
    ]
    composite = kind(*members)
    for k in range(200):
        assert await composite.try_lock()
        task = asyncio.create_task(composite.unlock())
        cancel_at(task, k)
        try:
            await task
            done = True
        except asyncio.CancelledError:
            done = False
        await quiesce(mine)
        await quiesce(other)
        assert await raw.exists(*(m.name for m in members)) == 0, f"k={k}"
        assert all(m.statistics().hold_count == 0 for m in members), f"k={k}"
        if done:
            break
    else:
        raise AssertionError("the unlock never completed before its cancel")
    assert k > 2


async def test_redlock_members_tried_at_once_share_the_whole_validity(
    proxy: FaultProxy, client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The first round tries every member at once: each try may take the whole validity,
    not a third of it as if they were asked one after another. One member held by someone
    else, one 0.4 s away: the majority (near + far) answers in 0.4 s, well within a 1 s
    lease; cut at (1 s - drift) / 3 = 0.33 s the far try never counted, and the RedLock
    was never acquired (issue 36 b8)."""
    # Through the proxy with the default timeouts (a 0.4 s reply is no fault).
    proxied = aiolock.Client.from_url(proxy.url)
    try:
        near = client.lock(f"{name}:a")
        far = proxied.lock(f"{name}:b")
        busy = client.lock(f"{name}:c", owner="busy")
        await busy.lock()
        assert await far.try_lock(wait=0)  # connected, its script loaded
        await far.unlock()
        red = aiolock.RedLock(near, far, client.lock(f"{name}:c"))
        with proxy.delay(0.4):
            assert await red.try_lock(wait=3, lease=1.0)
            assert far.statistics().hold_count == near.statistics().hold_count == 1
            await red.unlock()
        await busy.unlock()
    finally:
        await proxied.aclose()
