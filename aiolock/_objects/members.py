"""A composite lock's members, asked at once: tries, queries and unlocks.

The members' calls run at once, each in a task of its own that acts for the calling task
(a lock belongs to the task that took it: the engine is told that task, ``task=``), so
that members on servers far apart cost one round trip, not one each, and one member's
frozen server costs a bound, not its connection's timeout. Every call is run to its end
and its outcome read, whatever the caller's cancel state: nothing is left running behind
a call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

from redis.exceptions import RedisError

from .._exceptions import LockError
from .handle import LockHandle

__all__ = (
    "QUERY_CALL",
    "UNBOUNDED_CALL",
    "AtOnce",
    "T",
    "answers",
    "ask",
    "failed",
    "give_back",
    "held_by",
    "hold_count_of",
    "took",
    "try_member",
)

log = logging.getLogger("aiolock")

T = TypeVar("T")

# A RedLock member's call (its try at once, and its wait in turn) when neither a wait nor
# a lease bounds it.
UNBOUNDED_CALL = 1.5
# How long a query (is_locked() and the like) waits for the members' answers, and an
# unlock for each member's (seconds): a frozen server costs that, not its connection's
# timeout. As long as a try's call when nothing bounds it: an answer comes in milliseconds.
QUERY_CALL = UNBOUNDED_CALL


class AtOnce(Generic[T]):
    """Calls run at once, each in a task of its own, and the calling task's wait for them.

    Their tasks start in the constructor. A cancel of the calling task stops its wait,
    never the calls: the caller cancels them (``cancel_running``) and waits for their end
    (``finish``), so that what each did is known.
    """

    __slots__ = ("_expired", "_loop", "_wake", "running", "tasks")

    def __init__(self, calls: Iterable[Coroutine[Any, Any, T]]) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(call) for call in calls]
        #: How many have not ended.
        self.running = len(self.tasks)
        # One future per wait, set by any task's end or the deadline: cheaper than
        # asyncio.wait(), which adds and removes a callback on every task each time.
        self._wake: asyncio.Future[None] | None = None
        self._expired = False
        for task in self.tasks:
            task.add_done_callback(self._ended)

    def cancel_running(self) -> None:
        """Cancel every call still under way."""
        for task in self.tasks:
            task.cancel()

    async def wait(
        self, until: Callable[[], bool] | None = None, deadline: float | None = None
    ) -> None:
        """Wait until every call has ended, ``until()`` holds, or ``deadline`` (loop clock)."""
        loop = self._loop
        self._expired = False
        timer = None if deadline is None else loop.call_at(deadline, self._expire)
        try:
            while self.running and not self._expired and not (until is not None and until()):
                self._wake = loop.create_future()
                await self._wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def finish(self) -> asyncio.CancelledError | None:
        """Wait for every call's end through cancels of the calling task; the last one."""
        cancelled = None
        while self.running:
            try:
                await self.wait()
            except asyncio.CancelledError as exc:
                cancelled = exc
        return cancelled

    def _ended(self, _task: object) -> None:
        self.running -= 1
        self._rouse()

    def _expire(self) -> None:
        self._expired = True
        self._rouse()

    def _rouse(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)


