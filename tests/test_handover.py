"""Hand-over: a release that gives the lock straight to a parked waiter of the same client.

Checked against the server: who holds the lock, with what lease, whether anything was
published, and what is left once a waiter that was offered the lock has gone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._engine.waiting import IN_A_ROW
from aiolock._keys import lock_channel, rwlock_channel
from aiolock._net.scripts import load_script

from . import inside
from .conftest import ClientFactory
from .helpers import Gate, gated_redis, quiesce, wait_until

LIMIT = 10.0


def _parked(client: aiolock.Client, name: str, count: int = 1) -> bool:
    """Whether ``count`` waiters of ``client`` on ``name`` are parked in their wait."""
    waiters = inside.waiting_room(client).waiters(lock_channel(name))
    return sum(w.parked is not None for w in waiters) >= count


async def _publishes(raw: Redis) -> int:
    stats: dict[str, Any] = await raw.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


async def _park(client: aiolock.Client, name: str, count: int = 1) -> None:
    await wait_until(lambda: _parked(client, name, count), what=f"{count} waiter(s) parked")


async def test_release_hands_the_lock_to_the_parked_waiter(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    client = make_client(watchdog_timeout=20)
    lock = client.lock(name)
    await lock.lock()
    got = asyncio.Event()
    done = asyncio.Event()

    async def waiter() -> str:
        await lock.lock()
        got.set()
        holder = next(iter(await raw.hgetall(name)))
        await done.wait()
        await lock.unlock()
        return str(holder)

    task = asyncio.create_task(waiter())
    await _park(client, name)
    before = await _publishes(raw)
    await lock.unlock()
    await got.wait()
    # The waiter holds it, once, with its own lease, and nothing was published: the lock
    # was never free.
    fields = await raw.hgetall(name)
    assert list(fields.values()) == ["1"]
    assert 15_000 < await raw.pttl(name) <= 20_000
    assert await _publishes(raw) == before
    assert client.lock(name).statistics().tasks_waiting == 0
    done.set()
    holder = await task
    assert holder.startswith(client.id)
    assert await raw.exists(name) == 0


async def test_hand_overs_in_a_row_are_bounded(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """After IN_A_ROW hand-overs a release publishes, so other clients get their turn."""
    client = make_client()
    lock = client.lock(name)
    order: list[int] = []
    await lock.lock()

    async def waiter(i: int) -> None:
        async with lock:
            order.append(i)

    tasks = []
    for i in range(IN_A_ROW + 2):
        tasks.append(asyncio.create_task(waiter(i)))
        await _park(client, name, i + 1)
    before = await _publishes(raw)
    await lock.unlock()
    await asyncio.gather(*tasks)
    assert order == list(range(IN_A_ROW + 2))  # oldest first
    # Five releases of a lock with waiters parked: three hand-overs, then a release
    # that publishes (and wakes the next waiter), then again a hand-over... and the last
    # release, with nobody waiting, publishes too.
    assert await _publishes(raw) - before >= 2


async def test_a_waiter_of_another_client_is_not_handed_anything(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Only this client's waiters are heirs; another client's waiter is woken as ever."""
    mine, other = make_client(), make_client()
    await mine.lock(name).lock()
    task = asyncio.create_task(other.lock(name).try_lock(10))
    await wait_until(lambda: _parked(other, name), what="the other client's waiter parked")
    before = await _publishes(raw)
    await mine.lock(name).unlock()
    assert await task
    assert await _publishes(raw) == before + 1
    await other.lock(name, owner=None).force_unlock()


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> Any:
    """A client whose chosen script call can be held back (torn down before ``raw``)."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    # Loaded beforehand: a held NOSCRIPT reply would hold back the wrong send.
    await raw.script_load(load_script("lock_release").text)
    yield client, gate
    await client.aclose()
    await redis.aclose()


@pytest.mark.parametrize("leave", ["deadline", "cancel"])
async def test_a_waiter_gone_before_the_hand_over_lands_leaves_nothing(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str, leave: str
) -> None:
    """The release's reply is held: the waiter offered the lock leaves (its deadline, or a
    cancel) before it knows; once the hand-over lands, what it was handed is released."""
    client, gate = gated
    lock, releaser = client.lock(name), client.lock(name, owner="releaser")
    await releaser.lock()
    waiter = asyncio.create_task(lock.try_lock(0.5 if leave == "deadline" else 30))
    await _park(client, name)
    gate.arm("lock_release")
    release = asyncio.create_task(releaser.unlock())
    await gate.sent.wait()
    # The script ran: the waiter's holder has the lock on the server already.
    await wait_until(lambda: _held(raw, name), what="the hand-over ran")
    if leave == "cancel":
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    else:
        assert await waiter is False
    gate.release.set()
    await release
    await quiesce(client)
    assert await raw.exists(name) == 0
    assert not lock.statistics().held_by_current_task
    assert len(inside.holds(client)) == 0
    # The task that left can take the lock again at once.
    assert await lock.try_lock(0)
    await lock.unlock()


async def _held(raw: Redis, name: str) -> bool:
    return await _held_by(raw, name, "")


async def _held_by(raw: Redis, name: str, prefix: str) -> bool:
    """Whether a task holder (not an owner=) whose id starts with ``prefix`` holds it."""
    fields = [str(f) for f in await raw.hgetall(name)]  # raw decodes replies
    return any(f.startswith(prefix) and ":owner:" not in f for f in fields)


async def test_a_cancelled_release_still_hands_over(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """The releaser is cancelled with its script in flight: the waiter gets the lock from
    the release's completion in the background."""
    client, gate = gated
    lock, releaser = client.lock(name), client.lock(name, owner="releaser")
    await releaser.lock()

    async def waiter_call() -> bool:
        taken = await lock.try_lock(30)
        await lock.unlock()
        return taken

    waiter = asyncio.create_task(waiter_call())
    await _park(client, name)
    gate.arm("lock_release")
    release = asyncio.create_task(releaser.unlock())
    await gate.sent.wait()
    release.cancel()
    with pytest.raises(asyncio.CancelledError):
        await release
    await wait_until(lambda: _held_by(raw, name, client.id + ":"), what="the hand-over ran")
    gate.release.set()
    assert await waiter
    await quiesce(client)
    assert await raw.exists(name) == 0
    assert len(inside.holds(client)) == 0


