"""The work a client does beside its callers' calls, and the calls it must see end.

A call cut off by a cancel or an outage is completed here (a release, a rollback, a fair
queue exit), a reader or a renewal loop runs here, and ``aclose()`` waits for all of it:
nothing is fire-and-forget, and a failure nobody awaits is logged. It also counts the
public calls under way, so that ``aclose()`` lets none of them succeed after it.

**Unlock latches**: their deletion is deferred and batched.

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
import contextvars
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import RedisError

from .._exceptions import LockError
from .._net.resp import pack
from .ordering import Ticket, in_turn

if TYPE_CHECKING:
    from .._net.scripts import ScriptRunner
    from .._net.transport import CommandTransport

__all__ = ("Background", "LatchSweeper")

log = logging.getLogger("aiolock")
T = TypeVar("T")


class Background:
    """One client's background tasks and its count of public calls under way."""

    __slots__ = ("_awaited", "_idle", "_running", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        # Tasks whose outcome a caller awaits (shielded): their failure is the caller's.
        self._awaited: set[asyncio.Task[Any]] = set()
        self._running = 0
        self._idle: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        """How many background tasks have not ended (and been reported) yet."""
        return len(self._tasks)

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        """The background tasks running now (tests and statistics)."""
        return frozenset(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a background task that `drain()` waits for."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def serve(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a long-lived service of the client, in a context of its own.

        The renewal, a pub/sub reader, the Sentinel watch, the latch sweeper: it belongs to the
        client, not to the call that happened to start it: it must not carry that call's context
        vars (the sync API files a task started in a cancelled call's context as that call's undo,
        and waits for it).
        """
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def complete(self, ticket: Ticket, coro: Coroutine[Any, Any, Any]) -> None:
        """Finish a holder's cut-off call in the background, in ``ticket``'s turn.

        The holder's later calls on the lock wait for it, so they land in the order they
        were made.
        """
        self.spawn(in_turn(ticket, coro))

    async def shielded(self, ticket: Ticket, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` in ``ticket``'s turn, to its end even if the caller is cancelled.

        As ``complete``, but the caller waits for the outcome (and gets its failure).
        """
        task = self.spawn(in_turn(ticket, coro))
        self._awaited.add(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller is gone: the done-callback reports a failure now.
            self._awaited.discard(task)
            raise

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        awaited = task in self._awaited
        self._awaited.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not awaited:
            level = logging.WARNING if isinstance(exc, LockError) else logging.ERROR
            log.log(level, "aiolock: background operation failed: %r", exc, exc_info=exc)

    # -- public calls under way -----------------------------------------------------------

    def call_started(self) -> None:
        """A public call began: `calls_ended()` waits for it."""
        self._running += 1

    def call_ended(self) -> None:
        """A public call ended (however)."""
        self._running -= 1
        if not self._running and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def calls_ended(self) -> None:
        """Wait until no public call is under way."""
        while self._running:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._idle])

    async def drain(self) -> None:
        """Wait until every background task has ended and been reported."""
        # Not `while tasks: await gather(*tasks)`: a task that ended in this loop iteration
        # stays in the set until its done-callback runs in the next one, and from Python
        # 3.12 on gather() of futures that are all done completes without yielding to the
        # loop, so that loop spun forever. wait() also leaves the tasks running if drain()
        # is cancelled, where gather() cancelled them all.
        while self._tasks:
            running = [task for task in self._tasks if not task.done()]
            if running:
                await asyncio.wait(running)
            else:
                await asyncio.sleep(0)  # only their done-callbacks are left to run


# Unlock latches

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
