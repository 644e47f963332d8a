"""The command connection pool of a client built from a URL.

redis-py's default pool fails a checkout beyond its size and its BlockingConnectionPool
waits, but pays for that wait on every checkout: a condition and a timeout scope each time,
about a sixth of the client's CPU per lock call. This pool waits only when every connection
is in use, and otherwise costs what the default pool costs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

from redis.asyncio import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ("BoundedPool",)


class BoundedPool(ConnectionPool):
    """At most ``max_connections`` connections; a checkout beyond them waits its turn.

    A checkout that waits longer than ``timeout`` seconds raises redis-py's
    ``ConnectionError`` (as BlockingConnectionPool does), which the caller's retries see
    like any other connection failure.
    """

    def __init__(self, *, timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout = timeout
        # One future per waiting checkout, oldest first; a release resolves the oldest.
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()

    def _free(self) -> bool:
        return bool(self._available_connections) or (
            len(self._in_use_connections) < self.max_connections
        )

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        # Checkouts already waiting go first: a newcomer does not take the connection a
        # release just freed for them.
        if not self._queue and self._free():
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        await self._wait_turn()
        connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if self._free():
            # More than one connection was free (a newcomer queued behind a turn being
            # handed over): the next in line need not wait for a release.
            self._hand_on()
        return connection

    async def _wait_turn(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                turn = loop.create_future()
                self._queue.append(turn)
                while True:
                    try:
                        await turn
                    except BaseException:
                        self._leave(turn)
                        raise
                    if self._free():
                        break
                    # Another checkout got there first (e.g. one that never waited while
                    # this turn was being handed over): wait again, at the front.
                    turn = loop.create_future()
                    self._queue.appendleft(turn)
        except TimeoutError as exc:
            raise RedisConnectionError(
                f"no connection free in the pool of {self.max_connections} within {self.timeout} s"
            ) from exc

    def _leave(self, turn: asyncio.Future[None]) -> None:
        if turn.done() and not turn.cancelled():
            # Given a turn it will not use: pass it on, or the connection sits unused.
            self._hand_on()
        else:
            turn.cancel()
            with contextlib.suppress(ValueError):
                self._queue.remove(turn)

    def _hand_on(self) -> None:
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        self._hand_on()
