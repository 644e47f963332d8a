"""Leader election: ``client.leader(name)`` campaigns for the reentrant lock ``name``.

The election IS the lock: a term is a guarded hold of ``client.lock(name)`` (Redisson's RLock
layout), so a Java service that takes ``getLock(name)`` takes part in the same election, and
a candidate waits for its term as any waiter waits for the lock (pub/sub, no polling). A
term ends when the body returns, when it raises, or when the hold is lost: then the guard
cancels the body, before another candidate can be elected on the server's clock (see
``guarded()``), and the block raises ``LockLostError``. ``run(work)`` campaigns again after
a lost term and after a campaign the server could not answer.

A term cut off from the server ends before its lease can run out, so no other candidate is
elected while it runs. A term whose lock is deleted under it (``force_unlock()`` from
anywhere, Redisson's ``forceUnlock()``) ends on the unlock message itself, which reaches
it before the next candidate, woken by the same message, has its acquire answered; and a
term's body starts only once its own watch is in place (``LockHandle._guard_watch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._exceptions import ClientClosedError, LockLostError
from .handle import LockHandle
from .lock import Lock, LockPrimitive

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.guard import Hold

__all__ = ("Leader",)

log = logging.getLogger("aiolock")

T = TypeVar("T")

# Back-off between campaigns the server could not answer (it is restarting, or cut off):
# short, so that a new leader is elected soon after the server is back, since the lease a
# candidate waits out is the old leader's, not this one.
_RETRY_FIRST = 0.05
_RETRY_CAP = 0.5


class TermPrimitive(LockPrimitive):
    """The reentrant lock as a leader's terms hold it: the same keys, scripts and messages.

    Only what the client tells of its holds differs: their events say ``leader=True``, and
    a term is logged as slow past its leader's own ``slow_hold`` (None by default: a term is
    meant to last), not the client's.
    """

    __slots__ = ("_slow_hold",)

    leader = True

    def __init__(self, settings: Settings, name: str, slow_hold: float | None) -> None:
        super().__init__(settings, name)
        self._slow_hold = slow_hold

    def slow_hold(self, default: float | None) -> float | None:
        return self._slow_hold


def _term_lock(lock: Lock, slow_hold: float | None) -> Lock:
    """``lock``'s handle, for the same holder, whose holds are terms (``TermPrimitive``)."""
    engine = lock._engine
    term = Lock.__new__(Lock)
    LockHandle.__init__(
        term, engine, TermPrimitive(engine.settings, lock.name, slow_hold), owner=lock.owner
    )
    return term


class Leader:
    """An election among every holder of the reentrant lock ``name``; ``client.leader(name)``.

    ``async with leader.elected() as term:`` waits until this task is elected and runs the
    body as the leader, guarded: it is cancelled if leadership is lost, and the block then
    raises ``LockLostError``. ``await leader.run(work)`` keeps campaigning and running
    ``await work()`` as the leader until ``work`` returns. ``lease`` None: the client's
    watchdog keeps the term alive; a number: each term lasts at most that long.
    ``slow_hold``: a term held longer is logged as slow (WARNING), as the client's
    ``slow_hold`` does for other holds; None (the default): never, a term is meant to last.
    The term's events (``Acquired``, ``Released``, ``Lost``) say ``leader=True``.
    """

    __slots__ = ("__weakref__", "_lease", "_lock", "_terms")

    def __init__(self, lock: Lock, lease: float | None, slow_hold: float | None = None) -> None:
        self._lock = _term_lock(lock, slow_hold)
        self._lease = lease
        # The holds of this leader's terms under way (one per task elected through it).
        self._terms: set[Hold] = set()

    @property
    def name(self) -> str:
        """The name of the election's lock."""
        return self._lock.name

    @property
    def lock(self) -> Lock:
        """The reentrant lock whose holder is the leader."""
        return self._lock

    @property
    def is_leader(self) -> bool:
        """Whether a term of this leader is under way and not known to be lost."""
        return any(not hold.lost for hold in self._terms)

    def __repr__(self) -> str:
        state = "leader" if self.is_leader else "candidate"
        return f"<aiolock.Leader {self.name!r} ({state})>"

    def elected(self) -> contextlib.AbstractAsyncContextManager[Hold]:
        """``async with leader.elected() as term:`` waits until elected; the body is the term.

        The body is cancelled if the term is lost; the block then raises ``LockLostError``.
        Leaving the block ends the term (the lock is released and the next candidate wakes).
        """
        return self._elected()

    @contextlib.asynccontextmanager
    async def _elected(self) -> AsyncIterator[Hold]:
        # A guarded hold of the lock: its body (the term) begins once its watch is in
        # place (``LockHandle._guard_watch``), so a force ends it at once, and a leader forced out
        # for it has ended its own term by then.
        async with self._lock.guarded(lease=self._lease) as hold:
            self._terms.add(hold)
            try:
                yield hold
            finally:
                self._terms.discard(hold)

    def run(self, work: Callable[[], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        """Campaign, run ``await work()`` as the leader; after a lost term, campaign again.

        Returns what ``work`` returns, after the term ended (the lock released); an
        exception of ``work`` propagates the same way. A campaign that fails because the
        server cannot be reached is retried; an error releasing the lock after ``work``
        returned propagates (``work`` ran once, to the end). So does a ``LockLostError``
        from that release: the term was lost while ``work`` ran (taken by
        ``force_unlock()`` between two renewals) and ``work`` finished before the guard
        learnt of it, so another leader may have run meanwhile.
        """
        if not callable(work):
            raise TypeError(f"work must be a callable returning an awaitable, not {work!r}")
        return self._run(work)

    async def _run(self, work: Callable[[], Awaitable[T]]) -> T:
        pause = _RETRY_FIRST
        while True:
            term: Hold | None = None
            try:
                async with self.elected() as term:
                    pause = _RETRY_FIRST
                    return await work()
            except LockLostError as exc:
                if term is None or not term.lost:
                    raise  # not this term's: work's own, or another lock's
                if self._lock._engine.closed:
                    # aclose() ended the term and released the lock: a clean stop, not a
                    # loss, and no campaign can follow.
                    raise ClientClosedError from exc
                log.warning("aiolock: leadership of %r was lost; campaigning again", self.name)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if term is not None:
                    raise  # from work, or from the release after it
                log.warning(
                    "aiolock: campaign for %r failed (%s); retrying in %.2f s",
                    self.name,
                    exc,
                    pause,
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_CAP)
