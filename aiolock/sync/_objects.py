"""The sync semaphores, latch and leader: each method runs its async twin in the loop thread.

Permits and counts have no holder, so each object keeps ONE async twin. A leader's term is
held by the calling thread, as a lock is.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._config import TimeArg, lease_seconds, wait_seconds
from .._exceptions import ClientClosedError, LockLostError
from .._objects.leader import Leader as AsyncLeaderType
from ._hold import Block, GuardedBlock, Hold, TaskBlock
from ._portal import thread_owner

if TYPE_CHECKING:
    from types import TracebackType

    from .._objects.count_down_latch import CountDownLatch as AsyncLatch
    from .._objects.leader import Leader as AsyncLeader
    from .._objects.permit_expirable_semaphore import PermitExpirableSemaphore as AsyncPermits
    from .._objects.semaphore import Semaphore as AsyncSemaphore
    from ._runtime import Runtime

__all__ = ("CountDownLatch", "Leader", "PermitExpirableSemaphore", "Semaphore")

log = logging.getLogger("aiolock")

T = TypeVar("T")

_RETRY_FIRST = 0.1
_RETRY_CAP = 5.0


class _Counted:
    __slots__ = ("__weakref__", "_a", "_rt")

    _a: Any

    def __init__(self, rt: Runtime, twin: Any) -> None:
        self._rt = rt
        self._a = twin

    @property
    def name(self) -> str:
        """The object's name as given."""
        return str(self._a.name)

    def __repr__(self) -> str:
        return repr(self._a).replace("<aiolock.", "<aiolock.sync.", 1)

    def try_set_permits(self, permits: int) -> bool:
        """Set the permits if none are set yet; whether they were."""
        return bool(self._rt.run(self._a.try_set_permits(permits)))

    def add_permits(self, permits: int) -> None:
        """Add ``permits`` (a negative number takes them away)."""
        self._rt.run(self._a.add_permits(permits))

    def available_permits(self) -> int:
        """The permits free now."""
        return int(self._rt.run(self._a.available_permits()))

    def delete(self) -> bool:
        """Delete the semaphore; whether it existed."""
        return bool(self._rt.run(self._a.delete()))


class Semaphore(_Counted):
    """A counting semaphore (Redisson RSemaphore layout); permits have no owner."""

    __slots__ = ()
    _a: AsyncSemaphore

    def acquire(self, permits: int = 1) -> None:
        """Block until ``permits`` are taken."""
        a = self._a
        self._rt.run(a.acquire(permits), undo=lambda _: a.release(permits))

    def try_acquire(self, permits: int = 1, wait: TimeArg = 0) -> bool:
        """Try for up to ``wait`` s; whether the permits were taken."""
        a = self._a

        async def undo(ok: bool) -> None:  # noqa: FBT001 - an undo's value
            if ok:
                await a.release(permits)

        # As it is: no call (bool()) between the acquire and the caller (see Portal.run).
        ok: bool = self._rt.run(a.try_acquire(permits, wait), undo=undo)
        return ok

    def release(self, permits: int = 1) -> None:
        """Give ``permits`` back."""
        self._rt.run(self._a.release(permits), finish=True)

    def drain_permits(self) -> int:
        """Take every free permit; how many."""
        return int(self._rt.run(self._a.drain_permits()))

    def acquired(
        self, permits: int = 1, wait: TimeArg = None
    ) -> contextlib.AbstractContextManager[Self]:
        """``with sem.acquired(wait=5):`` LockTimeoutError after ``wait``."""
        return Block(self._rt.portal(), self._a.acquired(permits, wait), self)

    def __enter__(self) -> Self:
        Block(self._rt.portal(), self._a).__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._rt.run(self._a.__aexit__(exc_type, exc, tb), finish=True)


class PermitExpirableSemaphore(_Counted):
    """A semaphore of permits taken by id, each with a lease (RPermitExpirableSemaphore)."""

    __slots__ = ()
    _a: AsyncPermits

    def acquire(self, lease: TimeArg = None) -> str:
        """Block until a permit is taken; its id (``lease`` None: it never expires)."""
        a = self._a
        permit: str = self._rt.run(a.acquire(lease), undo=a.release)
        return permit

    def try_acquire(self, wait: TimeArg = 0, lease: TimeArg = None) -> str | None:
        """Try for up to ``wait`` s; the permit's id, or None."""
        a = self._a

        async def undo(permit: str | None) -> None:
            if permit is not None:
                await a.release(permit)

        permit: str | None = self._rt.run(a.try_acquire(wait, lease), undo=undo)
        return permit

    def release(self, permit_id: str) -> None:
        """Give the permit ``permit_id`` back (any thread of any client may)."""
        self._rt.run(self._a.release(permit_id), finish=True)

    def set_permits(self, permits: int) -> None:
        """Set the total of permits, those taken included."""
        self._rt.run(self._a.set_permits(permits))

    def acquired(
        self, wait: TimeArg = None, lease: TimeArg = None
    ) -> contextlib.AbstractContextManager[str]:
        """``with psem.acquired() as permit_id:``; ``lease`` None: renewed while held.

        The permit's renewal lives as long as the task that took it: one task of the loop
        thread takes it, waits for the block's end and gives it back.
        """
        return TaskBlock(self._rt.portal(), self._a.acquired(wait, lease))


