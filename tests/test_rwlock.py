"""The read-write lock in Redisson's RReadWriteLock layout: sharing, exclusion, wake-ups."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

import aiolock
from aiolock._engine.renewal import BATCH_SIZE
from aiolock._keys import rwlock_channel
from aiolock._net.scripts import Script, load_script

from . import inside
from .conftest import ClientFactory
from .helpers import (
    Gate,
    gated_redis,
    quiesce,
    subscribe_confirmed,
    subscriptions_confirmed,
    wait_until,
    watch_script_runs,
)

T = TypeVar("T")

# Safety net only: every wait below ends by an event or by Redis state, never by time.
# Watchdog leases are 30 s, so a waiter that gets in within LIMIT was woken by a message.
LIMIT = 10.0


# -- Redisson's names, spelled out independently of aiolock._keys ------------------------


def channel_of(name: str) -> str:
    """Redisson's read-write lock channel for a name without braces."""
    return f"redisson_rwlock:{{{name}}}"


def timeout_key(name: str, holder: str, k: int) -> str:
    """Redisson's key of read hold ``k`` of ``holder`` (a name without braces)."""
    return f"{{{name}}}:{holder}:rwlock_timeout:{k}"


def holder_id(client: aiolock.Client, owner: str) -> str:
    """The holder id of ``owner=`` on ``client``."""
    return f"{client.id}:owner:{owner}"


def rw(client: aiolock.Client, name: str, owner: str | None = None) -> aiolock.ReadWriteLock:
    """A read-write lock handle on ``client``."""
    return client.read_write_lock(name, owner=owner)


# -- helpers ----------------------------------------------------------------------------


@pytest.fixture
async def listen(raw: Redis) -> AsyncIterator[PubSub]:
    """A raw pub/sub connection, closed (and so unsubscribed) before the leak check."""
    pubsub = raw.pubsub(ignore_subscribe_messages=True)
    yield pubsub
    await pubsub.aclose()  # type: ignore[no-untyped-call]


async def next_message(pubsub: PubSub, limit: float = LIMIT) -> str:
    """The next message's data on ``pubsub``; fail if none arrives within ``limit`` s."""
    deadline = time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is not None and message["type"] == "message":
            data: str = message["data"]
            return data
    raise AssertionError(f"no message within {limit} s")


async def assert_nothing_published(raw: Redis, pubsub: PubSub, channel: str) -> None:
    """Nothing reached ``channel`` since the last message read: a marker comes next."""
    await raw.publish(channel, "marker")
    assert await next_message(pubsub) == "marker"


async def in_task(coro: Awaitable[T]) -> T:
    """Run ``coro`` in a new task: a different holder from the caller."""

    async def run() -> T:
        return await coro

    async with asyncio.timeout(LIMIT):
        return await asyncio.create_task(run())


async def gets_in(handle: aiolock.ReadLock | aiolock.WriteLock) -> bool:
    """Whether another task gets ``handle`` at once (it gives it back at once if so)."""

    async def attempt() -> bool:
        if not await handle.try_lock(0):
            return False
        await handle.unlock()
        return True

    return await in_task(attempt())


class Holder:
    """A task that takes a lock (waiting if need be) and holds it until told to let go."""

    def __init__(self, handle: aiolock.ReadLock | aiolock.WriteLock) -> None:
        self.handle = handle
        self.entered = asyncio.Event()
        self.leave = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with self.handle:
            self.entered.set()
            await self.leave.wait()

    async def wait_entered(self) -> None:
        """Until this task holds the lock."""
        async with asyncio.timeout(LIMIT):
            await self.entered.wait()

    async def release(self) -> None:
        """Let go and wait until the unlock is done."""
        self.leave.set()
        async with asyncio.timeout(LIMIT):
            await self.task


async def waiting(handle: aiolock.ReadLock | aiolock.WriteLock, count: int) -> None:
    """Until ``count`` tasks of ``handle``'s client wait on its name."""
    await wait_until(
        lambda: handle.statistics().tasks_waiting == count, what=f"{count} task(s) waiting"
    )


async def pttl(raw: Redis, key: str) -> int:
    """PTTL of ``key`` as an int."""
    return int(await raw.pttl(key))


# -- sharing and exclusion --------------------------------------------------------------


