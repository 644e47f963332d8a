"""A slot in migration on a real cluster: the servers refuse aiolock's scripts with TRYAGAIN
(each script declares a key that exists on neither side, a tombstone or a latch) for as
long as the migration lasts. Calls with a wait ride it out; an unlock refused past the
retries is finished in the background and its hold is not renewed meanwhile (defects b03,
b08 of review 3). The shared 3+3 cluster of the run; only the test's own slot changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.crc import key_slot
from redis.exceptions import TryAgainError

from . import clusters, inside
from .helpers import wait_until
from .topologies import ClusterHandle

# The cluster's fixtures, in place of the single server's (tests/clusters.py).
make_client = clusters.make_client

ClientFactory = Any
LIMIT = 20.0


def tryagains(cluster: ClusterHandle) -> int:
    """How many TRYAGAIN replies the primaries have given so far."""
    total = 0
    for node in cluster.primaries():
        stat = node.call("INFO", "errorstats").get("errorstat_TRYAGAIN", {})
        if isinstance(stat, str):  # redis-py before 5.1 leaves it "count=N"
            stat = dict(part.split("=") for part in stat.split(","))
        total += int(stat.get("count", 0))
    return total


@asynccontextmanager
async def migrating(cluster: ClusterHandle, slot: int) -> AsyncIterator[None]:
    """``slot`` marked MIGRATING to another primary (IMPORTING there) for the body, no key
    moved, then STABLE again: an aborted reshard, as redis-cli's can be."""

    def mark() -> Iterator[Any]:
        source = cluster.node_for_slot(slot)
        target = next(node for node in cluster.primaries() if node is not source)
        source_id, target_id = source.call("CLUSTER", "MYID"), target.call("CLUSTER", "MYID")
        target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        yield
        for node in (source, target):
            node.call("CLUSTER", "SETSLOT", slot, "STABLE")

    steps = mark()
    await asyncio.to_thread(next, steps)
    try:
        yield
    finally:
        await asyncio.to_thread(next, steps, None)


async def test_a_slot_migration_is_ridden_out_and_a_refused_unlock_completes(
    cluster: ClusterHandle, make_client: ClientFactory, uid: str
) -> None:
    """b08: lock() with no deadline and try_lock(wait=...) wait out TRYAGAIN (they raised
    it after the retries, 0.1 s here); try_lock(wait=0) still raises it. b03: an unlock()
    refused past the retries raises, its hold is renewed no more, and the release lands
    in the background once the slot is stable: the lock is free for another client."""
    quick: dict[str, Any] = {"retry_attempts": 1, "retry_interval": 0.05}
    a, b = make_client(**quick), make_client(**quick)
    held, other = f"test:{{{uid}}}:held", f"test:{{{uid}}}:other"
    lock = a.lock(held, owner="h")
    await lock.lock()
    async with migrating(cluster, key_slot(held.encode())):
        with pytest.raises(TryAgainError):
            await b.lock(other).try_lock(wait=0)
        with pytest.raises(TryAgainError):
            await lock.unlock()
        assert len(inside.renewal(a)) == 0, "the hold whose unlock was refused is still renewed"
        before = await asyncio.to_thread(tryagains, cluster)
        no_deadline = asyncio.create_task(b.lock(other, owner="x").lock())
        with_wait = asyncio.create_task(b.lock(other, owner="y").try_lock(wait=LIMIT))

        async def refused_past_the_retries() -> bool:
            # Each call sends 2 times per round of retries: both are past theirs.
            return await asyncio.to_thread(tryagains, cluster) >= before + 8

        await wait_until(refused_past_the_retries, limit=LIMIT, what="TRYAGAIN, many times")
        assert not no_deadline.done()
        assert not with_wait.done()
    async with asyncio.timeout(LIMIT):
        # Either may land first once the slot is stable; the other waits for its unlock.
        calls = {no_deadline: "x", with_wait: "y"}
        done, _ = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
        first = next(iter(done))
        await b.lock(other, owner=calls[first]).unlock()
        await no_deadline
        assert await with_wait
        await b.lock(other, owner=calls[no_deadline if first is with_wait else with_wait]).unlock()
        # The refused unlock was finished in the background: the lock is free.
        assert await b.lock(held).try_lock(wait=LIMIT)
        await b.lock(held).unlock()
    assert lock.statistics().hold_count == 0
