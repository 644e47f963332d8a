"""The pub/sub connection's keepalive: ONE timer that checks the connection is alive.

A pub/sub connection that is dropped silently (a middlebox, a frozen server) would deliver
nothing ever again, and every waiter would then depend on its lease-bounded timeout alone.
So: nothing heard for a whole period, a PING goes out; not answered within the next
period, the connection is ended (its owner reconnects and subscribes again).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from redis.exceptions import TimeoutError as RedisTimeoutError

from .resp import pack

if TYPE_CHECKING:
    from .wire import Wire

__all__ = ("Keepalive",)


class Keepalive:
    """The keepalive of one connection at a time (``start`` with each new one)."""

    def __init__(self, period: float) -> None:
        self._period = period
        #: Whether anything came since the last check (the connection's reader sets it).
        self.heard = False
        self._pinged = False
        self._wire: Wire | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, wire: Wire) -> None:
        """Watch ``wire`` from now on."""
        self._wire = wire
        self.heard = self._pinged = False
        self._timer = asyncio.get_running_loop().call_later(self._period, self._check)

    def stop(self) -> None:
        """The connection is gone: no more checks until the next ``start``."""
        self._wire = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        wire = self._wire
        if wire is None:
            self._timer = None
            return
        if self.heard:
            self.heard = False
            self._pinged = False
        elif self._pinged:
            wire.close(RedisTimeoutError("pub/sub connection did not answer a PING"))
            return
        else:
            wire.write(pack("PING"))
            self._pinged = True
        self._timer = asyncio.get_running_loop().call_later(self._period, self._check)
