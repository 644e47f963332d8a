"""The engine's pub/sub on a Redis Cluster: each channel on the primary of its slot.

Each primary has one dispatcher (``pubsub.py``) of the cluster's (``cluster.py``); this
picks the one that serves a channel's slot now, and while a failover leaves the slot with
no primary, reads the slot map again after the retry interval, as a script call is resent.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from redis.exceptions import ClusterDownError

if TYPE_CHECKING:
    from .cluster import Cluster
    from .subscriptions import Subscription

__all__ = ("ClusterPubSub",)


class ClusterPubSub:
    """The engine's ``PubSub`` on a cluster: each channel on its slot's primary."""

    def __init__(self, cluster: Cluster, *, retry_attempts: int, retry_interval: float) -> None:
        self._cluster = cluster
        self._retry_attempts = retry_attempts
        self._retry_interval = retry_interval

    def join(self, name: str) -> Subscription | None:
        dispatcher = self._cluster.dispatcher_for(name)
        return None if dispatcher is None else dispatcher.join(name)

    async def subscribe(self, name: str, limit: float | None) -> Subscription | None:
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        attempt = 0
        while (dispatcher := self._cluster.dispatcher_for(name)) is None:
            if attempt > self._retry_attempts:
                raise ClusterDownError(f"aiolock: no primary serves the slot of {name!r}")
            if attempt:
                # A failover under way: the map names no primary for the slot until it
                # ends. Read it again a moment later, as a script call is resent.
                pause = self._retry_interval
                if deadline is not None:
                    if (left := deadline - loop.time()) <= 0:
                        return None
                    pause = min(pause, left)
                await asyncio.sleep(pause)
            await self._cluster.refresh()
            attempt += 1
        return await dispatcher.subscribe(
            name, None if deadline is None else max(0.0, deadline - loop.time())
        )

    def channels(self) -> dict[str, int]:
        channels: dict[str, int] = {}
        for dispatcher in self._cluster.dispatchers():
            channels.update(dispatcher.channels())
        return channels

    @property
    def reconnects(self) -> int:
        return sum(dispatcher.reconnects for dispatcher in self._cluster.dispatchers())

    async def aclose(self) -> None:
        dispatchers = self._cluster.dispatchers()
        await asyncio.gather(*(dispatcher.aclose() for dispatcher in dispatchers))
