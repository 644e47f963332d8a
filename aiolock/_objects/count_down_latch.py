"""The count-down latch: a count that tasks wait to see reach zero.

Redisson's RCountDownLatch (redisson-spec-2.md section 4). State in Redis is Redisson's: a
string ``name`` holding the count (absent: zero, open), and the channel
``redisson_countdownlatch__channel__{name}``, which receives ``0`` when the count reaches
zero and ``1`` when a count is set. Where Redisson's waiters can hang, these cannot: every
message makes them look at the count (Redisson's ``delete()`` publishes a ``1`` that wakes
nobody), and every wait re-reads it at least every few seconds, so a lost message costs
latency, never liveness. A ``0`` received is itself the opening: a waiter that gets it
returns True even if the latch was set again before it could read the count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._config import TimeArg, check_count, wait_seconds
from .._engine.counting import await_condition, change
from .._engine.primitive import Invocation, Waitable
from .._engine.waiting import SETTLES
from .._keys import latch_channel
from .._net.scripts import load_script

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.engine import Engine

__all__ = ("CountDownLatch", "LatchState")


class LatchState(Waitable):
    """The latch as the engine sees it: its scripts and channel; every message wakes all."""

    __slots__ = ("chan",)

    shared_waits = True

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        if settings.cluster and "{" in self.key:
            # Redisson wraps the whole name in braces for the channel: with a hash tag of
            # its own, the channel hashes to another slot than the key, and every script
            # fails with CROSSSLOT.
            raise ValueError(
                f"name {name!r}: a count-down latch name with a '{{' cannot work on a "
                "Redis Cluster (Redisson's channel for it would be in another slot)"
            )
        self.chan = latch_channel(self.key)

    def channel(self, holder: str) -> str:
        return self.chan

    def wake_count(self, data: bytes) -> int | None:
        # "0": the count reached zero, which is what every wait() waits for, even if the
        # latch is set again before the waiter could look (Redisson's await() looks and
        # misses it). "1" (set, or deleted by Redisson): look again.
        return SETTLES if data == b"0" else None

    def try_set(self, count: int, latch: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("latch_try_set"),
            [self.key, self.chan, latch],
            [count, s.publish, s.latch_ttl_ms],
        )

    def count_down(self, latch: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("latch_count_down"),
            [self.key, self.chan, latch],
            [s.publish, s.latch_ttl_ms],
        )


class CountDownLatch:
    """A distributed count-down latch; ``client.count_down_latch(name)`` creates one.

    ``try_set_count(n)`` arms an open latch; each ``count_down()`` takes one off; ``wait()``
    returns True once the count is zero. A latch at zero stays open, and may be set again.
    """

    __slots__ = ("_engine", "_state")

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine = engine
        self._state = LatchState(engine.settings, name)

    @property
    def name(self) -> str:
        """The latch's name as given (without ``key_prefix``)."""
        return self._state.name

    def __repr__(self) -> str:
        waiting = self._engine.waiting(self._state.key)
        return f"<aiolock.CountDownLatch {self._state.name!r}, {waiting} waiting>"

    @property
    def tasks_waiting(self) -> int:
        """How many of this client's tasks wait on this latch now (a local count)."""
        return self._engine.waiting(self._state.key)

    async def try_set_count(self, count: int) -> bool:
        """Set the count if the latch is open (at zero); True if it was set.

        A count of 0 leaves the latch open and answers True.
        """
        n = check_count(count, "count", minimum=0)
        s = self._state
        return bool(await change(self._engine, s, lambda latch: s.try_set(n, latch), "set"))

    async def count_down(self) -> None:
        """Take one off the count; at zero the latch opens and its waiters return.

        Made once, even if the call is cancelled or cut off (it is then finished in the
        background). A latch already open stays open.
        """
        s = self._state
        await change(self._engine, s, s.count_down, "count down")

    async def get_count(self) -> int:
        """The count now (0: open)."""
        return await self._count()

    async def wait(self, timeout: TimeArg = None) -> bool:  # noqa: ASYNC109 - the contract's name
        """Wait until the count is zero; False if ``timeout`` seconds passed first."""
        limit = wait_seconds(timeout, "timeout")

        async def is_open() -> bool:
            return await self._count() == 0

        return await await_condition(self._engine, self._state, is_open, limit)

    async def _count(self) -> int:
        value = await self._engine.query(self._state, "GET", self._state.key)
        return int(value) if value is not None else 0
