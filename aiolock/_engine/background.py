"""The work a client does beside its callers' calls, and the calls it must see end.

A call cut off by a cancel or an outage is completed here (a release, a rollback, a fair
queue exit), a reader or a renewal loop runs here, and ``aclose()`` waits for all of it:
nothing is fire-and-forget, and a failure nobody awaits is logged. It also counts the
public calls under way, so that ``aclose()`` lets none of them succeed after it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from .._exceptions import LockError
from .ordering import Ticket, in_turn

__all__ = ("Background",)

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

    async def shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` to completion even if the caller is cancelled meanwhile."""
        task = self.spawn(coro)
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
