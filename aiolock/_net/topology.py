"""Where a key's commands go: the one server, or the primary of the key's cluster slot.

The script runner (``scripts.py``) asks a topology for the command connection of each key
and tells it what went wrong when a send fails; the topology decides what that means for
routing. Two kinds:

- `OneServer`: one server, or the current primary of a Sentinel group. Under
  Sentinel a write refused with READONLY means the connection still talks to a demoted
  primary: the connection is dropped, and the next send asks the sentinels anew.
- ``cluster.Cluster``: the slot map of a Redis Cluster and one connection per primary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError

if TYPE_CHECKING:
    from redis.exceptions import AskError, MovedError

    from .transport import CommandTransport

__all__ = ("OneServer", "Topology")


class Topology(Protocol):
    """What the script runner needs to know about where keys live."""

    #: Error replies that mean "send again a moment later" here, besides lost connections.
    transient: tuple[type[Exception], ...]

    def route(self, key: str) -> CommandTransport | None:
        """The connection for ``key``'s commands, or None until it is known."""

    async def locate(self, key: str) -> CommandTransport:
        """The connection for ``key``, after learning the layout if need be."""

    def shard(self, key: str) -> int:
        """Keys with the same shard may go in one multi-key command (the cluster slot)."""

    def redirected(self, exc: MovedError | AskError) -> CommandTransport:
        """The connection a MOVED or ASK reply points to (MOVED also updates the map)."""

    def failed(self, transport: CommandTransport, exc: Exception) -> None:
        """A send on ``transport`` failed with ``exc`` (lost, timed out, or transient)."""

    async def settle(self) -> None:
        """Wait before a call redirected several times is sent again (the layout is moving)."""

    def transports(self) -> list[CommandTransport]:
        """Every command connection there is now."""


class OneServer:
    """Every key on one server; under Sentinel, the group's current primary."""

    __slots__ = ("_transport", "transient")

    def __init__(self, transport: CommandTransport, *, sentinel: bool) -> None:
        self._transport = transport
        # On a plain server a READONLY refusal is the user's setup (a replica's URL), and
        # resending cannot help; under Sentinel it is a failover under way.
        self.transient: tuple[type[Exception], ...] = (ReadOnlyError,) if sentinel else ()

    def route(self, key: str) -> CommandTransport:
        return self._transport

    async def locate(self, key: str) -> CommandTransport:
        return self._transport

    def shard(self, key: str) -> int:
        return 0

    def redirected(self, exc: MovedError | AskError) -> CommandTransport:
        # MOVED from a server that is not a cluster's: the URL points at a cluster node.
        raise exc

    def failed(self, transport: CommandTransport, exc: Exception) -> None:
        if isinstance(exc, ReadOnlyError):
            transport.reset(
                RedisConnectionError(f"aiolock: the server is no longer the primary ({exc})")
            )

    async def settle(self) -> None:
        # Never reached: one server never redirects (redirected() raises).
        return

    def transports(self) -> list[CommandTransport]:
        return [self._transport]

    async def aclose(self) -> None:
        """Close the connection."""
        await self._transport.aclose()
