"""Redis Cluster: routing by slot, sharded pub/sub per primary, renewal per slot, and the
layout changing under held locks and parked waiters (failover, migration, a node killed).

Every test runs on a real local 3+3 cluster (``aiolock.testing.redis_cluster``); the
conformance suite runs there too (``test_cluster_conformance.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

import aiolock
from aiolock._net.cluster import Cluster
from aiolock._net.transport import CommandTransport

from . import clusters, inside
from .clusters import names_on_every_primary, node_redis
from .helpers import forced_term_ends_on_its_message, wait_until
from .topologies import ClusterHandle, redis_cluster

# The cluster's fixtures, in place of the single server's (tests/clusters.py).
make_client = clusters.make_client
raw = clusters.raw

ClientFactory = Any

# Safety net only: every wait ends on an event or on Redis state.
LIMIT = 20.0


async def pubsub_clients(port: int) -> int:
    """How many pub/sub connections with shard channels the node at ``port`` has."""
    async with node_redis(port) as redis:
        clients = await redis.client_list(_type="pubsub")
    return sum(1 for entry in clients if int(entry.get("ssub", 0)))


async def assert_one_subscriber_per_primary(cluster: ClusterHandle) -> None:
    """Every primary gets exactly one pub/sub connection of the waiting client.

    A call counts as waiting from the moment it starts to, before its SSUBSCRIBE is
    confirmed: wait for a subscriber on every primary, then check there is only one.
    """

    async def counts() -> list[int]:
        return [await pubsub_clients(node.port) for node in cluster.primaries()]

    async def everywhere() -> bool:
        return all(await counts())

    await wait_until(everywhere, what="a subscriber on every primary")
    assert await counts() == [1] * len(cluster.primaries())


async def test_every_lock_type_on_every_primary(
    cluster: ClusterHandle, make_client: ClientFactory, uid: str
) -> None:
    """Each lock type takes, reports and releases a lock on each primary."""
    client = make_client()
    for name in names_on_every_primary(cluster, uid):
        rw = client.read_write_lock(name + ":rw")
        for handle in (client.lock(name), client.fair_lock(name + ":fair"), rw.write_lock()):
            async with handle:
                assert await handle.is_locked()
                assert await handle.hold_count() == 1
            assert not await handle.is_locked()
        async with rw.read_lock(), rw.read_lock():
            assert await rw.read_lock().hold_count() == 2


async def test_waiters_on_every_primary_are_woken_by_sharded_pubsub(
    cluster: ClusterHandle, make_client: ClientFactory, uid: str
) -> None:
    """Waiters parked on every primary: one pub/sub connection per primary, all woken."""
    names = names_on_every_primary(cluster, uid)
    holder, waiting = make_client(), make_client()
    for name in names:
        await holder.lock(name, owner="h").lock()

    async def wait_for(name: str) -> str:
        async with waiting.lock(name).acquired(wait=LIMIT):
            return name

    tasks = [asyncio.create_task(wait_for(name)) for name in names]
    for name in names:
        await wait_until(lambda n=name: waiting.lock(n).statistics().tasks_waiting == 1)  # type: ignore[misc]
    await assert_one_subscriber_per_primary(cluster)
    for name in names:
        await holder.lock(name, owner="h").unlock()
    async with asyncio.timeout(LIMIT):
        assert sorted(await asyncio.gather(*tasks)) == sorted(names)


async def test_semaphore_and_latch_waiters_on_every_primary(
    cluster: ClusterHandle, make_client: ClientFactory, uid: str
) -> None:
    """Semaphore, permit-expirable semaphore and latch waiters on every primary, woken by
    another client's releases and count-down over sharded pub/sub."""
    semaphores = names_on_every_primary(cluster, f"{uid}:sem")
    latches = names_on_every_primary(cluster, f"{uid}:latch")
    permits = names_on_every_primary(cluster, f"{uid}:psem")
    giver, waiting = make_client(), make_client()
    given = []
    for sem, latch, psem in zip(semaphores, latches, permits, strict=True):
        assert await giver.semaphore(sem).try_set_permits(0)
        assert await giver.count_down_latch(latch).try_set_count(1)
        assert await giver.permit_expirable_semaphore(psem).try_set_permits(1)
        given.append(await giver.permit_expirable_semaphore(psem).acquire())
    tasks = [
        *(asyncio.create_task(waiting.semaphore(n).try_acquire(wait=LIMIT)) for n in semaphores),
        *(asyncio.create_task(waiting.count_down_latch(n).wait(timeout=LIMIT)) for n in latches),
    ]
    taking = [
        asyncio.create_task(waiting.permit_expirable_semaphore(n).try_acquire(wait=LIMIT))
        for n in permits
    ]
    await wait_until(lambda: inside.waiting_room(waiting).total() == len(tasks) + len(taking))
    await assert_one_subscriber_per_primary(cluster)
    for sem, latch, psem, permit in zip(semaphores, latches, permits, given, strict=True):
        await giver.semaphore(sem).release()
        await giver.count_down_latch(latch).count_down()
        await giver.permit_expirable_semaphore(psem).release(permit)
    async with asyncio.timeout(LIMIT):
        assert await asyncio.gather(*tasks) == [True] * len(tasks)
        taken = await asyncio.gather(*taking)
    raw = RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        for sem, latch, psem, permit in zip(semaphores, latches, permits, taken, strict=True):
            assert await raw.get(sem) == "0"
            assert await raw.exists(latch) == 0
            assert permit is not None
            await waiting.permit_expirable_semaphore(psem).release(permit)
            await raw.delete(sem, psem)
    finally:
        await raw.aclose()


