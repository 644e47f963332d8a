"""Helpers for tests on a local Redis Cluster: plain clients per primary, leftovers, names."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from .topologies import ClusterHandle

__all__ = ("assert_nothing_left", "names_on_every_primary", "node_redis", "on_primaries")


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
