"""One shared pub/sub connection: ref-counted channels, wake rules, and reconnects."""

from __future__ import annotations

import asyncio
from collections import deque

from redis.asyncio import Redis

import aiolock
from aiolock._engine.primitive import lock_wake_count
from aiolock._engine.waiting import Waiter, WaitingRoom, WakeCount
from aiolock._keys import lock_channel
from aiolock._net.pubsub import Dispatcher
from aiolock._net.subscriptions import Channel
from aiolock._objects.rwlock import rwlock_wake_count

from . import inside
from .conftest import ClientFactory
from .helpers import subscriptions_confirmed, wait_until


class _Waiters:
    """The waiters of channel "ch" in the waiting room, as the engine registers them."""

    def __init__(self, room: WaitingRoom, wake: WakeCount) -> None:
        self.room = room
        self.wake = wake

    def add_waiter(self, *, shared: bool = False) -> Waiter:
        return self.room.add("ch", self.wake, shared=shared)

    def remove_waiter(self, waiter: Waiter, *, leaving: bool, mid_attempt: bool = False) -> None:
        self.room.remove("ch", waiter, leaving=leaving, mid_attempt=mid_attempt)


def _subscription(
    wake: WakeCount = lock_wake_count,
) -> tuple[Dispatcher, _Waiters, Channel]:
    """A dispatcher subscribed to "ch" (no connection) and the room it delivers to."""
    room = WaitingRoom()
    channel = Channel("ch")
    channel.refs = 1
    dispatcher = inside.unconnected_dispatcher(room, [channel])
    return dispatcher, _Waiters(room, wake), channel


def _message(data: bytes) -> list[bytes]:
    return [b"message", b"ch", data]


def test_unlock_message_wakes_one_waiter_longest_waiting_first() -> None:
    """Message 0 wakes exactly one local waiter: the one registered first."""
    dispatcher, sub, _ = _subscription()
    waiters = [sub.add_waiter() for _ in range(3)]
    inside.deliver(dispatcher, _message(b"0"))
    assert [w.event.is_set() for w in waiters] == [True, False, False]
    inside.deliver(dispatcher, _message(b"0"))
    assert [w.event.is_set() for w in waiters] == [True, True, False]


def test_write_unlock_message_wakes_all() -> None:
    """Message 1 wakes every local waiter."""
    dispatcher, sub, _ = _subscription()
    waiters = [sub.add_waiter() for _ in range(3)]
    inside.deliver(dispatcher, _message(b"1"))
    assert all(w.event.is_set() for w in waiters)


def test_unused_wake_is_passed_on_when_a_waiter_leaves() -> None:
    """A woken waiter that gives up (cancelled, deadline) hands its wake-up on."""
    dispatcher, sub, _ = _subscription()
    first, second = sub.add_waiter(), sub.add_waiter()
    inside.deliver(dispatcher, _message(b"0"))
    sub.remove_waiter(first, leaving=True)
    assert second.event.is_set()


def test_waiter_leaving_mid_attempt_passes_its_turn_on() -> None:
    """A waiter whose attempt was cut off (cancelled, error) wakes the next one.

    The lock may be free, and a newcomer that queued behind it without trying (no
    barging) would hear no release message.
    """
    _, sub, _ = _subscription()
    trying, queued = sub.add_waiter(), sub.add_waiter()
    sub.remove_waiter(trying, leaving=True, mid_attempt=True)
    assert queued.event.is_set()


def test_waiter_leaving_after_a_lost_attempt_wakes_nobody() -> None:
    """Unwoken after losing to a holder, a leaving waiter wakes nobody: the release will."""
    _, sub, _ = _subscription()
    lost, other = sub.add_waiter(), sub.add_waiter()
    sub.remove_waiter(lost, leaving=True)
    assert not other.event.is_set()


def test_rwlock_messages_wake_every_reader_and_one_writer() -> None:
    """On a read-write lock channel "1" and "0" each wake all readers but one writer."""
    dispatcher, writers, _channel = _subscription(rwlock_wake_count)
    readers = writers
    order = [
        writers.add_waiter(),
        readers.add_waiter(shared=True),
        writers.add_waiter(),
        readers.add_waiter(shared=True),
        writers.add_waiter(),
    ]
    inside.deliver(dispatcher, _message(b"1"))
    assert [w.event.is_set() for w in order] == [True, True, False, True, False]
    later_reader = readers.add_waiter(shared=True)
    inside.deliver(dispatcher, _message(b"0"))
    assert [w.event.is_set() for w in order] == [True, True, True, True, False]
    assert later_reader.event.is_set()


def test_local_downgrade_wake_reaches_readers_only() -> None:
    """wake_shared(), as after a downgrade, lets the readers retry and leaves writers parked."""
    _dispatcher, writers, _channel = _subscription(rwlock_wake_count)
    writer, reader = writers.add_waiter(), writers.add_waiter(shared=True)
    writers.room.wake_shared("ch")
    assert reader.event.is_set()
    assert not writer.event.is_set()


def test_writer_passes_its_wake_to_the_next_writer_not_to_readers() -> None:
    """A woken writer that gives up wakes the next writer; readers are not woken again."""
    dispatcher, writers, _channel = _subscription(rwlock_wake_count)
    first, second = writers.add_waiter(), writers.add_waiter()
    inside.deliver(dispatcher, _message(b"1"))
    reader = writers.add_waiter(shared=True)
    writers.remove_waiter(first, leaving=True)
    assert second.event.is_set()
    assert not reader.event.is_set()


