"""Generic lock behaviour, run on every lock-like type (trio's ``generic_lock_test``).

A lock type joins the suite with ONE line in :data:`LOCK_FACTORIES`. Its flags say which
checks apply: a read lock is shared (``exclusive=False``), so the checks that need a second
holder to be shut out skip it by not being parametrized with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import pytest
from redis.asyncio import Redis

import aiolock
import aiolock.sync

from .helpers import wait_until
from .syncview import SyncView, TaskThreads, composite

T = TypeVar("T")
ClientFactory = Callable[..., aiolock.Client]

# Safety net only: every wait below is ended by an event or by Redis state, never by time.
LIMIT = 10.0


class LockLike(Protocol):
    """What the conformance checks use of a lock handle (the contract's lock methods)."""

    async def lock(self, lease: float | None = None) -> None: ...
    async def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool: ...
    async def unlock(self) -> None: ...
    def acquired(
        self, wait: float | None = None, lease: float | None = None
    ) -> AbstractAsyncContextManager[Any]: ...
    async def __aenter__(self) -> Any: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    async def force_unlock(self) -> bool: ...
    async def is_locked(self) -> bool: ...
    async def is_held_by_current_task(self) -> bool: ...
    async def hold_count(self) -> int: ...
    async def remaining_lease(self) -> float | None: ...
    def statistics(self) -> aiolock.LockStatistics: ...


@dataclass(frozen=True)
class LockKind:
    """One lock-like type: how to make a handle, and which generic checks apply to it."""

    id: str
    #: ``make(client, name, **kw)`` returns a handle; ``kw`` is ``owner=`` when given.
    make: Callable[..., LockLike]
    #: Only one holder at a time (False for a read lock, which holders share).
    exclusive: bool = True
    #: The same holder may lock again and needs a matching unlock per lock.
    reentrant: bool = True
    #: A lock over other locks (MultiLock, RedLock): it has no name or key of its own, so
    #: the per-handle checks of test_misuse.py do not apply (test_multilock.py has its own).
    composite: bool = False
    #: The key that holds the lock's holds, from its name (the name itself in Redisson's
    #: layouts).
    key: Callable[[str], str] = str


LOCK_FACTORIES: list[LockKind] = [
    LockKind("Lock", lambda client, name, **kw: client.lock(name, **kw)),
    LockKind("FairLock", lambda client, name, **kw: client.fair_lock(name, **kw)),
    LockKind("FencedLock", lambda client, name, **kw: client.fenced_lock(name, **kw)),
    LockKind("SpinLock", lambda client, name, **kw: client.spin_lock(name, **kw)),
    LockKind(
        "FairReadLock",
        lambda client, name, **kw: client.fair_read_write_lock(name, **kw).read_lock(),
        exclusive=False,
        key=lambda name: f"aiolock_frw:{{{name}}}",
    ),
    LockKind(
        "FairWriteLock",
        lambda client, name, **kw: client.fair_read_write_lock(name, **kw).write_lock(),
        key=lambda name: f"aiolock_frw:{{{name}}}",
    ),
    LockKind(
        "MultiLock",
        lambda client, name, **kw: composite(
            aiolock.MultiLock, client.lock(name, **kw), client.fair_lock(f"{name}:b", **kw)
        ),
        composite=True,
    ),
    LockKind(
        "RedLock",
        lambda client, name, **kw: composite(
            aiolock.RedLock, *(client.lock(f"{name}:{i}", **kw) for i in range(3))
        ),
        composite=True,
    ),
]


@pytest.fixture(name="make_client", params=["async", "sync"])
async def _make_client(
    redis_url: str, raw: Redis, request: pytest.FixtureRequest
) -> AsyncIterator[ClientFactory]:
    """Clients (each stands for one process): async ones, and aiolock.sync ones seen through
    the async interface (each task of a test its own thread: see syncview.py); all are
    closed before the leak check (``raw``'s)."""
    clients: list[aiolock.Client] = []
    sync_clients: list[aiolock.sync.Client] = []
    threads = TaskThreads()

    def make(**options: Any) -> aiolock.Client:
        if request.param == "async":
            client = aiolock.Client.from_url(redis_url, **options)
            clients.append(client)
            return client
        sync_client = aiolock.sync.Client.from_url(redis_url, **options)
        sync_clients.append(sync_client)
        return cast(aiolock.Client, SyncView(sync_client, threads))  # the same interface

    yield make
    for client in clients:
        await client.aclose()
    for sync_client in sync_clients:
        await asyncio.to_thread(sync_client.close)
    threads.close()


def kinds(*, exclusive: bool = False, reentrant: bool = False) -> list[Any]:
    """The kinds with every feature asked for, as readable pytest params."""
    return [
        pytest.param(kind, id=kind.id)
        for kind in LOCK_FACTORIES
        if (kind.exclusive or not exclusive) and (kind.reentrant or not reentrant)
    ]


ALL = kinds()
EXCLUSIVE = kinds(exclusive=True)
REENTRANT = kinds(reentrant=True)
EXCLUSIVE_REENTRANT = kinds(exclusive=True, reentrant=True)


async def in_task(coro: Awaitable[T]) -> T:
    """Run ``coro`` in a new task: a different holder from the caller."""

    async def run() -> T:
        return await coro

    async with asyncio.timeout(LIMIT):
        return await asyncio.create_task(run())


async def acquirable_elsewhere(handle: LockLike) -> bool:
    """Whether another task gets the lock at once (it gives it back at once if so)."""

    async def attempt() -> bool:
        if not await handle.try_lock(0):
            return False
        await handle.unlock()
        return True

    return await in_task(attempt())


async def wait_for_waiters(handle: LockLike, count: int) -> None:
    """Until ``count`` local tasks are blocked acquiring ``handle``'s name."""
    await wait_until(
        lambda: handle.statistics().tasks_waiting == count, what=f"{count} task(s) waiting"
    )


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_mutual_exclusion_across_tasks(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """N tasks doing a non-atomic read-modify-write under the lock never interleave."""
    handle = kind.make(client, name)
    total = 0
    inside = 0
    most_inside = 0

    async def worker() -> None:
        nonlocal total, inside, most_inside
        for _ in range(5):
            async with handle:
                inside += 1
                most_inside = max(most_inside, inside)
                seen = total
                await asyncio.sleep(0)  # a yield point inside the critical section
                total = seen + 1
                inside -= 1

    async with asyncio.timeout(LIMIT * 3), asyncio.TaskGroup() as tg:
        for _ in range(10):
            tg.create_task(worker())
    assert total == 50
    assert most_inside == 1
    assert not await handle.is_locked()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_mutual_exclusion_across_clients(
    kind: LockKind, make_client: ClientFactory, name: str
) -> None:
    """Tasks spread over two clients (two processes) never interleave either."""
    handles = [kind.make(make_client(), name) for _ in range(2)]
    total = 0
    inside = 0
    most_inside = 0

    async def worker(handle: LockLike) -> None:
        nonlocal total, inside, most_inside
        for _ in range(5):
            async with handle:
                inside += 1
                most_inside = max(most_inside, inside)
                seen = total
                await asyncio.sleep(0)
                total = seen + 1
                inside -= 1

    async with asyncio.timeout(LIMIT * 3), asyncio.TaskGroup() as tg:
        for i in range(6):
            tg.create_task(worker(handles[i % 2]))
    assert total == 30
    assert most_inside == 1


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_try_lock_no_wait_fails_while_held(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """try_lock(wait=0) by another task returns False while the lock is held."""
    handle = kind.make(client, name)
    await handle.lock()
    assert not await in_task(handle.try_lock(wait=0))
    await handle.unlock()
    assert await acquirable_elsewhere(handle)


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_try_lock_with_wait_gives_up(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """try_lock(wait=0.2) by another task returns False once its wait ran out."""
    handle = kind.make(client, name)
    await handle.lock()
    assert not await in_task(handle.try_lock(wait=0.2))
    assert handle.statistics().tasks_waiting == 0
    assert await handle.hold_count() == 1
    await handle.unlock()


@pytest.mark.parametrize("kind", ALL)
async def test_unlock_by_another_task_raises(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """unlock() from a task that does not hold the lock raises LockNotOwnedError."""
    handle = kind.make(client, name)
    await handle.lock()
    with pytest.raises(aiolock.LockNotOwnedError):
        await in_task(handle.unlock())
    # The holder's hold is untouched.
    assert await handle.hold_count() == 1
    await handle.unlock()


@pytest.mark.parametrize("kind", ALL)
async def test_unlock_when_free_raises(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """unlock() of a lock nobody holds raises LockNotOwnedError."""
    with pytest.raises(aiolock.LockNotOwnedError):
        await kind.make(client, name).unlock()


@pytest.mark.parametrize("kind", REENTRANT)
async def test_reentrant_hold_count(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """The same holder locks twice; each unlock lowers the hold count by one."""
    handle = kind.make(client, name)
    await handle.lock()
    assert await handle.try_lock(0)
    assert await handle.hold_count() == 2
    await handle.unlock()
    assert await handle.hold_count() == 1
    assert await handle.is_held_by_current_task()
    await handle.unlock()
    assert await handle.hold_count() == 0
    assert not await handle.is_locked()
    with pytest.raises(aiolock.LockNotOwnedError):
        await handle.unlock()


@pytest.mark.parametrize("kind", EXCLUSIVE_REENTRANT)
async def test_reentrant_excludes_until_last_unlock(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """Another task gets a twice-locked lock only after both unlocks."""
    handle = kind.make(client, name)
    await handle.lock()
    await handle.lock()
    assert not await acquirable_elsewhere(handle)
    await handle.unlock()
    assert not await acquirable_elsewhere(handle)
    await handle.unlock()
    assert await acquirable_elsewhere(handle)


@pytest.mark.parametrize("kind", ALL)
async def test_async_with_releases_on_exception(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """`async with` releases the lock when the body raises, and lets the error through."""
    handle = kind.make(client, name)

    async def body() -> None:
        async with handle:
            assert await handle.is_held_by_current_task()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await body()
    assert not await handle.is_locked()
    assert handle.statistics().hold_count == 0


@pytest.mark.parametrize("kind", ALL)
async def test_acquired_yields_handle_when_free(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """acquired(wait=...) on a free lock yields the handle itself and releases at the end."""
    handle = kind.make(client, name)
    async with handle.acquired(wait=1) as inside:
        assert inside is handle
        assert await handle.hold_count() == 1
    assert not await handle.is_locked()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_acquired_times_out_when_held(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """acquired(wait=...) raises LockTimeoutError, a TimeoutError, while held elsewhere."""
    handle = kind.make(client, name)
    await handle.lock()

    async def enter() -> None:
        async with handle.acquired(wait=0.1):
            pytest.fail("acquired a lock held by another task")

    with pytest.raises(aiolock.LockTimeoutError) as info:
        await in_task(enter())
    assert isinstance(info.value, TimeoutError)
    assert name in str(info.value)
    assert await handle.hold_count() == 1
    await handle.unlock()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_force_unlock_wakes_waiter(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """force_unlock() frees a held lock (True), wakes a waiter, and is False when free."""
    handle = kind.make(client, name)
    await handle.lock()
    acquired = asyncio.Event()

    async def waiter() -> None:
        async with handle:
            acquired.set()

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(waiter())
        await wait_for_waiters(handle, 1)
        assert await handle.force_unlock()
        await acquired.wait()
    assert not await handle.is_locked()
    assert not await handle.force_unlock()
    # The holder whose lock was taken learns it at its unlock.
    with pytest.raises(aiolock.LockLostError):
        await handle.unlock()


@pytest.mark.parametrize("kind", ALL)
async def test_force_unlock_from_another_client(
    kind: LockKind, make_client: ClientFactory, name: str
) -> None:
    """force_unlock() works whoever holds the lock, even from another client."""
    holder = kind.make(make_client(), name)
    other = kind.make(make_client(), name)
    await holder.lock()
    assert await other.force_unlock()
    assert not await other.is_locked()
    with pytest.raises(aiolock.LockLostError):
        await holder.unlock()


@pytest.mark.parametrize("kind", ALL)
async def test_queries_follow_the_hold(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """is_locked, is_held_by_current_task and hold_count report the holder's state."""
    handle = kind.make(client, name)
    assert not await handle.is_locked()
    assert not await handle.is_held_by_current_task()
    assert await handle.hold_count() == 0
    await handle.lock()
    assert await handle.is_locked()
    assert await handle.is_held_by_current_task()
    assert await handle.hold_count() == 1
    # Another task sees the lock taken, but not by itself.
    assert await in_task(handle.is_locked())
    assert not await in_task(handle.is_held_by_current_task())
    assert await in_task(handle.hold_count()) == 0
    await handle.unlock()
    assert not await handle.is_locked()
    assert not await handle.is_held_by_current_task()


@pytest.mark.parametrize("kind", ALL)
async def test_remaining_lease(kind: LockKind, make_client: ClientFactory, name: str) -> None:
    """remaining_lease is None when free, <= an explicit lease, ~ watchdog_timeout without."""
    client = make_client(watchdog_timeout=20)
    handle = kind.make(client, name)
    assert await handle.remaining_lease() is None

    await handle.lock(lease=5)
    lease = await handle.remaining_lease()
    assert lease is not None
    assert 0 < lease <= 5
    await handle.unlock()
    assert await handle.remaining_lease() is None

    await handle.lock()
    lease = await handle.remaining_lease()
    assert lease is not None
    assert 10 < lease <= 20
    await handle.unlock()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_two_clients_exclude_each_other(
    kind: LockKind, make_client: ClientFactory, name: str
) -> None:
    """A lock held through one client is shut to another, whose waiter wakes on unlock."""
    first = kind.make(make_client(), name)
    second = kind.make(make_client(), name)
    await first.lock()
    assert not await second.try_lock(0)
    acquired = asyncio.Event()

    async def waiter() -> None:
        async with second:
            acquired.set()

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(waiter())
        await wait_for_waiters(second, 1)
        assert not acquired.is_set()
        await first.unlock()
        await acquired.wait()
    assert not await first.is_locked()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_waiter_is_woken_by_unlock(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """A task blocked in lock() acquires once the holder unlocks."""
    handle = kind.make(client, name)
    await handle.lock()
    acquired = asyncio.Event()
    release = asyncio.Event()

    async def waiter() -> None:
        await handle.lock()
        acquired.set()
        await release.wait()
        await handle.unlock()

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(waiter())
        await wait_for_waiters(handle, 1)
        assert not acquired.is_set()
        await handle.unlock()
        await acquired.wait()
        assert handle.statistics().tasks_waiting == 0
        assert not await handle.is_held_by_current_task()
        assert await handle.is_locked()
        release.set()
    assert not await handle.is_locked()


@pytest.mark.parametrize("kind", ALL)
async def test_owner_hands_lock_to_another_task(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """A lock taken with owner= in one task is released with the same owner in another."""
    await in_task(kind.make(client, name, owner="job-1").lock())
    assert await kind.make(client, name).is_locked()

    async def release() -> None:
        with pytest.raises(aiolock.LockNotOwnedError):
            await kind.make(client, name).unlock()
        with pytest.raises(aiolock.LockNotOwnedError):
            await kind.make(client, name, owner="job-2").unlock()
        owned = kind.make(client, name, owner="job-1")
        assert await owned.is_held_by_current_task()
        assert await owned.hold_count() == 1
        await owned.unlock()

    await in_task(release())
    assert not await kind.make(client, name).is_locked()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_owner_excludes_plain_holders(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """A lock held by an owner= shuts out plain handles, even in the task that took it."""
    owned = kind.make(client, name, owner="job-1")
    await owned.lock()
    assert not await kind.make(client, name).try_lock(0)
    await owned.unlock()


@pytest.mark.parametrize("kind", ALL)
async def test_child_task_cannot_unlock(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """A task created by the holder is a different holder: its unlock raises."""
    handle = kind.make(client, name)
    await handle.lock()

    async def child() -> None:
        assert not await handle.is_held_by_current_task()
        with pytest.raises(aiolock.LockNotOwnedError):
            await handle.unlock()

    await asyncio.create_task(child())
    assert await handle.hold_count() == 1
    await handle.unlock()


@pytest.mark.parametrize("kind", EXCLUSIVE)
async def test_child_task_waits_for_parent(
    kind: LockKind, client: aiolock.Client, name: str
) -> None:
    """A task created by the holder waits for the lock like any other task."""
    handle = kind.make(client, name)
    await handle.lock()
    acquired = asyncio.Event()

    async def child() -> None:
        assert not await handle.try_lock(0)
        async with handle:
            acquired.set()

    async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
        tg.create_task(child())
        await wait_for_waiters(handle, 1)
        assert not acquired.is_set()
        await handle.unlock()
        await acquired.wait()
    assert not await handle.is_locked()


class Extendable(LockLike, Protocol):
    """A lock handle with extend() (every lock kind, MultiLock and RedLock)."""

    async def extend(self, lease: float) -> None: ...


@pytest.mark.parametrize("kind", ALL)
async def test_extend_moves_the_lease(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """extend(lease): the holder's lease becomes ``lease`` s from now, longer or shorter."""
    handle: Extendable = kind.make(client, name)  # type: ignore[assignment]
    await handle.lock(lease=3)
    await handle.extend(60)
    lease = await handle.remaining_lease()
    assert lease is not None
    assert 30 < lease <= 60
    assert await handle.hold_count() == 1
    await handle.unlock()
    assert not await handle.is_locked()


@pytest.mark.parametrize("kind", ALL)
async def test_extend_not_held_raises(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """extend() by a holder that holds nothing raises LockNotOwnedError, as unlock() does."""
    handle: Extendable = kind.make(client, name)  # type: ignore[assignment]
    with pytest.raises(aiolock.LockNotOwnedError):
        await handle.extend(5)


@pytest.mark.parametrize("kind", ALL)
async def test_extend_after_force_unlock_raises_lost(
    kind: LockKind, make_client: ClientFactory, name: str
) -> None:
    """A hold taken by another client's force_unlock(): extend() raises LockLostError, and
    so does the holder's unlock() after it."""
    a, b = make_client(), make_client()
    handle: Extendable = kind.make(a, name)  # type: ignore[assignment]
    await handle.lock()
    assert await kind.make(b, name).force_unlock()
    with pytest.raises(aiolock.LockLostError):
        await handle.extend(5)
    with pytest.raises(aiolock.LockLostError):
        await handle.unlock()