def returned(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` has ended with a value (no error, no cancel)."""
    return task.done() and not task.cancelled() and task.exception() is None


def failed(task: asyncio.Task[Any]) -> BaseException | None:
    """The error ``task`` ended with (None: a value, a cancel, or not ended)."""
    return None if not task.done() or task.cancelled() else task.exception()


async def ask(
    composite: object,
    members: list[LockHandle],
    query: Callable[[LockHandle, asyncio.Task[Any]], Coroutine[Any, Any, T]],
    decided: Callable[[list[T]], bool],
    unanswered: Callable[[LockHandle, BaseException], bool],
) -> list[T]:
    """The answers of the members that answer ``query`` within ``QUERY_CALL``.

    Asked at once, about the calling task's holds (``query(member, task)``), so that one
    member's frozen server costs the bound, not its connection's timeout; the rest are
    no longer waited for once ``decided(answers)``. A member that does not answer in time
    counts as one that is not held (its query, read-only, is cancelled); a member whose
    server fails too, for a RedLock (a MultiLock raises the error). An outer cancel
    raises CancelledError.
    """
    caller = _calling_task()
    asking = AtOnce(query(member, caller) for member in members)
    deadline = asyncio.get_running_loop().time() + QUERY_CALL
    try:
        await asking.wait(lambda: decided(answers(asking.tasks)), deadline)
    finally:
        # Read-only queries, cancelled: they end at once (no need to wait out a server).
        asking.cancel_running()
        cancelled = await asking.finish()
        if cancelled is not None:
            raise cancelled
    raised: BaseException | None = None
    for member, asked in zip(members, asking.tasks, strict=True):
        error = failed(asked)
        if asked.cancelled():
            log.info("aiolock: %r: member %r did not answer in time", composite, member.name)
        elif error is not None and raised is None and not unanswered(member, error):
            raised = error
    if raised is not None:
        raise raised
    return answers(asking.tasks)


async def try_member(
    member: LockHandle,
    wait: float | None,
    lease: float | None,
    *,
    timed: bool,
    task: asyncio.Task[Any] | None,
) -> bool:
    """``member.try_lock(wait, lease)`` (checked already) for ``task`` (None: the caller).

    Timed for a guarded hold. Not bounded by the member: the composite bounds its members'
    calls itself, with one deadline for all of them.
    """
    return await member._member_acquire(task, wait, lease, timed=timed)


async def held_by(member: LockHandle, task: asyncio.Task[Any]) -> bool:
    """``member.is_held_by_current_task()`` asked for ``task``."""
    return await member._member_held_by(task)


async def hold_count_of(member: LockHandle, task: asyncio.Task[Any]) -> int:
    """``member.hold_count()`` asked for ``task``."""
    return await member._member_hold_count(task)


def took(tried: asyncio.Task[bool]) -> bool:
    """Whether the try ``tried`` has ended with its member taken."""
    return returned(tried) and tried.result()


def answers(asking: list[asyncio.Task[T]]) -> list[T]:
    """The answers of the queries in ``asking`` that returned one."""
    return [asked.result() for asked in asking if returned(asked)]


def _calling_task() -> asyncio.Task[Any]:
    """The calling task, whose holds the members' are; refused from outside a task."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")
    return task


async def give_back(members: list[LockHandle], *, report: bool = True) -> list[BaseException]:
    """Unlock ``members`` at once for the calling task; return the failures.

    At once (``AtOnce``), so that members on servers far apart cost one round trip, not
    one each. Every one is made even if some fail or the caller is cancelled
    meanwhile: a cancel does not reach them, and the call raises it once they have ended,
    so that what it leaves is what they left. An unlock still unanswered after
    ``QUERY_CALL`` is cut off and finishes in the background (its client resends it until
    the server answers; its renewal, frozen with the server, lets the lease end
    meanwhile): not a failure, the release is under way. Failures are logged when
    ``report``.
    """
    if not members:
        return []
    caller = _calling_task()
    unlocks = AtOnce(_unlock(member, caller, report=report) for member in members)
    # One deadline for all of them (they start together), not a timeout scope in each.
    deadline = asyncio.get_running_loop().time() + QUERY_CALL
    cancelled: asyncio.CancelledError | None = None
    while unlocks.running:
        try:
            await unlocks.wait(deadline=deadline)
            break
        except asyncio.CancelledError as exc:
            # Not passed on to the unlocks: they go on to the deadline. (Each sees it
            # once it has released, and raises it: see _failures.)
            cancelled = exc
    cut = [not unlocking.done() for unlocking in unlocks.tasks]
    unlocks.cancel_running()
    cancelled = await unlocks.finish() or cancelled
    errors = _failures(members, unlocks.tasks, cut)
    if cancelled is not None:
        raise cancelled
    return errors


def _failures(
    members: list[LockHandle],
    unlocks: list[asyncio.Task[BaseException | None]],
    cut: list[bool],
) -> list[BaseException]:
    """The failures of the ended ``unlocks`` (of ``members``); those ``cut`` off are logged.

    An unlock that saw the caller's cancel raised it once released: not a failure. An
    error no member unlock expects is raised, as it was when unlocked in turn.
    """
    errors = []
    for member, unlocking, cut_off in zip(members, unlocks, cut, strict=True):
        if unlocking.cancelled():
            if cut_off:
                log.warning(
                    "aiolock: unlocking %r got no answer within %g s: it finishes in the "
                    "background",
                    member.name,
                    QUERY_CALL,
                )
        elif (error := unlocking.exception()) is not None:
            raise error
        elif (failure := unlocking.result()) is not None:
            errors.append(failure)
    return errors


async def _unlock(
    member: LockHandle, task: asyncio.Task[Any], *, report: bool
) -> BaseException | None:
    """Unlock ``member`` for ``task``: None, or its failure (logged when ``report``)."""
    try:
        await member._member_release(task)
    except (LockError, RedisError, OSError) as exc:
        if report:
            log.warning("aiolock: giving back %r failed: %r", member.name, exc)
        return exc
    return None
