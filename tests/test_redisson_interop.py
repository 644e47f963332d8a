"""Real Redisson against aiolock on one server: exclusion, wake-ups, fairness, leases, ownership.

Each test runs Java threads of one Redisson client (tests/redisson_driver.py: one JVM for the
module, ``REDISSON_VERSION``) and Python tasks of aiolock clients on the same names. Both
sides' watchdog leases are short (:data:`WATCHDOG` s) so that a hold outliving its lease
shows within seconds. Nothing here waits on a clock: a wait that would end only when a lease
runs out is given a lease far beyond the test's own timeout, so the test fails (not slows)
if a wake-up message is missed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis

import aiolock
import aiolock.events
import aiolock.sync

from . import redisson_driver
from .conftest import ClientFactory
from .helpers import subscriptions_confirmed, wait_until
from .redisson_driver import Build, Driver, Java, RedissonError

redisson_driver.check_tools()

#: Both sides' watchdog lease, seconds (renewed every third of it): short, so that a hold
#: outliving it shows soon, yet a renewal would have to be held up over a second (on a
#: loaded machine) for a lease to run out under its holder.
WATCHDOG = 2.0
#: A lease no test lives long enough to see run out: a waiter that gets the lock while it
#: is held so was woken by a message.
LONG = 600.0
#: Turns per worker in the exclusion tests.
TURNS = 10


@pytest.fixture(scope="session")
def redisson() -> Build:
    """The driver built for ``REDISSON_VERSION`` (or skip, or fail where required)."""
    return redisson_driver.build(redisson_driver.version())


@pytest.fixture(scope="module")
def driver(redisson: Build, redis_url: str) -> Iterator[Driver]:
    """One JVM for the module's tests (each test's threads and names are its own)."""
    with redisson_driver.running(redisson, redis_url, watchdog=round(WATCHDOG * 1000)) as driver:
        yield driver


@pytest.fixture
async def java(driver: Driver, uid: str, raw: Redis) -> AsyncIterator[Java]:
    """The test's Java threads; at the end none is blocked, and Redisson has left the
    test's channels (it unsubscribes after an acquire has returned, so the server's leak
    check, which runs after this, waits for that)."""
    view = Java(driver, uid)
    yield view
    assert driver.alive, f"the Redisson driver died: {driver.stderr()}"
    assert not view.unanswered(), "a Java call of this test is still blocked"

    async def unsubscribed() -> bool:
        return not await raw.pubsub_channels(f"*{uid}*")

    await wait_until(unsubscribed, what="Redisson's subscriptions of this test gone")


@pytest.fixture(autouse=True)
async def _unlock_latches(raw: Redis, uid: str) -> AsyncIterator[None]:
    """Some Redisson releases (3.52, for one) leave their unlock latches to expire (they
    answer a retried unlock): at the end each must carry an expiry; then they go, before the
    server's leak check (``raw``'s)."""
    yield
    latches = [key async for key in raw.scan_iter(match=f"redisson_unlock_latch:*{uid}*")]
    for key in latches:
        assert await raw.pttl(key) > 0, f"{key} would never expire"
    if latches:
        await raw.delete(*latches)


@pytest.fixture
def py(make_client: ClientFactory) -> aiolock.Client:
    return make_client(watchdog_timeout=WATCHDOG)


# -- one object, both languages -------------------------------------------------------------

LOCK_KINDS = ["lock", "fair", "write", "spin", "fenced", "multi"]


HANDLES: dict[str, Callable[..., Any]] = {
    "lock": lambda client, name, **kw: client.lock(name, **kw),
    "fair": lambda client, name, **kw: client.fair_lock(name, **kw),
    "write": lambda client, name, **kw: client.read_write_lock(name, **kw).write_lock(),
    "read": lambda client, name, **kw: client.read_write_lock(name, **kw).read_lock(),
    "spin": lambda client, name, **kw: client.spin_lock(name, **kw),
    "fenced": lambda client, name, **kw: client.fenced_lock(name, **kw),
    "multi": lambda client, name, **kw: aiolock.MultiLock(
        client.lock(f"{name}:a", **kw), client.lock(f"{name}:b", **kw)
    ),
}


def handle(client: aiolock.Client, kind: str, name: str, **options: Any) -> Any:
    """aiolock's handle for the Redisson object ``kind`` (the driver's kinds) on ``name``."""
    return HANDLES[kind](client, name, **options)


def needs(java: Java, kind: str) -> None:
    feature = {"spin": "spinLock", "fenced": "fencedLock"}.get(kind)
    if feature and not java.has(feature):
        pytest.skip(f"Redisson {java.version} has no {kind} lock")


def java_args(kind: str, name: str, **args: Any) -> dict[str, Any]:
    if kind == "multi":
        args["names"] = [f"{name}:a", f"{name}:b"]
    return args


class Turns:
    """The shared state of an exclusion run: a counter bumped by GET then SET, an ``inside``
    count (INCR on entry, DECR on exit: above ``limit`` means an overlap) and a log."""

    def __init__(self, raw: Redis, name: str, limit: int = 1) -> None:
        self.raw = raw
        self.name = name
        self.counter = f"{name}:counter"
        self.inside = f"{name}:inside"
        self.log = f"{name}:log"
        self.limit = limit
        self.overlaps = 0

    def args(self, n: int = TURNS) -> dict[str, Any]:
        return {
            "n": n,
            "counter": self.counter,
            "inside": self.inside,
            "log": self.log,
            "limit": self.limit,
        }

    async def turn(self, tag: object) -> None:
        """The body of one Python turn, run while holding."""
        if await self.raw.incr(self.inside) > self.limit:
            self.overlaps += 1
        value = await self.raw.get(self.counter)
        await self.raw.set(self.counter, int(value or 0) + 1)
        await self.raw.rpush(self.log, f"py:{tag}")
        await self.raw.decr(self.inside)

    async def count(self) -> int:
        return int(await self.raw.get(self.counter) or 0)

    async def entries(self) -> list[str]:
        return [str(entry) for entry in await self.raw.lrange(self.log, 0, -1)]

    async def clear(self) -> None:
        await self.raw.delete(self.counter, self.inside, self.log)


@pytest.fixture
async def turns(raw: Redis, name: str) -> AsyncIterator[Turns]:
    state = Turns(raw, name)
    yield state
    await state.clear()


@pytest.mark.parametrize("kind", LOCK_KINDS)
async def test_exclusion_across_languages(
    java: Java, py: aiolock.Client, make_client: ClientFactory, turns: Turns, kind: str
) -> None:
    """Two Java threads and two Python tasks (of two clients) take TURNS turns each on one
    name: no update lost, no two inside at once."""
    needs(java, kind)
    name = turns.name
    other = make_client(watchdog_timeout=WATCHDOG)

    async def python_side(client: aiolock.Client) -> None:
        lock = handle(client, kind, name)
        for i in range(TURNS):
            async with lock:
                await turns.turn(i)

    java_runs = [
        java.send(thread, kind, name, "turns", **java_args(kind, name, **turns.args()))
        for thread in ("a", "b")
    ]
    await asyncio.gather(python_side(py), python_side(other))
    overlaps = await asyncio.gather(*map(asyncio.wrap_future, java_runs))
    assert await turns.count() == 4 * TURNS
    assert overlaps == [0, 0]
    assert turns.overlaps == 0
    entries = await turns.entries()
    assert sum(entry.startswith("java:") for entry in entries) == 2 * TURNS


async def test_exclusion_with_sync_threads(
    java: Java, redis_url: str, turns: Turns, raw: Redis, name: str
) -> None:
    """aiolock.sync threads and Java threads on one lock: the same exclusion."""
    client = aiolock.sync.Client.from_url(redis_url, watchdog_timeout=WATCHDOG)
    errors: list[BaseException] = []
    counter, inside = turns.counter, turns.inside
    plain = redis.Redis.from_url(redis_url, decode_responses=True)

    def worker() -> None:
        try:
            lock = client.lock(name)
            for _ in range(TURNS):
                with lock:
                    if plain.incr(inside) > 1:
                        errors.append(AssertionError("overlap"))
                    value = plain.get(counter)
                    plain.set(counter, int(value or 0) + 1)
                    plain.decr(inside)
        except BaseException as error:
            errors.append(error)

    try:
        java_run = java.send("a", "lock", name, "turns", **turns.args())
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for thread in threads:
            thread.start()
        overlaps = await asyncio.wrap_future(java_run)
        for thread in threads:
            await asyncio.to_thread(thread.join)
    finally:
        await asyncio.to_thread(client.close)
        plain.close()
    assert errors == []
    assert overlaps == 0
    assert await turns.count() == 3 * TURNS


async def test_read_write_lock_across_languages(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """Readers of both languages hold together; a writer of either waits for both."""
    rw = py.read_write_lock(name)
    await java.call("r", "read", name, "lock")
    assert await rw.read_lock().try_lock()
    # (A writer in another task: this one's own read hold would make it an upgrade.)
    assert not await asyncio.create_task(rw.write_lock().try_lock())
    assert not await java.call("w", "write", name, "tryLock", wait=0)
    # A Java writer parked behind both readers gets the lock when the last one leaves.
    writer = java.send("w", "write", name, "tryLock", wait=LONG, lease=LONG)
    await java.call("r", "read", name, "unlock")
    assert not writer.done()
    await rw.read_lock().unlock()
    assert await asyncio.wrap_future(writer)
    assert not await rw.read_lock().try_lock()
    assert not await java.call("r", "read", name, "tryLock", wait=0)
    # A Python writer parked behind the Java writer is woken by its release.
    writer_py = py.read_write_lock(name, owner="writer").write_lock()
    waiting = asyncio.ensure_future(writer_py.try_lock(wait=LONG, lease=LONG))
    await py_parked(py)
    await java.call("w", "write", name, "unlock")
    assert await waiting
    await writer_py.unlock()


async def subscribers(raw: Redis, channel: str) -> int:
    """How many connections are subscribed to ``channel`` (Java's and Python's waiters)."""
    ((_, count),) = await raw.pubsub_numsub(channel)
    return int(count)


async def java_parked(raw: Redis, channel: str, count: int = 1) -> None:
    """Wait until ``count`` connections listen on ``channel``: the Java waiters are parked
    (Redisson subscribes before its last attempt)."""

    async def enough() -> bool:
        return await subscribers(raw, channel) >= count

    await wait_until(enough, what=f"{count} subscribers on {channel}")


async def py_parked(client: aiolock.Client) -> None:
    """Wait until the client's waiters are subscribed, confirmed by the server."""
    await wait_until(lambda: subscriptions_confirmed(client), what="the Python waiter parked")


