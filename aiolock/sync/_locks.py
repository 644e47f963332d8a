"""The sync lock handles: each method runs its async twin in the loop thread.

A sync handle keeps its name, its ``owner=`` and a way to make the async handle; each call
uses the async handle of the calling holder: the ``owner=`` given, else the calling
thread's own (``_portal.thread_owner``), so the holder is the thread, as a task is in the
async API, and its id (owner-form) never equals a task's. Every rule (reentrancy, waiting,
renewal, rollback, errors) is the async client's: nothing is decided here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import aiolock

from .._config import TimeArg, check_owner
from .._objects.handle import LockStatistics
from ._hold import Block, GuardedBlock, Hold
from ._portal import THREAD_PREFIX, thread_owner

if TYPE_CHECKING:
    from types import TracebackType

    from ._runtime import Runtime

__all__ = (
    "FairLock",
    "FairReadLock",
    "FairReadWriteLock",
    "FairWriteLock",
    "FencedLock",
    "Lock",
    "LockMethods",
    "MultiLock",
    "ReadLock",
    "ReadWriteLock",
    "RedLock",
    "SpinLock",
    "WriteLock",
)

A = TypeVar("A")


def sync_owner(owner: object) -> str | None:
    """Validate a sync handle's ``owner=``; the threads' own ids are reserved."""
    checked = check_owner(owner)
    if checked is not None and checked.startswith(THREAD_PREFIX):
        raise ValueError(f"owner must not start with {THREAD_PREFIX!r}: the threads' ids do")
    return checked


class _PerHolder(Generic[A]):
    """The async handle of each holder: the ``owner=`` given, or each calling thread.

    A thread's handle lives in the thread's own storage (``threading.local``): it is freed
    with the thread, so a long-lived sync handle used by many short-lived threads (a
    thread per request) keeps one async handle per LIVE thread, not one per thread ever.
    """

    __slots__ = ("_local", "_make", "_owned", "_owner")

    def __init__(self, make: Callable[[str], A], owner: str | None) -> None:
        self._make = make
        self._owner = owner
        self._owned: A | None = None  # the handle of owner=, made once
        self._local = threading.local()

    def get(self) -> A:
        if self._owner is not None:
            handle = self._owned
            if handle is None:
                handle = self._owned = self._make(self._owner)
            return handle
        owner = thread_owner()
        local = self._local
        # The owner is checked: a forked child's copy of a thread is another holder.
        if getattr(local, "owner", None) != owner:
            local.handle = self._make(owner)
            local.owner = owner
        handle_of_thread: A = local.handle
        return handle_of_thread


class LockMethods:
    """The lock methods every sync lock has (the async contract's, blocking)."""

    __slots__ = ("__weakref__", "_h", "_rt")

    _rt: Runtime
    _h: _PerHolder[Any]

    @property
    def name(self) -> str:
        """The lock's name as given (a MultiLock's: its members', joined)."""
        return str(self._h.get().name)

    def _async(self) -> Any:
        """The calling holder's async handle."""
        return self._h.get()

    def __repr__(self) -> str:
        return repr(self._async()).replace("<aiolock.", "<aiolock.sync.", 1)

    # -- acquiring ------------------------------------------------------------------------

    def lock(self, lease: TimeArg = None) -> None:
        """Block until acquired. ``lease`` None: the watchdog keeps the lease alive."""
        h = self._async()
        self._rt.run(h.lock(lease), undo=lambda _: h.unlock())

    def try_lock(self, wait: TimeArg = 0, lease: TimeArg = None) -> bool:
        """Try for up to ``wait`` s (0: one attempt, None: forever); True if acquired."""
        h = self._async()
        # run()'s value returned as it is: no call (bool()) where an interruption could
        # land between the acquire and the caller (see Portal.run).
        ok: bool = self._rt.run(h.try_lock(wait, lease), undo=lambda ok: _unlock_if(h, ok))
        return ok

    def unlock(self) -> None:
        """Release one hold; LockNotOwnedError / LockLostError if this holder has none."""
        self._rt.run(self._async().unlock(), finish=True)

    def extend(self, lease: TimeArg) -> None:
        """Make this holder's lease ``lease`` seconds from now."""
        self._rt.run(self._async().extend(lease))

    def __enter__(self) -> Self:
        Block(self._rt.portal(), self._async()).__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._rt.run(self._async().__aexit__(exc_type, exc, tb), finish=True)

    def acquired(
        self, wait: TimeArg = None, lease: TimeArg = None
    ) -> contextlib.AbstractContextManager[Self]:
        """``with lock.acquired(wait=5):`` raises LockTimeoutError after ``wait``."""
        return Block(self._rt.portal(), self._async().acquired(wait, lease), self)

    def guarded(
        self, wait: TimeArg = None, lease: TimeArg = None
    ) -> contextlib.AbstractContextManager[Hold]:
        """``with lock.guarded(wait=5) as hold:`` a hold that tells the thread when it is lost.

        The body is NOT interrupted when the hold is lost (a thread cannot be cancelled
        safely): check ``hold.lost`` / ``hold.check()`` at safe points; the block's exit
        raises ``LockLostError`` if the hold was lost at any time (a note on the body's own
        exception if it raised one). The release of a lost hold runs in the background.
        """
        h = self._async()
        return GuardedBlock(self._rt.portal(), h.guarded(wait, lease), h.name, h._guard_holder())

    # -- queries --------------------------------------------------------------------------

    def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held."""
        return bool(self._rt.run(self._async().force_unlock()))

    def is_locked(self) -> bool:
        """Whether anyone holds the lock."""
        return bool(self._rt.run(self._async().is_locked()))

    def is_held_by_current_task(self) -> bool:
        """Whether the calling thread (or this handle's owner) holds the lock, per Redis."""
        return bool(self._rt.run(self._async().is_held_by_current_task()))

    #: The sync name of the same question.
    is_held_by_current_thread = is_held_by_current_task

    def hold_count(self) -> int:
        """The calling holder's reentrancy count, per Redis; 0 if it does not hold it."""
        return int(self._rt.run(self._async().hold_count()))

    def remaining_lease(self) -> float | None:
        """Seconds left on the lease; None if the lock is absent or has no expiry."""
        left: float | None = self._rt.run(self._async().remaining_lease())
        return left

    def statistics(self) -> LockStatistics:
        """What this client knows locally, for the calling thread (no I/O)."""
        stats: LockStatistics = self._async().statistics()
        return stats


async def _unlock_if(handle: Any, acquired: bool) -> None:  # noqa: FBT001 - an undo's value
    if acquired:
        await handle.unlock()


class _Handle(LockMethods):
    """A sync handle of one named lock."""

    __slots__ = ("_owner",)

    def __init__(self, rt: Runtime, make: Callable[[str | None], Any], owner: str | None) -> None:
        self._rt = rt
        self._owner = sync_owner(owner)
        make(None)  # the name checked now, as the async handle does (nothing is sent)
        self._h = _PerHolder(make, self._owner)

    @property
    def owner(self) -> str | None:
        """The ``owner=`` this handle was made with (None: the calling thread holds)."""
        return self._owner

    @property
    def client_id(self) -> str:
        """The id of the client this handle belongs to."""
        return self._rt.client_id


class Lock(_Handle):
    """A reentrant lock (Redisson RLock layout), held by the calling thread."""

    __slots__ = ()


class FairLock(_Handle):
    """A FIFO reentrant lock (Redisson RFairLock layout)."""

    __slots__ = ()


class SpinLock(_Handle):
    """A reentrant lock whose waiters poll with back-off (RSpinLock)."""

    __slots__ = ()


class ReadLock(_Handle):
    """The read side of a read-write lock: shared by readers."""

    __slots__ = ()


class WriteLock(_Handle):
    """The write side of a read-write lock: exclusive."""

    __slots__ = ()


class FairReadLock(_Handle):
    """The read side of a fair read-write lock."""

    __slots__ = ()


class FairWriteLock(_Handle):
    """The write side of a fair read-write lock."""

    __slots__ = ()


class FencedLock(_Handle):
    """A reentrant lock whose every acquisition takes a growing fencing token."""

    __slots__ = ()

    def lock_and_get_token(self, lease: TimeArg = None) -> int:
        """Block until acquired; the acquisition's fencing token."""
        h = self._async()
        token: int = self._rt.run(h.lock_and_get_token(lease), undo=lambda _: h.unlock())
        return token

    def try_lock_and_get_token(self, wait: TimeArg = 0, lease: TimeArg = None) -> int | None:
        """Try for up to ``wait`` s; the fencing token, or None if not acquired."""
        h = self._async()
        token: int | None = self._rt.run(
            h.try_lock_and_get_token(wait, lease),
            undo=lambda token: _unlock_if(h, token is not None),
        )
        return token


class _Pair:
    __slots__ = ("__weakref__", "_name", "_owner", "_rt")

    def __init__(self, rt: Runtime, name: str, owner: str | None) -> None:
        self._rt = rt
        self._owner = sync_owner(owner)
        self._name = name
        self._async_pair(None)  # the name checked now

    def _async_pair(self, owner: str | None) -> Any:
        raise NotImplementedError  # pragma: no cover - abstract

    @property
    def name(self) -> str:
        """The lock's name as given."""
        return self._name

    def __repr__(self) -> str:
        owner = f" owner={self._owner!r}" if self._owner else ""
        return f"<aiolock.sync.{type(self).__name__} {self._name!r}{owner}>"


class ReadWriteLock(_Pair):
    """A read-write lock (RReadWriteLock layout): ``read_lock()``, ``write_lock()``."""

    __slots__ = ()

    def _async_pair(self, owner: str | None) -> Any:
        return self._rt.async_client.read_write_lock(self._name, owner=owner)

    def read_lock(self) -> ReadLock:
        """The shared side."""
        return ReadLock(self._rt, lambda o: self._async_pair(o).read_lock(), self._owner)

    def write_lock(self) -> WriteLock:
        """The exclusive side."""
        return WriteLock(self._rt, lambda o: self._async_pair(o).write_lock(), self._owner)


class FairReadWriteLock(_Pair):
    """A read-write lock serving readers and writers in arrival order."""

    __slots__ = ()

    def _async_pair(self, owner: str | None) -> Any:
        return self._rt.async_client.fair_read_write_lock(self._name, owner=owner)

    def read_lock(self) -> FairReadLock:
        """The shared side."""
        return FairReadLock(self._rt, lambda o: self._async_pair(o).read_lock(), self._owner)

    def write_lock(self) -> FairWriteLock:
        """The exclusive side."""
        return FairWriteLock(self._rt, lambda o: self._async_pair(o).write_lock(), self._owner)


class _Composite(LockMethods):
    __slots__ = ("_locks",)

    _kind: Callable[..., Any]

    def __init__(self, *locks: LockMethods) -> None:
        for lock in locks:
            if not isinstance(lock, _Handle):
                raise TypeError(
                    f"{type(self).__name__} members must be aiolock.sync lock handles, "
                    f"not {type(lock).__name__}"
                )
        self._locks = locks
        # Refused at once as the async one refuses (no members, the same handle twice).
        type(self)._kind(*(lock._h.get() for lock in locks))
        self._rt = locks[0]._rt
        self._h = _PerHolder(self._make, None)

    def _make(self, owner: str) -> Any:
        # Each member as this holder: its own owner= where it has one, else the thread.
        return type(self)._kind(*(lock._h.get() for lock in self._locks))


class MultiLock(_Composite):
    """All or nothing over its members (which may be of several sync clients)."""

    __slots__ = ()
    _kind = aiolock.MultiLock


class RedLock(_Composite):
    """Held while a majority of its members (on independent servers) are."""

    __slots__ = ()
    _kind = aiolock.RedLock
