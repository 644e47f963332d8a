"""A leader's watch: a message on its lock's channel while it holds it means it was forced.

Nobody else releases a lock while its holder holds it, so a message then means a
``force_unlock()``: the renewal is run at once, finds the hold gone, and the guard cancels
the leader's term now rather than at the next renewal period.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core import Part

if TYPE_CHECKING:
    from .primitive import Primitive

__all__ = ("Watch",)


class Watch(Part):
    """The leader's watch of its lock's channel."""

    async def watch_taken(self, p: Primitive, holder: str) -> None:
        """Until cancelled: renew this client's holds after each message on ``p``'s channel.

        (And after every resubscription, when messages may have been lost.) Nobody else
        releases a lock while its holder holds it: a message then means it was forced away
        (``force_unlock()``). The renewal finds such a hold gone now rather than at its
        next period, and the guard cancels a guarded body at once. A stale message (a
        release from before the hold began, delivered late) costs one renewal. The
        subscription is shared with this client's waiters, and released at the end.
        """
        channel = p.channel(holder)
        room = self._s.waiting
        while True:
            sub = await self._s.dispatcher.subscribe(channel, None)
            if sub is None:  # pragma: no cover - only a caller's limit gives None
                return
            try:
                # Registered before each renewal: a message while it flies wakes the next.
                waiter = room.add(channel, p.wake_count, shared=True, watch=True)
                try:
                    # A message published before the server took the SUBSCRIBE was never
                    # heard (a force_unlock() just as the term began): look once now.
                    self._core.check_open()
                    await self._s.renewal.renew_once()
                    while not sub.stale:
                        await waiter.wait(None)
                        room.remove(channel, waiter, leaving=False)
                        waiter = room.add(channel, p.wake_count, shared=True, watch=True)
                        self._core.check_open()
                        await self._s.renewal.renew_once()
                finally:
                    room.remove(channel, waiter, leaving=False)
            finally:
                sub.release()
