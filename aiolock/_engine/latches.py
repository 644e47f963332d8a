"""Deferred deletion of unlock latches.

Redisson deletes each unlock latch with a DEL right after the unlock. Doing that as its own
round trip would make every lock/unlock pair cost three commands; the latch only matters
to resends of the one unlock call, which are over by the time it returns, so aiolock
deletes latches in batches in the background (and all remaining ones at ``aclose()``).
Their PX expiry stays as the safety net.

A batch costs each server one round trip. On a cluster a multi-key command must stay in one
slot, and a latch is in its lock's slot: locks over many names give one UNLINK per slot,
so each server gets all of its UNLINKs in one pipeline. (One UNLINK after another, each
waiting for its reply, fell behind the unlocks of a busy client: latches piled up in the
client and on the servers until their PX expiry.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .._net.resp import pack

if TYPE_CHECKING:
    from .._net.scripts import ScriptRunner
    from .._net.transport import CommandTransport

__all__ = ("LatchSweeper",)

log = logging.getLogger("aiolock")

_BATCH = 100  # keys per UNLINK, and UNLINKs per pipeline
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
            keys, self._keys = self._keys, []
            # server -> slot -> its latches (one slot, shard 0, on a single server)
            servers: dict[CommandTransport | None, dict[int, list[str]]] = {}
            runner = self._runner
            for key in keys:
                slots = servers.setdefault(runner.server(key), {})
                slots.setdefault(runner.shard(key), []).append(key)
            for server, slots in servers.items():
                unlinks = [
                    same[start : start + _BATCH]
                    for same in slots.values()
                    for start in range(0, len(same), _BATCH)
                ]
                for start in range(0, len(unlinks), _BATCH):
                    await self._unlink(server, unlinks[start : start + _BATCH])

    async def _unlink(self, server: CommandTransport | None, unlinks: list[list[str]]) -> None:
        """UNLINK each list of keys: in one round trip to ``server``, else one by one."""
        if server is not None:
            try:
                replies = await server.call_many([pack("UNLINK", *keys) for keys in unlinks])
            except (RedisError, OSError):
                pass  # the connection lost: each again, with the runner's retries
            else:
                # An error reply (the slot moved, say): that one again, redirected.
                unlinks = [
                    keys
                    for keys, reply in zip(unlinks, replies, strict=True)
                    if isinstance(reply, BaseException)
                ]
        for keys in unlinks:
            # Best effort: a latch not deleted expires by itself.
            with contextlib.suppress(RedisError, OSError):
                await self._runner.command("UNLINK", *keys)
