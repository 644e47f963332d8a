"""aiolock.sync on a real server: every lock kind from threads, interop with the async
client both ways (wake-ups), interruption (SIGINT, close), forks and misuse."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, assert_type

import pytest
from redis import Redis

import aiolock
import aiolock.sync
from aiolock._keys import lock_channel

from . import inside
from .helpers import wait_until as until
from .test_lock import JAVA_ACQUIRE, JAVA_UNLOCK

# Safety net only: every wait below ends on an event or on Redis state.
LIMIT = 10.0

SyncFactory = Callable[..., aiolock.sync.Client]

KINDS: list[Any] = [
    pytest.param(lambda c, n, **kw: c.lock(n, **kw), True, id="Lock"),
    pytest.param(lambda c, n, **kw: c.fair_lock(n, **kw), True, id="FairLock"),
    pytest.param(lambda c, n, **kw: c.fenced_lock(n, **kw), True, id="FencedLock"),
    pytest.param(lambda c, n, **kw: c.spin_lock(n, **kw), True, id="SpinLock"),
    pytest.param(lambda c, n, **kw: c.read_write_lock(n, **kw).read_lock(), False, id="ReadLock"),
    pytest.param(lambda c, n, **kw: c.read_write_lock(n, **kw).write_lock(), True, id="WriteLock"),
    pytest.param(
        lambda c, n, **kw: c.fair_read_write_lock(n, **kw).read_lock(), False, id="FairReadLock"
    ),
    pytest.param(
        lambda c, n, **kw: c.fair_read_write_lock(n, **kw).write_lock(), True, id="FairWriteLock"
    ),
    pytest.param(
        lambda c, n, **kw: aiolock.sync.MultiLock(c.lock(n, **kw), c.fair_lock(f"{n}:b", **kw)),
        True,
        id="MultiLock",
    ),
    pytest.param(
        lambda c, n, **kw: aiolock.sync.RedLock(*(c.lock(f"{n}:{i}", **kw) for i in range(3))),
        True,
        id="RedLock",
    ),
]


@pytest.fixture
def make_sync(redis_url: str, uid: str) -> Iterator[SyncFactory]:
    clients: list[aiolock.sync.Client] = []

    def make(**options: Any) -> aiolock.sync.Client:
        client = aiolock.sync.Client.from_url(redis_url, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
    with Redis.from_url(redis_url) as redis:
        # Keys that outlive a test by design, each with a TTL: a fenced lock's token counter,
        # and the tombstone an interrupted acquire leaves for a late copy of its attempt.
        transient = (b"redisson_lock_token:", b"aiolock_acquire_cancel:")
        left = [k for k in redis.keys(f"*{uid}*") if not k.startswith(transient)]
        assert left == [], "a test left keys behind"
        assert all(redis.pttl(k) > 0 for k in redis.keys(f"aiolock_acquire_cancel:*{uid}*"))
        redis.delete(*redis.keys(f"redisson_lock_token:*{uid}*") or ["-"])


@pytest.fixture
def sync_client(make_sync: SyncFactory) -> aiolock.sync.Client:
    return make_sync()


def in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a new thread (another holder); its result or its exception."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:
            box.append((False, exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(LIMIT)
    assert box, "the thread did not finish"
    ok, value = box[0]
    if not ok:
        raise value
    return value


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


@pytest.mark.parametrize(("make", "exclusive"), KINDS)
def test_every_kind_from_threads(
    make: Callable[..., Any], exclusive: bool, sync_client: aiolock.sync.Client, name: str
) -> None:
    """The contract's lock methods, with threads as holders, on every lock kind."""
    handle = make(sync_client, name)
    with handle:
        assert handle.is_locked()
        assert handle.is_held_by_current_task()
        assert handle.hold_count() == 1
        assert handle.try_lock(0)  # reentrant
        assert handle.hold_count() == 2
        handle.unlock()
        assert not in_thread(handle.is_held_by_current_task)
        with pytest.raises(aiolock.LockNotOwnedError):
            in_thread(handle.unlock)
        if exclusive:
            assert not in_thread(lambda: handle.try_lock(wait=0.05))

            def enter() -> None:
                with handle.acquired(wait=0.05):
                    pytest.fail("acquired a lock another thread holds")

            with pytest.raises(aiolock.LockTimeoutError):
                in_thread(enter)
    assert not handle.is_locked()

    def fails_inside() -> None:
        with handle.acquired(wait=1) as inside:
            assert inside is handle
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fails_inside()
    assert not handle.is_locked()
    with pytest.raises(aiolock.LockNotOwnedError):
        handle.unlock()


