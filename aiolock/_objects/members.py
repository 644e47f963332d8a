"""A composite lock's members, asked at once: tries, queries and unlocks.

The members' calls run side by side in the calling task (``side_by_side``: a lock
belongs to the task that took it), so that members on servers far apart cost one round
trip, not one each, and one member's frozen server costs a bound, not its connection's
timeout. Every call is run to its end and its outcome read, whatever the caller's cancel
state: nothing is left running behind a call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from redis.exceptions import RedisError

from .._engine.acquire import acquire
from .._exceptions import LockError
from .handle import LockHandle
from .side_by_side import Side, SideBySide

__all__ = (
    "QUERY_CALL",
    "UNBOUNDED_CALL",
    "T",
    "answers",
    "ask",
    "give_back",
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


async def ask(
    composite: object,
    members: list[LockHandle],
    query: Callable[[LockHandle], Coroutine[Any, Any, T]],
    decided: Callable[[list[T]], bool],
    unanswered: Callable[[LockHandle, BaseException], bool],
) -> list[T]:
    """The answers of the members that answer ``query`` within ``QUERY_CALL``.

    Asked at once, side by side in the calling task (about its holds), so that one
    member's frozen server costs the bound, not its connection's timeout; the rest are
    no longer waited for once ``decided(answers)``. A member that does not answer in time
    counts as one that is not held (its query, read-only, is cancelled); a member whose
    server fails too, for a RedLock (a MultiLock raises the error). An outer cancel
    raises CancelledError.
    """
    _calling_task()
    asking = SideBySide(query(member) for member in members)
    deadline = asyncio.get_running_loop().time() + QUERY_CALL
    try:
        await asking.wait(lambda: decided(answers(asking.sides)), deadline)
    finally:
        # Read-only queries, cancelled: they end at once (no need to wait out a server).
        asking.cancel_running()
        cancelled = await asking.finish()
        if cancelled is not None:
            raise cancelled
    raised: BaseException | None = None
    for member, asked in zip(members, asking.sides, strict=True):
        if asked.cancelled():
            log.info("aiolock: %r: member %r did not answer in time", composite, member.name)
        elif asked.error is not None and raised is None and not unanswered(member, asked.error):
            raised = asked.error
    if raised is not None:
        raise raised
    return answers(asking.sides)


async def try_member(
    member: LockHandle, wait: float | None, lease: float | None, *, timed: bool
) -> bool:
    """``member.try_lock(wait, lease)`` (checked already), timed for a guarded hold.

    Straight to the engine, not bounded there: the composite bounds its members' calls
    itself (a timeout scope of the member's own would cancel the task every member runs
    in, side by side).
    """
    return await acquire(
        member._engine, member._primitive, member._owner, wait, lease, timed=timed, bounded=False
    )


def took(tried: Side[bool]) -> bool:
    """Whether the try ``tried`` has ended with its member taken."""
    return tried.returned() and bool(tried.value)


def answers(asking: list[Side[T]]) -> list[T]:
    """The answers of the queries in ``asking`` that returned one."""
    return [asked.value for asked in asking if asked.returned()]  # type: ignore[misc]


def _calling_task() -> None:
    """Refuse a call from outside a task: the members' holds are a task's."""
    if asyncio.current_task() is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")


async def give_back(members: list[LockHandle], *, report: bool = True) -> list[BaseException]:
    """Unlock ``members`` at once for the calling task; return the failures.

    Side by side in the calling task, so that members on servers far apart cost one round
    trip, not one each. Every one is made even if some fail or the caller is cancelled
    meanwhile: a cancel does not reach them, and the call raises it once they have ended,
    so that what it leaves is what they left. An unlock still unanswered after
    ``QUERY_CALL`` is cut off and finishes in the background (its client resends it until
    the server answers; its renewal, frozen with the server, lets the lease end
    meanwhile): not a failure, the release is under way. Failures are logged when
    ``report``.
    """
    if not members:
        return []
    _calling_task()
    unlocks = SideBySide(_unlock(member, report=report) for member in members)
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
    cut = [not unlocking.done for unlocking in unlocks.sides]
    unlocks.cancel_running()
    cancelled = await unlocks.finish() or cancelled
    errors = _failures(members, unlocks.sides, cut)
    if cancelled is not None:
        raise cancelled
    return errors


def _failures(
    members: list[LockHandle], unlocks: list[Side[BaseException | None]], cut: list[bool]
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
        elif unlocking.error is not None:
            raise unlocking.error
        elif unlocking.value is not None:
            errors.append(unlocking.value)
    return errors


async def _unlock(member: LockHandle, *, report: bool) -> BaseException | None:
    """Unlock ``member``: None, or its failure (logged when ``report``)."""
    try:
        await member.unlock()
    except (LockError, RedisError, OSError) as exc:
        if report:
            log.warning("aiolock: giving back %r failed: %r", member.name, exc)
        return exc
    return None
