"""Semaphores declared with their permits (``permits=``, issue 37).

``client.semaphore(name, permits=n)`` and ``client.permit_expirable_semaphore(name,
permits=n)``: an acquire that finds no state sets ``n`` first, atomically, as Redisson's
trySetPermits would; a semaphore with state (set by anyone, permits taken) is never
overwritten. So a restart without persistence, or a failover to a replica that had not seen
the permits, re-seeds the semaphore instead of leaving every caller without a permit.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from .conftest import ClientFactory


async def test_a_declared_semaphore_seeds_itself_at_its_first_acquire(
    make_client: ClientFactory, name: str
) -> None:
    a, b = make_client(), make_client()
    first, second = a.semaphore(name, permits=2), b.semaphore(name, permits=2)
    assert await first.try_acquire()
    assert await second.try_acquire()
    # Seeded once: the third finds the state (0 available), never seeds again.
    assert not await first.try_acquire()
    await first.release(2)
    assert await first.available_permits() == 2
    await first.delete()


async def test_a_semaphore_lost_with_a_restart_is_seeded_again(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    sem = make_client().semaphore(name, permits=3)
    assert await sem.try_acquire()
    # What a restart without persistence (or a failover) leaves: no key at all.
    await raw.delete(name)
    assert await sem.try_acquire(2)
    assert await sem.available_permits() == 1
    await sem.delete()


async def test_seeding_never_overwrites_a_set_semaphore(
    make_client: ClientFactory, name: str
) -> None:
    client = make_client()
    assert await client.semaphore(name).try_set_permits(1)
    declared = client.semaphore(name, permits=5)
    assert await declared.try_acquire()
    assert not await declared.try_acquire()
    assert await declared.available_permits() == 0
    await declared.delete()


async def test_an_undeclared_semaphore_still_has_no_permits_until_set(
    make_client: ClientFactory, name: str
) -> None:
    assert not await make_client().semaphore(name).try_acquire()


async def test_a_declared_permit_expirable_semaphore_seeds_and_reseeds(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    psem = make_client().permit_expirable_semaphore(name, permits=1)
    permit = await psem.try_acquire(lease=60)
    assert permit is not None
    assert await psem.try_acquire(lease=60) is None
    await psem.release(permit)
    # A restart without persistence: neither the count nor the ids taken survive.
    await raw.delete(name, f"{{{name}}}:timeout")
    again = await make_client().permit_expirable_semaphore(name, permits=1).try_acquire()
    assert again is not None
    await psem.release(again)
    await psem.delete()


@pytest.mark.parametrize("bad", [-1, True, "3", 1.5])
def test_declared_permits_are_checked_when_the_handle_is_made(
    make_client: ClientFactory, name: str, bad: object
) -> None:
    client = make_client()
    with pytest.raises((TypeError, ValueError)):
        client.semaphore(name, permits=bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        client.permit_expirable_semaphore(name, permits=bad)  # type: ignore[arg-type]
