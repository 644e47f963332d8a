"""Real Redisson against aiolock on a Redis Cluster: wake-ups by sharded pub/sub.

On a cluster both clients publish and subscribe with SPUBLISH/SSUBSCRIBE (Redisson since
3.22, detected at start-up): a release of one language must reach the other's waiter on
every primary. Each wait here is one no lease would end within the test, so a message
sent on the wrong kind of channel fails it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from . import redisson_driver
from .clusters import make_client, names_on_every_primary, node_redis, on_primaries, raw
from .conftest import ClientFactory
from .helpers import subscriptions_confirmed, wait_until
from .redisson_driver import Build, Driver, Java
from .topologies import ClusterHandle

redisson_driver.check_tools()

__all__ = ("make_client", "raw")

#: A lease no test lives long enough to see run out.
LONG = 600.0


@pytest.fixture(scope="session")
def redisson() -> Build:
    return redisson_driver.build(redisson_driver.version())


@pytest.fixture(scope="module")
def driver(redisson: Build, cluster: ClusterHandle) -> Iterator[Driver]:
    nodes = ",".join(f"redis://127.0.0.1:{node.port}" for node in cluster.nodes)
    with redisson_driver.running(redisson, cluster.url, cluster=nodes, watchdog=2000) as driver:
        yield driver


@pytest.fixture
async def java(
    driver: Driver,
    cluster: ClusterHandle,
    uid: str,
    raw: RedisCluster,
    make_client: ClientFactory,
) -> AsyncIterator[Java]:
    """The test's Java threads; at the end none is blocked, and the unlock latches some
    Redisson releases leave to expire (3.52) are gone before the leak check of
    ``make_client`` (set up before this fixture, so torn down after)."""
    view = Java(driver, uid)
    yield view
    assert driver.alive, f"the Redisson driver died: {driver.stderr()}"
    assert not view.unanswered(), "a Java call of this test is still blocked"

    async def unsubscribed() -> bool:
        # Redisson leaves a channel after its acquire has returned.
        async for redis in on_primaries(cluster):
            channels = await redis.execute_command(  # type: ignore[no-untyped-call]
                "PUBSUB", "SHARDCHANNELS", f"*{uid}*"
            )
            if channels:
                return False
        return True

    await wait_until(unsubscribed, what="Redisson's shard channels of this test gone")
    latches = [key async for key in raw.scan_iter(match=f"redisson_unlock_latch:*{uid}*")]
    for key in latches:
        await raw.delete(key)


async def java_parked(cluster: ClusterHandle, channel: str) -> None:
    """Wait until someone listens on ``channel`` by sharded pub/sub on its slot's primary."""
    node = cluster.node_for_slot(key_slot(channel.encode()))
    async with node_redis(node.port) as redis:

        async def listening() -> bool:
            reply = await redis.execute_command(  # type: ignore[no-untyped-call]
                "PUBSUB", "SHARDNUMSUB", channel
            )
            return int(reply[1]) >= 1

        await wait_until(listening, what=f"a sharded subscriber on {channel}")


async def test_lock_wake_ups_on_every_primary(
    java: Java, cluster: ClusterHandle, make_client: ClientFactory, uid: str
) -> None:
    """On each primary, a Java unlock wakes a parked Python waiter and a Python unlock a
    parked Java thread (sharded pub/sub both ways), for a lock and a fair lock."""
    py = make_client()
    for kind in ("lock", "fair"):
        for name in names_on_every_primary(cluster, f"{uid}{kind}"):
            lock = py.lock(name, owner="p") if kind == "lock" else py.fair_lock(name, owner="p")
            # A fair waiter listens on its own channel: its thread id is asked before it blocks.
            channel = f"redisson_lock__channel:{{{name}}}"
            if kind == "fair":
                channel += f":{await java.holder('w')}"
            await java.call("h", kind, name, "lock", lease=LONG)
            waiting = asyncio.ensure_future(lock.try_lock(wait=LONG, lease=LONG))
            await wait_until(lambda: subscriptions_confirmed(py), what="the Python waiter parked")
            await java.call("h", kind, name, "unlock")
            assert await waiting
            java_waiter = java.send("w", kind, name, "tryLock", wait=LONG, lease=LONG)
            await java_parked(cluster, channel)
            await lock.unlock()
            assert await asyncio.wrap_future(java_waiter)
            await java.call("w", kind, name, "unlock")


async def test_semaphore_and_latch_wake_ups_on_every_primary(
    java: Java, cluster: ClusterHandle, make_client: ClientFactory, raw: RedisCluster, uid: str
) -> None:
    """On each primary, a Java permit release wakes a Python acquire and the other way
    round, and a Python count-down opens a Java latch waiter."""
    py = make_client()
    for name in names_on_every_primary(cluster, f"{uid}s"):
        sem = py.semaphore(name)
        assert await sem.try_set_permits(0)
        waiting = asyncio.ensure_future(sem.try_acquire(wait=LONG))
        await wait_until(lambda: subscriptions_confirmed(py), what="the Python waiter parked")
        await java.call("a", "semaphore", name, "release")
        assert await waiting
        java_waiter = java.send("w", "semaphore", name, "tryAcquire", wait=LONG)
        await java_parked(cluster, f"redisson_sc:{{{name}}}")
        await sem.release()
        assert await asyncio.wrap_future(java_waiter)
        await raw.delete(name)
    for name in names_on_every_primary(cluster, f"{uid}l"):
        latch = py.count_down_latch(name)
        assert await latch.try_set_count(1)
        java_waiter = java.send("w", "latch", name, "await", timeout=LONG)
        await java_parked(cluster, f"redisson_countdownlatch__channel__{{{name}}}")
        await latch.count_down()
        assert await asyncio.wrap_future(java_waiter)