@pytest.mark.parametrize(("make", "exclusive"), [k for k in KINDS if k.values[1]])
def test_threads_racing_never_overlap(
    make: Callable[..., Any], exclusive: bool, make_sync: SyncFactory, name: str
) -> None:
    """Threads of two clients doing a read-modify-write under the lock never interleave."""
    handles = [make(make_sync(), name) for _ in range(2)]
    inside = 0
    most = 0
    total = 0
    guard = threading.Lock()

    def worker(handle: Any) -> None:
        nonlocal inside, most, total
        for _ in range(5):
            with handle:
                with guard:
                    inside += 1
                    most = max(most, inside)
                seen = total
                time.sleep(0)
                total = seen + 1
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=worker, args=(handles[i % 2],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIMIT * 3)
    assert (total, most) == (30, 1)


def test_sync_and_async_wake_each_other(
    sync_client: aiolock.sync.Client, redis_url: str, name: str
) -> None:
    """A blocked sync waiter wakes at an async release, and an async waiter at a sync one."""
    sync_lock = sync_client.lock(name)
    woke: list[float] = []
    release = threading.Event()

    def sync_holder() -> None:
        sync_lock.lock()
        woke.append(time.monotonic())
        release.wait(LIMIT)
        sync_lock.unlock()

    async def main() -> None:
        async with aiolock.Client.from_url(redis_url) as client:
            # owner=: the task that waits below and this one are one holder.
            async_lock = client.lock(name, owner="async-side")
            await async_lock.lock()
            thread = threading.Thread(target=sync_holder)
            thread.start()
            await until(lambda: sync_lock.statistics().tasks_waiting == 1, what="sync waits")
            released = time.monotonic()
            await async_lock.unlock()
            await until(lambda: bool(woke), what="the sync waiter woke")
            assert woke[0] - released < 1.0  # generous: pub/sub wakes it in ms
            assert not await async_lock.try_lock(0)
            waiting = asyncio.create_task(async_lock.lock())
            await until(lambda: async_lock.statistics().tasks_waiting == 1, what="async waits")
            released = time.monotonic()
            release.set()
            async with asyncio.timeout(LIMIT):
                await waiting
            assert time.monotonic() - released < 1.0
            await async_lock.unlock()
            await asyncio.to_thread(thread.join, LIMIT)

    asyncio.run(main())


def test_close_wakes_waiting_threads(make_sync: SyncFactory, name: str) -> None:
    """close() while threads wait raises ClientClosedError in each; calls after it too."""
    holder = make_sync().lock(name)
    holder.lock()
    client = make_sync()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            client.lock(name).lock()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    wait_until(lambda: client.lock(name).statistics().tasks_waiting == 3, "3 threads wait")
    client.close()
    for thread in threads:
        thread.join(LIMIT)
    assert [type(e) for e in errors] == [aiolock.ClientClosedError] * 3
    with pytest.raises(aiolock.ClientClosedError):
        client.lock(name).try_lock()
    holder.unlock()


def test_guarded_hold_tells_the_thread(sync_client: aiolock.sync.Client, name: str) -> None:
    """A lost guarded hold: hold.lost, hold.check() and the block's exit raise LockLostError."""
    lock = sync_client.lock(name)

    def lose() -> None:
        with lock.guarded() as hold:
            assert not hold.lost
            hold.check()
            assert in_thread(lock.force_unlock)
            assert hold.wait_lost(LIMIT)
            with pytest.raises(aiolock.LockLostError):
                hold.check()

    with pytest.raises(aiolock.LockLostError):
        lose()
    with lock.guarded() as hold:
        assert hold.confirmed_until > time.monotonic()
    assert not hold.lost
    assert not lock.is_locked()


