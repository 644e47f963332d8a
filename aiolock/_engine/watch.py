"""A guarded hold's watch: a message on its lock's channel while held means it was forced.

Nobody else releases a lock while its holder holds it, so a message published then means
the lock was deleted under it: a ``force_unlock()`` (or Redisson's ``forceUnlock()``).
The next candidate is woken by that same message and needs a round trip to take the lock:
so the term must end on the message itself, with no round trip of its own.

What tells such a message from a stale one (a release published before the term's acquire
and delivered after its answer: pub/sub is a connection of its own, unordered against the
command connection) is a *barrier* (``_net/barrier.py``): a PING sent on the pub/sub
connection once the hold is granted, answered in order with that connection's messages.

* A message heard after the barrier came back was published after the acquire: the hold
  is reported lost in the message's own callback (``WaitingRoom.deliver`` calls the
  watcher's ``forced``), and the guard cancels the term's body in the next loop iteration.
* A message heard before it may be stale: the hold is looked up at once (one round trip,
  ``HEXISTS``), which finds a forced hold gone (and a stale message costs that only).
* After a reconnect (the barrier is broken) a new barrier is sent on the new connection
  and the hold is looked up at once, since messages may have been lost meanwhile.

Every guarded hold of a kind whose channel tells a force (``Primitive.watched``: the
reentrant and fenced locks, the write lock) is watched so, a leader's term among them.
The body starts only once the barrier is back and the messages before it checked:
from its first moment a force ends it in the message's callback. And the leader forced out
heard the message that woke this one before this one's acquire was even answered (the
server wrote it first), so its term has ended by then: the barrier's round trip is the
margin (two loop iterations at least when both leaders share a process).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING

from .core import Part

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._net.subscriptions import Barrier
    from .holds import HoldRecord
    from .primitive import Primitive
    from .waiting import Waiter

__all__ = ("Watch",)


class Watch(Part):
    """A guarded hold's watch of its lock's channel."""

    async def watch_taken(self, p: Primitive, holder: str, armed: asyncio.Event) -> None:
        """Until cancelled: end ``holder``'s hold of ``p`` as soon as it is forced away.

        A message on ``p``'s channel after this watch's barrier passed reports the hold
        lost at once (the guard then cancels a guarded body); one before it, and every
        resubscription, runs the renewal now, which finds a forced hold gone. ``armed``
        is set once the barrier is back and every message before it was checked (or the
        barrier broke, or the watch ended): the term's body starts then. Ends by itself
        once the hold is lost. The subscription is shared with this client's waiters, and
        released at the end.
        """
        try:
            await self._watch(p, holder, armed)
        finally:
            armed.set()  # the term goes on without the watch (the client closes, say)

    async def _watch(self, p: Primitive, holder: str, armed: asyncio.Event) -> None:
        channel = p.channel(holder)
        room = self._s.waiting
        hold = self._s.holds.get(p.key, p.field(holder))
        if hold is None:  # pragma: no cover - the term's acquire recorded it
            return
        forced = partial(self._forced, hold)
        while True:
            sub = await self._s.dispatcher.subscribe(channel, None)
            if sub is None:  # pragma: no cover - only a caller's limit gives None
                return
            try:
                # Sent before anything else: the sooner it is back, the sooner the term
                # starts, and a forced unlock ends it without a round trip.
                barrier = sub.barrier()
                waiter = self._watcher(channel, p, barrier, forced)
                try:
                    # A message published before the server took the SUBSCRIBE was never
                    # heard (a force_unlock() just as the hold began): look once now.
                    await self._check(hold)
                    while not sub.stale and not _lost(hold):
                        if not await _woken(waiter, barrier, armed):
                            continue  # the barrier is back: armed now
                        room.remove(channel, waiter, leaving=False)
                        if _lost(hold):
                            return
                        if barrier.broken:
                            # Woken by a resubscription on a new connection: a barrier there.
                            barrier = sub.barrier()
                        # Registered before the renewal: a message while it flies wakes it.
                        waiter = self._watcher(channel, p, barrier, forced)
                        await self._check(hold)
                finally:
                    room.remove(channel, waiter, leaving=False)
            finally:
                sub.release()
            if _lost(hold):
                return

    def _watcher(
        self, channel: str, p: Primitive, barrier: Barrier, forced: Callable[[], None]
    ) -> Waiter:
        """A fresh watcher on ``channel``: told at once of a message after ``barrier``."""
        waiter = self._s.waiting.add(channel, p.wake_count, shared=True, watch=True)
        waiter.barrier = barrier
        waiter.forced = forced
        return waiter

    async def _check(self, hold: HoldRecord) -> None:
        """Look once whether the hold is still on the server (one plain command).

        Not a renewal round: that would renew every hold of the client, and give a hold
        of an explicit lease the watchdog's. A hold found gone while none of its releases
        ran meanwhile is reported lost.
        """
        self._core.check_open()
        releases = hold.releases
        held = await self._s.runner.command("HEXISTS", hold.key, hold.field)
        if (
            not int(held)
            and hold.lost is None
            and hold.count
            and not hold.releasing
            and hold.releases == releases
            and self._s.holds.get(hold.key, hold.field) is hold
        ):
            self._s.holds.report_lost(hold, "its watch found it gone", "renewal")

    def _forced(self, hold: HoldRecord) -> None:
        """A message heard after the barrier passed: the hold was deleted while held."""
        holds = self._s.holds
        if (
            hold.lost is None
            and hold.count
            # Its own release in flight publishes too (the watch ends before the term's
            # release, but a body may release a hold of its own).
            and not hold.releasing
            and holds.get(hold.key, hold.field) is hold
        ):
            # "forced", not "renewal": the message itself tells a force (nothing else
            # publishes while it is held), whoever sent it.
            holds.report_lost(
                hold,
                "its lock was deleted while it held it (force_unlock()), said its channel",
                "forced",
            )


def _lost(hold: HoldRecord) -> bool:
    # A function: the type checker does not carry an earlier check across an await.
    return hold.lost is not None


async def _woken(waiter: Waiter, barrier: Barrier, armed: asyncio.Event) -> bool:
    """Wait until ``waiter`` is woken (True); until ``armed``, or ``barrier`` settles (False).

    A settled barrier arms the watch: back, or broken (the term goes on without it).
    """
    if not armed.is_set() and barrier.settled.is_set():
        armed.set()
    if armed.is_set():
        await waiter.wait(None)
        return True
    await _either(waiter.event, barrier.settled)
    return waiter.event.is_set()


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Wait until either event is set (a term's first moments only: two small tasks)."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
