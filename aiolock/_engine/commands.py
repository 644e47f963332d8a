"""Calls that run once and are not waited on: force_unlock, delete and the queries.

None of them takes a hold or waits: an error reply names the object, and a cancel that
came while the call ran wins over its result (a cancel swallowed below aiolock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from .cancel import cancel_mark, cancelled_since
from .core import Part
from .replies import decode_force, script_error

if TYPE_CHECKING:
    from .primitive import Invocation, Primitive, Waitable

__all__ = ("Commands",)

T = TypeVar("T")


class Commands(Part):
    """force_unlock(), delete() and the read-only queries of every object."""

    async def force(self, p: Primitive) -> bool:
        """Delete ``p`` whoever holds it and wake its waiters; True if it was held."""
        mark = cancel_mark()
        self._core.check_open()
        sent_at = self._s.holds.clock()
        try:
            deleted = decode_force(await self._s.runner.run(*p.force()))
        except ResponseError as exc:
            raise script_error(p.name, p.key, exc) from exc
        if deleted and p.polls:
            # Nothing was published: wake this client's own waiters here.
            self._s.waiting.deliver(p.channel(""), b"0", heard=False)
        if deleted:
            # Only what was deleted is lost (a read-write lock's force_unlock() of the other
            # mode deletes nothing, and this client's holds on it stay valid).
            self._s.holds.mark_key_lost(p.key, "force_unlock() deleted it", begun_by=sent_at)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    async def delete(self, w: Waitable, *keys: str) -> bool:
        """Remove ``w``'s ``keys`` as Redisson's delete does; True if any of them existed.

        This client's renewed holds on ``w`` (a semaphore's permits) are gone with them:
        marked lost, so the watchdog stops and their release raises LockLostError.
        """
        mark = cancel_mark()
        self._core.check_open()
        sent_at = self._s.holds.clock()
        try:
            deleted = int(await self._s.runner.command("DEL", *keys)) > 0
        except ResponseError as exc:
            raise script_error(w.name, w.key, exc) from exc
        if deleted:
            self._s.holds.mark_key_lost(w.key, "delete() deleted it", begun_by=sent_at)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    async def query(self, p: Waitable, *args: str) -> Any:
        """Run one plain command about ``p``."""
        return await self._one_shot(p, lambda: self._s.runner.command(*args))

    async def ask(self, p: Waitable, invocation: Invocation) -> Any:
        """Run a read-only script about ``p``."""
        return await self._one_shot(p, lambda: self._s.runner.run(*invocation))

    async def _one_shot(self, p: Waitable, send: Callable[[], Awaitable[T]]) -> T:
        """A call that changes nothing: an error reply names ``p``, a cancel wins."""
        mark = cancel_mark()
        self._core.check_open()
        try:
            reply = await send()
        except ResponseError as exc:
            raise script_error(p.name, p.key, exc) from exc
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return reply

    async def query_all(self, p: Primitive, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands about ``p`` in one round trip (a pipeline), as query() one."""
        mark = cancel_mark()
        self._core.check_open()
        replies = await self._s.runner.pipeline(*commands)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        for reply in replies:
            if isinstance(reply, ResponseError):
                error = script_error(p.name, p.key, reply)
                if error is reply:
                    raise reply
                raise error from reply
        return replies
