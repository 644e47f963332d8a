"""One node frozen while the others serve: nothing on the other nodes slows beyond its own
bounds (issue 21, b01).

The watchdog renews each server's holds on that server's own time: a cluster primary that
stops answering (SIGSTOP) delays only its own holds' renewal, never the other primaries'.
The RedLock and MultiLock side (a member's server frozen) is in ``test_multilock.py``; the
systematic scenario, with figures, in ``faults/test_scenarios_frozen.py``.
"""

from __future__ import annotations

import asyncio

import pytest

import aiolock
from aiolock.testing import start_local_server

from . import inside
from .clusters import names_on_every_primary
from .freezing import frozen
from .helpers import quiesce, wait_until
from .topologies import primary_and_replicas, redis_cluster

# Safety net only: every wait ends on an event or on Redis state.
LIMIT = 20.0
# The holder's watchdog: a 0.6 s lease renewed every 0.2 s.
WATCHDOG = 0.6


async def test_a_frozen_primary_delays_only_its_own_holds_renewal(uid: str) -> None:
    """A cluster of three primaries without replicas (nothing fails over), each serving its
    slots whatever the others' state; a lock held on each. One primary frozen for ten
    renewal periods (more than three leases): the locks on the other two stay held and
    renewed, a rival cannot take them; the frozen one's lease ran out meanwhile, and once
    its primary answers again that lock is reported lost, as before."""
    with redis_cluster(primaries=3, replicas=0) as own:
        for node in own.nodes:
            node.call("CONFIG", "SET", "cluster-require-full-coverage", "no")
        names = names_on_every_primary(own, uid)
        # Not the seed node: the tests read the slot map from it.
        frozen_name = next(n for n in names if own.node_for_key(n).port != own.nodes[0].port)
        healthy = [n for n in names if n != frozen_name]
        victim = own.node_for_key(frozen_name)
        holder = aiolock.Client.from_url(own.url, cluster=True, watchdog_timeout=WATCHDOG)
        rival = aiolock.Client.from_url(own.url, cluster=True)
        try:
            locks = {n: holder.lock(n) for n in names}
            for lock in locks.values():
                await lock.lock()
            for n in healthy:  # the rival knows every primary before the freeze
                assert not await rival.lock(n).try_lock()
            renewal = inside.renewal(holder)
            with frozen(victim.pid):
                rounds = renewal.rounds
                # The renewal goes on every period for the primaries that answer.
                await wait_until(
                    lambda: renewal.rounds >= rounds + 10, limit=LIMIT, what="ten periods"
                )
                for n in healthy:
                    assert not await rival.lock(n).try_lock(), f"{n} was lost while held"
                    assert await locks[n].is_held_by_current_task()
                assert len(renewal) == 3
            await wait_until(lambda: len(renewal) == 2, limit=LIMIT, what="frozen hold reported")
            with pytest.raises(aiolock.LockLostError):
                await locks[frozen_name].unlock()
            for n in healthy:
                await locks[n].unlock()
        finally:
            await holder.aclose()
            await rival.aclose()


async def test_a_frozen_replica_never_holds_up_the_renewal(uid: str) -> None:
    """``replica_acks=1`` and the primary's one replica frozen: every acquisition's WAIT
    runs to its timeout, one after another (each blocks its connection), for far longer
    than a lease. The hold taken before the freeze stays renewed all along: renewals do
    not queue behind the WAITs (they did: a healthy primary's hold expired 3 s into the
    freeze, issue 36 b7). The acquisitions meanwhile fail with ReplicaAckError, given back."""
    with primary_and_replicas(1) as (primary, replica):
        url = f"redis://127.0.0.1:{primary.port}/0"
        # A 1.5 s lease renewed every 0.5 s; 12 WAITs of 0.4 s back to back: 4.8 s.
        client = aiolock.Client.from_url(
            url, replica_acks=1, replica_ack_timeout=0.4, watchdog_timeout=1.5
        )
        try:
            held = client.lock(f"{uid}:held")
            await held.lock()
            failed = 0

            async def acquire(index: int) -> None:
                nonlocal failed
                try:
                    await client.lock(f"{uid}:{index}").lock()
                except aiolock.ReplicaAckError:
                    failed += 1

            with frozen(replica.pid):
                async with asyncio.timeout(LIMIT), asyncio.TaskGroup() as tg:
                    for index in range(12):
                        tg.create_task(acquire(index))
                assert failed == 12
                assert await held.is_held_by_current_task()
            await held.unlock()
        finally:
            await client.aclose()


@pytest.mark.parametrize("wait", [0.0, 0.3])
async def test_a_call_with_a_wait_returns_within_it_on_a_frozen_server(
    uid: str, wait: float
) -> None:
    """A server that stops answering (SIGSTOP) while the client is connected: try_lock and
    acquired() with a ``wait`` return within it plus the stated cut-off (0.5 s), not after
    the connection's timeouts and retries (20 s on a frozen cluster shard, issue 36 b3).
    Once the server answers again, what the cut-off attempt took is given back: the lock
    is free for another client."""
    server = start_local_server()
    client = aiolock.Client.from_url(server.url)
    other = aiolock.Client.from_url(server.url)
    try:
        lock = client.lock(f"{uid}:x")
        assert await lock.try_lock(wait=0)  # connected, scripts loaded
        await lock.unlock()
        server.pause()
        try:
            # The outer bound is a safety net far above wait + 0.5 s, far below the 30 s
            # this connection's (unset) socket timeout would allow.
            async with asyncio.timeout(LIMIT / 2):
                assert not await lock.try_lock(wait=wait)
                with pytest.raises(aiolock.LockTimeoutError):
                    async with lock.acquired(wait=wait):
                        pass
        finally:
            server.resume()
        await quiesce(client)
        rival = other.lock(f"{uid}:x")
        assert await rival.try_lock(wait=LIMIT)
        await rival.unlock()
    finally:
        await client.aclose()
        await other.aclose()
        server.close()
