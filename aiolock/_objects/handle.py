"""The public face every lock handle shares: lock, try_lock, unlock, queries, statistics.

A handle is cheap and holds no state but its name and owner: each method checks its
arguments and hands the call to the engine with the handle's primitive (the description of
its lock type). A lock type subclasses `LockHandle` and gives it its ``Primitive``
(``_engine/primitive.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from redis.exceptions import RedisError

from .._config import TimeArg, check_name, check_owner, lease_seconds, wait_seconds
from .._engine.acquire import acquire
from .._engine.guard import Guarded, guarded_hold
from .._engine.release import hold_of, release, release_soon
from .._exceptions import LockError, LockTimeoutError, ReleaseError

if TYPE_CHECKING:
    from types import TracebackType

    from .._engine.engine import Engine
    from .._engine.guard import Guard, Guarding
    from .._engine.holds import HoldRecord
    from .._engine.primitive import Primitive

log = logging.getLogger("aiolock")

__all__ = (
    "Acquirable",
    "LockHandle",
    "LockStatistics",
    "ReadWritePair",
    "extend_seconds",
    "release_at_exit",
)


def extend_seconds(lease: object) -> float:
    """Validate extend()'s ``lease``: a finite number of seconds > 0 (None is no lease)."""
    seconds = lease_seconds(lease)
    if seconds is None:
        raise TypeError("lease must be a number of seconds > 0, not None")
    return seconds


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """A snapshot of what this client knows locally about one lock handle's name.

    ``held_by_current_task`` and ``hold_count`` are this client's belief for the calling
    holder (Redis is the truth: use ``is_held_by_current_task()`` to ask it);
    ``tasks_waiting`` counts this client's tasks waiting to acquire the name.
    """

    name: str
    held_by_current_task: bool
    hold_count: int
    tasks_waiting: int


async def release_at_exit(
    name: str,
    release: Callable[[], Awaitable[None]],
    body_error: BaseException | None,
    what: str = "lock",
) -> None:
    """Release (``release()``) at the end of a block, never hiding the body's exception.

    A body cancelled (even twice, the second time during this release) still
    releases: unlock() finishes a cancelled release in the background, and a cancel
    during it raises CancelledError as ever. Any other failure of the release is,
    when the body raised, a note on the body's exception (and a WARNING); else it is
    raised: the lock's own errors (LockLostError, LockNotOwnedError) and misuse
    (RuntimeError) as they are, a redis-py or socket error (the server unreachable)
    as ReleaseError, so that a failed release after the work was done never reads as
    a failed acquire.
    """
    try:
        await release()
    except Exception as exc:
        # The server's or the network's failure (after the client's retries): the
        # release failed. Anything else (the lock's own errors, a misuse) as it is.
        failed = isinstance(exc, (RedisError, OSError)) and not isinstance(exc, LockError)
        error = ReleaseError(name, exc, what=what) if failed else exc
        if body_error is None:
            if error is exc:
                raise
            raise error from exc
        if error is not exc:
            error.__cause__ = exc
        log.warning(
            "aiolock: releasing %r at the end of a block that raised %r failed: %r",
            name,
            body_error,
            error,
        )
        body_error.add_note(f"aiolock: and releasing {what} {name!r} failed: {error!r}")


