"""Sentinel: follow the group's primary when the sentinels switch it.

A connection opened through a Sentinel pool asks the sentinels for the primary when it
connects, and then stays where it is. After a failover the old primary keeps accepting
writes until the sentinels demote it (8-11 s measured): a client still talking to it and a
client already on the new primary could then both hold one lock. So, as Redisson does, the
client listens to the sentinels' ``+switch-master`` events; when the group's primary
switches, it drops its command and pub/sub connections, whose next connect asks the
sentinels anew. Calls in flight fail and are resent there (every script is idempotent);
the pub/sub connection subscribes again and wakes every waiter.

A write refused with READONLY (a demoted primary) drops the command connection as well
(``_topology.OneServer``), in case a switch event was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from ._resp import pack
from ._wire import Wire, open_wire

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection
    from redis.asyncio.sentinel import SentinelConnectionPool

__all__ = ("SentinelWatch",)

log = logging.getLogger("aiolock")

_CHANNEL = "+switch-master"
_SUBSCRIBE = pack("SUBSCRIBE", _CHANNEL)
_PING = pack("PING")
# A sentinel that answers nothing (not even a PING) for this long is left for the next.
_KEEPALIVE = 5.0
# Pause after every sentinel of the group failed in turn.
_ROUND_PAUSE = 1.0


class SentinelWatch:
    """Listens to one sentinel at a time (the next when it fails) for primary switches."""

    def __init__(
        self,
        pool: SentinelConnectionPool,
        on_switch: Callable[[str], None],
        spawn: Callable[[Any], asyncio.Task[Any]],
    ) -> None:
        self._service = pool.service_name
        self._sentinels: list[Callable[[], AbstractConnection]] = [
            sentinel.connection_pool.make_connection for sentinel in pool.sentinel_manager.sentinels
        ]
        self._on_switch = on_switch
        self._spawn = spawn
        self._task: asyncio.Task[None] | None = None
        self._wire: Wire | None = None
        self._ended: asyncio.Future[Exception] | None = None
        self._heard = False
        self.closed = False
        #: Switches of this group's primary heard so far.
        self.switches = 0
        #: Whether a sentinel has confirmed the subscription (tests wait for it).
        self.listening = asyncio.Event()

    def start(self) -> None:
        """Begin listening (once; the command connection calls it when it connects)."""
        if self._task is None and not self.closed and self._sentinels:
            self._task = self._spawn(self._run())

    # -- the wire's listener ---------------------------------------------------------------

    def on_reply(self, reply: Any) -> None:
        self._heard = True
        if isinstance(reply, Exception) or not isinstance(reply, list) or len(reply) < 3:
            return
        kind = _text(reply[0])
        if kind == "subscribe":
            self.listening.set()
        elif kind == "message" and _text(reply[1]) == _CHANNEL:
            # "<name> <old ip> <old port> <new ip> <new port>"
            fields = _text(reply[2]).split()
            if fields and fields[0] == self._service:
                self.switches += 1
                new = f"{fields[3]}:{fields[4]}" if len(fields) >= 5 else "?"
                log.warning(
                    "aiolock: the sentinels switched %r's primary to %s; reconnecting",
                    self._service,
                    new,
                )
                self._on_switch(new)

    on_push = on_reply

    def on_lost(self, wire: Wire, exc: Exception) -> None:
        if wire is self._wire:
            self._wire = None
            self.listening.clear()
            ended = self._ended
            if ended is not None and not ended.done():
                ended.set_result(exc)

    # -- I/O --------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed:
            for make_connection in list(self._sentinels):
                if self._closed_now():
                    return
                wire: Wire | None = None
                try:
                    self._ended = loop.create_future()
                    wire = await open_wire(make_connection, self, pushes=True)
                    self._wire = wire
                    wire.write(_SUBSCRIBE)
                    await self._listen(wire)
                except (RedisError, OSError) as exc:
                    log.debug("aiolock: sentinel connection failed: %r", exc)
                finally:
                    if wire is not None:
                        if not wire.closed:
                            wire.close()
                        await wire.dispose()
            if not self.closed:
                await asyncio.sleep(_ROUND_PAUSE)

    async def _listen(self, wire: Wire) -> None:
        """Until the connection ends: a PING each quiet period, the end if none is heard."""
        ended = self._ended
        assert ended is not None
        self._heard = True
        while not ended.done():
            if not self._heard:
                wire.close()
                return
            self._heard = False
            wire.write(_PING)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_KEEPALIVE):
                    await asyncio.shield(ended)

    def _closed_now(self) -> bool:
        # A method, so the type checker does not carry an earlier check across an await.
        return self.closed

    async def aclose(self) -> None:
        """Stop listening."""
        self.closed = True
        task = self._task
        if task is None:
            return
        task.cancel()
        wire = self._wire
        if wire is not None:
            wire.close()
        await asyncio.wait([task], timeout=2.0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