def lock_channel(name: str) -> str:
    return f"redisson_lock__channel:{{{name}}}"


def rw_channel(name: str) -> str:
    return f"redisson_rwlock:{{{name}}}"


# -- fenced tokens, semaphores, latch -------------------------------------------------------


async def test_fenced_tokens_increase_across_languages(
    java: Java, py: aiolock.Client, turns: Turns, raw: Redis
) -> None:
    """Tokens of both languages' acquisitions, in the order the lock was held, strictly
    increase."""
    needs(java, "fenced")
    name = turns.name
    lock = py.fenced_lock(name)

    async def python_side() -> None:
        for _ in range(TURNS):
            token = await lock.lock_and_get_token()
            try:
                await turns.turn(token)
            finally:
                await lock.unlock()

    java_run = java.send("a", "fenced", name, "tokenTurns", **turns.args())
    await asyncio.gather(python_side(), python_side())
    assert await asyncio.wrap_future(java_run) == 0
    tokens = [int(entry.split(":")[1]) for entry in await turns.entries()]
    assert len(tokens) == 3 * TURNS
    assert tokens == sorted(set(tokens))
    await raw.delete(f"redisson_lock_token:{{{name}}}")


async def test_semaphore_across_languages(java: Java, py: aiolock.Client, turns: Turns) -> None:
    """Two permits, two Java threads and two Python tasks: never more than two inside; every
    permit back at the end."""
    name = turns.name
    turns.limit = 2
    sem = py.semaphore(name)
    assert await sem.try_set_permits(2)
    assert not await java.call("a", "semaphore", name, "trySetPermits", permits=5)

    async def python_side() -> None:
        for i in range(TURNS):
            async with sem:
                await turns.turn(i)

    java_runs = [java.send(t, "semaphore", name, "turns", **turns.args()) for t in ("a", "b")]
    await asyncio.gather(python_side(), python_side())
    assert await asyncio.gather(*map(asyncio.wrap_future, java_runs)) == [0, 0]
    assert turns.overlaps == 0
    assert await java.call("a", "semaphore", name, "availablePermits") == 2
    assert await sem.available_permits() == 2
    # A Python release wakes a parked Java acquire, and a Java release a parked Python one.
    assert await java.call("a", "semaphore", name, "drainPermits") == 2
    acquiring = java.send("b", "semaphore", name, "tryAcquire", wait=LONG)
    await java_parked(turns.raw, f"redisson_sc:{{{name}}}")
    await sem.release()
    assert await asyncio.wrap_future(acquiring)
    waiting = asyncio.ensure_future(sem.try_acquire(wait=LONG))
    await py_parked(py)
    await java.call("b", "semaphore", name, "release")
    assert await waiting
    assert await sem.available_permits() == 0
    await turns.raw.delete(name)