def test_a_latch_name_with_a_hash_tag_is_refused_on_a_cluster(
    cluster: ClusterHandle, make_client: ClientFactory
) -> None:
    """Redisson's latch channel wraps the whole name in braces: with a tag of its own, the
    channel hashes to another slot than the key, so no latch script could run there."""
    client = make_client()
    with pytest.raises(ValueError, match="cannot work on a Redis Cluster"):
        client.count_down_latch("{orders}:ready")
    client.semaphore("{orders}:slots")  # the semaphore's channel keeps the tag: fine


async def test_forced_leader_term_ends_on_its_sharded_message(
    cluster: ClusterHandle, make_client: ClientFactory, uid: str
) -> None:
    """A leader's barrier (a PING on the SSUBSCRIBE connection of each primary) comes back:
    a forced term ends on its message, with no renewal, on every primary."""
    client, admin = make_client(), make_client()
    for name in names_on_every_primary(cluster, uid):
        await forced_term_ends_on_its_message(client, admin, name, LIMIT)


async def test_renewal_is_one_call_per_slot(
    make_client: ClientFactory, raw: RedisCluster, uid: str
) -> None:
    """Hundreds of locks over every shard stay held; a round sends one call per slot."""
    client = make_client(watchdog_timeout=1.5)
    names = [f"test:{uid}:{index}" for index in range(300)]
    for name in names:
        await client.lock(name, owner="o").lock()
    rounds = inside.renewal(client).rounds
    await wait_until(
        lambda: inside.renewal(client).rounds >= rounds + 3, limit=LIMIT, what="renewals"
    )
    assert inside.renewal(client).last_round_calls == len(
        {key_slot(name.encode()) for name in names}
    )
    for name in names:
        assert await raw.pttl(name) > 0
        await client.lock(name, owner="o").unlock()


async def test_replica_acks_wait_on_the_slots_own_primary(
    cluster: ClusterHandle, make_client: ClientFactory, raw: RedisCluster, uid: str
) -> None:
    """The WAIT after an acquisition runs on the primary that took it, whatever the slot:
    each primary has one replica, so one acknowledgement comes and never two."""
    names = names_on_every_primary(cluster, uid)
    one = make_client(replica_acks=1)
    two = make_client(replica_acks=2, replica_ack_timeout=0.2)
    for name in names:
        async with one.lock(name).acquired(wait=LIMIT):
            assert await raw.exists(name)
        with pytest.raises(aiolock.ReplicaAckError, match="1 of 2 replicas"):
            await two.lock(name).lock()
        assert not await raw.exists(name)


async def test_failover_keeps_holds_and_wakes_parked_waiters(
    cluster: ClusterHandle, make_client: ClientFactory, raw: RedisCluster, uid: str
) -> None:
    """CLUSTER FAILOVER under a held lock and parked waiters: renewal goes on on the new
    primary, the unlock frees it there, and every waiter gets it in turn."""
    holder, waiting = make_client(watchdog_timeout=1.5), make_client()
    name = f"test:{uid}"
    lock = holder.lock(name, owner="h")
    await lock.lock()
    served: list[int] = []

    async def wait_for(index: int) -> None:
        async with waiting.lock(name).acquired(wait=LIMIT):
            served.append(index)

    tasks = [asyncio.create_task(wait_for(index)) for index in range(3)]
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 3)
    old = cluster.node_for_key(name)
    new = await asyncio.to_thread(cluster.failover, old)
    assert cluster.node_for_key(name).port == new.port != old.port
    rounds = inside.renewal(holder).rounds
    await wait_until(
        lambda: inside.renewal(holder).rounds >= rounds + 2, limit=LIMIT, what="renewals"
    )
    assert await raw.hget(name, f"{holder.id}:owner:h") == "1"
    assert await raw.pttl(name) > 0
    await lock.unlock()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*tasks)
    assert sorted(served) == [0, 1, 2]


