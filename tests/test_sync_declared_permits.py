"""``aiolock.sync``: semaphores declared with their permits, as the async client's (issue 37).

``Client.semaphore(name, permits=n)`` and ``Client.permit_expirable_semaphore(name,
permits=n)``: a sync acquire that finds no state seeds ``n`` first, atomically, so a
restart without persistence re-seeds the semaphore; one with state is never overwritten.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

import aiolock.sync


@pytest.fixture
def sync_client(redis_url: str) -> Iterator[aiolock.sync.Client]:
    client = aiolock.sync.Client.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


def test_a_declared_sync_semaphore_seeds_itself(
    sync_client: aiolock.sync.Client, redis_url: str, name: str
) -> None:
    sem = sync_client.semaphore(name, permits=2)
    assert sem.try_acquire()
    assert sem.try_acquire()
    assert not sem.try_acquire()  # seeded once: 0 available, never seeded again
    sem.release(2)
    assert sem.available_permits() == 2
    # What a restart without persistence leaves: no key. The next acquire seeds again.
    with Redis.from_url(redis_url) as raw:
        raw.delete(name)
    with sem.acquired():
        assert sem.available_permits() == 1
    sem.delete()


def test_a_declared_sync_permit_expirable_semaphore_seeds_itself(
    sync_client: aiolock.sync.Client, name: str
) -> None:
    psem = sync_client.permit_expirable_semaphore(name, permits=1)
    with psem.acquired() as permit_id:
        assert isinstance(permit_id, str)
        assert psem.try_acquire() is None  # its one permit is taken
    assert psem.available_permits() == 1
    psem.delete()


@pytest.mark.parametrize("bad", [-1, True, "3", 1.5])
def test_sync_permits_are_checked_when_declared(
    sync_client: aiolock.sync.Client, name: str, bad: object
) -> None:
    with pytest.raises((TypeError, ValueError)):
        sync_client.semaphore(name, permits=bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        sync_client.permit_expirable_semaphore(name, permits=bad)  # type: ignore[arg-type]