def test_call_from_the_loop_thread_is_refused(sync_client: aiolock.sync.Client, name: str) -> None:
    """A listener (in the loop thread) calling the sync client gets a RuntimeError, not a hang."""
    lock = sync_client.lock(name)
    seen: list[BaseException] = []

    def listener(event: object) -> None:
        try:
            lock.is_locked()
        except RuntimeError as exc:
            seen.append(exc)

    sync_client.add_listener(listener)
    with lock:
        pass
    sync_client.remove_listener(listener)
    assert seen
    assert "own event-loop thread" in str(seen[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_fork_is_refused_in_the_child(sync_client: aiolock.sync.Client, name: str) -> None:
    """A forked child's call raises RuntimeError before any I/O; the parent is unaffected."""
    lock = sync_client.lock(name)
    assert not lock.is_locked()  # used in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            lock.try_lock()
            os.write(write, b"no error")
        except RuntimeError as exc:
            os.write(write, b"refused" if "forked" in str(exc) else b"other")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    assert said == b"refused"
    assert lock.try_lock()
    lock.unlock()


# The child turns Ctrl-C into KeyboardInterrupt as a script run from a terminal does: a job
# a shell starts in the background (CI) inherits SIGINT ignored, and Python then installs
# no handler of its own.
_SIGINT_CHILD = """
import signal, sys, aiolock.sync
signal.signal(signal.SIGINT, signal.default_int_handler)
client = aiolock.sync.Client.from_url(sys.argv[1])
print("waiting", flush=True)
try:
    client.fair_lock(sys.argv[2]).lock()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    client.close()
    sys.exit(3)
"""


def test_sigint_while_waiting_leaves_nothing(
    sync_client: aiolock.sync.Client, redis_url: str, name: str
) -> None:
    """Ctrl-C in a script blocked on a fair lock: no queue entry left, the process exits."""
    lock = sync_client.fair_lock(name)
    lock.lock()
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SIGINT_CHILD), redis_url, name],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "waiting"
            with Redis.from_url(redis_url) as redis:
                queue = f"redisson_lock_queue:{{{name}}}"
                wait_until(lambda: redis.llen(queue) == 1, "the child queues")
                child.send_signal(signal.SIGINT)
                assert child.wait(LIMIT) == 3
                assert child.stdout.read().strip() == "interrupted"
                assert redis.llen(queue) == 0
        finally:
            child.kill()  # whatever failed, the with block's wait ends
    lock.unlock()
    assert not lock.is_locked()


def test_a_release_hands_the_lock_to_a_waiting_thread(
    sync_client: aiolock.sync.Client, redis_url: str, name: str
) -> None:
    """Threads of one client take turns as tasks do: the release hands the lock to the
    parked thread (one round trip, nothing published), so contention costs no herd."""
    lock = sync_client.lock(name)
    lock.lock()
    got = threading.Event()
    done = threading.Event()

    def waiter() -> None:
        lock.lock()
        got.set()
        done.wait(LIMIT)
        lock.unlock()

    thread = threading.Thread(target=waiter)
    thread.start()
    with Redis.from_url(redis_url) as redis:

        def publishes() -> int:
            stats: dict[str, Any] = redis.info("commandstats")
            return int(stats.get("cmdstat_publish", {}).get("calls", 0))

        # Parked in its wait (its attempt answered), not only registered.
        waiting = inside.waiting_room(inside.runtime(sync_client).async_client)
        wait_until(
            lambda: any(w.parked is not None for w in waiting.waiters(lock_channel(name))),
            "the thread is parked",
        )
        before = publishes()
        lock.unlock()
        try:
            assert got.wait(LIMIT)
            assert publishes() == before
            assert list(redis.hgetall(name).values()) == [b"1"]
        finally:
            done.set()
            thread.join(LIMIT)
    assert not lock.is_locked()


