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

__all__ = ("Channel", "PubSub", "Recipient", "Releaser", "Subscription", "text", "wait_event")


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