class CountDownLatch:
    """A count-down latch (Redisson RCountDownLatch layout)."""

    __slots__ = ("__weakref__", "_a", "_rt")

    def __init__(self, rt: Runtime, twin: AsyncLatch) -> None:
        self._rt = rt
        self._a = twin

    @property
    def name(self) -> str:
        """The latch's name as given."""
        return self._a.name

    def __repr__(self) -> str:
        return repr(self._a).replace("<aiolock.", "<aiolock.sync.", 1)

    @property
    def tasks_waiting(self) -> int:
        """How many of this client's threads (and tasks) wait on the latch."""
        return self._a.tasks_waiting

    def try_set_count(self, count: int) -> bool:
        """Set the count if it is zero; whether it was set."""
        return bool(self._rt.run(self._a.try_set_count(count)))

    def count_down(self) -> None:
        """Count down by one (at zero it stays zero)."""
        self._rt.run(self._a.count_down())

    def get_count(self) -> int:
        """The count now."""
        return int(self._rt.run(self._a.get_count()))

    def wait(self, timeout: TimeArg = None) -> bool:
        """Block until the count is zero, or ``timeout`` s; True once it reached zero."""
        return bool(self._rt.run(self._a.wait(timeout)))


class Leader:
    """An election on the reentrant lock ``name``: the thread holding it is the leader."""

    __slots__ = ("__weakref__", "_lease", "_local", "_name", "_rt", "_slow_hold", "_terms")

    def __init__(self, rt: Runtime, name: str, lease: TimeArg, slow_hold: TimeArg = None) -> None:
        self._rt = rt
        self._name = name
        self._lease = lease_seconds(lease)
        self._slow_hold = wait_seconds(slow_hold, "slow_hold")
        # Each thread's async leader, freed with the thread (as the lock handles' are).
        self._local = threading.local()
        self._terms = 0
        self._leader()  # the arguments checked now

    def _leader(self) -> AsyncLeader:
        owner = thread_owner()
        local = self._local
        if getattr(local, "owner", None) != owner:
            # The async leader over this thread's lock: the term is the thread's.
            lock = self._rt.async_client.lock(self._name, owner=owner)
            local.leader = AsyncLeaderType(lock, self._lease, self._slow_hold)
            local.owner = owner
        leader: AsyncLeader = local.leader
        return leader

    @property
    def name(self) -> str:
        """The election's lock name."""
        return self._name

    @property
    def is_leader(self) -> bool:
        """Whether a thread of this object is in a term now (no I/O)."""
        return self._terms > 0

    def __repr__(self) -> str:
        return f"<aiolock.sync.Leader {self._name!r}{' (leading)' if self.is_leader else ''}>"

    @contextlib.contextmanager
    def elected(self) -> Iterator[Hold]:
        """``with leader.elected() as term:`` blocks until elected; the term is a Hold.

        ``term.lost``, ``term.check()`` and ``term.sleep(seconds)`` tell the body of a
        lost term (a thread cannot be stopped from outside); the block's exit raises
        ``LockLostError`` if the term was lost at any time.
        """
        leader = self._leader()
        with GuardedBlock(
            self._rt.portal(), leader.elected(), self._name, leader.lock._guard_holder()
        ) as term:
            self._terms += 1
            try:
                yield term
            finally:
                self._terms -= 1

    def run(self, work: Callable[[Hold], T] | Callable[[], T]) -> T:
        """Campaign, run ``work`` as the leader; after a lost term, campaign again.

        ``work(term)`` if ``work`` takes an argument, else ``work()``; it runs in this
        thread and cannot be stopped from outside: use ``term.sleep(seconds)`` between
        steps and ``term.check()`` before each effect, which raise ``LockLostError`` once
        the term is lost, so that ``work`` stops and a new campaign starts. A term lost
        while ``work`` ran on is learnt, at the latest, when it returns (LockLostError at
        the term's end), and ``work`` then runs again in a new term. A new term never
        starts before the previous call of ``work`` has returned.
        """
        if not callable(work):
            raise TypeError(f"work must be a callable, not {work!r}")
        takes_term = _takes_one_argument(work)
        pause = _RETRY_FIRST
        while True:
            term: Hold | None = None
            try:
                with self.elected() as term:
                    pause = _RETRY_FIRST
                    if takes_term:
                        return cast("Callable[[Hold], T]", work)(term)
                    return cast("Callable[[], T]", work)()
            except LockLostError as exc:
                if term is None or not term.lost:
                    raise
                if self._rt.closed:
                    # close() ended the term: a clean stop, not a loss; no campaign follows.
                    raise ClientClosedError from exc
                log.warning("aiolock: leadership of %r was lost; campaigning again", self._name)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if term is not None:
                    raise
                log.warning(
                    "aiolock: campaign for %r failed (%s); retrying in %.2f s",
                    self._name,
                    exc,
                    pause,
                )
                time.sleep(pause)
                pause = min(pause * 2, _RETRY_CAP)


def _takes_one_argument(work: Callable[..., Any]) -> bool:
    """Whether ``work`` takes a positional argument (the term) in ``run(work)``."""
    try:
        parameters = inspect.signature(work).parameters.values()
    except (TypeError, ValueError):
        return False  # no signature to read (some builtins): called as work()
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(p.kind in positional for p in parameters)