def test_reader_giving_up_wakes_a_writer_queued_behind_it() -> None:
    """A woken reader that leaves wakes a writer that queued after the wake-up.

    Such a writer (no barging) never tried: without the pass-on it would sleep until its
    lease-bounded timeout although the lock may be free.
    """
    dispatcher, writers, _channel = _subscription(rwlock_wake_count)
    readers = writers
    reader = readers.add_waiter(shared=True)
    inside.deliver(dispatcher, _message(b"1"))
    queued = writers.add_waiter()
    readers.remove_waiter(reader, leaving=True)
    assert queued.event.is_set()
    assert writers.room.waiters("ch") == [queued]


def test_confirmation_wakes_every_waiter_to_recheck() -> None:
    """A (re)confirmed subscription wakes all waiters: messages may have been missed."""
    dispatcher, sub, channel = _subscription()
    waiters = [sub.add_waiter() for _ in range(2)]
    inside.deliver(dispatcher, [b"subscribe", b"ch", 1])
    assert channel.confirmed.is_set()
    assert all(w.event.is_set() for w in waiters)


def test_stale_subscribe_reply_does_not_confirm() -> None:
    """A reply to an older SUBSCRIBE, with an UNSUBSCRIBE and SUBSCRIBE queued, is not taken."""
    dispatcher, _, channel = _subscription()
    for subscribe in (True, False, True):
        inside.sent_of(dispatcher).setdefault("ch", deque()).append(subscribe)
    inside.deliver(dispatcher, [b"subscribe", b"ch", 1])
    inside.deliver(dispatcher, [b"unsubscribe", b"ch", 0])
    assert not channel.confirmed.is_set()
    inside.deliver(dispatcher, [b"subscribe", b"ch", 1])
    assert channel.confirmed.is_set()


async def _pubsub_clients(raw: Redis) -> int:
    return len(await raw.client_list(_type="pubsub"))


async def test_one_connection_serves_every_waiter(
    client: aiolock.Client, raw: Redis, uid: str
) -> None:
    """Ten tasks waiting on three locks share one pub/sub connection, one SUBSCRIBE each."""
    holders = [client.lock(f"test:{uid}:{i}", owner="holder") for i in range(3)]
    for lock in holders:
        await lock.lock()
    waiters = [asyncio.create_task(client.lock(f"test:{uid}:{i % 3}").lock()) for i in range(10)]
    await wait_until(lambda: inside.waiting_room(client).total() == 10, what="ten waiting")
    await wait_until(lambda: subscriptions_confirmed(client), what="subscriptions confirmed")
    assert await _pubsub_clients(raw) == 1
    numsub = dict(await raw.pubsub_numsub(*(lock_channel(lock.name) for lock in holders)))
    assert set(numsub.values()) == {1}
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    for lock in holders:
        await lock.unlock()


async def test_waiters_recover_after_pubsub_connection_is_killed(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """CLIENT KILL TYPE pubsub while tasks wait: every one of them still acquires.

    The holder's lease is long (watchdog 30 s) and the test's safety net is much shorter,
    so the waiters cannot be rescued by the TTL-bounded wait: only a restored subscription
    and the re-check after it can wake them in time. The holder is another client's: a
    release of this client would hand the lock over to a waiter, needing no message.
    """
    client = make_client()
    holder = make_client().lock(name, owner="holder")
    await holder.lock()
    acquired: list[int] = []

    async def worker(i: int) -> None:
        async with client.lock(name):
            acquired.append(i)

    tasks = [asyncio.create_task(worker(i)) for i in range(5)]
    await wait_until(lambda: client.lock(name).statistics().tasks_waiting == 5, what="5 waiting")
    await wait_until(lambda: subscriptions_confirmed(client), what="subscribed")
    await raw.client_kill_filter(_type="pubsub")
    # Release while the subscription is (probably) down: that message may be lost.
    await holder.unlock()
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks)
    assert sorted(acquired) == list(range(5))
    assert inside.dispatcher(client).reconnects >= 1


async def test_repeated_pubsub_kills_while_waiting(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Kills before, during and after a handoff chain never strand a waiter."""
    client = make_client()
    count = 0

    async def worker() -> None:
        nonlocal count
        for _ in range(5):
            async with client.lock(name):
                value = count
                await asyncio.sleep(0)
                count = value + 1

    tasks = [asyncio.create_task(worker()) for _ in range(6)]
    async with asyncio.timeout(20):
        while not all(t.done() for t in tasks):
            await raw.client_kill_filter(_type="pubsub")
            await asyncio.wait(tasks, timeout=0.05)
        await asyncio.gather(*tasks)
    assert count == 30


async def test_releasing_task_does_not_barge_past_a_waiter(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A task that unlocks and locks again at once goes after the task already waiting."""
    order: list[str] = []
    first_hold = asyncio.Event()
    again = asyncio.Event()

    async def releaser() -> None:
        lock = client.lock(name)
        await lock.lock()
        first_hold.set()
        await again.wait()
        await lock.unlock()
        await lock.lock()  # straight back: without the rule it wins before the waiter wakes
        order.append("releaser")
        await lock.unlock()

    async def waiter() -> None:
        async with client.lock(name):
            order.append("waiter")

    releasing = asyncio.create_task(releaser())
    await first_hold.wait()
    waiting = asyncio.create_task(waiter())
    await wait_until(lambda: client.lock(name).statistics().tasks_waiting == 1, what="waiting")
    await wait_until(lambda: subscriptions_confirmed(client), what="subscribed")
    again.set()
    async with asyncio.timeout(10):
        await asyncio.gather(releasing, waiting)
    assert order == ["waiter", "releaser"]