def test_types_as_a_user_sees_them(sync_client: aiolock.sync.Client, name: str) -> None:
    """What the blocking API returns, checked by mypy --strict (assert_type) and at run time."""
    lock = sync_client.lock(name)
    assert_type(lock, aiolock.sync.Lock)
    assert assert_type(lock.try_lock(0), bool)
    assert assert_type(lock.hold_count(), int) == 1
    assert assert_type(lock.is_held_by_current_thread(), bool)
    assert assert_type(lock.remaining_lease(), float | None) is not None
    assert assert_type(lock.statistics(), aiolock.LockStatistics).held_by_current_task
    lock.unlock()
    fenced = sync_client.fenced_lock(name)
    with assert_type(fenced.guarded(wait=1), AbstractContextManager[aiolock.sync.Hold]) as hold:
        assert isinstance(assert_type(hold.token, int | None), int)
        assert not assert_type(hold.lost, bool)
    with assert_type(lock.acquired(wait=1), AbstractContextManager[aiolock.sync.Lock]) as held:
        assert held is lock
    with sync_client.read_write_lock(name).write_lock() as write:
        assert_type(write, aiolock.sync.WriteLock)

    @sync_client.locked("{key}", kind="fair_lock")
    def work(key: str) -> int:
        return len(key)

    assert assert_type(work(name), int) == len(name)
    semaphore = sync_client.semaphore(f"{name}:s")
    assert assert_type(semaphore.try_set_permits(1), bool)
    assert assert_type(semaphore.delete(), bool)


def test_java_interop_both_ways(
    sync_client: aiolock.sync.Client, redis_url: str, name: str
) -> None:
    """Redisson's own RLock scripts (the Java side) and a sync thread on one name: each
    excludes the other, and each one's release wakes the other's waiter within 1 s."""
    java = "6f1c1a0e-5d2b-4c1e-9a57-0b8a8b7c2d10:57"  # a Java client's id and thread id
    channel = f"redisson_lock__channel:{{{name}}}"
    lock = sync_client.lock(name)
    with Redis.from_url(redis_url) as redis, redis.pubsub() as listen:
        # Java holds: the sync waiter waits, then wakes at Java's release (its publish).
        assert redis.eval(JAVA_ACQUIRE, 1, name, 30_000, java) is None
        assert not lock.try_lock(0)
        woke: list[float] = []

        def waiter() -> None:
            with lock:
                woke.append(time.monotonic())

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_until(lambda: lock.statistics().tasks_waiting == 1, "the thread waits")
        released = time.monotonic()
        assert redis.eval(JAVA_UNLOCK, 2, name, channel, "0", 30_000, java) == 1
        thread.join(LIMIT)
        assert woke
        assert woke[0] - released < 1.0
        # The sync thread holds: Java is shut out, and the sync release publishes the
        # message a Java waiter (subscribed to the channel) wakes on.
        listen.subscribe(channel)
        assert listen.get_message(timeout=LIMIT) is not None  # the confirmation
        lock.lock()
        assert isinstance(redis.eval(JAVA_ACQUIRE, 1, name, 30_000, java), int)  # its pttl
        released = time.monotonic()
        lock.unlock()
        message = listen.get_message(ignore_subscribe_messages=True, timeout=1.0)
        assert message is not None
        assert time.monotonic() - released < 1.0
        assert redis.eval(JAVA_ACQUIRE, 1, name, 30_000, java) is None  # Java gets it now
        assert redis.eval(JAVA_UNLOCK, 2, name, channel, "0", 30_000, java) == 1


def test_a_call_interrupted_at_once_ends_cancelled(
    sync_client: aiolock.sync.Client, name: str
) -> None:
    """An interruption racing the call's start (here about 1 in 5 had begun) always ends
    it, cancelled, before interrupt() returns; a body that never began is not warned about."""
    portal = inside.runtime(sync_client).portal()

    async def body() -> None:
        await asyncio.sleep(LIMIT)

    for _ in range(50):
        call = portal.start(body())
        call.interrupt()
        assert call.done()
        assert isinstance(call.error, asyncio.CancelledError)
        portal.forget(call)
    assert not sync_client.lock(name).is_locked()  # the client works on
