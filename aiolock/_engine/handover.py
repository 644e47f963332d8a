"""Hand-over: a release that gives the lock straight to a waiter of the same client.

Every release that frees a lock publishes a message; each client with waiters wakes one,
and every one of them runs its acquire script: one wins, the others have spent a round
trip for nothing. Across four processes that made five round trips per acquisition. When
the releasing client has a waiter of its own parked on the lock, the release script can
instead write that waiter's hold in place of the releaser's (``lock_release.lua``, reply
3): one round trip for the release and the acquisition together, no message, no attempt
anywhere. The lock is never free in between, so the state stays Redisson's.

Rules, all here as plain sync methods:

- **Who**: the oldest parked waiter of a task or of an aiolock.sync thread (not another
  ``owner=``, whose holder may have other calls under way), exclusive, not woken, whose
  holder has no call or background completion under way on this lock (a pending
  rollback of its earlier attempt could otherwise undo the hold it is handed), and only
  if its primitive takes a hand-over from the releaser's (``Primitive.takes_hand_over``).
  Kinds share a hash and channel (Lock, FencedLock, SpinLock): a fenced acquisition
  takes a token, which no release script does, so a fenced waiter is never an heir; nor
  is any call asking for a token.
- **How often**: at most ``IN_A_ROW`` hand-overs on one lock, then a release publishes as
  usual, so that waiters of other clients (other processes, Redisson) get their turn: a
  client cannot keep a contended lock among its own tasks for ever.
- **The offer**: made to one waiter for one release call, and settled with that call's
  outcome (handed, not handed, unknown). The waiter returns holding the lock if handed;
  a waiter that leaves first (deadline, cancellation) abandons it, and the engine then
  releases whatever it is handed, in that holder's turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .primitive import Call, Primitive

__all__ = ("IN_A_ROW", "HandOvers", "Offer")

#: Hand-overs in a row on one lock before a release frees it for everyone. Each free-for-all
#: costs one attempt per client with waiters; with four processes of eight tasks on one
#: lock, 8 gave 1.15-1.22x the owner changes of a pub/sub token ring where 3 gave
#: 0.82-0.86x (benchmark, pinned to one core), at the price of longer turns per client.
IN_A_ROW = 8


class Offer:
    """One release call's hand-over to one parked waiter."""

    __slots__ = ("_wake", "abandoned", "call", "heir", "outcome", "sent")

    def __init__(self, call: Call, heir: Primitive, wake: Callable[[], None]) -> None:
        #: The waiting call it is offered to, the primitive it waits for (the hold is
        #: recorded as that one's), and how to wake it.
        self.call = call
        self.heir = heir
        self._wake = wake
        #: True: handed (the hold is recorded); False: not handed; None: unknown (the
        #: release went unanswered: an attempt of the waiter finds out).
        loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[bool | None] = loop.create_future()
        #: Made just before the release is sent: the heir's lease runs at least until this
        #: plus its lease (the guard's confirmation of a handed hold; a guarded heir's).
        self.sent = loop.time() if call.timed else None
        #: The waiter left before the outcome: whatever it is handed is released for it.
        self.abandoned = False

    def settle(self, *, handed: bool | None) -> None:
        """Record the release's outcome and wake the waiter to take it (once)."""
        if self.outcome.done():
            return
        self.outcome.set_result(handed)
        self._wake()


class HandOvers:
    """The client's hand-over policy: which waiter, and how many times in a row."""

    __slots__ = ("_in_a_row",)

    def __init__(self) -> None:
        self._in_a_row: dict[str, int] = {}

    def allowed(self, key: str) -> bool:
        """Whether a release of ``key`` may hand over now."""
        return self._in_a_row.get(key, 0) < IN_A_ROW

    def handed(self, key: str) -> None:
        """A release of ``key`` handed it over."""
        self._in_a_row[key] = self._in_a_row.get(key, 0) + 1

    def freed(self, key: str) -> None:
        """A release of ``key`` freed it for everyone (or the lock went away)."""
        self._in_a_row.pop(key, None)
