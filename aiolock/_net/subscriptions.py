"""What pub/sub offers the engine, and what it tells the waiting room: the vocabulary.

The engine subscribes through a ``PubSub`` (one ``Dispatcher``, ``pubsub.py``, or one per
cluster primary, ``cluster.py``) and holds a ``Subscription`` while it waits; the
dispatcher hands every message and every (re)confirmed subscription to a ``Recipient``
(the engine's waiting room), which wakes the waiters they concern. Data flows one way:
pub/sub -> waiting room; neither side imports the other.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

__all__ = (
    "Barrier",
    "Channel",
    "Link",
    "PubSub",
    "Recipient",
    "Releaser",
    "Subscription",
    "text",
    "wait_event",
)


class Recipient(Protocol):
    """Where a dispatcher's messages and (re)confirmations go (the waiting room)."""

    def deliver(self, channel: str, data: bytes) -> None:
        """A message on ``channel``: wake as many waiters as it lets in."""

    def wake_all(self, channel: str) -> None:
        """Wake every waiter on ``channel``: messages may have been lost (a resubscribe)."""


class Releaser(Protocol):
    """What a subscription gives its reference back to (its dispatcher)."""

    def release(self, channel: Channel) -> None:
        """Drop one reference to ``channel``."""

    def barrier(self, channel: Channel) -> Barrier:
        """A barrier (``barrier.py``) sent now on the connection that carries ``channel``."""


class Channel:
    """One subscribed channel: its local references, its confirmation, where it was sent."""

    __slots__ = ("confirmed", "linger", "moved", "name", "refs", "sent_on")

    def __init__(self, name: str) -> None:
        self.name = name
        self.refs = 0
        self.linger: asyncio.TimerHandle | None = None
        self.confirmed = asyncio.Event()
        # The generation of the wire its latest SUBSCRIBE went out on (None: not yet).
        self.sent_on: int | None = None
        # Its cluster slot left this server: whoever holds it subscribes anew, elsewhere.
        self.moved = False


class Link:
    """The life of one pub/sub connection: ``up`` until it is lost."""

    __slots__ = ("up",)

    def __init__(self) -> None:
        self.up = True


class Barrier:
    """A PING sent on the connection carrying a channel, and whether it came back.

    Once it has ``passed``, every message heard on the channel was published after it was
    sent; before that, a message may be older (``barrier.py``). ``broken`` once that
    connection is lost or the channel moved to another server: messages then come on
    another stream, which only a new barrier orders. ``settled`` is set once it came back
    or its connection was lost.
    """

    __slots__ = ("_back", "_channel", "_link", "settled")

    def __init__(self, link: Link | None, channel: Channel) -> None:
        # None: there was no connection to send it on; it never passes.
        self._link = link
        self._channel = channel
        self._back = False
        self.settled = asyncio.Event()
        if link is None:
            self.settled.set()

    def came_back(self) -> None:
        """Its answer arrived (in order with the connection's messages)."""
        self._back = True
        self.settled.set()

    @property
    def broken(self) -> bool:
        """Whether its connection is gone or its channel moved: it will never pass now."""
        return self._link is None or not self._link.up or self._channel.moved

    @property
    def passed(self) -> bool:
        """Whether its answer arrived on a connection that still carries the channel."""
        return self._back and not self.broken


class Subscription:
    """A reference to one subscribed channel, held by one acquire call while it waits."""

    __slots__ = ("_channel", "_dispatcher")

    def __init__(self, dispatcher: Releaser, channel: Channel) -> None:
        self._dispatcher = dispatcher
        self._channel = channel

    def release(self) -> None:
        """Drop this reference; the last one unsubscribes."""
        self._dispatcher.release(self._channel)

    @property
    def stale(self) -> bool:
        """Whether the channel's cluster slot moved: this subscription hears nothing more."""
        return self._channel.moved

    def barrier(self) -> Barrier:
        """Send a barrier now on the connection that carries this subscription.

        Once it has passed, every message heard on the channel was published after this
        call (``barrier.py``).
        """
        return self._dispatcher.barrier(self._channel)


class PubSub(Protocol):
    """What the engine subscribes through: one dispatcher, or one per cluster primary."""

    def join(self, name: str) -> Subscription | None:
        """A reference to ``name`` if it is subscribed and confirmed already, else None."""

    async def subscribe(self, name: str, limit: float | None) -> Subscription | None:
        """Subscribe to ``name`` and wait for the server (None: ``limit`` ran out)."""

    def channels(self) -> dict[str, int]:
        """Map each subscribed channel to its number of local references."""

    @property
    def reconnects(self) -> int:
        """How many times a pub/sub connection was made again."""

    async def aclose(self) -> None:
        """Release whoever waits in subscribe() and close the connections."""


async def wait_event(event: asyncio.Event, limit: float | None) -> bool:
    """Wait for ``event`` at most ``limit`` seconds (None: no limit); True if it is set."""
    if event.is_set():
        return True
    if limit is not None and limit <= 0:
        return False
    try:
        async with asyncio.timeout(limit):
            await event.wait()
    except TimeoutError:
        return False
    return True


def text(value: Any) -> str:
    """A reply's bytes (or other value) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
