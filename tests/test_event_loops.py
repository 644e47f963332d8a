"""A client used from one ``asyncio.run()`` after another: once the loop that first used it
is closed, it moves to the new one (reconnects there) and works as in the first.

Plain test functions, not async: each runs its own loops, as a script, a Celery worker or
a per-job ``asyncio.run()`` does. The old loops' connections are closed (the suite runs
with warnings as errors, so an unclosed transport would fail it)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from redis import Redis as SyncRedis

import aiolock

from .helpers import wait_until
from .topologies import ClusterHandle

# Safety net of each run (each takes milliseconds).
LIMIT = 10.0


async def _job(client: aiolock.Client, rival: aiolock.Client, name: str) -> None:
    """Take and release a lock, then wait on one the rival holds until it lets go."""
    async with asyncio.timeout(LIMIT):
        lock = client.lock(name)
        async with lock:
            assert await lock.hold_count() == 1
        await rival.lock(f"{name}:b").lock()
        waited = client.lock(f"{name}:b")

        async def wait_then_release() -> bool:
            got = await waited.try_lock(wait=LIMIT)
            if got:
                await waited.unlock()
            return got

        waiting = asyncio.create_task(wait_then_release())
        await wait_until(lambda: waited.statistics().tasks_waiting > 0, what="parked")
        await rival.lock(f"{name}:b").unlock()
        assert await waiting
        # A hold renewed by the watchdog and one with an explicit lease, then released.
        await client.fair_lock(name).lock()
        await client.fair_lock(name).extend(5)
        await client.fair_lock(name).unlock()


@pytest.mark.parametrize("runs", [2, 3])
def test_one_client_in_consecutive_asyncio_runs(redis_url: str, name: str, runs: int) -> None:
    client = aiolock.Client.from_url(redis_url)
    for _ in range(runs):
        # The rival lives in each run alone, as a client made inside the job would.
        async def job() -> None:
            rival = aiolock.Client.from_url(redis_url)
            try:
                await _job(client, rival, name)
            finally:
                await rival.aclose()

        asyncio.run(job())
        # The old loop's connections are closed now, not at some later collection.
        gc.collect()
    asyncio.run(client.aclose())
    redis = SyncRedis.from_url(redis_url)
    try:
        assert not redis.exists(name, f"{name}:b")
    finally:
        redis.close()


def test_holds_of_a_closed_loop_are_forgotten(redis_url: str, name: str) -> None:
    """A hold left by a run that ended holding it belongs to a task that is gone: the next
    run does not believe it holds it (it expires with its lease)."""
    client = aiolock.Client.from_url(redis_url, watchdog_timeout=1)
    asyncio.run(client.lock(name).lock(lease=0.3))

    async def second() -> None:
        lock = client.lock(name)
        assert lock.statistics().hold_count == 0
        assert await lock.try_lock(wait=LIMIT)
        await lock.unlock()
        await client.aclose()

    asyncio.run(second())


def test_a_cluster_client_in_consecutive_asyncio_runs(cluster: ClusterHandle, name: str) -> None:
    """The same on a Redis Cluster: its per-node connections and pub/sub move too."""
    client = aiolock.Client.from_url(cluster.url, cluster=True)
    for _ in range(2):

        async def job() -> None:
            rival = aiolock.Client.from_url(cluster.url, cluster=True)
            try:
                await _job(client, rival, name)
            finally:
                await rival.aclose()

        asyncio.run(job())
    asyncio.run(client.aclose())