async def test_readers_hold_at_once_across_tasks_and_clients(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Three tasks on one client and two on another hold the read lock at the same time."""
    first, second = make_client(), make_client()
    holders = [Holder(rw(first, name).read_lock()) for _ in range(3)]
    holders += [Holder(rw(second, name).read_lock()) for _ in range(2)]
    for holder in holders:
        await holder.wait_entered()
    state = {str(field): str(count) for field, count in (await raw.hgetall(name)).items()}
    assert state.pop("mode") == "read"
    assert set(state.values()) == {"1"}
    assert sum(field.startswith(f"{first.id}:") for field in state) == 3
    assert sum(field.startswith(f"{second.id}:") for field in state) == 2
    for field in state:
        assert await raw.get(timeout_key(name, field, 1)) == "1"
        assert await pttl(raw, timeout_key(name, field, 1)) > 0
    for holder in holders:
        await holder.release()
    assert await raw.exists(name) == 0


async def test_writer_excludes_readers_and_writers(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """While a writer holds, no other task or client gets the read or the write lock."""
    client, other = make_client(), make_client()
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    assert not await gets_in(rw(client, name).read_lock())
    assert not await gets_in(rw(client, name).write_lock())
    assert not await rw(other, name).read_lock().try_lock(0)
    assert not await rw(other, name).write_lock().try_lock(0)
    assert await raw.hgetall(name) == {"mode": "write", f"{holder_id(client, 'w')}:write": "1"}
    await writer.unlock()
    assert await raw.exists(name) == 0


async def test_readers_exclude_writers(make_client: ClientFactory, raw: Redis, name: str) -> None:
    """While readers hold, no writer gets in, locally or from another client."""
    client, other = make_client(), make_client()
    reader = rw(client, name, owner="r").read_lock()
    await reader.lock()
    assert not await gets_in(rw(client, name).write_lock())
    assert not await rw(other, name).write_lock().try_lock(0)
    assert not await rw(other, name).write_lock().try_lock(wait=0.1)
    assert await raw.hgetall(name) == {"mode": "read", holder_id(client, "r"): "1"}
    await reader.unlock()
    assert await raw.exists(name) == 0


async def test_writer_waits_for_every_reader(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A waiting writer gets in only once the last of three readers (two clients) left."""
    client, other = make_client(), make_client()
    readers = [Holder(rw(client, name).read_lock()) for _ in range(2)]
    readers.append(Holder(rw(other, name).read_lock()))
    for reader in readers:
        await reader.wait_entered()
    writer = rw(client, name).write_lock()
    last_left = False
    inside: dict[Any, Any] = {}

    async def write() -> None:
        async with writer:
            assert last_left
            inside.update(await raw.hgetall(name))

    task = asyncio.create_task(write())
    await waiting(writer, 1)
    for reader in readers[:-1]:
        await reader.release()
        # Readers remain: nothing was published and the writer still waits.
        assert writer.statistics().tasks_waiting == 1
        assert await raw.hget(name, "mode") == "read"
    last_left = True
    # The last reader is on the other client: its "0" wakes the writer here.
    await readers[-1].release()
    async with asyncio.timeout(LIMIT):
        await task
    assert inside.pop("mode") == "write"
    assert len(inside) == 1
    assert next(iter(inside)).endswith(":write")
    assert await raw.exists(name) == 0


async def test_write_unlock_wakes_every_waiting_reader(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A write unlock ("1") lets every waiting reader in, on this client and another."""
    client, other = make_client(), make_client()
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    local = [Holder(rw(client, name).read_lock()) for _ in range(2)]
    remote = Holder(rw(other, name).read_lock())
    await waiting(writer, 2)
    await waiting(remote.handle, 1)
    await writer.unlock()
    for reader in [*local, remote]:
        await reader.wait_entered()
    state = await raw.hgetall(name)
    assert state.pop("mode") == "read"
    assert len(state) == 3
    for reader in [*local, remote]:
        await reader.release()
    assert await raw.exists(name) == 0


async def test_read_unlock_wakes_waiting_writers(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """The last read unlock ("0") wakes a writer on each client; the second follows the first."""
    client, other = make_client(), make_client()
    reader = rw(client, name, owner="r").read_lock()
    await reader.lock()
    local = Holder(rw(client, name).write_lock())
    remote = Holder(rw(other, name).write_lock())
    await waiting(local.handle, 1)
    await waiting(remote.handle, 1)
    await reader.unlock()
    await wait_until(
        lambda: local.entered.is_set() or remote.entered.is_set(), what="a writer got in"
    )
    first, second = (local, remote) if local.entered.is_set() else (remote, local)
    assert not second.entered.is_set()
    # The first writer's "1" then wakes the second.
    await first.release()
    await second.wait_entered()
    await second.release()
    assert await raw.exists(name) == 0


async def test_mixed_waiters_all_get_through(make_client: ClientFactory, name: str) -> None:
    """Readers and writers waiting on two clients all get in, woken by "0" and "1" alone."""
    client, other = make_client(), make_client()
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    got: list[str] = []

    async def visit(handle: aiolock.ReadLock | aiolock.WriteLock, label: str) -> None:
        async with handle:
            got.append(label)

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        for i in range(2):
            tg.create_task(visit(rw(client, name).read_lock(), f"local-r{i}"))
            tg.create_task(visit(rw(other, name).read_lock(), f"remote-r{i}"))
        tg.create_task(visit(rw(client, name).write_lock(), "local-w"))
        tg.create_task(visit(rw(other, name).write_lock(), "remote-w"))
        await waiting(writer, 3)
        await waiting(rw(other, name).read_lock(), 3)
        await writer.unlock()
    assert sorted(got) == sorted(
        ["local-r0", "local-r1", "remote-r0", "remote-r1", "local-w", "remote-w"]
    )


class Scripts:
    """Counts the scripts every client starts and finishes running, by name."""

    def __init__(self) -> None:
        self.started: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()

    def in_flight(self) -> int:
        """Scripts sent whose reply has not been handed back yet."""
        return self.started.total() - self.finished.total()


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> Scripts:
    """Count script runs (through the runner every lock call goes through)."""
    counts = Scripts()

    def started(script: Script, _keys: list[str]) -> None:
        counts.started[script.name] += 1

    def finished(script: Script) -> None:
        counts.finished[script.name] += 1

    watch_script_runs(monkeypatch, started, finished)
    return counts


async def parked(client: aiolock.Client, name: str, count: int, scripts: Scripts) -> None:
    """Until ``count`` waiters are registered on the name's channel, none mid-attempt.

    A registered waiter whose attempt has come back has nothing left to do before it
    sleeps but synchronous steps, so from then on only a wake-up makes it try again.
    """

    def all_parked() -> bool:
        channel = inside.channels_of(inside.dispatcher(client)).get(rwlock_channel(name))
        return (
            channel is not None
            and channel.confirmed.is_set()
            and len(inside.waiting_room(client).waiters(rwlock_channel(name))) == count
            and scripts.in_flight() == 0
        )

    await wait_until(all_parked, what=f"{count} waiter(s) parked")


async def test_write_unlock_wakes_every_reader_but_one_writer(
    client: aiolock.Client, raw: Redis, name: str, scripts: Scripts
) -> None:
    """A write unlock sets every local reader retrying but only one local writer.

    The readers can all get in together; of the writers only one can, so waking them all
    would have the others run their script for nothing (a herd that grows with N). The
    readers wait longest: the unlock frees the lock rather than hand it to a writer.
    """
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    readers = [Holder(rw(client, name).read_lock()) for _ in range(2)]
    await parked(client, name, 2, scripts)
    writers = [Holder(rw(client, name).write_lock()) for _ in range(3)]
    await parked(client, name, 5, scripts)
    before = scripts.started.copy()
    await writer.unlock()
    # Whoever wins, every woken task has sent its attempt before the first reply is in.
    await wait_until(
        lambda: (
            any(w.entered.is_set() for w in writers) or all(r.entered.is_set() for r in readers)
        ),
        what="a writer or both readers got in",
    )
    woken = scripts.started - before
    # The rest follow through the messages of the releases alone (leases are 30 s).
    everyone = [*writers, *readers]
    for holder in everyone:
        holder.leave.set()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*(holder.task for holder in everyone))
    assert woken["rw_read_acquire"] == 2
    assert woken["rw_write_acquire"] == 1
    assert await raw.exists(name) == 0


async def test_releasing_writer_does_not_barge_past_a_waiting_writer(
    client: aiolock.Client, name: str, scripts: Scripts
) -> None:
    """A task that write-unlocks and write-locks again at once goes after the one waiting."""
    order: list[str] = []
    first_hold = asyncio.Event()
    again = asyncio.Event()

    async def releaser() -> None:
        lock = rw(client, name).write_lock()
        await lock.lock()
        first_hold.set()
        await again.wait()
        await lock.unlock()
        await lock.lock()  # straight back: without the rule it wins before the waiter wakes
        order.append("releaser")
        await lock.unlock()

    async def waiter() -> None:
        async with rw(client, name).write_lock():
            order.append("waiter")

    releasing = asyncio.create_task(releaser())
    await first_hold.wait()
    waiting_task = asyncio.create_task(waiter())
    await parked(client, name, 1, scripts)
    again.set()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(releasing, waiting_task)
    assert order == ["waiter", "releaser"]


# -- reentrancy -------------------------------------------------------------------------


async def test_reentrant_read_holds_have_one_timeout_key_each(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Each read re-entry adds timeout key k with its own lease; the hash lives the longest."""
    reader = rw(client, name, owner="r").read_lock()
    holder = holder_id(client, "r")
    await reader.lock(lease=100)
    await reader.lock(lease=5)
    assert await raw.hgetall(name) == {"mode": "read", holder: "2"}
    assert await raw.get(timeout_key(name, holder, 1)) == "1"
    assert await raw.get(timeout_key(name, holder, 2)) == "1"
    assert 50_000 < await pttl(raw, timeout_key(name, holder, 1)) <= 100_000
    assert 0 < await pttl(raw, timeout_key(name, holder, 2)) <= 5_000
    assert await pttl(raw, name) > 50_000
    assert await reader.hold_count() == 2
    await reader.unlock()
    # The highest-numbered hold's key goes; the hash TTL follows the remaining key.
    assert await raw.exists(timeout_key(name, holder, 2)) == 0
    assert await raw.hgetall(name) == {"mode": "read", holder: "1"}
    assert abs(await pttl(raw, name) - await pttl(raw, timeout_key(name, holder, 1))) < 1_000
    await reader.unlock()
    assert await raw.exists(name, timeout_key(name, holder, 1)) == 0


async def test_write_reentry_adds_to_the_ttl(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Write re-entry sets the TTL to the remaining PTTL plus the new lease, as Redisson."""
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock(lease=10)
    assert 0 < await pttl(raw, name) <= 10_000
    await writer.lock(lease=10)
    assert 10_000 < await pttl(raw, name) <= 20_000
    assert await raw.hgetall(name) == {"mode": "write", f"{holder_id(client, 'w')}:write": "2"}
    await writer.unlock()
    # A partial write unlock re-applies the lease.
    assert 0 < await pttl(raw, name) <= 10_000
    await writer.unlock()
    assert await raw.exists(name) == 0


# -- downgrade and upgrade --------------------------------------------------------------


async def test_downgrade_releasing_write_first(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """Writer takes the read lock, drops the write: mode=read, published nothing, readers in."""
    await subscribe_confirmed(listen, channel_of(name))
    lock = rw(client, name, owner="d")
    holder = holder_id(client, "d")
    await lock.write_lock().lock()
    await lock.read_lock().lock()
    assert await raw.hgetall(name) == {"mode": "write", f"{holder}:write": "1", holder: "1"}
    assert await raw.get(timeout_key(name, holder, 1)) == "1"
    await lock.write_lock().unlock()
    assert await raw.hgetall(name) == {"mode": "read", holder: "1"}
    await assert_nothing_published(raw, listen, channel_of(name))
    assert await gets_in(rw(client, name).read_lock())
    assert not await gets_in(rw(client, name).write_lock())
    await rw(client, name, owner="other").read_lock().lock()
    await rw(client, name, owner="other").read_lock().unlock()
    await lock.read_lock().unlock()
    assert await next_message(listen) == "0"
    assert await raw.exists(name, timeout_key(name, holder, 1)) == 0


async def test_downgrade_releasing_read_first(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """Writer takes and drops a read hold: still mode=write; its write unlock publishes "1"."""
    await subscribe_confirmed(listen, channel_of(name))
    lock = rw(client, name, owner="d")
    holder = holder_id(client, "d")
    await lock.write_lock().lock(lease=20)
    await lock.read_lock().lock(lease=5)
    await lock.read_lock().unlock()
    assert await raw.hgetall(name) == {"mode": "write", f"{holder}:write": "1"}
    assert await raw.exists(timeout_key(name, holder, 1)) == 0
    # The writer's lease is untouched by the read hold's coming and going.
    assert 5_000 < await pttl(raw, name) <= 20_000
    await assert_nothing_published(raw, listen, channel_of(name))
    assert not await gets_in(rw(client, name).read_lock())
    await lock.write_lock().unlock()
    assert await next_message(listen) == "1"
    assert await raw.exists(name) == 0


async def test_downgrade_wakes_local_readers_at_once_and_remote_ones_by_ttl(
    make_client: ClientFactory, raw: Redis, listen: PubSub, name: str, scripts: Scripts
) -> None:
    """After a downgrade, local readers are woken without a message; remote ones retry."""
    await subscribe_confirmed(listen, channel_of(name))
    client, other = make_client(), make_client()
    lock = rw(client, name, owner="d")
    # The remote reader's wait is bounded by this lease; the local one's too, but it
    # must not need it: the write lock is re-leased to 30 s by the read hold below.
    # Both must be parked (their last attempt back) before that: an attempt after it
    # would bound the remote reader's wait by 30 s instead.
    await lock.write_lock().lock(lease=1)
    local = Holder(rw(client, name).read_lock())
    await parked(client, name, 1, scripts)
    remote = Holder(rw(other, name).read_lock())
    await parked(other, name, 1, scripts)
    await lock.read_lock().lock()
    assert await pttl(raw, name) > 20_000
    await lock.write_lock().unlock()
    await local.wait_entered()
    await remote.wait_entered()
    await assert_nothing_published(raw, listen, channel_of(name))
    await local.release()
    await remote.release()
    await lock.read_lock().unlock()
    assert await next_message(listen) == "0"
    assert await raw.exists(name) == 0


async def test_upgrade_raises_at_once_and_changes_nothing(
    client: aiolock.Client, raw: Redis, name: str, uid: str
) -> None:
    """A task holding only read holds that asks for the write lock gets LockUpgradeError."""
    lock = rw(client, name)
    await lock.read_lock().lock()
    await lock.read_lock().lock()
    before = await raw.hgetall(name)
    keys_before = sorted(await raw.keys(f"*{uid}*"))
    write = lock.write_lock()
    with pytest.raises(aiolock.LockUpgradeError) as info:
        await write.lock()
    assert isinstance(info.value, aiolock.LockError)
    assert name in str(info.value)
    with pytest.raises(aiolock.LockUpgradeError):
        await write.try_lock(wait=None)
    with pytest.raises(aiolock.LockUpgradeError):
        await write.try_lock(0)
    with pytest.raises(aiolock.LockUpgradeError):
        async with write.acquired(wait=5):
            pytest.fail("upgraded")
    with pytest.raises(aiolock.LockUpgradeError):
        async with write:
            pytest.fail("upgraded")
    assert await raw.hgetall(name) == before
    assert sorted(await raw.keys(f"*{uid}*")) == keys_before
    assert write.statistics().tasks_waiting == 0
    assert inside.dispatcher(client).channels() == {}
    assert lock.read_lock().statistics().hold_count == 2
    # Another task is not upgrading: it simply waits (and here gives up).
    assert not await gets_in(write)
    await lock.read_lock().unlock()
    await lock.read_lock().unlock()
    await write.lock()
    await write.unlock()
    assert await raw.exists(name) == 0


async def test_upgrade_is_detected_for_an_owner_across_tasks(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """owner= makes two tasks one holder: read in one, write in the other is an upgrade."""
    await in_task(rw(client, name, owner="job").read_lock().lock())
    with pytest.raises(aiolock.LockUpgradeError):
        await in_task(rw(client, name, owner="job").write_lock().lock())
    assert await raw.hgetall(name) == {"mode": "read", holder_id(client, "job"): "1"}
    await in_task(rw(client, name, owner="job").read_lock().unlock())
    assert await raw.exists(name) == 0


async def test_writer_holding_read_may_reenter_write_until_it_downgrades(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Write + read holders re-enter the write lock; after dropping the write it is an upgrade."""
    lock = rw(client, name)
    await lock.write_lock().lock()
    await lock.read_lock().lock()
    await lock.write_lock().lock()
    assert await lock.write_lock().hold_count() == 2
    await lock.write_lock().unlock()
    await lock.write_lock().unlock()
    with pytest.raises(aiolock.LockUpgradeError):
        await lock.write_lock().lock()
    await lock.read_lock().unlock()
    assert await raw.exists(name) == 0


async def test_owner_applies_to_both_sides(client: aiolock.Client, raw: Redis, name: str) -> None:
    """With owner=, write and read holds of different tasks are one holder's (a downgrade)."""
    lock = rw(client, name, owner="job")
    holder = holder_id(client, "job")
    await in_task(lock.write_lock().lock())
    await in_task(lock.read_lock().lock())
    assert await raw.hgetall(name) == {"mode": "write", f"{holder}:write": "1", holder: "1"}
    assert await in_task(lock.write_lock().is_held_by_current_task())
    assert await in_task(lock.read_lock().hold_count()) == 1
    await in_task(lock.write_lock().unlock())
    await in_task(lock.read_lock().unlock())
    assert await raw.exists(name) == 0


# -- Redis layout and messages ------------------------------------------------------------


async def test_layout_and_messages_are_redissons(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str, uid: str
) -> None:
    """mode, fields, timeout keys and channel are Redisson's; "0" on read, "1" on write release."""
    await subscribe_confirmed(listen, channel_of(name))
    a, b = rw(client, name, owner="a").read_lock(), rw(client, name, owner="b").read_lock()
    await a.lock()
    await b.lock()
    assert await raw.type(name) == "hash"
    assert await raw.hgetall(name) == {
        "mode": "read",
        holder_id(client, "a"): "1",
        holder_id(client, "b"): "1",
    }
    assert sorted(await raw.keys(f"*{uid}*")) == sorted(
        [
            name,
            timeout_key(name, holder_id(client, "a"), 1),
            timeout_key(name, holder_id(client, "b"), 1),
        ]
    )
    await a.unlock()
    # Another reader remains: nothing is published.
    await assert_nothing_published(raw, listen, channel_of(name))
    await b.unlock()
    assert await next_message(listen) == "0"

    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    assert await raw.hgetall(name) == {"mode": "write", f"{holder_id(client, 'w')}:write": "1"}
    await writer.unlock()
    assert await next_message(listen) == "1"
    await assert_nothing_published(raw, listen, channel_of(name))
    assert await raw.exists(name) == 0


async def test_waiters_subscribe_to_the_rwlock_channel(
    client: aiolock.Client, raw: Redis, name: str, uid: str
) -> None:
    """Read and write waiters of one client share one subscription to redisson_rwlock:{name}."""
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    read_waiter = Holder(rw(client, name).read_lock())
    write_waiter = Holder(rw(client, name).write_lock())
    await waiting(writer, 2)
    await wait_until(lambda: subscriptions_confirmed(client), what="subscribed")
    assert inside.dispatcher(client).channels() == {channel_of(name): 2}
    assert await raw.pubsub_channels(f"*{uid}*") == [channel_of(name)]
    await writer.unlock()
    # Either may get in first (both are woken): each lets go as soon as it is in.
    for waiter in (read_waiter, write_waiter):
        waiter.leave.set()
    for waiter in (read_waiter, write_waiter):
        await waiter.release()
        assert waiter.entered.is_set()


async def test_braced_name_layout(
    client: aiolock.Client, raw: Redis, listen: PubSub, uid: str
) -> None:
    """A name with a {tag} is used as is: name:<holder>:rwlock_timeout:1, redisson_rwlock:name."""
    name = f"{{{uid}}}:rw"
    await subscribe_confirmed(listen, f"redisson_rwlock:{name}")
    reader = rw(client, name, owner="r").read_lock()
    await reader.lock()
    key = f"{name}:{holder_id(client, 'r')}:rwlock_timeout:1"
    assert await raw.get(key) == "1"
    assert sorted(await raw.keys(f"*{uid}*")) == sorted([name, key])
    await reader.unlock()
    assert await next_message(listen) == "0"
    assert await raw.exists(name, key) == 0


async def test_key_prefix_applies_to_every_key(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """key_prefix is prepended to the name before every rw key and channel is derived."""
    client = make_client(key_prefix="app:")
    full = f"app:{name}"
    reader = rw(client, name, owner="r").read_lock()
    await reader.lock()
    assert await raw.hgetall(full) == {"mode": "read", holder_id(client, "r"): "1"}
    assert await raw.exists(timeout_key(full, holder_id(client, "r"), 1)) == 1
    await reader.unlock()
    assert await raw.exists(full) == 0


# -- read unlock TTL recomputation (spec 6.3) -----------------------------------------------


async def test_read_unlock_recomputes_the_ttl_from_every_holder(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A read unlock sets the hash TTL to the longest remaining read hold, whoever's."""
    client, other = make_client(), make_client()
    long_ = rw(client, name, owner="long").read_lock()
    short = rw(other, name, owner="short").read_lock()
    await long_.lock(lease=100)
    await short.lock(lease=5)
    assert await pttl(raw, name) > 50_000
    await long_.unlock()
    assert 0 < await pttl(raw, name) <= 5_000
    await long_.lock(lease=100)
    assert await pttl(raw, name) > 50_000
    await short.unlock()
    assert 50_000 < await pttl(raw, name) <= 100_000
    await long_.unlock()
    assert await raw.exists(name) == 0


async def test_java_read_hold_keeps_the_hash_alive(
    client: aiolock.Client, raw: Redis, listen: PubSub, name: str
) -> None:
    """A Java reader's timeout key counts in the recomputation; once gone, the hash goes."""
    await subscribe_confirmed(listen, channel_of(name))
    java = "7b0c7d56-5d36-4b55-9bb4-0a5f3c1f8a11:42"
    await raw.hset(name, mapping={"mode": "read", java: "1"})
    await raw.set(timeout_key(name, java, 1), "1", px=60_000)
    await raw.pexpire(name, 60_000)
    reader = rw(client, name, owner="r").read_lock()
    await reader.lock(lease=5)
    await reader.unlock()
    assert await raw.hgetall(name) == {"mode": "read", java: "1"}
    assert 50_000 < await pttl(raw, name) <= 60_000
    await assert_nothing_published(raw, listen, channel_of(name))
    # The Java hold's key ran out (its process died): the next last unlock deletes the hash.
    await raw.delete(timeout_key(name, java, 1))
    await reader.lock()
    await reader.unlock()
    assert await raw.exists(name) == 0
    assert await next_message(listen) == "0"


# -- queries and force_unlock ---------------------------------------------------------------


async def test_queries_per_side(client: aiolock.Client, raw: Redis, name: str) -> None:
    """is_locked, is_held_by_current_task and hold_count answer for their own side."""
    lock = rw(client, name)
    read, write = lock.read_lock(), lock.write_lock()
    assert not await read.is_locked()
    assert not await write.is_locked()

    await read.lock()
    await read.lock()
    assert await read.is_locked()
    assert not await write.is_locked()
    assert await read.hold_count() == 2
    assert await read.is_held_by_current_task()
    assert await write.hold_count() == 0
    assert not await write.is_held_by_current_task()
    assert not await in_task(read.is_held_by_current_task())
    await read.unlock()
    await read.unlock()

    await write.lock()
    # A writer alone: the read side is not locked (mode=write with no read holds).
    assert await write.is_locked()
    assert not await read.is_locked()
    assert await write.hold_count() == 1
    assert await read.hold_count() == 0
    await read.lock()
    # mode=write with read holds (HLEN > 2): both sides are locked.
    assert await read.is_locked()
    assert await write.is_locked()
    assert await read.is_held_by_current_task()
    assert await write.is_held_by_current_task()
    remaining = await read.remaining_lease()
    assert remaining is not None
    assert remaining > 20
    await write.unlock()
    assert await read.is_locked()
    assert not await write.is_locked()
    await read.unlock()
    assert await read.remaining_lease() is None
    assert await raw.exists(name) == 0


async def test_force_unlock_only_in_its_own_mode(
    make_client: ClientFactory, raw: Redis, listen: PubSub, name: str, uid: str
) -> None:
    """read force_unlock() leaves a writer alone and vice versa; in its mode it deletes all."""
    await subscribe_confirmed(listen, channel_of(name))
    client, other = make_client(), make_client()
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    assert not await rw(other, name).read_lock().force_unlock()
    assert not await rw(client, name).read_lock().force_unlock()
    await assert_nothing_published(raw, listen, channel_of(name))
    # The writer's hold is intact, still renewed, and released normally.
    assert writer.statistics().held_by_current_task
    assert len(inside.renewal(client)) == 1
    await writer.unlock()
    assert await next_message(listen) == "1"

    readers = [rw(client, name, owner=f"r{i}").read_lock() for i in range(2)]
    for reader in readers:
        await reader.lock()
    await readers[0].lock()
    assert not await rw(other, name).write_lock().force_unlock()
    assert await raw.hget(name, "mode") == "read"
    assert len(inside.renewal(client)) == 2
    assert await rw(other, name).read_lock().force_unlock()
    assert await next_message(listen) == "0"
    # The hash and every read hold's timeout key are gone.
    assert await raw.keys(f"*{uid}*rwlock_timeout*") == []
    assert await raw.exists(name) == 0
    # The holders' client learns it from its watchdog.
    await inside.renewal(client).renew_once()
    assert len(inside.renewal(client)) == 0
    for reader in readers:
        with pytest.raises(aiolock.LockLostError):
            await reader.unlock()
        # As Redisson's read unlock does, an unlock of a lock with no mode still
        # publishes "0": a wake-up for anyone waiting on a lock that vanished.
        assert await next_message(listen) == "0"

    await writer.lock()
    assert await rw(other, name).write_lock().force_unlock()
    assert await next_message(listen) == "1"
    assert await raw.exists(name) == 0
    with pytest.raises(aiolock.LockLostError):
        await writer.unlock()


async def test_wrong_type_raises_lock_error(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A key of another type under the name raises LockError from every rw operation."""
    await raw.set(name, "not a hash")
    lock = rw(client, name)
    for side in (lock.read_lock(), lock.write_lock()):
        with pytest.raises(aiolock.LockError, match="another type"):
            await side.try_lock(0)
        with pytest.raises(aiolock.LockError, match="another type"):
            await side.is_locked()
        with pytest.raises(aiolock.LockError, match="another type"):
            await side.unlock()
        with pytest.raises(aiolock.LockError, match="another type"):
            await side.force_unlock()
    await raw.delete(name)


# -- leases and the watchdog --------------------------------------------------------------


@pytest.mark.parametrize("case", ["read-delete", "read-expire", "write-delete", "write-expire"])
async def test_lost_lease_is_logged_and_raised(
    make_client: ClientFactory, raw: Redis, uid: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A watchdog hold whose hash vanishes is logged at WARNING and its unlock raises."""
    side, how = case.split("-")
    name = f"test:{uid}"
    client = make_client(watchdog_timeout=0.3)
    lock = rw(client, name, owner="h")
    handle = lock.read_lock() if side == "read" else lock.write_lock()
    await handle.lock()
    if how == "delete":
        await raw.delete(name)
    else:
        await raw.pexpire(name, 1)
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await wait_until(lambda: len(inside.renewal(client)) == 0, what="watchdog noticed")
    lost = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert len(lost) == 1
    assert name in lost[0]
    assert holder_id(client, "h") in lost[0]
    with pytest.raises(aiolock.LockLostError, match="watchdog"):
        await handle.unlock()
    # A read hold's timeout key outlives a deleted hash until its own lease runs out.
    for key in await raw.keys(f"*{uid}*"):
        assert key == timeout_key(name, holder_id(client, "h"), 1)
        await raw.delete(key)


async def test_explicit_lease_read_hold_expires(
    make_client: ClientFactory, raw: Redis, name: str, uid: str
) -> None:
    """A read hold with lease= is never renewed: hash and timeout key expire together."""
    client = make_client(watchdog_timeout=0.3)
    reader = rw(client, name).read_lock()
    await reader.lock(lease=0.2)
    assert len(inside.renewal(client)) == 0

    async def gone() -> bool:
        return await raw.keys(f"*{uid}*") == []

    await wait_until(gone, what="lease expired")
    with pytest.raises(aiolock.LockLostError):
        await reader.unlock()


async def test_watchdog_renews_read_and_write_holds(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Watchdog read holds (hash + own timeout keys) and write holds outlive many leases."""
    client = make_client(watchdog_timeout=0.3)
    reader = rw(client, name, owner="r").read_lock()
    writer = rw(client, f"{name}:w", owner="w").write_lock()
    await reader.lock()
    await reader.lock()
    await writer.lock()
    # One call per kind per period; twenty calls are ten periods, over three leases.
    await wait_until(lambda: inside.renewal(client).calls >= 20, what="ten renewal periods")
    assert await reader.hold_count() == 2
    assert await writer.is_held_by_current_task()
    holder = holder_id(client, "r")
    for key in (name, timeout_key(name, holder, 1), timeout_key(name, holder, 2), f"{name}:w"):
        assert 0 < await pttl(raw, key) <= 300, key
    before = inside.renewal(client).calls
    await inside.renewal(client).renew_once()
    assert inside.renewal(client).calls - before == 2
    await reader.unlock()
    await reader.unlock()
    await writer.unlock()
    assert len(inside.renewal(client)) == 0
    assert await raw.exists(name, f"{name}:w") == 0


async def test_read_renewal_leaves_other_clients_keys_alone(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A client's read renewal extends its own timeout keys, never another client's."""
    mine, theirs = make_client(), make_client()
    own = rw(mine, name, owner="me").read_lock()
    foreign = rw(theirs, name, owner="them").read_lock()
    await own.lock()
    await foreign.lock()
    own_key = timeout_key(name, holder_id(mine, "me"), 1)
    foreign_key = timeout_key(name, holder_id(theirs, "them"), 1)
    for key in (name, own_key, foreign_key):
        await raw.pexpire(key, 1_000)
    await inside.renewal(mine).renew_once()
    assert await pttl(raw, own_key) > 20_000
    assert await pttl(raw, name) > 20_000
    assert 0 < await pttl(raw, foreign_key) <= 1_000
    assert await raw.hget(name, holder_id(theirs, "them")) == "1"
    await foreign.unlock()
    await own.unlock()
    assert await raw.exists(name) == 0


async def test_read_renewal_never_shortens_the_hash(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Renewing a watchdog reader keeps a longer explicit lease of another reader intact."""
    mine, theirs = make_client(), make_client()
    own = rw(mine, name, owner="me").read_lock()
    long_ = rw(theirs, name, owner="long").read_lock()
    await long_.lock(lease=100)
    await own.lock()
    await inside.renewal(mine).renew_once()
    assert await pttl(raw, name) > 50_000
    await own.unlock()
    await long_.unlock()


async def test_read_renewal_is_batched_per_kind(
    make_client: ClientFactory, raw: Redis, uid: str
) -> None:
    """150 read holds and 50 write holds cost ceil(150/100) + 1 renewal calls per period."""
    client = make_client(watchdog_timeout=3600)
    readers = [rw(client, f"test:{uid}:r{i}").read_lock() for i in range(150)]
    writers = [rw(client, f"test:{uid}:w{i}").write_lock() for i in range(50)]
    for handle in [*readers, *writers]:
        await handle.lock()
    before = inside.renewal(client).calls
    await inside.renewal(client).renew_once()
    assert inside.renewal(client).calls - before == -(-150 // BATCH_SIZE) + 1
    for handle in [*readers, *writers]:
        await handle.unlock()


# -- pub/sub loss ------------------------------------------------------------------------


async def test_waiters_recover_after_pubsub_connection_is_killed(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """CLIENT KILL TYPE pubsub while readers and a writer wait: every one still gets in."""
    client = make_client()
    writer = rw(client, name, owner="w").write_lock()
    await writer.lock()
    got: list[str] = []

    async def visit(handle: aiolock.ReadLock | aiolock.WriteLock, label: str) -> None:
        async with handle:
            got.append(label)

    tasks = [asyncio.create_task(visit(rw(client, name).read_lock(), f"r{i}")) for i in range(3)]
    tasks.append(asyncio.create_task(visit(rw(client, name).write_lock(), "w")))
    await waiting(writer, 4)
    await wait_until(lambda: subscriptions_confirmed(client), what="subscribed")
    await raw.client_kill_filter(_type="pubsub")
    # Released while the subscription is (probably) down: that "1" may be lost. The
    # holder's lease is 30 s, so only the restored subscription can wake them in time.
    await writer.unlock()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*tasks)
    assert sorted(got) == ["r0", "r1", "r2", "w"]
    assert inside.dispatcher(client).reconnects >= 1


# -- cancellation and idempotency -----------------------------------------------------------


@pytest.fixture
async def gated(redis_url: str, raw: Redis) -> AsyncIterator[tuple[aiolock.Client, Gate]]:
    """A client whose chosen script reply can be held back after the command was sent."""
    redis, gate = gated_redis(redis_url)
    client = gate.attach(aiolock.Client(redis))
    yield client, gate
    await client.aclose()
    await redis.aclose()


async def _cancel_in_flight(task: asyncio.Task[Any], gate: Gate) -> None:
    async with asyncio.timeout(LIMIT):
        await gate.sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _only_renewal_running(client: aiolock.Client) -> bool:
    return inside.background(client).tasks <= {inside.task_of(inside.renewal(client))}


@pytest.mark.parametrize("side", ["read", "write"])
async def test_acquire_cancelled_in_flight_leaves_nothing(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str, uid: str, side: str
) -> None:
    """A read or write lock() cancelled with its script in flight is rolled back entirely."""
    client, gate = gated
    lock = rw(client, name, owner="c")
    handle = lock.read_lock() if side == "read" else lock.write_lock()
    gate.arm(f"rw_{side}_acquire")
    await _cancel_in_flight(asyncio.create_task(handle.lock()), gate)
    await wait_until(lambda: _only_renewal_running(client), what="rollback finished")

    async def nothing_left() -> bool:
        keys = [str(key) for key in await raw.keys(f"*{uid}*")]
        return not [k for k in keys if not k.startswith("aiolock_acquire_cancel:")]

    assert await nothing_left()
    assert len(inside.holds(client)) == 0
    assert len(inside.renewal(client)) == 0
    assert await handle.try_lock(0)
    await handle.unlock()


async def test_reentrant_read_cancel_undoes_exactly_one_hold(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str
) -> None:
    """A reader with count 1 whose re-entry is cancelled in flight keeps count 1 and key 1."""
    client, gate = gated
    reader = rw(client, name, owner="c").read_lock()
    holder = holder_id(client, "c")
    await reader.lock()
    gate.arm("rw_read_acquire")
    await _cancel_in_flight(asyncio.create_task(reader.lock()), gate)
    await wait_until(lambda: _only_renewal_running(client), what="rollback finished")
    assert await raw.hgetall(name) == {"mode": "read", holder: "1"}
    assert await raw.exists(timeout_key(name, holder, 1)) == 1
    assert await raw.exists(timeout_key(name, holder, 2)) == 0
    assert reader.statistics().hold_count == 1
    await reader.unlock()
    assert await raw.exists(name) == 0


async def test_rollback_before_late_acquire_voids_it(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """If a rollback reaches the server before its acquire, the acquire takes nothing."""
    field = f"{client.id}:late"
    prefix = timeout_key(name, field, 1).removesuffix(":1")
    read_tomb = f"aiolock_acquire_cancel:{{{name}}}:late-r"
    write_tomb = f"aiolock_acquire_cancel:{{{name}}}:late-w"
    run = inside.runner(client).run
    channel = channel_of(name)
    assert (
        await run(
            load_script("rw_read_rollback"),
            [name, channel, prefix, f"{{{name}}}", read_tomb],
            [field, 1, "PUBLISH", 5_000],
        )
        == 0
    )
    assert await run(
        load_script("rw_read_acquire"),
        [name, prefix, read_tomb],
        [30_000, field, f"{field}:write", 1],
    ) == [-1, 0]
    assert (
        await run(
            load_script("rw_write_rollback"),
            [name, channel, write_tomb],
            [f"{field}:write", 1, 30_000, "PUBLISH", 5_000],
        )
        == 0
    )
    assert await run(
        load_script("rw_write_acquire"), [name, write_tomb], [30_000, f"{field}:write", 1]
    ) == [-1, 0]
    assert await raw.exists(name, f"{prefix}:1") == 0
    await raw.delete(read_tomb, write_tomb)


async def test_resent_acquire_counts_once(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A read or write acquire resent with the same target takes (and extends) once."""
    field = f"{client.id}:direct"
    prefix = timeout_key(name, field, 1).removesuffix(":1")
    tomb = f"aiolock_acquire_cancel:{{{name}}}:direct"
    read, write = load_script("rw_read_acquire"), load_script("rw_write_acquire")
    run = inside.runner(client).run
    for _ in range(2):
        assert await run(read, [name, prefix, tomb], [30_000, field, f"{field}:write", 1]) == [1, 1]
    assert await raw.hgetall(name) == {"mode": "read", field: "1"}
    assert await raw.exists(f"{prefix}:2") == 0
    await raw.delete(name, f"{prefix}:1")

    for target in (1, 2, 2):
        reply = await run(write, [name, tomb], [10_000, f"{field}:write", target])
        assert reply == [1, target]
    assert await raw.hget(name, f"{field}:write") == "2"
    # One re-entry added one lease, not two.
    assert 10_000 < await pttl(raw, name) <= 20_000
    await raw.delete(name)


async def test_release_replays_from_latch(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Resent read and write releases replay their first result instead of running again."""
    field = f"{client.id}:direct"
    prefix = timeout_key(name, field, 1).removesuffix(":1")
    tomb = f"aiolock_acquire_cancel:{{{name}}}:direct"
    run = inside.runner(client).run
    channel = channel_of(name)
    await run(load_script("rw_write_acquire"), [name, tomb], [30_000, f"{field}:write", 1])
    await run(
        load_script("rw_read_acquire"), [name, prefix, tomb], [30_000, field, f"{field}:write", 1]
    )

    write_latch = f"redisson_unlock_latch:{{{name}}}:{'a' * 32}"
    write_args: list[str | int] = ["1", 30_000, f"{field}:write", "PUBLISH", 20_000]
    for _ in range(2):
        # 2: the write hold is gone, the holder's read hold remains (downgraded).
        assert (
            await run(load_script("rw_write_release"), [name, channel, write_latch], write_args)
            == 2
        )
    assert await raw.hgetall(name) == {"mode": "read", field: "1"}

    read_latch = f"redisson_unlock_latch:{{{name}}}:{'b' * 32}"
    read_keys = [name, channel, prefix, f"{{{name}}}", read_latch]
    for _ in range(2):
        assert (
            await run(load_script("rw_read_release"), read_keys, ["0", field, "PUBLISH", 20_000])
            == 1
        )
    assert await raw.exists(name, f"{prefix}:1") == 0
    # A new request id finds nothing to release, and writes no latch.
    other_latch = f"redisson_unlock_latch:{{{name}}}:{'c' * 32}"
    read_keys[-1] = other_latch
    assert (
        await run(load_script("rw_read_release"), read_keys, ["0", field, "PUBLISH", 20_000])
        is None
    )
    assert await raw.exists(other_latch) == 0
    await raw.delete(write_latch, read_latch)


# -- handle ------------------------------------------------------------------------------


async def test_handle_name_repr_and_statistics(client: aiolock.Client, name: str) -> None:
    """The handle shows its name; both sides count the name's waiters together."""
    lock = client.read_write_lock(name, owner="job")
    assert lock.name == name
    assert repr(lock) == f"<aiolock.ReadWriteLock {name!r} owner='job'>"
    assert lock.read_lock().name == lock.write_lock().name == name
    assert isinstance(lock.read_lock(), aiolock.ReadLock)
    assert isinstance(lock.write_lock(), aiolock.WriteLock)
    await lock.write_lock().lock()
    waiter = Holder(client.read_write_lock(name).read_lock())
    await waiting(lock.read_lock(), 1)
    assert lock.write_lock().statistics().tasks_waiting == 1
    assert lock.write_lock().statistics().held_by_current_task
    assert not lock.read_lock().statistics().held_by_current_task
    await lock.write_lock().unlock()
    await waiter.wait_entered()
    await waiter.release()


@pytest.mark.parametrize("bad", ["", 3])
def test_invalid_arguments(client: aiolock.Client, bad: Any) -> None:
    """A bad name or owner is refused at once."""
    with pytest.raises((TypeError, ValueError)):
        client.read_write_lock(bad)
    with pytest.raises((TypeError, ValueError)):
        client.read_write_lock("x", owner=bad)


async def _cut_off_read_unlock(reader: aiolock.ReadLock, gate: Gate) -> None:
    """``reader.unlock()`` cut off by a timeout once its script is sent (its reply held),
    in the calling task."""
    gate.arm("rw_read_release")

    async def unlock_until_cut() -> None:
        async with asyncio.timeout(None) as cut:

            async def cut_when_sent() -> None:
                await gate.sent.wait()
                cut.reschedule(asyncio.get_running_loop().time())

            watcher = asyncio.create_task(cut_when_sent())
            try:
                await reader.unlock()
            finally:
                await watcher

    with pytest.raises(TimeoutError):
        await unlock_until_cut()


@pytest.mark.parametrize("reads", [1, 2])
async def test_write_lock_after_a_cut_off_read_unlock_waits_for_it(
    gated: tuple[aiolock.Client, Gate], raw: Redis, name: str, reads: int
) -> None:
    """A read unlock() cut off by a timeout finishes in the background. The same task's
    write lock() then waits its turn: it gets in once the last read hold is gone (it used
    to raise LockUpgradeError at once), and is refused as an upgrade if one remains."""
    client, gate = gated
    lock = rw(client, name)
    reader, writer = lock.read_lock(), lock.write_lock()
    for _ in range(reads):
        await reader.lock()
    await _cut_off_read_unlock(reader, gate)
    if reads == 1:
        await writer.lock()
        assert (await raw.hgetall(name))["mode"] == "write"
        await writer.unlock()
    else:
        with pytest.raises(aiolock.LockUpgradeError):
            await writer.lock()
        assert reader.statistics().hold_count == 1
        await reader.unlock()
    await quiesce(client)
    assert await raw.exists(name) == 0


async def test_a_renewal_sent_behind_a_reentrant_read_unlock_reports_no_loss(
    client: aiolock.Client, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal round sent while one of two read holds is being released.

    The server runs the release first, so the round finds the second hold's timeout key gone.
    That answer comes after the release's: the hold it judged had changed under it, and no
    loss is reported. The last hold still unlocks."""
    # owner=: the unlock runs in a task of its own.
    reader = client.read_write_lock(name, owner="r").read_lock()
    await reader.lock()
    await reader.lock()
    unlocking = asyncio.create_task(reader.unlock())
    await asyncio.sleep(0)  # the unlock's script is sent in its first step
    await inside.renewal(client).renew_once()
    await unlocking
    await reader.unlock()  # raised LockLostError when the round's answer was taken as a loss
    assert "was lost" not in caplog.text