async def test_permit_expirable_semaphore_across_languages(
    java: Java, py: aiolock.Client, turns: Turns
) -> None:
    """Permits with leases taken by both languages never exceed the count; an id is released
    from the other language; a lease run out gives its permit back to the other side."""
    name = turns.name
    turns.limit = 2
    sem = py.permit_expirable_semaphore(name)
    assert await sem.try_set_permits(2)

    async def python_side() -> None:
        for i in range(TURNS):
            permit = await sem.acquire(lease=LONG)
            try:
                await turns.turn(i)
            finally:
                await sem.release(permit)

    java_runs = [java.send(t, "pes", name, "turns", lease=LONG, **turns.args()) for t in ("a", "b")]
    await asyncio.gather(python_side(), python_side())
    assert await asyncio.gather(*map(asyncio.wrap_future, java_runs)) == [0, 0]
    assert turns.overlaps == 0
    assert await sem.available_permits() == 2
    # An id taken by Java, released by Python, and the other way round.
    java_permit = await java.call("a", "pes", name, "acquire", lease=LONG)
    python_permit = await sem.acquire(lease=LONG)
    assert await java.call("a", "pes", name, "availablePermits") == 0
    await sem.release(java_permit)
    assert await java.call("a", "pes", name, "tryRelease", permit=python_permit)
    with pytest.raises(aiolock.LockNotOwnedError):
        await sem.release(python_permit)
    # A Java permit with a short lease comes back to a parked Python waiter by itself.
    await java.call("a", "pes", name, "acquire", lease=0.5)
    await java.call("a", "pes", name, "acquire", lease=LONG)
    permit = await sem.try_acquire(wait=LONG, lease=LONG)
    assert permit is not None
    await turns.raw.delete(name, f"{{{name}}}:timeout")