def _token_key(name: str) -> str:
    return f"redisson_lock_token:{{{name}}}"


async def _counter(raw: Redis, name: str) -> int:
    """The fenced token counter as stored."""
    value = await raw.get(_token_key(name))
    assert value is not None
    return int(value)


@pytest.mark.parametrize("how", ["lock_and_get_token", "try_lock_and_get_token"])
async def test_a_plain_release_never_hands_the_lock_to_a_fenced_waiter(
    client: aiolock.Client, raw: Redis, name: str, how: str
) -> None:
    """A Lock and a FencedLock of one client share the hash and the channel. The Lock's
    release frees the lock for the fenced waiter, which takes it with a token of its own
    (a hand-over would take none): it used to get IndexError, holding the lock."""
    plain, fenced = client.lock(name), client.fenced_lock(name)
    await plain.lock()

    async def fenced_waiter() -> tuple[int | None, int]:
        if how == "lock_and_get_token":
            token: int | None = await fenced.lock_and_get_token()
        else:
            token = await fenced.try_lock_and_get_token(wait=LIMIT)
        counter = await _counter(raw, name)
        await fenced.unlock()
        return token, counter

    waiter = asyncio.create_task(fenced_waiter())
    await _park(client, name)
    before = await _publishes(raw)
    await plain.unlock()
    token, counter = await waiter
    # Its own acquisition's token: the lock was freed (and published), not handed over.
    assert token == counter
    assert await _publishes(raw) == before + 2  # the plain release and the fenced one
    assert await raw.exists(name) == 0
    assert len(inside.holds(client)) == 0


