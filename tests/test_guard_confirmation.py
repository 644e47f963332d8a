"""The guard's deadline is never later than the server's expiry (issue 35: c1, c5, c6, c7, c8).

Every call that sets a hold's expiry (an acquire or re-entry, ``extend()``, a renewal, an
unlock's re-applied lease) moves ``confirmed_until`` with it, both ways, and the guard
fires at the deadline it gives: checked against the key's PTTL read on the server, for
every lock kind that extends and re-enters. And a body parked at an await when its
deadline passes during a stalled loop resumes with the cancel, never with the await's
result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import start_local_server

from . import inside
from .conftest import ClientFactory
from .helpers import wait_until

LIMIT = 10.0
# A short watchdog lease: renewals every 0.3 s.
FAST_LEASE = 0.9

Kind = Callable[[aiolock.Client, str], Any]

# Kinds whose hold is the key's expiry (a read hold's own timeout key is what ends it; its
# hash keeps the longest reader's lease: see test_read_extend_shorter below).
KINDS: dict[str, Kind] = {
    "lock": lambda c, n: c.lock(n),
    "fair": lambda c, n: c.fair_lock(n),
    "write": lambda c, n: c.read_write_lock(n).write_lock(),
    "fair-write": lambda c, n: c.fair_read_write_lock(n).write_lock(),
    "fenced": lambda c, n: c.fenced_lock(n),
    "spin": lambda c, n: c.spin_lock(n),
}


async def server_expiry(raw: Redis, key: str) -> float:
    """The key's expiry on this loop's clock, at its earliest (PTTL runs after the send)."""
    sent = asyncio.get_running_loop().time()
    pttl = await raw.pttl(key)
    assert pttl > 0, f"{key!r} has no lease (PTTL {pttl})"
    return sent + pttl / 1000


def key_of(lock: Any) -> str:
    """The key whose expiry ends the hold (a fair read-write lock's is aiolock's own)."""
    return str(inside.key_of(lock))


async def assert_not_later(raw: Redis, key: str, hold: aiolock.Hold) -> None:
    """The guard's deadline is not later than the server's expiry."""
    expiry = await server_expiry(raw, key)
    assert hold.confirmed_until <= expiry, (
        f"guard deadline {hold.confirmed_until:.3f} later than the expiry {expiry:.3f}"
    )


async def lost_within(body: Callable[[aiolock.Hold], Any], guarded: Any) -> aiolock.Hold:
    """Run ``body`` in ``guarded``; the block must raise LockLostError within LIMIT."""
    seen: list[aiolock.Hold] = []

    async def run() -> None:
        async with guarded as hold:
            seen.append(hold)
            await body(hold)
            await asyncio.Event().wait()

    with pytest.raises(aiolock.LockLostError):
        await asyncio.wait_for(run(), LIMIT)
    return seen[0]


async def shorten_by(how: str, lock: Any, lease: float) -> None:
    """Set ``lease`` on the calling task's hold: by ``extend()``, or by a re-entry."""
    if how == "extend":
        await lock.extend(lease)
    elif isinstance(lock, aiolock.FencedLock):
        await lock.lock_and_get_token(lease=lease)
    else:
        await lock.lock(lease=lease)


