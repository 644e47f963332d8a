"""A release whose pub/sub message never arrives still ends the wait it was meant to end.

Client B waits through a fault proxy that drops every message published on the lock's
channels; client A, direct, holds and then releases. A lost message costs latency, never
liveness: each wait is bounded, by the holder's remaining lease for a lock (a waiter's
attempt answers the lease it found; engine ``_wait_subscribed``), and for the fair
read-write lock also by half of ``watchdog_timeout`` (its scripts' wait cap); by
``_RECHECK`` (5 s) for a semaphore or a latch, whose state has no lease (or sooner, by the
next permit to expire, for the permit-expirable semaphore; engine ``_wait_for``). The spin
lock publishes nothing and polls: it is not here.

A pub/sub subscription the server does not confirm within ``subscribe_timeout`` (the
confirmation lost, or late) fails the wait with redis-py's ``TimeoutError`` then.

A's leases are 1 s (``watchdog_timeout=1``), so a lock case takes about 1 s and a
semaphore or latch case about 5 s. The default run covers three representative kinds
(the plain lock, a shared waiter, a fair lock's per-waiter channel); ``--full-sweep=server``
every waitable kind. Each case prints the time from the release to B's
acquisition, the figure a user pays for a lost message.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock

from .conftest import ClientFactory, full_sweep
from .faultproxy import Delay, DropMessage, FaultProxy, Match, Rule, command
from .helpers import wait_until
from .sweep import Kind, handle, parked, rival_handle

#: A's watchdog lease, and so the longest a lock waiter of B waits for a lost message.
LEASE = 1.0
#: The engine's re-check period of a semaphore or latch wait (``counting._RECHECK``).
RECHECK = 5.0
#: "Bounded, not hung": the documented bound plus a generous margin. Not a timing claim.
MARGIN = 3.0


class Counting(enum.Enum):
    """The waitables without a lease: their waiters re-check every RECHECK seconds."""

    SEMAPHORE = "semaphore"
    PERMITS = "permit_expirable_semaphore"
    LATCH = "count_down_latch"


Waitable = Kind | Counting

#: Every waitable kind but the spin lock (it polls, never subscribes).
WAITABLES: list[Waitable] = [*(kind for kind in Kind if kind is not Kind.SPIN), *Counting]
#: What the default run covers: the plain lock, a shared waiter, a per-waiter channel.
QUICK = frozenset({Kind.LOCK, Kind.READ, Kind.FAIR})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "waitable" in metafunc.fixturenames:
        full = full_sweep(metafunc.config, "server")
        chosen = [w for w in WAITABLES if full or w in QUICK]
        metafunc.parametrize("waitable", chosen, ids=[w.value for w in chosen])


def bound(waitable: Waitable) -> float:
    """How long at most a waiter of ``waitable`` waits for a message that was lost."""
    return LEASE if isinstance(waitable, Kind) else RECHECK


@dataclass
class Side:
    """One side's part of a scenario: take (or wait for) the waitable, and give it back."""

    take: Callable[[], Coroutine[Any, Any, object]]
    give: Callable[[], Coroutine[Any, Any, object]]


class Replies(Rule):
    """Counts the replies to matching commands that reached the proxy (the server ran them)."""

    def __init__(self, proxy: FaultProxy, match: Match) -> None:
        super().__init__(proxy, match)
        self.replies = 0
        proxy._rules.append(self)

    def _replied(self, reply: object) -> None:
        super()._replied(reply)
        self.replies += 1


def attempts_of(waitable: Waitable) -> Match:
    """B's attempts: a script run, or for a latch a read of its count."""
    if waitable is Counting.LATCH:
        return command("GET")
    return lambda words: words[0].upper() in (b"EVALSHA", b"EVAL")


@pytest.fixture
async def proxied(proxy: FaultProxy) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """Clients through the proxy (B's), closed at the end."""
    clients: list[aiolock.Client] = []

    def make(**options: object) -> aiolock.Client:
        client = aiolock.Client.from_url(proxy.url, **options)  # type: ignore[arg-type]
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def sides(
    waitable: Waitable, a: aiolock.Client, b: aiolock.Client, name: str
) -> tuple[Side, Side, Callable[[], Awaitable[bool]]]:
    """A's side, B's side, and what tells that B got what it waited for."""
    if isinstance(waitable, Kind):
        held, wanted = rival_handle(a, waitable, name), handle(b, waitable, name, "b")
        return (
            Side(held.lock, held.unlock),
            Side(wanted.lock, wanted.unlock),
            wanted.is_held_by_current_task,
        )
    if waitable is Counting.SEMAPHORE:
        sem_a, sem_b = a.semaphore(name), b.semaphore(name)
        assert await sem_a.try_set_permits(1)
        return (
            Side(sem_a.acquire, sem_a.release),
            Side(sem_b.acquire, sem_b.release),
            lambda: _zero(sem_a.available_permits()),
        )
    if waitable is Counting.PERMITS:
        pes_a, pes_b = a.permit_expirable_semaphore(name), b.permit_expirable_semaphore(name)
        assert await pes_a.try_set_permits(1)
        ids: dict[str, str] = {}

        async def take(pes: aiolock.PermitExpirableSemaphore, who: str) -> None:
            ids[who] = await pes.acquire()

        async def give(pes: aiolock.PermitExpirableSemaphore, who: str) -> None:
            await pes.release(ids.pop(who))

        return (
            Side(lambda: take(pes_a, "a"), lambda: give(pes_a, "a")),
            Side(lambda: take(pes_b, "b"), lambda: give(pes_b, "b")),
            lambda: _zero(pes_a.available_permits()),
        )
    latch_a, latch_b = a.count_down_latch(name), b.count_down_latch(name)

    async def nothing() -> None:
        pass

    async def opened() -> bool:
        return await latch_a.get_count() == 0

    async def wait() -> None:
        assert await latch_b.wait() is True

    # A "holds" the latch closed (a count of 1) and "releases" it by counting it down.
    return Side(lambda: latch_a.try_set_count(1), latch_a.count_down), Side(wait, nothing), opened