async def test_migration_of_a_held_locks_slot(
    cluster: ClusterHandle, make_client: ClientFactory, raw: RedisCluster, uid: str
) -> None:
    """The slot of a held lock moves to another primary: renewal, waking and the unlock
    follow it."""
    holder, waiting = make_client(watchdog_timeout=1.5), make_client()
    name = f"test:{uid}"
    lock = holder.lock(name, owner="h")
    await lock.lock()
    waiter = asyncio.create_task(_hold_once(waiting.lock(name)))
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
    source = cluster.node_for_key(name)
    target = next(node for node in cluster.primaries() if node.port != source.port)
    await asyncio.to_thread(cluster.migrate_slot, key_slot(name.encode()), target)
    assert cluster.node_for_key(name).port == target.port
    rounds = inside.renewal(holder).rounds
    await wait_until(
        lambda: inside.renewal(holder).rounds >= rounds + 2, limit=LIMIT, what="renewals"
    )
    assert await raw.hget(name, f"{holder.id}:owner:h") == "1"
    await lock.unlock()
    async with asyncio.timeout(LIMIT):
        await waiter


async def _hold_once(handle: aiolock.Lock) -> None:
    async with handle.acquired(wait=LIMIT):
        pass


async def test_a_killed_primary_loses_nothing_silently(uid: str) -> None:
    """A primary killed under a held lock and a parked waiter (a cluster of its own): the
    replica takes over; the holder's unlock either frees the lock or reports it lost, and
    the waiter is served. Nobody hangs.

    Calls to the dead primary's slots fail until its replica is elected (2 s of
    cluster-node-timeout, then the vote): clients whose retries span that (here 8 s) ride
    it out."""
    with redis_cluster() as own:
        holder = aiolock.Client.from_url(
            own.url, cluster=True, watchdog_timeout=1.5, retry_attempts=40, retry_interval=0.2
        )
        waiting = aiolock.Client.from_url(
            own.url, cluster=True, retry_attempts=40, retry_interval=0.2
        )
        try:
            name = f"test:{uid}"
            lock = holder.lock(name, owner="h")
            await lock.lock()
            waiter = asyncio.create_task(_hold_once(waiting.lock(name)))
            await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
            victim = own.node_for_key(name)
            victim.kill()
            # Until its replica is elected (cluster-node-timeout 2 s, then the vote).
            await asyncio.to_thread(
                own.wait_stable, lambda: own.node_for_key(name).port != victim.port
            )
            with contextlib.suppress(aiolock.LockLostError):
                async with asyncio.timeout(LIMIT):
                    await lock.unlock()
            async with asyncio.timeout(LIMIT * 2):
                await waiter
        finally:
            await holder.aclose()
            await waiting.aclose()


async def test_a_slot_served_by_no_primary_for_a_while_is_waited_out(uid: str) -> None:
    """A slot left without a primary (as a slot-map read can answer mid-failover): the
    parked waiter, told its channel moved, and a new caller both ride it out within their
    retries, and are served once a primary takes the slot again. Neither raises
    ClusterDownError at the first map that lacks the slot (a cluster of its own)."""
    with redis_cluster() as own:
        options: dict[str, Any] = {"retry_attempts": 100, "retry_interval": 0.05}
        holder = aiolock.Client.from_url(own.url, cluster=True, **options)
        waiting = aiolock.Client.from_url(own.url, cluster=True, **options)
        try:
            name, other = f"test:{{{uid}}}:held", f"test:{{{uid}}}:free"
            slot = key_slot(name.encode())
            lock = holder.lock(name, owner="h")
            await lock.lock()
            parked = asyncio.create_task(_hold_once(waiting.lock(name)))
            await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
            reads = await asyncio.to_thread(own.slot_map_reads)
            owner = await asyncio.to_thread(own.unassign_slot, slot)
            fresh = asyncio.create_task(_hold_once(waiting.lock(other)))

            async def retrying() -> bool:
                # Both have read a map lacking the slot, more than once: they are retrying.
                return await asyncio.to_thread(own.slot_map_reads) >= reads + 4

            await wait_until(retrying)
            assert not parked.done()
            assert not fresh.done()
            await asyncio.to_thread(own.assign_slot, slot, owner)
            async with asyncio.timeout(LIMIT):
                await fresh
                await lock.unlock()
                await parked
        finally:
            await holder.aclose()
            await waiting.aclose()