@pytest.mark.parametrize("how", ["extend", "reentry"])
@pytest.mark.parametrize("lease", [None, 20.0], ids=["watchdog", "lease"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_shorter_lease_moves_the_deadline(
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    *,
    kind: str,
    lease: float | None,
    how: str,
) -> None:
    """c1, c5: extend() or a re-entry to a shorter lease: the deadline follows at once (the
    guard re-armed for it), and the body stops."""
    client = make_client(watchdog_timeout=6)
    lock = KINDS[kind](client, name)

    async def shorten(hold: aiolock.Hold) -> None:
        await shorten_by(how, lock, 0.4)
        await assert_not_later(raw, key_of(lock), hold)

    hold = await lost_within(shorten, lock.guarded(lease=lease))
    assert hold.lost


@pytest.mark.parametrize("kind", KINDS)
async def test_renewal_after_a_longer_reentry(
    make_client: ClientFactory, raw: Redis, name: str, kind: str
) -> None:
    """c8: a re-entry with a longer lease, then a renewal sets the watchdog's lease again.

    The renewal's answer is the deadline, not the longer lease it replaced.
    """
    client = make_client(watchdog_timeout=FAST_LEASE)
    lock = KINDS[kind](client, name)
    rounds: list[object] = []
    client.add_listener(
        lambda event: (
            rounds.append(event) if isinstance(event, aiolock.events.RenewalRound) else None
        )
    )
    async with lock.guarded() as hold:
        if kind == "fenced":
            await lock.lock_and_get_token(lease=12)
        else:
            await lock.lock(lease=12)
        # The re-entry set 12 s; the next round sets the watchdog's lease again.
        seen = len(rounds)
        await wait_until(lambda: len(rounds) > seen + 1, limit=LIMIT)
        await assert_not_later(raw, key_of(lock), hold)
        assert hold.confirmed_until < asyncio.get_running_loop().time() + FAST_LEASE
        await lock.unlock()


@pytest.mark.parametrize("kind", KINDS)
async def test_extend_longer_is_no_false_loss(
    make_client: ClientFactory, raw: Redis, name: str, kind: str
) -> None:
    """c6: guarded(lease=2) then extend(20): confirmed on to the new lease, not cut at 2 s."""
    client = make_client(watchdog_timeout=6)
    lock = KINDS[kind](client, name)
    loop = asyncio.get_running_loop()
    async with lock.guarded(lease=2) as hold:
        await lock.extend(20)
        assert hold.confirmed_until > loop.time() + 10
        await assert_not_later(raw, key_of(lock), hold)
    assert not hold.lost


async def test_unlock_of_a_longer_reentry_reapplies_the_watchdog_lease(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """An unlock of a re-entry re-applies the remaining holds' lease: the deadline follows."""
    client = make_client(watchdog_timeout=FAST_LEASE)
    lock = client.lock(name)
    async with lock.guarded() as hold:
        await lock.lock(lease=30)
        assert hold.confirmed_until > asyncio.get_running_loop().time() + 20
        await lock.unlock()  # the outer watchdog hold remains: the watchdog's lease again
        await assert_not_later(raw, key_of(lock), hold)
        assert hold.confirmed_until < asyncio.get_running_loop().time() + FAST_LEASE


async def test_multilock_member_extended_shorter(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A MultiLock's deadline follows a member whose lease was shortened."""
    client = make_client(watchdog_timeout=6)
    first, second = client.lock(f"{name}:a"), client.lock(f"{name}:b")
    multi = aiolock.MultiLock(first, second)

    async def shorten(hold: aiolock.Hold) -> None:
        await second.extend(0.4)
        await assert_not_later(raw, f"{name}:b", hold)

    await lost_within(shorten, multi.guarded(lease=20))


async def test_leader_term_extended_shorter(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """c1 for a leader's term: its lock extended shorter ends the term before it expires."""
    client = make_client(watchdog_timeout=6)
    leader = client.leader(name)

    async def shorten(hold: aiolock.Hold) -> None:
        await leader.lock.extend(0.4)
        await assert_not_later(raw, key_of(leader.lock), hold)

    await lost_within(shorten, leader.elected())


async def test_no_step_after_a_stalled_deadline(make_client: ClientFactory, name: str) -> None:
    """c7: the loop stalls past the deadline; the parked body resumes with the cancel.

    Its sleep and the guard's deadline are both due when the loop resumes: the body must
    never return from its await and run one more step.
    """
    client = make_client(watchdog_timeout=6)
    lock = client.lock(name)
    steps: list[float] = []

    async def body() -> None:
        async with lock.guarded(lease=0.3):
            while True:
                await asyncio.sleep(0.05)
                steps.append(time.monotonic())

    task = asyncio.create_task(body())
    await wait_until(lambda: bool(steps), limit=LIMIT)
    before = len(steps)
    # The stall under test: the whole loop blocked past the lease (another task's blocking
    # call), with the body parked in its sleep.
    time.sleep(0.6)  # noqa: ASYNC251
    with pytest.raises(aiolock.LockLostError):
        await asyncio.wait_for(task, LIMIT)
    assert len(steps) == before, "the body ran a step after its deadline had passed"


WATCHED: dict[str, Kind] = {
    "lock": lambda c, n: c.lock(n),
    "write": lambda c, n: c.read_write_lock(n).write_lock(),
    "fenced": lambda c, n: c.fenced_lock(n),
}


@pytest.mark.parametrize("kind", WATCHED)
async def test_forced_guarded_body_stops_before_the_next_holder(
    make_client: ClientFactory, name: str, kind: str
) -> None:
    """c2: a force_unlock() of a plain guarded hold ends its body on the unlock message.

    Default options (renewals every 10 s): the body must stop before a waiter of another
    client, woken by the same message, has its acquire answered, and no renewal runs.
    """
    holder, admin, rival = make_client(), make_client(), make_client()
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()
    stopped = taken = 0.0

    async def body() -> None:
        nonlocal stopped
        async with WATCHED[kind](holder, name).guarded():
            entered.set()
            try:
                await asyncio.Event().wait()
            finally:
                stopped = loop.time()

    async def next_holder() -> None:
        nonlocal taken
        lock = WATCHED[kind](rival, name)
        await lock.lock()
        taken = loop.time()
        await lock.unlock()

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), LIMIT)
    waiting = asyncio.create_task(next_holder())
    await wait_until(
        lambda: inside.engine(rival).waiting(inside.key_of(WATCHED[kind](rival, name))) > 0
    )
    rounds = inside.renewal(holder).rounds
    assert await WATCHED[kind](admin, name).force_unlock()
    with pytest.raises(aiolock.LockLostError, match="deleted while it held it"):
        await asyncio.wait_for(task, LIMIT)
    await asyncio.wait_for(waiting, LIMIT)
    assert 0 < stopped < taken
    assert inside.renewal(holder).rounds == rounds


@pytest.mark.parametrize("kind", ["lock", "fair"])
async def test_restart_without_persistence_ends_the_body_when_the_server_is_back(
    kind: str,
) -> None:
    """c4: a server restarted without persistence lost the hold; the guarded body ends as
    soon as the server answers again (a renewal round on the lost connection's return),
    not at the next renewal period (10 s with the defaults), while others may hold it."""
    with start_local_server(appendonly=False) as server:
        holder = aiolock.Client.from_url(server.url)
        rival = aiolock.Client.from_url(server.url)
        name = f"restart-{kind}"
        entered = asyncio.Event()
        loop = asyncio.get_running_loop()
        stopped = 0.0

        async def body() -> None:
            nonlocal stopped
            async with KINDS[kind](holder, name).guarded():
                entered.set()
                try:
                    await asyncio.Event().wait()
                finally:
                    stopped = loop.time()

        try:
            task = asyncio.create_task(body())
            await asyncio.wait_for(entered.wait(), LIMIT)
            restarted = loop.time()
            await asyncio.to_thread(server.restart)
            with pytest.raises(aiolock.LockLostError):
                await asyncio.wait_for(task, LIMIT / 2)
            # Well before the renewal period: settled once the server answered again.
            assert stopped - restarted < 10 / 2
            assert await KINDS[kind](rival, name).try_lock(wait=LIMIT)
        finally:
            await holder.aclose()
            await rival.aclose()


async def test_strict_restarts_wait_out_the_grace() -> None:
    """restart_grace: after a restart without persistence, another client acquires only
    once the server has been up that long (at least the holder's lease); by then the old
    holder's body has ended, whenever its own client found out."""
    with start_local_server(appendonly=False) as server:
        holder = aiolock.Client.from_url(server.url, watchdog_timeout=1.5)
        strict = aiolock.Client.from_url(server.url, restart_grace=2)
        name = "strict-restart"
        entered = asyncio.Event()
        loop = asyncio.get_running_loop()
        stopped = 0.0

        async def body() -> None:
            nonlocal stopped
            async with holder.fair_lock(name).guarded():
                entered.set()
                try:
                    await asyncio.Event().wait()
                finally:
                    stopped = loop.time()

        try:
            # A server up for less than the grace: nothing is taken there yet.
            assert not await strict.fair_lock(f"{name}:new").try_lock(wait=0)
            task = asyncio.create_task(body())
            await asyncio.wait_for(entered.wait(), LIMIT)
            await asyncio.to_thread(server.restart)
            assert not await strict.fair_lock(name).try_lock(wait=0)
            assert await strict.fair_lock(name).try_lock(wait=LIMIT)
            taken = loop.time()
            with pytest.raises(aiolock.LockLostError):
                await asyncio.wait_for(task, LIMIT)
            assert 0 < stopped < taken
        finally:
            await holder.aclose()
            await strict.aclose()


def test_restart_grace_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="restart_grace"):
        aiolock.Client.from_url("redis://127.0.0.1:1", restart_grace=0)
    with pytest.raises(TypeError, match="restart_grace"):
        aiolock.Client.from_url("redis://127.0.0.1:1", restart_grace="2")  # type: ignore[arg-type]


async def test_read_extend_shorter(make_client: ClientFactory, name: str) -> None:
    """A read lock's extend() to a shorter lease shortens the lock's own lease too, unless
    another reader holds longer (its lease is kept)."""
    client, other = make_client(), make_client()
    read = client.read_write_lock(name).read_lock()
    await read.lock()  # the watchdog's 30 s
    await read.extend(10)
    left = await read.remaining_lease()
    assert left is not None
    assert left <= 10
    # Another reader's longer lease is never cut short by this one's extend().
    longer = other.read_write_lock(name).read_lock()
    await longer.lock(lease=20)
    await read.extend(0.5)
    left = await read.remaining_lease()
    assert left is not None
    assert left > 10
    await longer.unlock()
    await read.unlock()


async def test_a_shielded_acquire_is_named_in_the_warning(
    client: aiolock.Client, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """c10: ``await asyncio.shield(lock.lock())`` holds for shield's inner task, which ends at
    once: the warning says so and names the cure, so the lock held by nobody's knowledge
    (until its lease ends, or the client closes) is explained where it is reported."""
    lock = client.lock(name)
    await asyncio.shield(lock.lock(lease=5))
    await wait_until(lambda: "asyncio.shield()" in caplog.text, limit=LIMIT)
    assert "owner=" in caplog.text
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    assert await client.lock(name).force_unlock()


async def test_strict_restarts_hold_back_semaphores_too() -> None:
    """restart_grace holds back a semaphore's takes as it does acquires: permits a restart
    forgot may still be in use."""
    with start_local_server(appendonly=False) as server:
        strict = aiolock.Client.from_url(server.url, restart_grace=1)
        try:
            reports = strict.semaphore("strict-reports", permits=1)
            assert not await reports.try_acquire(wait=0)
            assert await reports.try_acquire(wait=LIMIT)
            await reports.release()
        finally:
            await strict.aclose()
