"""Helpers for tests on a local Redis Cluster: clients, plain clients per primary, leftovers,
names.

``make_client`` and ``raw`` are fixtures: a test module on the cluster imports them
(``from .clusters import make_client, raw``) in place of the single server's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

import aiolock

from .topologies import ClusterHandle

__all__ = (
    "assert_nothing_left",
    "cluster_clients",
    "make_client",
    "names_on_every_primary",
    "node_redis",
    "on_primaries",
    "raw",
)


@contextlib.asynccontextmanager
async def cluster_clients(
    cluster: ClusterHandle, uid: str, **defaults: Any
) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """A factory of clients of ``cluster`` (``defaults``: options each gets unless given):
    all closed at the end, then nothing of the test ``uid`` may remain on any primary."""
    clients: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        client = aiolock.Client.from_url(cluster.url, cluster=True, **{**defaults, **options})
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    await assert_nothing_left(cluster, uid)


@pytest.fixture
async def make_client(
    cluster: ClusterHandle, uid: str
) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """Clients of the shared cluster (see ``cluster_clients``)."""
    async with cluster_clients(cluster, uid) as make:
        yield make


@pytest.fixture
async def raw(cluster: ClusterHandle) -> AsyncIterator[RedisCluster]:
    """A redis-py cluster client, decoding replies, for looking at the state."""
    redis = RedisCluster.from_url(cluster.url, decode_responses=True)
    yield redis
    await redis.aclose()


@contextlib.asynccontextmanager
async def node_redis(port: int) -> AsyncIterator[Redis]:
    """A plain client on the node at ``port``."""
    redis = Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        yield redis
    finally:
        await redis.aclose()


async def on_primaries(cluster: ClusterHandle) -> AsyncIterator[Redis]:
    """A plain client on each current primary in turn."""
    for node in cluster.primaries():
        async with node_redis(node.port) as redis:
            yield redis


async def assert_nothing_left(cluster: ClusterHandle, uid: str) -> None:
    """No key and no shard channel of this test on any primary."""
    async for redis in on_primaries(cluster):
        keys = [
            key
            async for key in redis.scan_iter(match=f"*{uid}*")
            if not key.startswith(("aiolock_acquire_cancel:", "redisson_lock_token:"))
        ]
        channels = await redis.execute_command(  # type: ignore[no-untyped-call]
            "PUBSUB", "SHARDCHANNELS", f"*{uid}*"
        )
        assert not keys, f"keys left behind: {keys}"
        assert not channels, f"shard channels left behind: {channels}"


def names_on_every_primary(cluster: ClusterHandle, uid: str) -> list[str]:
    """One lock name per primary, each served by a different one."""
    wanted = {node.port for node in cluster.primaries()}
    names: dict[int, str] = {}
    index = 0
    while len(names) < len(wanted):
        name = f"test:{uid}:{index}"
        names.setdefault(cluster.node_for_key(name).port, name)
        index += 1
    return list(names.values())