class Acquirable:
    """The acquiring methods every lock has, over ``_acquire(wait, lease)`` and ``unlock()``.

    A lock handle's go to the engine; a MultiLock's and a RedLock's to their members.
    """

    __slots__ = ()

    def _acquire(
        self, wait: float | None, lease: float | None, *, timed: bool = False
    ) -> Awaitable[bool]:
        """Acquire within ``wait`` (None: forever); whether it was.

        ``timed``: for a guarded hold (each member's send time is recorded).
        """
        raise NotImplementedError  # pragma: no cover - abstract

    async def unlock(self) -> None:
        """Release one hold."""
        raise NotImplementedError  # pragma: no cover - abstract

    async def extend(self, lease: TimeArg) -> None:
        """Make the calling holder's lease ``lease`` seconds from now."""
        raise NotImplementedError  # pragma: no cover - abstract

    @property
    def name(self) -> str:
        raise NotImplementedError  # pragma: no cover - abstract

    async def lock(self, lease: TimeArg = None) -> None:
        """Wait until acquired. ``lease`` None: the watchdog keeps the lease alive."""
        await self._acquire(None, lease_seconds(lease))

    async def try_lock(self, wait: TimeArg = 0, lease: TimeArg = None) -> bool:
        """Try for up to ``wait`` seconds (0: one attempt, None: forever); True if acquired."""
        return await self._acquire(wait_seconds(wait), lease_seconds(lease))

    def acquired(
        self, wait: TimeArg = None, lease: TimeArg = None
    ) -> contextlib.AbstractAsyncContextManager[Self]:
        """``async with lock.acquired(wait=5):`` raises LockTimeoutError after ``wait``."""
        return self._acquired(wait_seconds(wait), lease_seconds(lease))

    @contextlib.asynccontextmanager
    async def _acquired(self, wait: float | None, lease: float | None) -> AsyncIterator[Self]:
        if not await self._acquire(wait, lease):
            assert wait is not None
            raise LockTimeoutError(self.name, wait)
        try:
            yield self
        except BaseException as exc:
            await self._release_at_exit(exc)
            raise
        await self._release_at_exit(None)

    def guarded(self, wait: TimeArg = None, lease: TimeArg = None) -> Guarded:
        """``async with lock.guarded(wait=5) as hold:`` the body is cancelled if it is lost.

        Lost: found gone or taken, or no longer confirmed by the server (``Hold``). The
        block then raises ``LockLostError`` (a cancel from outside still raises
        ``CancelledError``) without waiting for the server; the release runs in the
        background. ``wait`` as in ``acquired()``: ``LockTimeoutError`` once it ran out.
        """
        return Guarded(self, wait_seconds(wait), lease_seconds(lease))

    async def _guard_acquire(self, wait: float | None, lease: float | None) -> Guarding | None:
        """Acquire within ``wait`` and build its guarded hold; None if ``wait`` ran out."""
        raise NotImplementedError  # pragma: no cover - abstract

    async def _guard_release(self, body_error: BaseException | None) -> None:
        """Release a guarded hold that was not lost, never hiding ``body_error``."""
        await self._release_at_exit(body_error)

    def _guard_release_soon(self) -> None:
        """Release a lost guarded hold in the background."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _guard_holder(self) -> str:
        """The calling holder's id, for a guarded hold's LockLostError."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _guard_watch(self, armed: asyncio.Event) -> asyncio.Task[None] | None:
        """Watch a guarded hold for a forced unlock; None: this kind is not watched."""
        return None

    async def __aenter__(self) -> Self:
        await self._acquire(None, None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._release_at_exit(exc)

    async def _release_at_exit(self, body_error: BaseException | None) -> None:
        """Release at the end of a block, never hiding the body's exception."""
        await release_at_exit(self.name, self.unlock, body_error)


class LockHandle(Acquirable):
    """Base of the lock handles: the public methods, over the engine."""

    __slots__ = ("__weakref__", "_engine", "_key", "_name", "_owner", "_primitive")

    def __init__(self, engine: Engine, p: Primitive, *, owner: str | None = None) -> None:
        self._engine = engine
        self._primitive = p
        self._name = p.name
        self._owner = check_owner(owner)
        self._key = p.key

    @property
    def name(self) -> str:
        """The lock's name as given (without ``key_prefix``)."""
        return self._name

    @property
    def client_id(self) -> str:
        """The id of the client this handle belongs to (``Client.id``)."""
        return self._engine.client_id

    @property
    def owner(self) -> str | None:
        """The ``owner=`` this handle was made with (None: the calling task holds)."""
        return self._owner

    def __repr__(self) -> str:
        waiting = self._engine.waiting(self._key)
        owner = f" owner={self._owner!r}" if self._owner else ""
        return f"<aiolock.{type(self).__name__} {self._name!r}{owner}, {waiting} waiting>"

    # -- acquiring ------------------------------------------------------------------------

    def _acquire(
        self, wait: float | None, lease: float | None, *, timed: bool = False
    ) -> Awaitable[bool]:
        return acquire(self._engine, self._primitive, self._owner, wait, lease, timed=timed)

    # -- guarded holds --------------------------------------------------------------------

    async def _guard_acquire(self, wait: float | None, lease: float | None) -> Guarding | None:
        if not await self._acquire(wait, lease, timed=True):
            return None
        return self._guard_hold(lease)

    def _guard_watch(self, armed: asyncio.Event) -> asyncio.Task[None] | None:
        """The calling holder's hold watched for a forced unlock, in a task of its own.

        ``Engine.watch_taken``: a guarded hold learns of a force at once, from ``armed``
        on (set once the watch is in place). Cancel it to stop. None where the kind's
        channel does not tell a force (``Primitive.watched``).
        """
        if not self._primitive.watched:
            return None
        holder, _ = self._engine.holder(self._owner)
        watch = _quietly(self._engine, self._primitive, holder, armed)
        return asyncio.get_running_loop().create_task(watch)

    def _guard_hold(self, lease: float | None, token: int | None = None) -> Guarding:
        # Right after the acquire's answer, with no await in between: the record is the
        # one it made.
        return guarded_hold(
            [self._record()], need=1, leases=[lease], guards=[self._engine.guard], token=token
        )

    def _record(self) -> HoldRecord | None:
        """The calling holder's hold record on this lock (None: none)."""
        return hold_of(self._engine, self._primitive, self._owner)

    def _guard_release_soon(self) -> None:
        release_soon(self._engine, self._primitive, self._owner)

    def _guard_holder(self) -> str:
        return self._engine.holder(self._owner)[0]

    # -- as a composite's member: what MultiLock and RedLock ask of it (members.py) ------

    def _member_acquire(
        self,
        task: asyncio.Task[Any] | None,
        wait: float | None,
        lease: float | None,
        *,
        timed: bool,
    ) -> Awaitable[bool]:
        """``try_lock(wait, lease)`` (checked already) for ``task`` (None: the caller).

        Not bounded here: the composite bounds its members' calls together.
        """
        return acquire(
            self._engine,
            self._primitive,
            self._owner,
            wait,
            lease,
            timed=timed,
            bounded=False,
            task=task,
        )

    async def _member_release(self, task: asyncio.Task[Any]) -> None:
        """``unlock()`` for ``task``."""
        await release(self._engine, self._primitive, self._owner, task)

    async def _member_held_by(self, task: asyncio.Task[Any]) -> bool:
        """``is_held_by_current_task()`` asked for ``task``."""
        holder, _ = self._engine.holder(self._owner, task)
        field = self._primitive.field(holder)
        return bool(await self._engine.query(self._primitive, "HEXISTS", self._key, field))

    async def _member_hold_count(self, task: asyncio.Task[Any]) -> int:
        """``hold_count()`` asked for ``task``."""
        holder, _ = self._engine.holder(self._owner, task)
        field = self._primitive.field(holder)
        count = await self._engine.query(self._primitive, "HGET", self._key, field)
        return int(count) if count is not None else 0

    def _member_place(self) -> tuple[str, str]:
        """Where it is: its full key and its server (as the client names it)."""
        return self._key, self._engine.settings.server

    def _member_guard(self) -> Guard:
        """The guard of its client's event loop, which watches its guarded holds."""
        return self._engine.guard

    # -- releasing ------------------------------------------------------------------------

    async def unlock(self) -> None:
        """Release one hold; raise LockNotOwnedError / LockLostError if there is none."""
        await release(self._engine, self._primitive, self._owner)

    async def extend(self, lease: TimeArg) -> None:
        """Make the calling holder's lease ``lease`` seconds from now.

        Raises LockNotOwnedError / LockLostError as unlock() does. A hold the watchdog
        renews stays renewed: only its current expiry moves, and the watchdog's next
        renewal (every third of ``watchdog_timeout``) gives it the watchdog's lease again.
        """
        await self._engine.extend(self._primitive, self._owner, round(extend_seconds(lease) * 1000))

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held."""
        return await self._engine.force(self._primitive)

    # -- queries --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """Whether anyone holds the lock."""
        # HLEN, not Redisson's EXISTS: the same answer for a lock (a hash exists while it
        # has a field), and a WRONGTYPE error for a key of another type instead of True.
        return bool(await self._query("HLEN", self._key))

    async def is_held_by_current_task(self) -> bool:
        """Whether the calling task (or this handle's owner) holds the lock, per Redis."""
        holder, _ = self._engine.holder(self._owner)
        return bool(await self._query("HEXISTS", self._key, self._primitive.field(holder)))

    async def hold_count(self) -> int:
        """The calling holder's reentrancy count, per Redis; 0 if it does not hold it."""
        holder, _ = self._engine.holder(self._owner)
        count = await self._query("HGET", self._key, self._primitive.field(holder))
        return int(count) if count is not None else 0

    async def remaining_lease(self) -> float | None:
        """Seconds left on the lease; None if the lock is absent or has no expiry."""
        # PTTL alone answers for a key of any type: HLEN in the same round trip fails with
        # WRONGTYPE for one that is not a lock, where PTTL would report one without expiry.
        _, ms = await self._engine.query_all(
            self._primitive, ("HLEN", self._key), ("PTTL", self._key)
        )
        return None if int(ms) < 0 else int(ms) / 1000

    async def _query(self, *args: str) -> Any:
        return await self._engine.query(self._primitive, *args)

    def statistics(self) -> LockStatistics:
        """What this client knows locally; call it from the task whose hold you ask about."""
        count = self._engine.believed(self._primitive, self._owner)
        return LockStatistics(
            name=self._name,
            held_by_current_task=count > 0,
            hold_count=count,
            tasks_waiting=self._engine.waiting(self._key),
        )


class ReadWritePair:
    """What both read-write locks are: a name, an owner, and two views made on demand.

    Nothing is stored here: each view is a handle of its own on the one state in Redis.
    """

    __slots__ = ("__weakref__", "_engine", "_name", "_owner")

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        self._engine = engine
        self._name = check_name(name)
        self._owner = check_owner(owner)

    @property
    def name(self) -> str:
        """The lock's name as given (without ``key_prefix``)."""
        return self._name

    def __repr__(self) -> str:
        owner = f" owner={self._owner!r}" if self._owner else ""
        return f"<aiolock.{type(self).__name__} {self._name!r}{owner}>"


async def _quietly(engine: Engine, p: Primitive, holder: str, armed: asyncio.Event) -> None:
    """The watch, ended quietly by the client's closing or a connection error.

    It only hurries what the periodic renewal does anyway.
    """
    try:
        await engine.watch_taken(p, holder, armed)
    except (LockError, RedisError, OSError) as exc:
        log.debug("aiolock: watch of %r for a forced unlock ended: %s", p.name, exc)
