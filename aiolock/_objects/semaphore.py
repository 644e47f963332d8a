"""The semaphore: a count of permits that any task of any client may take and give back.

Redisson's RSemaphore (redisson-spec-2.md section 2). State in Redis is Redisson's: a string
``name`` holding the number of available permits, and the channel ``redisson_sc:{name}``, on
which every increase publishes the new count. What aiolock adds lives beside it for a few
seconds: a receipt per attempt to take, so that a resend never takes twice and a cancelled
attempt gives back exactly what it took, and a latch per release, so that a resend never
gives twice.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Self

from .._config import TimeArg, check_count, wait_seconds
from .._engine.counting import change, take
from .._engine.primitive import Invocation, Outcome, Waitable
from .._exceptions import LockTimeoutError
from .._keys import semaphore_channel
from .._net.scripts import load_script
from .handle import release_at_exit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from .._config import Settings
    from .._engine.engine import Engine

__all__ = ("PermitCount", "Permits", "Semaphore", "SemaphoreState", "declared")


class PermitCount(Waitable):
    """What both semaphores share as the engine sees them.

    The count of available permits (Redisson's string ``name``), its channel and wake rule,
    and the scripts that set it and add to it.
    """

    __slots__ = ("chan", "seed")

    # Redisson's release publishes the count available after it, not the permits freed.
    counts_available = True

    def __init__(self, settings: Settings, name: str, permits: int | None = None) -> None:
        super().__init__(settings, name)
        self.chan = semaphore_channel(self.key)
        #: The permits the handle was declared with, as the acquire scripts take them
        #: ('' for none): an acquire that finds no state sets them first (seed.lua).
        self.seed = "" if permits is None else str(permits)

    def channel(self, holder: str) -> str:
        return self.chan

    def wake_count(self, data: bytes) -> int | None:
        # A count: wake up to that many waiters (one that finds too few passes its wake-up
        # on), whatever Redisson's sender meant by it. Anything else: wake them all to look.
        try:
            return max(0, int(data))
        except ValueError:
            return None

    def add(self, permits: int, latch: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("semaphore_add"),
            [self.key, self.chan, latch],
            [permits, s.publish, s.latch_ttl_ms],
        )

    def try_set(self, permits: int, latch: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("semaphore_try_set"),
            [self.key, self.chan, latch],
            [permits, s.publish, s.latch_ttl_ms],
        )


class SemaphoreState(PermitCount):
    """The semaphore as the engine sees it: the count, and takes with a receipt each."""

    __slots__ = ()

    receipts = True
    # A task that releases and takes again at once queues behind this client's waiters:
    # else it re-takes the permit its release woke one of them for, whose attempt runs
    # for nothing (4 permits, 16 tasks: 3.3 scripts per acquisition instead of 2). A
    # take that leaves permits wakes as many waiters itself (Outcome.left).
    no_barging = True

    def take(self, permits: int, receipt: str) -> Invocation:
        return Invocation(
            load_script("semaphore_acquire"),
            [self.key, receipt],
            [permits, self.settings.latch_ttl_ms, self.seed],
        )

    def give_back(self, permits: int, receipt: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("semaphore_rollback"),
            [self.key, self.chan, receipt],
            [permits, s.publish, s.latch_ttl_ms],
        )

    def drain(self, receipt: str) -> Invocation:
        return Invocation(
            load_script("semaphore_drain"), [self.key, receipt], [self.settings.latch_ttl_ms]
        )

    def undrain(self, receipt: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("semaphore_undrain"),
            [self.key, self.chan, receipt],
            [s.publish, s.latch_ttl_ms],
        )


def _taken(reply: Any) -> Outcome:
    """``{1, left}``: taken, ``left`` permits left; ``{0, n}``: not, n available (too few)."""
    if int(reply[0]) == 1:
        return Outcome(done=True, left=int(reply[1]))
    return Outcome(done=False, spare=int(reply[1]) > 0)


def declared(permits: object) -> int | None:
    """A semaphore's declared ``permits=`` (None: not declared), checked when the handle is made."""
    if permits is None:
        return None
    return check_count(permits, "permits", minimum=0)


class Permits:
    """What both semaphore handles share: the name, and setting and adding permits."""

    __slots__ = ("_engine", "_state")

    _state: PermitCount

    def __init__(self, engine: Engine, state: PermitCount) -> None:
        self._engine = engine
        self._state = state

    @property
    def name(self) -> str:
        """The semaphore's name as given (without ``key_prefix``)."""
        return self._state.name

    def __repr__(self) -> str:
        waiting = self._engine.waiting(self._state.key)
        return f"<aiolock.{type(self).__name__} {self._state.name!r}, {waiting} waiting>"

    async def try_set_permits(self, permits: int) -> bool:
        """Set the number of permits if the semaphore has none set yet; True if it was set."""
        n = check_count(permits, "permits", minimum=0)
        s = self._state
        return bool(await change(self._engine, s, lambda latch: s.try_set(n, latch), "set"))

    async def add_permits(self, permits: int) -> None:
        """Add ``permits`` (negative: take some away, never waiting)."""
        n = check_count(permits, "permits", minimum=-(2**63))
        s = self._state
        await change(self._engine, s, lambda latch: s.add(n, latch), "add permits to")


class Semaphore(Permits):
    """A distributed counting semaphore; ``client.semaphore(name)`` creates one.

    Permits have no owner: any task of any client may release them, and releases are not
    bounded by the permits set (as in Redisson). ``async with sem:`` takes one permit and
    gives it back on exit, cancelled or not. A semaphore that was never set has no permits:
    call ``try_set_permits(n)`` first, or declare them: ``client.semaphore(name,
    permits=n)`` makes every acquire that finds no state (never set, or lost with a restart
    without persistence or a failover) set ``n`` first, atomically, as ``try_set_permits``.
    """

    __slots__ = ()

    _state: SemaphoreState

    def __init__(self, engine: Engine, name: str, permits: int | None = None) -> None:
        super().__init__(engine, SemaphoreState(engine.settings, name, declared(permits)))

    async def available_permits(self) -> int:
        """The number of permits available now (0 if the semaphore was never set)."""
        value = await self._engine.query(self._state, "GET", self._state.key)
        return int(value) if value is not None else 0

    async def drain_permits(self) -> int:
        """Take every permit available now; how many (Redisson's drainPermits).

        The count is what the semaphore held: 0 if it was never set; negative if
        ``add_permits`` took away more than there were (the count is then 0). Cancelled,
        it takes nothing: what it drained is given back.
        """
        s = self._state
        drained: list[int] = []

        def decode(reply: Any) -> Outcome:
            drained.append(int(reply[1]))
            return Outcome(done=int(reply[0]) == 1)

        taken = await take(
            self._engine, s, lambda receipt: (s.drain(receipt), s.undrain(receipt)), 0, decode
        )
        return drained[-1] if taken else 0

    async def delete(self) -> bool:
        """Remove the semaphore, as Redisson does; True if it existed.

        As in Redisson nothing is published: waiters find it gone at their next look.
        """
        return await self._engine.delete(self._state, self._state.key)

    def acquired(
        self, permits: int = 1, wait: TimeArg = None
    ) -> contextlib.AbstractAsyncContextManager[Self]:
        """``async with sem.acquired(2, wait=5):`` takes ``permits``, given back on exit.

        Given back whether the body returned, raised or was cancelled; LockTimeoutError
        once ``wait`` ran out (None: forever).
        """
        return self._acquired(check_count(permits, "permits", minimum=1), wait_seconds(wait))

    @contextlib.asynccontextmanager
    async def _acquired(self, permits: int, wait: float | None) -> AsyncIterator[Self]:
        if not await self._take(permits, wait):
            assert wait is not None
            raise LockTimeoutError(self.name, wait)

        async def release() -> None:
            await self.release(permits)

        try:
            yield self
        except BaseException as exc:
            await release_at_exit(self.name, release, exc, "semaphore")
            raise
        await release_at_exit(self.name, release, None, "semaphore")

    async def acquire(self, permits: int = 1) -> None:
        """Take ``permits``, waiting as long as it takes."""
        await self._take(permits, None)

    async def try_acquire(self, permits: int = 1, wait: TimeArg = 0) -> bool:
        """Take ``permits`` within ``wait`` seconds (0: one attempt, None: forever)."""
        return await self._take(permits, wait_seconds(wait))

    async def _take(self, permits: int, wait: float | None) -> bool:
        n = check_count(permits, "permits", minimum=1)
        s = self._state
        return await take(
            self._engine,
            s,
            lambda receipt: (s.take(n, receipt), s.give_back(n, receipt)),
            wait,
            _taken,
            kind="semaphore",
        )

    async def release(self, permits: int = 1) -> None:
        """Give back ``permits`` (made once, even if the call is cancelled or cut off)."""
        n = check_count(permits, "permits", minimum=1)
        s = self._state
        await change(self._engine, s, lambda latch: s.add(n, latch), "release permits of")

    async def __aenter__(self) -> Self:
        await self._take(1, None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release(1)
