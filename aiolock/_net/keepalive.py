"""The pub/sub connection's keepalive: ONE timer that checks the connection is alive.

A pub/sub connection that is dropped silently (a middlebox, a frozen server) would deliver
nothing ever again, and every waiter would then depend on its lease-bounded timeout alone,
and a guarded hold's watch would miss a forced unlock. So: a PING goes out every period,
and a connection from which nothing came within the period after a PING is ended (its
owner reconnects and subscribes again). A connection that goes silent is therefore ended
within two periods, whatever it carried just before (a check that only pinged after a
silent period took up to three).
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
        if self._pinged and not self.heard:
            wire.close(RedisTimeoutError("pub/sub connection did not answer a PING"))
            return
        # Whatever comes from now on (this PING's answer at the latest) shows it alive.
        self.heard = False
        wire.write(pack("PING"))
        self._pinged = True
        self._timer = asyncio.get_running_loop().call_later(self._period, self._check)
