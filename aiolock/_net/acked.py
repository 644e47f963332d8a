"""The command connection of a server with a sibling for acknowledged writes (WAIT).

A WAIT (``replica_acks``) holds back every reply behind it on its connection until the
replicas answer or its timeout passes, and WAITs queued one behind another add up: with
one replica frozen, a renewal queued behind them let a healthy primary's hold expire.
So each acknowledged write and its WAIT go on a second connection to the same server,
made when first needed, where they hold back only each other: renewals and releases on
the first never wait behind a WAIT.
"""

from __future__ import annotations

from .transport import CommandTransport

__all__ = ("AckedTransport",)


class AckedTransport(CommandTransport):
    """A ``CommandTransport`` whose writes followed by a WAIT go on ``acks()``."""

    _acks: CommandTransport | None = None

    def acks(self) -> CommandTransport:
        """The second connection to this server: reset and closed with this one."""
        acks = self._acks
        if acks is None:
            acks = self._acks = CommandTransport(
                self._make_connection, deadline=self._deadline, limit=self._limit
            )
            if self.closed:
                acks.closed = True
                acks._retired = self._retired
        return acks

    def reset(self, exc: Exception) -> None:
        super().reset(exc)
        if self._acks is not None:
            self._acks.reset(exc)

    async def aclose(self, why: str | None = None) -> None:
        await super().aclose(why)
        if self._acks is not None:
            await self._acks.aclose(why)


def acks_of(transport: CommandTransport) -> CommandTransport:
    """Where ``transport``'s writes followed by a WAIT go (itself, without a sibling)."""
    return transport.acks() if isinstance(transport, AckedTransport) else transport
