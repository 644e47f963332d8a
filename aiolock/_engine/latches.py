"""Deferred deletion of unlock latches.

Redisson deletes each unlock latch with a DEL right after the unlock. Doing that as its own
round trip would make every lock/unlock pair cost three commands; the latch only matters
to resends of the one unlock call, which are over by the time it returns, so aiolock
deletes latches in batches in the background (and all remaining ones at ``aclose()``).
Their PX expiry stays as the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

if TYPE_CHECKING:
    from .._net.scripts import ScriptRunner

__all__ = ("LatchSweeper",)

log = logging.getLogger("aiolock")

_BATCH = 100
_DELAY = 0.05


class LatchSweeper:
    """Collects latch keys and UNLINKs them a batch at a time."""

    __slots__ = ("_keys", "_runner", "_spawn", "_task")

    def __init__(self, runner: ScriptRunner, spawn: Callable[[Any], asyncio.Task[Any]]) -> None:
        self._runner = runner
        self._spawn = spawn
        self._keys: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, key: str) -> None:
        """Delete ``key`` soon."""
        self._keys.append(key)
        if self._task is None:
            self._task = self._spawn(self._sweep_soon())

    async def _sweep_soon(self) -> None:
        try:
            # Wait a moment so one UNLINK carries the latches of many unlocks.
            await asyncio.sleep(_DELAY)
            await self.flush()
        finally:
            self._task = None

    async def flush(self) -> None:
        """Delete every collected latch now."""
        while self._keys:
            # One UNLINK per shard: on a cluster a multi-key command stays in one slot.
            shards: dict[int, list[str]] = {}
            for key in self._keys:
                shards.setdefault(self._runner.shard(key), []).append(key)
            self._keys = []
            for keys in shards.values():
                for start in range(0, len(keys), _BATCH):
                    with contextlib.suppress(RedisError, OSError):
                        await self._runner.command("UNLINK", *keys[start : start + _BATCH])