async def _zero(available: Awaitable[int]) -> bool:
    return await available == 0


_figures: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the figures (release -> B's acquisition, message lost) past output capture."""
    yield
    if not _figures:
        return
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for kind, seconds in _figures.items():
            reporter.write_line(f"lost release message: {kind}: B in {seconds:.2f} s after it")


async def test_a_lost_release_message_costs_a_bounded_wait(
    *,
    waitable: Waitable,
    make_client: ClientFactory,
    proxied: Callable[..., aiolock.Client],
    proxy: FaultProxy,
    raw: Redis,
    name: str,
    uid: str,
) -> None:
    a = make_client(watchdog_timeout=LEASE)
    b = proxied(watchdog_timeout=LEASE)
    side_a, side_b, got = await sides(waitable, a, b, name)
    await side_a.take()
    lost = proxy.drop_messages(f"*{name}*", times=None)  # every message on its channels
    attempts = Replies(proxy, attempts_of(waitable))
    waiting = asyncio.create_task(side_b.take())
    # Parked: subscribed, and its attempt after subscribing answered (it found the
    # waitable taken), so only a message or its bounded wait can end the wait now.
    await wait_until(lambda: parked(b, name) and attempts.replies >= 2)
    attempts.remove()
    await side_a.give()
    released = time.monotonic()
    limit = bound(waitable) + MARGIN
    async with asyncio.timeout(limit):
        await lost.dropped.wait()  # the release did publish, and B never heard it
        await waiting
    _figures[waitable.value] = time.monotonic() - released
    assert await got()
    await side_b.give()
    lost.remove()
    await b.aclose()  # its subscriptions gone before the leak check of ``raw``
    await _clean(raw, uid)


async def _clean(raw: Redis, uid: str) -> None:
    """Delete the state a semaphore or latch keeps by design (permits, a count)."""
    async for key in raw.scan_iter(match=f"*{uid}*"):
        await raw.delete(key)


async def _subscribe_fails(fault: str, proxy: FaultProxy, b: aiolock.Client, name: str) -> None:
    """B's wait on ``name`` (held by A) fails once its subscription is not confirmed in time."""
    unconfirmed: DropMessage | Delay
    if fault == "dropped":
        unconfirmed = proxy.drop_messages(f"*{name}*", kinds=("subscribe",), times=None)
    else:
        unconfirmed = proxy.delay(SUBSCRIBE_TIMEOUT + MARGIN, command("SUBSCRIBE"))
    with unconfirmed:
        async with asyncio.timeout(SUBSCRIBE_TIMEOUT + MARGIN):
            with pytest.raises(RedisTimeoutError, match="subscribe_timeout"):
                await b.lock(name).try_lock(wait=30)


async def _waits_again(a: aiolock.Client, b: aiolock.Client, name: str) -> bool:
    """Whether B, waiting on ``name`` again with nothing lost, gets it once A releases."""
    held, wanted = a.lock(name, owner="a"), b.lock(name, owner="b")
    await held.lock()
    waiting = asyncio.create_task(wanted.try_lock(wait=LEASE + MARGIN))
    await wait_until(lambda: wanted.statistics().tasks_waiting > 0 or waiting.done())
    await held.unlock()
    try:
        got = await waiting
    except RedisTimeoutError:
        return False
    if got:
        await wanted.unlock()
    return got


#: B's subscribe_timeout in the cases where its SUBSCRIBE is not confirmed in time.
SUBSCRIBE_TIMEOUT = 0.5


@pytest.mark.parametrize("fault", ["dropped", "delayed"])
async def test_an_unconfirmed_subscription_ends_the_wait_in_time(
    fault: str,
    make_client: ClientFactory,
    proxied: Callable[..., aiolock.Client],
    proxy: FaultProxy,
    name: str,
) -> None:
    """The server's SUBSCRIBE confirmation lost, or later than ``subscribe_timeout``: the
    wait fails within subscribe_timeout (redis-py's TimeoutError), it does not hang."""
    a = make_client()
    b = proxied(subscribe_timeout=SUBSCRIBE_TIMEOUT, watchdog_timeout=LEASE)
    async with a.lock(name):
        await _subscribe_fails(fault, proxy, b, name)
    if fault == "delayed":
        # The late confirmation was paired with its SUBSCRIBE: the next wait works.
        assert await _waits_again(a, b, name)
    await b.aclose()


async def test_a_lost_subscribe_confirmation_leaves_later_waits_working(
    make_client: ClientFactory,
    proxied: Callable[..., aiolock.Client],
    proxy: FaultProxy,
    name: str,
) -> None:
    """A SUBSCRIBE confirmation that never came must not leave the connection pairing each
    later confirmation with the command before it (every later wait on the channel then
    failed with subscribe_timeout while the connection lived): the dispatcher drops that
    connection, and the next wait works on a new one."""
    a = make_client()
    b = proxied(subscribe_timeout=SUBSCRIBE_TIMEOUT, watchdog_timeout=LEASE)
    try:
        async with a.lock(name):
            await _subscribe_fails("dropped", proxy, b, name)
        assert await _waits_again(a, b, name)
    finally:
        await b.aclose()
