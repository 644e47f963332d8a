"""A composite lock's members, asked at once: tries, queries and unlocks.

Each member's call runs in a task of its own that acts for the calling task (a lock
belongs to the task that took it: ``asking_for``), so that members on servers far apart
cost one round trip, not one each, and one member's frozen server costs a bound, not its
connection's timeout. Every task is waited for and every error read, whatever the
caller's cancel state: nothing is left running behind a call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from redis.exceptions import RedisError

from .._engine.holders import asking_for
from .._exceptions import LockError
from .handle import LockHandle

__all__ = (
    "QUERY_CALL",
    "UNBOUNDED_CALL",
    "T",
    "answers",
    "ask",
    "give_back",
    "settle",
    "took",
    "try_member",
    "within",
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


async def within(bound: float | None, call: Coroutine[Any, Any, bool]) -> bool:
    """``call``'s result, or False if it is still under way after ``bound`` seconds.

    Cut off, the member's call is cancelled: its engine undoes an acquire that landed
    (now, or once the server answers again), as for any cancelled call. An outer cancel
    still raises CancelledError.
    """
    if bound is None:
        return await call
    scope = asyncio.timeout(bound)
    try:
        async with scope:
            return await call
    except TimeoutError:
        if scope.expired():
            return False
        raise


async def ask(
    composite: object,
    members: list[LockHandle],
    query: Callable[[LockHandle], Coroutine[Any, Any, T]],
    decided: Callable[[list[T]], bool],
    unanswered: Callable[[LockHandle, BaseException], bool],
) -> list[T]:
    """The answers of the members that answer ``query`` within ``QUERY_CALL``.

    Asked at once, each in a task of its own that asks about the calling task's holds
    (``asking_for``), so that one member's frozen server costs the bound, not its
    connection's timeout; the rest are no longer waited for once ``decided(answers)``.
    A member that does not answer in time counts as one that is not held (its query,
    read-only, is cancelled); a member whose server fails too, for a RedLock (a
    MultiLock raises the error). An outer cancel raises CancelledError.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")
    with asking_for(task):
        asking = [asyncio.create_task(query(member)) for member in members]
    pending = set(asking)
    scope = asyncio.timeout(QUERY_CALL)
    try:
        async with scope:
            while pending and not decided(answers(asking)):
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        if not scope.expired():
            raise
    finally:
        for asked in pending:
            asked.cancel()
        if pending:
            # Read-only queries, cancelled: they end at once (no need to wait out a
            # server); waited for so that none is left behind or its error unread.
            await asyncio.wait(pending)
    raised: BaseException | None = None
    for member, asked in zip(members, asking, strict=True):
        if asked.cancelled():
            log.info("aiolock: %r: member %r did not answer in time", composite, member.name)
            continue
        # Every task's error is read, the ones after the first raised included: an
        # error never read is logged ("Task exception was never retrieved") when the
        # task is collected, wherever that happens.
        error = asked.exception()
        if error is not None and raised is None and not unanswered(member, error):
            raised = error
    if raised is not None:
        raise raised
    return answers(asking)


async def try_member(
    member: LockHandle, wait: float | None, lease: float | None, *, timed: bool
) -> bool:
    """``member.try_lock(wait, lease)`` (checked already), timed for a guarded hold."""
    return await member._acquire(wait, lease, timed=timed)


def took(tried: asyncio.Task[bool]) -> bool:
    """Whether the try ``tried`` has ended with its member taken."""
    return tried.done() and not tried.cancelled() and tried.exception() is None and tried.result()


def answers(asking: list[asyncio.Task[T]]) -> list[T]:
    """The answers of the queries in ``asking`` that returned one."""
    return [
        asked.result()
        for asked in asking
        if asked.done() and not asked.cancelled() and asked.exception() is None
    ]


async def give_back(members: list[LockHandle], *, report: bool = True) -> list[BaseException]:
    """Unlock ``members`` at once for the calling task; return the failures.

    Each in a task of its own that releases the calling task's hold (``asking_for``), so
    that members on servers far apart cost one round trip, not one each. Every one is
    made even if some fail or the caller is cancelled meanwhile: a cancel does not reach
    them, and the call raises it once they have ended, so that what it leaves is what
    they left. An unlock still unanswered after ``QUERY_CALL`` is cut off and finishes in
    the background (its client resends it until the server answers; its renewal, frozen
    with the server, lets the lease end meanwhile): not a failure, the release is under
    way. Failures are logged when ``report``.
    """
    if not members:
        return []
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")
    # Told by each unlock as it ends, in its own last step, so that this task runs in the
    # loop's next pass (waiting for the tasks themselves would cost it one pass more).
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[None] = loop.create_future()
    under_way = [len(members)]

    def ended() -> None:
        under_way[0] -= 1
        if not under_way[0] and not settled.done():
            settled.set_result(None)

    with asking_for(task):
        unlocks = [asyncio.create_task(_unlock(member, ended, report=report)) for member in members]
    for unlocking in unlocks:
        # The loop holds tasks weakly: an unlock outlives a caller cancelled and gone.
        _UNLOCKING.add(unlocking)
        unlocking.add_done_callback(_UNLOCKING.discard)
    # One deadline for all of them (they start together), not a timeout scope in each.
    deadline = loop.time() + QUERY_CALL
    timer = loop.call_at(deadline, settle, settled)
    cancelled: asyncio.CancelledError | None = None
    try:
        await settled
    except asyncio.CancelledError as exc:
        cancelled = exc  # not passed on to the unlocks: they are waited for below
    finally:
        timer.cancel()
    # Those still under way: past the deadline, or this task was cancelled meanwhile.
    pending = {unlocking for unlocking in unlocks if not unlocking.done()}
    while pending:
        try:
            left = deadline - loop.time()
            if left <= 0:
                for unlocking in pending:
                    unlocking.cancel()
                await asyncio.wait(pending)
                break
            _, pending = await asyncio.wait(pending, timeout=left)
        except asyncio.CancelledError as exc:
            cancelled = exc
    errors = _failures(members, unlocks)
    if cancelled is not None:
        raise cancelled
    return errors


def _failures(
    members: list[LockHandle], unlocks: list[asyncio.Task[BaseException | None]]
) -> list[BaseException]:
    """The failures of the ended ``unlocks`` (of ``members``); those cut off are logged.

    Every result is read (an error never read is logged when the task is collected); an
    error no member unlock expects is raised, as it was when unlocked in turn.
    """
    errors = []
    for member, unlocking in zip(members, unlocks, strict=True):
        if unlocking.cancelled():
            log.warning(
                "aiolock: unlocking %r got no answer within %g s: it finishes in the background",
                member.name,
                QUERY_CALL,
            )
        elif (error := unlocking.result()) is not None:
            errors.append(error)
    return errors


#: Member unlocks under way (``_give_back``), referenced until they end.
_UNLOCKING: set[asyncio.Task[BaseException | None]] = set()


async def _unlock(
    member: LockHandle, ended: Callable[[], None], *, report: bool
) -> BaseException | None:
    """Unlock ``member``: None, or its failure (logged when ``report``); then ``ended()``."""
    try:
        await member.unlock()
    except (LockError, RedisError, OSError) as exc:
        if report:
            log.warning("aiolock: giving back %r failed: %r", member.name, exc)
        return exc
    finally:
        ended()
    return None


def settle(settled: asyncio.Future[None]) -> None:
    """A deadline is up: what waits on ``settled`` goes on with what has ended."""
    if not settled.done():
        settled.set_result(None)
