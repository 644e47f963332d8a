"""aclose()'s release of the holds whose tasks ended holding them, and the end of the rest."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .._keys import unlock_latch_key
from .core import Part
from .replies import Release, decode_release

if TYPE_CHECKING:
    from .holds import HoldRecord
    from .primitive import Primitive

__all__ = ("Closing",)

log = logging.getLogger("aiolock")


class Closing(Part):
    """What aclose() releases on the holders' behalf."""

    async def release_ended(self) -> None:
        """aclose()'s release of every hold whose holder can no longer release it.

        The holds of tasks that ended holding them (a guarded body that aclose() cancelled
        releases its own, in the background): each released at once, so another process takes the
        lock over without waiting out the lease. Each is sent once, with the client's
        retries (so this is bounded with the server unreachable); a failure is logged,
        and that lock then runs out with its lease.
        """
        loop = asyncio.get_running_loop()
        ended = self._s.holds.ended(loop.time())
        for hold in self._s.holds:
            # A task ended whose done-callback has not run yet.
            done = hold.task is not None and hold.task.done()
            if done and hold.count and hold.lost is None:
                ended.append((hold, hold.count - hold.releasing))
                self._s.holds.drop(hold, ended="task_ended")
        if ended:
            await asyncio.gather(*(self._release_ended(hold, kept) for hold, kept in ended))

    async def _release_ended(self, hold: HoldRecord, kept: int) -> None:
        p: Primitive | None = hold.primitive
        if p is None or kept <= 0:
            return
        try:
            # One release per hold left, as its unlocks would have been: a reentrant
            # hold's last one frees the lock and wakes its waiters.
            for _ in range(kept):
                latch = unlock_latch_key(p.key, self._core.request_id())
                invocation = p.release(hold.field, self.settings.lease_ms, latch)
                result = decode_release(await self._s.runner.run(*invocation))
                self._s.latches.add(latch)
                if result is not Release.KEPT:
                    break
        except Exception as exc:
            log.warning(
                "aiolock: could not release lock %r of %s, whose task has ended, at close "
                "(%r): it expires with its lease",
                hold.name,
                hold.holder,
                exc,
            )
            return
        log.info("aiolock: released lock %r of %s, whose task had ended", hold.name, hold.holder)

    def end_held(self) -> None:
        """aclose()'s last word on the holds still held by running tasks: each is ended.

        They are not released (their tasks may still be in their critical sections; the
        lock expires with its lease), but nothing of this client renews or releases them
        any more: each is logged at WARNING and ends here with a ``Lost`` event
        (``how="closed"``), so that every ``Acquired`` has its end and a metric of the
        holds held (OpenTelemetry's ``aiolock.held``) falls back to 0.
        """
        for hold in list(self._s.holds):
            if hold.count and hold.lost is None:
                task = f"task {hold.task.get_name()} " if hold.task is not None else ""
                log.warning(
                    "aiolock: client closed while %s(%s) holds lock %r; it is not released "
                    "and expires with its lease",
                    task,
                    hold.holder,
                    hold.name,
                )
                self._s.holds.drop(hold, ended="closed")