async def test_latch_releases_both_sides(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """Waiters of both languages are released when the count reaches zero, whichever side
    counts down last."""
    latch = py.count_down_latch(name)
    assert await latch.try_set_count(2)
    assert not await java.call("a", "latch", name, "trySetCount", count=5)
    assert await java.call("a", "latch", name, "getCount") == 2
    java_waiter = java.send("w", "latch", name, "await", timeout=LONG)
    python_waiter = asyncio.ensure_future(latch.wait(timeout=LONG))
    await py_parked(py)
    await java_parked(raw, f"redisson_countdownlatch__channel__{{{name}}}", 2)
    await java.call("a", "latch", name, "countDown")
    assert await latch.get_count() == 1
    assert not python_waiter.done()
    await latch.count_down()
    assert await python_waiter
    assert await asyncio.wrap_future(java_waiter)
    # Set again by Java, opened by Python.
    assert await java.call("a", "latch", name, "trySetCount", count=1)
    java_waiter = java.send("w", "latch", name, "await", timeout=LONG)
    await java_parked(raw, f"redisson_countdownlatch__channel__{{{name}}}")
    await latch.count_down()
    assert await asyncio.wrap_future(java_waiter)
    assert await java.call("a", "latch", name, "getCount") == 0


# -- wake-ups, force unlock, leases ---------------------------------------------------------


async def java_channel(java: Java, kind: str, name: str, thread: str) -> str:
    """The channel a parked Java ``thread`` waits on for ``kind`` (a fair lock's waiter has
    its own). Asked before the thread blocks: its thread id comes from the thread itself."""
    if kind == "fair":
        return f"redisson_lock__channel:{{{name}}}:{await java.holder(thread)}"
    if kind in {"read", "write"}:
        return rw_channel(name)
    return lock_channel(name)


@pytest.mark.parametrize("kind", ["lock", "fair", "write", "fenced"])
async def test_wake_ups_across_languages(
    java: Java, py: aiolock.Client, raw: Redis, name: str, kind: str
) -> None:
    """A Java unlock wakes a parked Python waiter and a Python unlock a parked Java thread,
    by message: every holder's lease would outlast the test."""
    needs(java, kind)
    lock = handle(py, kind, name, owner="p")
    await java.call("h", kind, name, "lock", lease=LONG)
    waiting = asyncio.ensure_future(lock.try_lock(wait=LONG, lease=LONG))
    await py_parked(py)
    await java.call("h", kind, name, "unlock")
    assert await waiting
    channel = await java_channel(java, kind, name, "w")
    java_waiter = java.send("w", kind, name, "tryLock", wait=LONG, lease=LONG)
    await java_parked(raw, channel)
    await lock.unlock()
    assert await asyncio.wrap_future(java_waiter)
    await java.call("w", kind, name, "unlock")
    assert not await lock.is_locked()
    if kind == "fenced":
        await raw.delete(f"redisson_lock_token:{{{name}}}")


@pytest.mark.parametrize("kind", ["lock", "fair", "write"])
async def test_force_unlock_across_languages(
    java: Java, py: aiolock.Client, raw: Redis, name: str, kind: str
) -> None:
    """A Python force_unlock wakes a parked Java waiter; a Java forceUnlock a parked Python
    waiter (the holders' leases outlast the test)."""
    lock = handle(py, kind, name, owner="holder")
    await java.call("h", kind, name, "lock", lease=LONG)
    channel = await java_channel(java, kind, name, "w")
    java_waiter = java.send("w", kind, name, "tryLock", wait=LONG, lease=LONG)
    await java_parked(raw, channel)
    assert await lock.force_unlock()
    assert await asyncio.wrap_future(java_waiter)
    # Java's waiter now holds; then a Python hold, a Python waiter, and a Java forceUnlock.
    assert await java.call("w", kind, name, "forceUnlock")
    await lock.lock(lease=LONG)
    waiting = asyncio.ensure_future(handle(py, kind, name, owner="w").try_lock(wait=LONG))
    await py_parked(py)
    assert await java.call("h", kind, name, "forceUnlock")
    assert await waiting
    assert await java.call("h", kind, name, "forceUnlock")
    assert not await lock.is_locked()


async def test_java_watchdog_keeps_its_hold_while_python_waits(
    java: Java, py: aiolock.Client, name: str
) -> None:
    """A Java hold without a lease outlives two watchdog leases while Python waits; its
    unlock then lets Python in."""
    lock = py.lock(name)
    await java.call("h", "lock", name, "lock")
    assert not await lock.try_lock(wait=2 * java.watchdog)
    assert await java.call("x", "lock", name, "isLocked")
    assert await lock.remaining_lease() is not None
    await java.call("h", "lock", name, "unlock")
    assert await lock.try_lock(wait=LONG)
    await lock.unlock()


async def test_python_watchdog_keeps_its_hold_while_java_waits(
    java: Java, py: aiolock.Client, name: str
) -> None:
    """The same, the other way round."""
    lock = py.lock(name)
    await lock.lock()
    assert not await java.call("w", "lock", name, "tryLock", wait=2 * WATCHDOG, lease=LONG)
    await lock.unlock()
    assert await java.call("w", "lock", name, "tryLock", wait=LONG, lease=LONG)
    await java.call("w", "lock", name, "unlock")


# -- reentrancy and ownership ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "fair", "write", "read"])
async def test_holds_are_independent_across_languages(
    java: Java, py: aiolock.Client, name: str, kind: str
) -> None:
    """A Java thread's hold count and a Python task's are their own; neither unlocks the
    other's hold."""
    lock = handle(py, kind, name)
    await java.call("h", kind, name, "lock")
    await java.call("h", kind, name, "lock")
    assert await java.call("h", kind, name, "getHoldCount") == 2
    assert await lock.hold_count() == 0
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    assert await java.call("h", kind, name, "getHoldCount") == 2
    await java.call("h", kind, name, "unlock")
    await java.call("h", kind, name, "unlock")
    await lock.lock()
    await lock.lock()
    assert await lock.hold_count() == 2
    assert await java.call("h", kind, name, "getHoldCount") == 0
    with pytest.raises(RedissonError) as refused:
        await java.call("h", kind, name, "unlock")
    assert refused.value.error == "IllegalMonitorStateException"
    assert await lock.hold_count() == 2
    await lock.unlock()
    await lock.unlock()
    assert not await lock.is_locked()


# -- fair lock queues -----------------------------------------------------------------------


def fair_queue(name: str) -> str:
    return f"redisson_lock_queue:{{{name}}}"


def fair_timeouts(name: str) -> str:
    return f"redisson_lock_timeout:{{{name}}}"


async def queued(raw: Redis, name: str, count: int) -> None:
    """Wait until the fair lock's queue holds ``count`` waiters."""

    async def enough() -> bool:
        return int(await raw.llen(fair_queue(name))) == count

    await wait_until(enough, what=f"{count} waiters queued on {name}")


async def test_fair_queue_order_across_languages(
    java: Java, py: aiolock.Client, turns: Turns, raw: Redis
) -> None:
    """Java threads and Python tasks queued alternately on one fair lock are served in the
    order they queued."""
    name = turns.name
    await java.call("h", "fair", name, "lock", lease=LONG)
    lock = py.fair_lock(name)

    async def python_turn(label: str) -> None:
        async with lock:
            await turns.turn(label)

    order = ["p1", "j2", "p3", "j4", "p5"]
    runs: list[asyncio.Future[Any]] = []
    for position, label in enumerate(order, 1):
        if label.startswith("p"):
            runs.append(asyncio.ensure_future(python_turn(label)))
        else:
            runs.append(
                asyncio.wrap_future(
                    java.send(label, "fair", name, "turns", label=label, **turns.args(1))
                )
            )
        await queued(raw, name, position)
    await java.call("h", "fair", name, "unlock")
    await asyncio.gather(*runs)
    assert await turns.entries() == [f"{'py' if x[0] == 'p' else 'java'}:{x}" for x in order]
    assert not await raw.exists(fair_queue(name), fair_timeouts(name))


async def test_java_waiter_giving_up_leaves_the_fair_queue(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """A Java tryLock that times out in the queue leaves it (queue and timeouts) as Redisson
    expects: the Python waiter queued before it, and one queued after it, are served."""
    await java.call("h", "fair", name, "lock", lease=LONG)
    first = asyncio.ensure_future(py.fair_lock(name, owner="first").try_lock(wait=LONG))
    await queued(raw, name, 1)
    quitter = await java.holder("q")
    giving_up = java.send("q", "fair", name, "tryLock", wait=1.0, lease=LONG)
    assert not await asyncio.wrap_future(giving_up)
    assert quitter not in await raw.lrange(fair_queue(name), 0, -1)
    assert await raw.zscore(fair_timeouts(name), quitter) is None
    last = asyncio.ensure_future(py.fair_lock(name, owner="last").try_lock(wait=LONG))
    await queued(raw, name, 2)
    await java.call("h", "fair", name, "unlock")
    assert await first
    assert not last.done()
    await py.fair_lock(name, owner="first").unlock()
    assert await last
    await py.fair_lock(name, owner="last").unlock()
    assert not await raw.exists(fair_queue(name), fair_timeouts(name))


async def test_cancelled_python_waiter_leaves_the_fair_queue(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """A Python waiter cancelled mid-queue leaves it as Redisson expects: the Java thread
    queued behind it gets the lock on the holder's unlock, not after the cancelled waiter's
    queue timeout (Redisson's, 5 minutes)."""
    await java.call("h", "fair", name, "lock", lease=LONG)
    cancelled = asyncio.ensure_future(py.fair_lock(name).lock())
    await queued(raw, name, 1)
    behind = java.send("w", "fair", name, "tryLock", wait=LONG, lease=LONG)
    await queued(raw, name, 2)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await queued(raw, name, 1)
    await java.call("h", "fair", name, "unlock")
    assert await asyncio.wrap_future(behind)
    await java.call("w", "fair", name, "unlock")
    assert not await raw.exists(fair_queue(name), fair_timeouts(name))


# -- crashes --------------------------------------------------------------------------------


async def test_halted_jvm_frees_its_locks_after_its_watchdog_lease(
    redisson: Build, redis_url: str, py: aiolock.Client, name: str
) -> None:
    """A JVM halted while holding (no unlock, its watchdog gone) frees every lock after its
    lease; the Python waiters, parked meanwhile, get them."""
    kinds = ["lock", "fair", "write"]
    with redisson_driver.running(redisson, redis_url, watchdog=round(WATCHDOG * 1000)) as crashing:
        for kind in kinds:
            await crashing.call("h", kind, f"{name}:{kind}", "lock")
        waiting = [
            asyncio.ensure_future(handle(py, kind, f"{name}:{kind}", owner="w").try_lock(wait=LONG))
            for kind in kinds
        ]
        await py_parked(py)
        await asyncio.to_thread(crashing.crash)
        assert not crashing.alive
    assert await asyncio.gather(*waiting) == [True, True, True]
    for kind in kinds:
        await handle(py, kind, f"{name}:{kind}", owner="w").unlock()


KILLED_HOLDER = """
import asyncio, os, sys
import aiolock

async def main() -> None:
    client = aiolock.Client.from_url(sys.argv[1], watchdog_timeout=float(sys.argv[3]))
    await client.lock(sys.argv[2]).lock()
    print("held", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_killed_python_process_frees_its_lock_for_java(
    java: Java, redis_url: str, name: str
) -> None:
    """A Python process killed while holding frees the lock after its watchdog lease; a
    parked Java thread gets it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        KILLED_HOLDER,
        redis_url,
        name,
        str(WATCHDOG),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        assert await process.stdout.readline() == b"held\n"
        assert not await java.call("w", "lock", name, "tryLock", wait=0)
        waiter = java.send("w", "lock", name, "tryLock", wait=LONG, lease=LONG)
        process.kill()
    finally:
        await process.wait()
    assert await asyncio.wrap_future(waiter)
    await java.call("w", "lock", name, "unlock")


# -- more objects and options ---------------------------------------------------------------


async def test_read_holds_of_both_languages_outlive_their_watchdog_leases(
    java: Java, py: aiolock.Client, name: str
) -> None:
    """A Java read hold and a Python read hold, both renewed by their watchdogs, keep
    writers of both languages out for two leases; when both leave a writer gets in."""
    await java.call("r", "read", name, "lock")
    reader = py.read_write_lock(name, owner="reader").read_lock()
    await reader.lock()
    writer = py.read_write_lock(name, owner="writer").write_lock()
    assert not await writer.try_lock(wait=2 * WATCHDOG)
    assert not await java.call("w", "write", name, "tryLock", wait=0)
    assert await java.call("r", "read", name, "getHoldCount") == 1
    assert await reader.hold_count() == 1
    await java.call("r", "read", name, "unlock")
    assert not await writer.try_lock()
    await reader.unlock()
    assert await writer.try_lock(wait=LONG)
    await writer.unlock()


async def test_multilock_across_languages(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """A Redisson MultiLock and an aiolock MultiLock over the same plain locks exclude each
    other; each one's unlock wakes the other's parked waiter."""
    multi = handle(py, "multi", name, owner="p")
    members = java_args("multi", name)
    await java.call("h", "multi", name, "lock", lease=LONG, **members)
    assert not await multi.try_lock()
    assert not await py.lock(f"{name}:b").try_lock()
    waiting = asyncio.ensure_future(multi.try_lock(wait=LONG, lease=LONG))
    await py_parked(py)
    await java.call("h", "multi", name, "unlock", **members)
    assert await waiting
    java_waiter = java.send("w", "multi", name, "tryLock", wait=LONG, lease=LONG, **members)
    await java_parked(raw, lock_channel(f"{name}:a"))
    await multi.unlock()
    assert await asyncio.wrap_future(java_waiter)
    await java.call("w", "multi", name, "unlock", **members)


async def test_key_prefix_matches_a_redisson_name_mapper(
    redisson: Build, redis_url: str, make_client: ClientFactory, turns: Turns, raw: Redis
) -> None:
    """aiolock's ``key_prefix`` and a Redisson NameMapper adding the same prefix name the
    same keys and channels: the two exclude and wake each other."""
    prefix = f"app{turns.name[-4:]}:"
    name = turns.name
    py = make_client(watchdog_timeout=WATCHDOG, key_prefix=prefix)
    lock = py.lock(name, owner="p")
    options = {"watchdog": round(WATCHDOG * 1000), "prefix": prefix}
    with redisson_driver.running(redisson, redis_url, **options) as mapped:
        await mapped.call("h", "lock", name, "lock", lease=LONG)
        assert await raw.exists(f"{prefix}{name}")
        assert not await lock.try_lock()
        waiting = asyncio.ensure_future(lock.try_lock(wait=LONG, lease=LONG))
        await py_parked(py)
        await mapped.call("h", "lock", name, "unlock")
        assert await waiting
        waiter = mapped.send("w", "lock", name, "tryLock", wait=LONG, lease=LONG)
        await java_parked(raw, lock_channel(f"{prefix}{name}"))
        await lock.unlock()
        assert await asyncio.wrap_future(waiter)
        await mapped.call("w", "lock", name, "unlock")
        assert not await raw.exists(f"{prefix}{name}")


async def test_inspect_shows_java_holders_and_waiters(
    java: Java, redis_url: str, raw: Redis, name: str
) -> None:
    """``aiolock inspect`` on a fair lock held and queued for by Java threads names each by
    Redisson's client id and thread id."""
    holder = await java.holder("h")
    queued_id = await java.holder("q")
    channel = await java_channel(java, "fair", name, "q")
    await java.call("h", "fair", name, "lock")
    waiter = java.send("q", "fair", name, "tryLock", wait=LONG, lease=LONG)
    await java_parked(raw, channel)
    try:
        done = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aiolock",
            "inspect",
            redis_url,
            name,
            "--json",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await done.communicate()
        assert done.returncode == 0
        shown = json.loads(out)
    finally:
        await java.call("h", "fair", name, "unlock")
        assert await asyncio.wrap_future(waiter)
        await java.call("q", "fair", name, "unlock")
    assert shown["kind"] == "fair_lock"
    ((held,),) = [shown["holders"]]
    assert (held["id"], held["client"], held["count"]) == (holder, java.driver.client_id, 1)
    assert held["thread"] == int(holder.rsplit(":", 1)[1])
    ((first,),) = [shown["queue"]]
    assert (first["id"], first["thread"]) == (queued_id, int(queued_id.rsplit(":", 1)[1]))
    assert first["subscribed"] == 1


async def test_semaphore_waiters_for_several_permits_across_languages(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """A waiter for two permits is served once the other language has released two, one at
    a time, both ways round."""
    sem = py.semaphore(name)
    assert await sem.try_set_permits(0)
    channel = f"redisson_sc:{{{name}}}"
    waiting = asyncio.ensure_future(sem.try_acquire(permits=2, wait=LONG))
    await py_parked(py)
    await java.call("a", "semaphore", name, "release", permits=1)
    assert await sem.available_permits() == 1
    assert not waiting.done()
    await java.call("a", "semaphore", name, "release", permits=1)
    assert await waiting
    java_waiter = java.send("w", "semaphore", name, "tryAcquire", permits=2, wait=LONG)
    await java_parked(raw, channel)
    await sem.release()
    await sem.release()
    assert await asyncio.wrap_future(java_waiter)
    assert await sem.available_permits() == 0
    await raw.delete(name)


async def test_expired_python_permit_serves_a_parked_java_waiter(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """A permit aiolock took with a short lease comes back, by its expiry alone, to a Java
    waiter parked meanwhile (Redisson reads aiolock's expiry entries and times its wait by
    the earliest)."""
    sem = py.permit_expirable_semaphore(name)
    assert await sem.try_set_permits(1)
    await sem.acquire(lease=1.0)
    waiter = java.send("w", "pes", name, "tryAcquire", wait=LONG, lease=LONG)
    permit = await asyncio.wrap_future(waiter)
    assert isinstance(permit, str)
    await java.call("w", "pes", name, "release", permit=permit)
    assert await sem.available_permits() == 1
    await raw.delete(name, f"{{{name}}}:timeout")


KILLED_WAITER = """
import asyncio, sys
import aiolock

async def main() -> None:
    client = aiolock.Client.from_url(sys.argv[1], fair_lock_wait_timeout=float(sys.argv[3]))
    print("queueing", flush=True)
    await client.fair_lock(sys.argv[2]).lock()

asyncio.run(main())
"""


async def test_dead_python_waiter_is_pruned_from_the_fair_queue_by_java(
    redisson: Build, redis_url: str, raw: Redis, name: str
) -> None:
    """A Python waiter killed in a fair lock's queue is dropped by the Java waiter behind
    it once the dead waiter's queue timeout has passed (both sides' fair-lock wait timeout
    short here), as it drops a dead Java waiter: the two sides agree on the queue's
    timeouts."""
    fair_wait = 2.0
    options = {"watchdog": round(WATCHDOG * 1000), "fair_wait_timeout": round(fair_wait * 1000)}
    with redisson_driver.running(redisson, redis_url, **options) as java:
        if not java.features["fairWaitTimeout"]:
            pytest.skip(f"Redisson {java.version} has a fixed fair-lock wait timeout (5 min)")
        # Under the watchdog: a waiter's queue timeout counts from the holder's lease (as
        # Redisson's), so a long explicit lease would keep the dead waiter queued that long.
        await java.call("h", "fair", name, "lock")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            KILLED_WAITER,
            redis_url,
            name,
            str(fair_wait),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            await queued(raw, name, 1)
            process.kill()
        finally:
            await process.wait()
        waiter = java.send("w", "fair", name, "lock")
        await queued(raw, name, 2)
        await java.call("h", "fair", name, "unlock")
        await asyncio.wrap_future(waiter)
        await java.call("w", "fair", name, "unlock")
    assert not await raw.exists(name, fair_queue(name), fair_timeouts(name))


async def test_events_see_java_holders_as_contention(
    java: Java, py: aiolock.Client, name: str
) -> None:
    """A client's listeners see a Java hold only as contention: the Python waiter's Waiting,
    AcquireFailed and Acquired (with its own holder id), never an event with the Java holder."""
    events: list[aiolock.events.Event] = []
    py.add_listener(events.append)
    lock = py.lock(name, owner="p")
    await java.call("h", "lock", name, "lock", lease=LONG)
    assert not await lock.try_lock()
    waiting = asyncio.ensure_future(lock.try_lock(wait=LONG))
    await py_parked(py)
    await java.call("h", "lock", name, "unlock")
    assert await waiting
    await lock.unlock()
    waits = [event.waiting for event in events if isinstance(event, aiolock.events.Waiting)]
    assert waits == [1, 0]
    rest = [event for event in events if not isinstance(event, aiolock.events.Waiting)]
    kinds = [type(event).__name__ for event in rest]
    assert kinds == ["AcquireFailed", "Acquired", "Released"], kinds
    failed, acquired, _ = rest
    assert isinstance(failed, aiolock.events.AcquireFailed)
    assert failed.reason == "timeout"
    assert isinstance(acquired, aiolock.events.Acquired)
    assert acquired.holder == f"{py.id}:owner:p"
    java_holder = await java.holder("h")
    assert all(getattr(event, "holder", None) != java_holder for event in events)


async def test_wake_ups_with_sync_threads(
    java: Java, redis_url: str, raw: Redis, name: str
) -> None:
    """An aiolock.sync thread parked on a Java-held fair lock is woken by the Java unlock,
    and a Java thread parked on the sync thread's hold by its release."""
    client = aiolock.sync.Client.from_url(redis_url, watchdog_timeout=WATCHDOG)
    try:
        lock = client.fair_lock(name, owner="sync")
        await java.call("h", "fair", name, "lock", lease=LONG)
        waiting = asyncio.ensure_future(asyncio.to_thread(lock.try_lock, wait=LONG, lease=LONG))
        await queued(raw, name, 1)
        await java.call("h", "fair", name, "unlock")
        assert await waiting
        channel = await java_channel(java, "fair", name, "w")
        java_waiter = java.send("w", "fair", name, "tryLock", wait=LONG, lease=LONG)
        await java_parked(raw, channel)
        await asyncio.to_thread(lock.unlock)
        assert await asyncio.wrap_future(java_waiter)
        await java.call("w", "fair", name, "unlock")
    finally:
        await asyncio.to_thread(client.close)


async def test_latch_zero_stored_by_redisson(
    java: Java, py: aiolock.Client, raw: Redis, name: str
) -> None:
    """Redisson's ``trySetCount(0)`` stores a 0 that refuses every later count (its defect,
    docs/redisson.md): aiolock reads that latch as open, refuses to set it as Redisson does,
    and its count_down clears the 0, after which either side can set the latch again."""
    latch = py.count_down_latch(name)
    assert await java.call("a", "latch", name, "trySetCount", count=0)
    assert await raw.get(name) == "0"
    assert not await java.call("a", "latch", name, "trySetCount", count=2)
    assert await latch.get_count() == 0
    assert await latch.wait(timeout=0)
    assert not await latch.try_set_count(2)
    await latch.count_down()
    assert not await raw.exists(name)
    assert await java.call("a", "latch", name, "trySetCount", count=1)
    await latch.count_down()
    assert await java.call("a", "latch", name, "getCount") == 0