async def test_waiters_on_a_frozen_primary_follow_its_replica_by_polling(uid: str) -> None:
    """A primary frozen (SIGSTOP, a cluster of its own) under a held lock and a parked
    waiter: its replica is promoted, and nothing the clients do would tell them (the waiter
    has no traffic; its SSUBSCRIBE sits on the frozen node). Both read the slot map by
    themselves: the holder's unlock goes to the new primary, and the waiter, moved there,
    is served. Before, the waiter was served ~17 s late (pub/sub keepalive or lease)."""
    with redis_cluster() as own:
        holder = aiolock.Client.from_url(own.url, cluster=True)
        waiting = aiolock.Client.from_url(own.url, cluster=True)
        victim = None
        try:
            name = f"test:{uid}"
            lock = holder.lock(name, owner="h")
            await lock.lock()
            waiter = asyncio.create_task(_hold_once(waiting.lock(name)))
            await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
            victim = own.node_for_key(name)
            replica = own.replicas_of(victim)[0]
            assert victim.pid is not None

            # The hold on the replica before the freeze: replication is asynchronous, and a
            # loaded machine once froze the primary before it had sent the hold (the
            # promoted replica then found no lock to unlock). What is tested is the routing.
            # WAIT counts from its own connection's last write, made after the hold's.
            def replicated() -> int:
                with victim.redis() as redis:
                    redis.set(f"{{{name}}}:replicated", 1)
                    return int(redis.execute_command("WAIT", 1, 5000))

            assert await asyncio.to_thread(replicated) == 1
            os.kill(victim.pid, signal.SIGSTOP)
            # Promoted after cluster-node-timeout (2 s) and the vote.
            await wait_until(
                lambda: asyncio.to_thread(lambda: replica.call("ROLE")[0] == "master"),
                limit=LIMIT,
                what="the replica promoted",
            )
            promoted = time.monotonic()
            port = replica.port

            # Bounded, not hung: a poll each second, a frozen node skipped after 0.5 s.
            def routed_to_replica(client: aiolock.Client) -> bool:
                topology = inside.topology(client)
                assert isinstance(topology, Cluster)
                node = inside.slots_of(topology)[topology.shard(name)]
                return node is not None and node.address[1] == port

            await wait_until(
                lambda: routed_to_replica(holder),
                limit=5.0,
                what="the holder's map names the promoted replica",
            )
            await lock.unlock()
            async with asyncio.timeout(5.0):
                await waiter
            assert time.monotonic() - promoted < 5.0 + 5.0
            assert routed_to_replica(waiting)
        finally:
            if victim is not None and victim.pid is not None:
                os.kill(victim.pid, signal.SIGCONT)
            await holder.aclose()
            await waiting.aclose()


async def test_latches_of_many_slots_go_in_one_round_trip_per_primary(
    cluster: ClusterHandle,
    make_client: ClientFactory,
    raw: RedisCluster,
    uid: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unlock latches in many slots are deleted a pipeline per primary, not an UNLINK per
    round trip: a busy client's latches must not pile up until their PX expiry."""
    trips: list[tuple[CommandTransport, int]] = []  # (server, UNLINKs it carried)
    call_many = CommandTransport.call_many

    async def counted(self: CommandTransport, commands: list[bytes]) -> list[Any]:
        carried = sum(b"UNLINK" in command[:24] for command in commands)
        if carried:
            trips.append((self, carried))
        return await call_many(self, commands)

    monkeypatch.setattr(CommandTransport, "call_many", counted)
    client = make_client()
    async with client.lock(f"{uid}:warm"):  # the slot map read, a connection per primary
        pass
    await inside.latches(client).flush()
    trips.clear()
    # Latches of unlocks on 300 names, all waiting for the sweeper's next batch (added
    # with no await in between, so that one flush takes them all).
    names = [f"{uid}:latch:{i}" for i in range(300)]
    latches = [f"redisson_unlock_latch:{{{name}}}:{uid}:1" for name in names]
    for latch in latches:
        await raw.set(latch, 1, px=60_000)
    for latch in latches:
        inside.latches(client).add(latch)
    await inside.latches(client).flush()
    assert [latch for latch in latches if await raw.exists(latch)] == []
    # An UNLINK per slot (a cluster's multi-key command stays in one slot), and each
    # primary's UNLINKs in one round trip (up to 100 a pipeline).
    slots = {key_slot(name.encode()) for name in names}
    assert sum(carried for _, carried in trips) == len(slots)
    per_server = {server for server, _ in trips}
    assert len(per_server) == len(cluster.primaries())
    for server in per_server:
        carried = [count for to, count in trips if to is server]
        assert len(carried) == -(-sum(carried) // 100), carried