async def test_a_lock_waiter_behind_a_fenced_one_is_not_handed_the_lock_past_it(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The oldest waiter takes no hand-over (fenced): the release frees the lock rather than
    hand it to a younger plain waiter, and the fenced one gets in first, with a token."""
    plain, fenced = client.lock(name), client.fenced_lock(name)
    await plain.lock()
    order: list[str] = []
    release_fenced = asyncio.Event()

    async def fenced_waiter() -> int:
        token = await fenced.lock_and_get_token()
        order.append("fenced")
        await release_fenced.wait()
        await fenced.unlock()
        return token

    async def plain_waiter() -> None:
        await plain.lock()
        order.append("plain")
        await plain.unlock()

    first = asyncio.create_task(fenced_waiter())
    await _park(client, name)
    second = asyncio.create_task(plain_waiter())
    await _park(client, name, 2)
    before = await _publishes(raw)
    await plain.unlock()
    await wait_until(lambda: bool(order), what="a waiter got in")
    assert order == ["fenced"]
    assert await _publishes(raw) == before + 1
    release_fenced.set()
    token = await first
    await second
    assert order == ["fenced", "plain"]
    assert token == await _counter(raw, name)
    assert await raw.exists(name) == 0


async def test_a_fenced_release_hands_nothing_over(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A FencedLock's release frees the lock (and publishes) even for a plain waiter."""
    plain, fenced = client.lock(name), client.fenced_lock(name)
    await fenced.lock_and_get_token()
    waiter = asyncio.create_task(plain.try_lock(LIMIT))
    await _park(client, name)
    before = await _publishes(raw)
    await fenced.unlock()
    assert await waiter
    assert await _publishes(raw) == before + 1
    await plain.force_unlock()


# -- the read-write lock's write side ------------------------------------------------------


def _rw_parked(client: aiolock.Client, name: str, count: int) -> bool:
    waiters = inside.waiting_room(client).waiters(rwlock_channel(name))
    return sum(w.parked is not None for w in waiters) >= count


async def _park_rw(client: aiolock.Client, name: str, count: int = 1) -> None:
    await wait_until(lambda: _rw_parked(client, name, count), what=f"{count} waiter(s) parked")


async def test_a_write_release_hands_the_lock_to_a_parked_writer(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """The writer gets the lock from the release itself: one write hold with its own lease,
    mode still "write", and nothing published (the lock was never free)."""
    client = make_client(watchdog_timeout=20)
    releaser = client.read_write_lock(name, owner="releaser").write_lock()
    await releaser.lock()
    got, done = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with client.read_write_lock(name).write_lock():
            got.set()
            await done.wait()

    task = asyncio.create_task(writer())
    await _park_rw(client, name)
    before = await _publishes(raw)
    await releaser.unlock()
    async with asyncio.timeout(LIMIT):
        await got.wait()
    fields = await raw.hgetall(name)
    assert fields.pop("mode") == "write"
    [(field, count)] = [(str(f), str(c)) for f, c in fields.items()]  # raw decodes
    assert field.startswith(client.id + ":")
    assert field.endswith(":write")
    assert count == "1"
    assert ":owner:" not in field
    assert 15_000 < await raw.pttl(name) <= 20_000
    assert await _publishes(raw) == before
    done.set()
    await task
    assert await raw.exists(name) == 0


async def test_a_write_release_frees_the_lock_for_a_reader_waiting_longer(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A reader parked before the writer: the release frees the lock and publishes "1", and
    the reader gets in (a writer handed the lock would have passed it)."""
    releaser = client.read_write_lock(name, owner="releaser").write_lock()
    await releaser.lock()
    order: list[str] = []

    async def take(view: str) -> None:
        pair = client.read_write_lock(name)
        async with pair.read_lock() if view == "read" else pair.write_lock():
            order.append(view)

    reader = asyncio.create_task(take("read"))
    await _park_rw(client, name)
    writer = asyncio.create_task(take("write"))
    await _park_rw(client, name, 2)
    before = await _publishes(raw)
    await releaser.unlock()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(reader, writer)
    assert order[0] == "read"
    assert await _publishes(raw) > before
    assert await raw.exists(name) == 0


async def test_a_downgrading_write_release_hands_nothing_over(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """The releaser keeps read holds: the lock goes to read mode (as in Redisson), not to the
    parked writer, which gets in once the read hold goes."""
    pair = client.read_write_lock(name, owner="releaser")
    await pair.write_lock().lock()
    await pair.read_lock().lock()
    writer = asyncio.create_task(client.read_write_lock(name).write_lock().try_lock(LIMIT))
    await _park_rw(client, name)
    await pair.write_lock().unlock()
    fields = await raw.hgetall(name)
    assert fields == {"mode": "read", f"{client.id}:owner:releaser": "1"}
    assert not writer.done()
    await pair.read_lock().unlock()
    assert await writer
    await client.read_write_lock(name).write_lock().force_unlock()
