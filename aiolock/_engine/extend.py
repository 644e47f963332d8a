"""extend(): a new lease from now for a hold, in the holder's turn."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._exceptions import LockLostError, LockNotOwnedError
from .cancel import cancel_requested
from .core import Part
from .replies import script_error

if TYPE_CHECKING:
    from .primitive import Primitive

__all__ = ("Extender",)


class Extender(Part):
    """Extending a held lease."""

    async def extend(self, p: Primitive, owner: str | None, lease_ms: int) -> None:
        """Give the hold of ``owner`` (None: the calling task) a lease of ``lease_ms`` from now.

        LockNotOwnedError / LockLostError as release() raises them. A watchdog hold stays
        renewed: only its current expiry moves (the watchdog's next renewal gives it the
        watchdog's lease again); explicit leases become ``lease_ms`` (what an unlock of a
        reentrant hold re-applies). Cancelled in flight it raises CancelledError: the
        script may have run, which only moved an expiry of a hold the holder still has,
        so there is nothing to undo.
        """
        mark, task = self._core.call_starts()
        try:
            await self._extend(p, owner, lease_ms, mark, task)
        except Exception as exc:
            if cancel_requested(task, mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._s.background.call_ended()

    async def _extend(
        self,
        p: Primitive,
        owner: str | None,
        lease_ms: int,
        mark: int,
        calling: asyncio.Task[Any] | None,
    ) -> None:
        holder, _ = self._core.holder(owner, calling)
        field = p.field(holder)
        # In the holder's turn, as its unlock: after a release of the same holder lands,
        # never racing it.
        ticket = self._s.order.join((p.key, holder))
        try:
            if not ticket.ready:
                await ticket.wait()
            hold = self._s.holds.get(p.key, field)
            if hold is None or not hold.count:
                raise LockNotOwnedError(p.name, holder, self._core.held_by_sibling(p.key, holder))
            if hold.lost is not None:
                # Known gone: the holder's unlock() raises it too (the hold is kept for it).
                raise LockLostError(p.name, holder, hold.lost)
            # The new lease may be shorter than the one confirmed: bracketed for the guard.
            expiry = hold.expiry_sent(asyncio.get_running_loop().time() + lease_ms / 1000)
            applied = False
            try:
                reply = await self._s.runner.run(*p.extend(hold, lease_ms))
                applied = bool(int(reply[0]))
            except ResponseError as exc:
                raise script_error(p.name, p.key, exc) from exc
            finally:
                hold.expiry_settled(expiry, applied=applied)
            if not applied:
                why = "its lease ran out or was taken before extend()"
                self._s.holds.report_lost(hold, f"{why}; found by extend()", "extend")
                raise LockLostError(p.name, holder, why)
            self._s.holds.extended(hold, lease_ms)
        finally:
            ticket.release()
        if cancel_requested(calling, mark):
            raise asyncio.CancelledError
