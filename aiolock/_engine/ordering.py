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
    """One call's place in its holder's line."""

    __slots__ = ("_future", "_line", "_released")

    def __init__(self, line: _Line, future: asyncio.Future[None] | None) -> None:
        self._line = line
        # None: the turn was free when the call was made (the common, uncontended case).
        self._future = future
        self._released = False

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
        if not self._released:
            self._released = True
            self._line.leave(self)


class _Line:
    __slots__ = ("active", "key", "order", "waiting")

    def __init__(self, order: CallOrder, key: Hashable, active: Ticket | None) -> None:
        self.order = order
        self.key = key
        self.active = active
        self.waiting: deque[Ticket] = deque()

    def leave(self, ticket: Ticket) -> None:
        if self.active is not ticket:
            # Never had its turn: it just leaves the line.
            self.waiting.remove(ticket)
            return
        if self.waiting:
            self.active = nxt = self.waiting.popleft()
            assert nxt._future is not None
            nxt._future.set_result(None)
            return
        self.active = None
        self.order.closed_line(self.key)


class CallOrder:
    """The lines of every (lock key, holder field) with a call under way in one client."""

    __slots__ = ("_drained", "_lines")

    def __init__(self) -> None:
        self._lines: dict[Hashable, _Line] = {}
        self._drained: asyncio.Future[None] | None = None

    def join(self, key: Hashable) -> Ticket:
        """Take a place in ``key``'s line now; ``await ticket.wait()`` for the turn."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line(self, key, None)
            line.active = ticket = Ticket(line, None)
            return ticket
        ticket = Ticket(line, asyncio.get_running_loop().create_future())
        line.waiting.append(ticket)
        return ticket

    def closed_line(self, key: Hashable) -> None:
        del self._lines[key]
        if not self._lines and self._drained is not None and not self._drained.done():
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
