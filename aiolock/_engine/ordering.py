"""One holder's calls on one lock run one after the other.

API.md: calls of one holder that overlap in time behave as if made one after the other. An
acquire attempt computes the count it expects to reach from this client's bookkeeping, and
the undo of a cut-off call assumes nothing else of the same holder ran in between; both hold
only if a holder's round trips on one lock never overlap. So each attempt, release, rollback
and fair-queue exit takes a turn in the line of its (lock key, holder), in the order
the calls were made, and keeps it until its bookkeeping is settled.

A turn can be handed to a background task (the completion of a call cut off by a cancel or
an outage): the holder's next call then waits for that completion instead of racing it.
Taking a place in line is synchronous, so a place is reserved at the moment a call is made,
before any other call of the same holder can be made.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Hashable
from typing import Any, TypeVar

__all__ = ("CallOrder", "Ticket", "in_turn")

T = TypeVar("T")


class Ticket:
    """One call's place in its holder's line.

    The line is the ticket whose turn it is (in ``CallOrder``, by key) and the tickets
    behind it (in its ``_behind``, handed on with the turn): no object of its own, as
    nearly every line holds one ticket only (two per lock/unlock pair).
    """

    __slots__ = ("_behind", "_future", "_key", "_order", "_released")

    def __init__(
        self, order: CallOrder, key: Hashable, future: asyncio.Future[None] | None
    ) -> None:
        self._order = order
        self._key = key
        # None: the turn was free when the call was made (the common, uncontended case).
        self._future = future
        self._released = False
        # While it is this ticket's turn: the tickets waiting behind it (None: none yet).
        self._behind: deque[Ticket] | None = None

    @property
    def ready(self) -> bool:
        """Whether the turn is this ticket's now (no wait needed: the common case)."""
        future = self._future
        return future is None or future.done()

    async def wait(self) -> None:
        """Wait for this ticket's turn.

        A cancel of the caller stops only the waiting: the ticket keeps its place, and the
        caller decides whether to withdraw it (``release``) or hand it to a background task.
        """
        future = self._future
        if future is not None and not future.done():
            await asyncio.wait([future])

    def release(self) -> None:
        """End this ticket's turn, or withdraw it from the line; the next call goes on."""
        if self._released:
            return
        self._released = True
        lines = self._order._lines
        key = self._key
        active = lines[key]
        if active is not self:
            # Never had its turn: it just leaves the line.
            assert active._behind is not None
            active._behind.remove(self)
            return
        behind = self._behind
        if behind:
            lines[key] = nxt = behind.popleft()
            nxt._behind = behind
            self._behind = None
            assert nxt._future is not None
            nxt._future.set_result(None)
            return
        del lines[key]
        if not lines:
            self._order.emptied()


class CallOrder:
    """The lines of every (lock key, holder field) with a call under way in one client."""

    __slots__ = ("_drained", "_lines")

    def __init__(self) -> None:
        # The ticket whose turn it is, per line.
        self._lines: dict[Hashable, Ticket] = {}
        self._drained: asyncio.Future[None] | None = None

    def join(self, key: Hashable) -> Ticket:
        """Take a place in ``key``'s line now; ``await ticket.wait()`` for the turn."""
        active = self._lines.get(key)
        if active is None:
            ticket = self._lines[key] = Ticket(self, key, None)
            return ticket
        ticket = Ticket(self, key, asyncio.get_running_loop().create_future())
        behind = active._behind
        if behind is None:
            behind = active._behind = deque()
        behind.append(ticket)
        return ticket

    def emptied(self) -> None:
        """The last line closed: wake ``drained()``."""
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def busy(self, key: Hashable) -> bool:
        """Whether a call is under way in ``key``'s line."""
        return key in self._lines

    def __len__(self) -> int:
        """How many lines have a call under way."""
        return len(self._lines)

    async def drained(self) -> None:
        """Wait until no call of any holder is under way (aclose)."""
        while self._lines:
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._drained])


async def in_turn(ticket: Ticket, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` once ``ticket``'s turn comes, and end the turn after it."""
    try:
        await ticket.wait()
        return await coro
    finally:
        # Never started if the wait failed: closing it spares a "never awaited" warning.
        coro.close()
        ticket.release()
