"""Barriers on a pub/sub connection: which messages were published after a given moment.

A pub/sub connection is a stream of its own, unordered against the command connection: a
message published before an acquire may arrive after the acquire's answer. A barrier is a
PING sent on the connection that carries a subscription: the server answers it after every
message it published to that connection before it and before every one after it, on the
same stream. So once a barrier has *passed*, each message on the channel was published
after the barrier was sent; before that, any message may be that old.

Plain sync bookkeeping: the dispatcher (``pubsub.py``) sends the PINGs and hands their
answers and its connection's end to ``Barriers``; a ``Barrier`` (``subscriptions.py``) is
what the engine holds.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from .resp import pack
from .subscriptions import Barrier, Link, text

if TYPE_CHECKING:
    from .subscriptions import Channel
    from .wire import Wire

__all__ = ("Barriers",)


class Barriers:
    """The barriers of one dispatcher's connection, one connection at a time."""

    __slots__ = ("_link", "_pending", "_sent")

    def __init__(self) -> None:
        self._link: Link | None = None
        # Sent on the current connection and not answered yet, oldest first, with the
        # token of each one's PING.
        self._pending: deque[tuple[str, Barrier]] = deque()
        self._sent = 0

    def connected(self) -> None:
        """A new connection is in use: barriers are sent on it from now on."""
        self.lost()  # (it was, already: the old connection's end came first)
        self._link = Link()

    def lost(self) -> None:
        """The connection is gone: every barrier sent on it is broken."""
        if self._link is not None:
            self._link.up = False
            self._link = None
        for _, barrier in self._pending:
            barrier.settled.set()  # broken: whoever waits for it goes on without it
        self._pending.clear()

    def send(self, wire: Wire | None, channel: Channel) -> Barrier:
        """A barrier sent now on ``wire`` (None: no wire carries ``channel``: broken)."""
        link = self._link
        if wire is None or link is None:
            return Barrier(None, channel)
        barrier = Barrier(link, channel)
        self._sent += 1
        # A token of its own tells its answer from the keepalive's (a PING with none).
        token = f"aiolock:barrier:{self._sent}"
        self._pending.append((token, barrier))
        wire.write(pack("PING", token))
        return barrier

    def answered(self, token: Any) -> None:
        """A PING was answered with ``token``: the keepalive's, or the oldest barrier's."""
        pending = self._pending
        if pending and text(token) == pending[0][0]:
            pending.popleft()[1].came_back()
