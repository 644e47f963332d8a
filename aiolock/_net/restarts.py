"""Strict restarts: no acquire on a server until it has been up for ``restart_grace``.

A server restarted without persistence (or with ``appendfsync everysec``) forgets every lock
at once, while their holders still believe they hold them until their own next round trip
finds out (docs/guarantees.md, Lease loss). Redis's advice for Redlock's restarted nodes is
the cure: a node that restarts empty stays out of the game for the longest lease. With
``restart_grace`` set, this client does that for every server: before its first acquire on
a connection (a new one after every reconnect, so after every restart it can see), it asks
the server's ``uptime_in_seconds`` (``INFO server``, one round trip per connection), and
acquires there only once the server has been up that long. By then every hold taken before
the restart has ended: found gone by its holder, or past its lease.

Plain bookkeeping per connection; the engine asks ``left_ms`` before an attempt and waits
that long as for a held lock (its wait bounds it).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from .resp import pack

if TYPE_CHECKING:
    from .scripts import ScriptRunner
    from .transport import CommandTransport

__all__ = ("RestartGrace",)

_INFO = pack("INFO", "server")


class RestartGrace:
    """When each server this client acquires on has been up ``grace`` seconds."""

    __slots__ = ("_grace", "_ready", "_runner")

    def __init__(self, runner: ScriptRunner, grace: float) -> None:
        self._runner = runner
        self._grace = grace
        # Per connection: the connection count it was read on, and when (loop time) the
        # server will have been up ``grace``.
        self._ready: dict[CommandTransport, tuple[int, float]] = {}

    async def left_ms(self, key: str) -> int:
        """How long (ms) acquires on ``key``'s server must wait still (0: none)."""
        transport = self._runner.server(key)
        if transport is None:
            # Not located yet (a cluster's slot map not read): a plain read locates it.
            await self._runner.command("PTTL", key)
            transport = self._runner.server(key)
            if transport is None:  # pragma: no cover - located by the read above
                return 0
        loop = asyncio.get_running_loop()
        known = self._ready.get(transport)
        # No open connection (lost: the server may be restarting): the acquire would open
        # a new one, so ask on it first.
        if known is None or known[0] != transport.connects or transport.peer is None:
            asked = loop.time()
            up = _uptime(await transport.call(_INFO))
            # Up for ``up`` whole seconds at most when asked: it started no later than
            # ``asked - up``, so that plus the grace is never early.
            self._ready[transport] = known = (transport.connects, asked - up + self._grace)
        return max(0, math.ceil((known[1] - loop.time()) * 1000))


def _uptime(info: Any) -> float:
    """``uptime_in_seconds`` of an ``INFO server`` reply."""
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("uptime_in_seconds:"):
            return float(line.partition(":")[2])
    raise ValueError("the server's INFO has no uptime_in_seconds")
