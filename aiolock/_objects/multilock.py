"""Locks over several locks: the MultiLock (all of them) and the RedLock (a majority).

Client-side only, as in Redisson: each member keeps its own keys, channel, waiters and
watchdog, and nothing of the composite is stored. The members are asked at once, each
call in a task of its own acting for the calling task, which holds them
(``members.AtOnce``), so that members on servers far apart cost one round trip, not one
each (Redisson takes them one after another). A composite waits for a member only in an
order every process agrees on (by name and lock type, then full key, server and owner:
``_place``), holding none after it, so two composites over the same locks never wait for
each other in a circle (Redisson takes them as listed: its issues #1160 and #467).
An unlock, and a failed attempt's give back, release the members at once too. What
Redisson gets wrong and these do not: a failed or cancelled attempt gives back every
member it took, an unlock tries every member even when one fails (the sync MultiLock
unlock stops at the first failure), and a lease is used as given, never converted again
on each retry (Redisson's MultiLock multiplies it by 1000 per cycle).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from .._config import TimeArg
from .._engine.cancel import within
from .._engine.guard import Guarding, guarded_hold
from .._exceptions import LockError
from .handle import Acquirable, LockHandle, LockStatistics, extend_seconds
from .members import (
    QUERY_CALL,
    AtOnce,
    T,
    ask,
    failed,
    give_back,
    held_by,
    hold_count_of,
    took,
    try_member,
)

__all__ = ("MIN_CALL", "Composite", "Left", "MultiLock")

log = logging.getLogger("aiolock")

# The longest pause between two rounds of taking the members (seconds).
_RETRY_PAUSE = 0.05
# The least time a member's call is given, whatever is left of the wait or the validity
# (seconds): one round trip on a loaded machine, so that a member that answers is not cut
# off for want of time, while a hung server costs no more than that.
MIN_CALL = 0.25


@dataclass(frozen=True, slots=True)
class Left:
    """The time left while taking the members.

    Of the wait and of the validity (None: no bound), and how many members share it (a
    RedLock member waits for its lock a share of the time, as Redisson's does).
    """

    wait: float | None
    valid: float | None
    members: int


class Composite(Acquirable):
    """What the MultiLock and the RedLock share: members, order, taking and giving back."""

    __slots__ = ("_members", "_name", "_quorum")

    def __init__(self, kind: str, locks: tuple[object, ...]) -> None:
        if not locks:
            raise ValueError(f"{kind} needs at least one lock")
        seen: set[tuple[str, str, str, str | None]] = set()
        for lock in locks:
            if not isinstance(lock, LockHandle):
                raise TypeError(f"{kind} members must be lock handles, not {type(lock).__name__}")
            identity = (lock.client_id, type(lock).__name__, lock.name, lock.owner)
            if identity in seen:
                raise ValueError(f"{kind} got the lock {lock.name!r} twice")
            seen.add(identity)
        members = [lock for lock in locks if isinstance(lock, LockHandle)]
        self._name = "+".join(member.name for member in members)
        self._members = sorted(members, key=_place)
        self._quorum = self._quorum_of(len(members))

    @staticmethod
    def _quorum_of(count: int) -> int:
        return count

    @property
    def name(self) -> str:
        """The members' names joined by ``+``, as given."""
        return self._name

    def __repr__(self) -> str:
        return f"<aiolock.{type(self).__name__} {self._name!r}>"

    # -- acquiring ------------------------------------------------------------------------

    async def _acquire(
        self, wait: float | None, lease: float | None, *, timed: bool = False
    ) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if wait is None else loop.time() + wait
        budget = self._budget(lease)
        while True:
            started = loop.time()
            taken = await self._round(deadline, budget, started, lease, timed=timed)
            if len(taken) >= self._quorum and self._valid(budget, loop.time() - started):
                return True
            await give_back(taken)
            # Too few, or taken too slowly to be valid: again, while time is left, after a
            # short random pause so that rivals that failed together do not collide again.
            pause = random.uniform(0, _RETRY_PAUSE)  # noqa: S311 - jitter, not secrecy
            if deadline is not None:
                left = deadline - loop.time()
                if wait == 0 or left <= 0:
                    return False
                pause = min(pause, left)
            await asyncio.sleep(pause)

    def _left(self, deadline: float | None, budget: float | None, started: float) -> Left:
        """The time left now of the wait (to ``deadline``) and of the validity."""
        now = asyncio.get_running_loop().time()
        return Left(
            wait=None if deadline is None else max(0.0, deadline - now),
            valid=None if budget is None else max(0.0, budget - (now - started)),
            members=len(self._members),
        )

    async def _round(
        self,
        deadline: float | None,
        budget: float | None,
        started: float,
        lease: float | None,
        *,
        timed: bool,
    ) -> list[LockHandle]:
        """One round of taking the members: those taken (on a failure or cancel: none).

        On a member's error or a cancel, what was taken is given back and it is raised.

        Every member is tried at once without waiting for it (the usual case: one round
        trip; a RedLock's tries stop once the quorum is out of reach). Then, unless enough
        were free, from the first one not free (in the fixed order), one after another,
        waiting for each: a task waits for a member only while it holds none after it, so
        two composites over the same locks never wait for each other in a circle (were a
        RedLock's members waited for at once, two tasks each holding one could wait for
        the other's for good: neither a wait nor a lease bounds lock()). The MultiLock
        stops at the first member it cannot take; the RedLock goes on to the next while
        the quorum can still be reached, and stops once it is.
        """
        members, quorum = self._members, self._quorum
        left = self._left(deadline, budget, started)
        done = await self._at_once(left, lease, timed=timed)
        if len(done) >= quorum or left.wait == 0:
            return done
        # The members taken before the first one not free are kept; those after it are
        # given back, so that this task holds none after a member it waits for.
        kept = 0
        while kept < len(members) and members[kept] in done:
            kept += 1
        taken = members[:kept]
        await give_back([m for m in done if m not in taken])
        try:
            for index in range(kept, len(members)):
                if len(taken) >= quorum or len(taken) + len(members) - index < quorum:
                    break
                member = members[index]
                wait, bound = self._call_of(self._left(deadline, budget, started), at_once=False)
                if await within(bound, self._take(member, wait, lease, timed=timed)):
                    taken.append(member)
                elif quorum == len(members):
                    break  # a MultiLock needs every member
        except BaseException:
            await give_back(taken)
            raise
        return taken

    async def _at_once(self, left: Left, lease: float | None, *, timed: bool) -> list[LockHandle]:
        """Try every member at once for the calling task, waiting for none: those taken.

        At once (``members.AtOnce``), each try ends by the round's
        bound (one deadline for them all, not a timeout scope in each). The tries still
        under way once the quorum is out of reach (more members not taken than a RedLock
        allows) are cancelled: their engines undo what they took. On a member's error or
        an outer cancel, every try is cancelled and run to its end, every member taken is
        given back, and the error (the cancel first) is raised.
        """
        members = self._members
        allowed = len(members) - self._quorum  # members not taken a RedLock can do without
        wait, bound = self._call_of(left, at_once=True)
        caller = asyncio.current_task()
        tries = AtOnce(
            self._take(member, wait, lease, timed=timed, task=caller) for member in members
        )

        def settled() -> bool:
            """One try has raised, or the quorum is out of reach."""
            missed = 0
            for tried in tries.tasks:
                if tried.done():
                    if tried.cancelled() or tried.exception() is not None:
                        return True
                    missed += not tried.result()
            return 0 < allowed < missed

        deadline = None if bound is None else asyncio.get_running_loop().time() + bound
        cancelled: asyncio.CancelledError | None = None
        try:
            await tries.wait(settled, deadline)
        except asyncio.CancelledError as exc:
            cancelled = exc
        # The tries still under way are cut off (the bound) or not needed: not taken. A
        # try cancelled ends soon: its engine undoes what landed, or will once its server
        # answers. Run to its end even through another cancel, so that a member it took
        # before the cancel reached it is known, and given back.
        tries.cancel_running()
        cancelled = await tries.finish() or cancelled
        error = next((error for t in tries.tasks if (error := failed(t)) is not None), None)
        taken = [member for member, t in zip(members, tries.tasks, strict=True) if took(t)]
        if cancelled is not None or error is not None:
            await give_back(taken)
            raise cancelled if cancelled is not None else error  # type: ignore[misc]
        return taken

    def _call_of(self, left: Left, *, at_once: bool) -> tuple[float | None, float | None]:
        """A member's call in a round with the time ``left``: (its wait, its bound).

        The wait is how long the member waits for its lock (``at_once``: the try of every
        member at once, which waits for no lock; else, in turn, as long as the wait has
        left). The bound is how long the call as a whole may last, round trips included
        (None: no bound): shortly after the wait, or when the validity runs out, so that
        a hung server cannot hold the MultiLock past either. A call cut off counts as not
        taken.
        """
        bound = None if left.wait is None else left.wait + MIN_CALL
        if left.valid is not None:
            valid = max(left.valid, MIN_CALL)
            bound = valid if bound is None else min(bound, valid)
        return (0.0 if at_once else left.wait), bound

    async def _take(
        self,
        member: LockHandle,
        wait: float | None,
        lease: float | None,
        *,
        timed: bool,
        task: asyncio.Task[Any] | None = None,
    ) -> bool:
        """Take one member, waiting ``wait`` for it (its caller bounds the call).

        A connection error is raised (see RedLock).
        """
        return await try_member(member, wait, lease, timed=timed, task=task)

    def _budget(self, lease: float | None) -> float | None:
        """How long taking the members may last with ``lease`` (None: any time)."""
        return lease

    @staticmethod
    def _valid(budget: float | None, took: float) -> bool:
        """Whether members taken over ``took`` seconds (of ``budget``) are all still held."""
        return budget is None or took < budget

    # -- guarded holds --------------------------------------------------------------------

    async def _guard_acquire(self, wait: float | None, lease: float | None) -> Guarding | None:
        if not await self._acquire(wait, lease, timed=True):
            return None
        # Lost once fewer than the quorum of members remain held (a MultiLock: any one
        # lost; a RedLock: fewer than a majority); confirmed until the quorum-th latest
        # member confirmation. Members on several clients: each client's guard watches it.
        records = [member._record() for member in self._members]
        return guarded_hold(
            [r if r is not None and r.count and r.lost is None else None for r in records],
            need=self._quorum,
            leases=[lease] * len(records),
            guards=[member._member_guard() for member in self._members],
        )

    def _guard_release_soon(self) -> None:
        for member in self._to_release():
            if member._record() is not None:
                member._guard_release_soon()

    def _guard_holder(self) -> str:
        return self._members[0]._guard_holder()

    # -- releasing ------------------------------------------------------------------------

    def _to_release(self) -> list[LockHandle]:
        """The members an unlock releases: all of them (one not held raises)."""
        return self._members

    async def unlock(self) -> None:
        """Release every member, each tried even when another fails.

        Then the first failure is raised: LockNotOwnedError if a member was not held,
        LockLostError if one was lost (a RedLock raises only when fewer than a majority
        were released).
        """
        members = self._to_release()
        errors = await give_back(members, report=False)
        self._check_release(len(members) - len(errors), errors)

    def _check_release(self, released: int, errors: list[BaseException]) -> None:
        if errors:
            raise errors[0]

    async def extend(self, lease: TimeArg) -> None:
        """Extend every member held (a RedLock: a majority must confirm) to ``lease`` s.

        Each member is tried even when another fails, each for 1.5 s at most (an extend
        cut off only moved an expiry, or did nothing); then, as for unlock(), the first
        failure is raised (a RedLock raises only when fewer than a majority confirmed).
        """
        seconds = extend_seconds(lease)
        members = self._to_release()
        errors: list[BaseException] = []
        for member in members:
            scope = asyncio.timeout(QUERY_CALL)
            try:
                async with scope:
                    await member.extend(seconds)
            except TimeoutError as exc:
                log.warning("aiolock: %r: extending member %r failed: %r", self, member.name, exc)
                errors.append(exc)
            except (LockError, RedisError, OSError) as exc:
                errors.append(exc)
        self._check_release(len(members) - len(errors), errors)

    async def force_unlock(self) -> bool:
        """Delete every member whoever holds it; True if any was held."""
        deleted = False
        for member in self._members:
            deleted = await member.force_unlock() or deleted
        return deleted

    # -- queries --------------------------------------------------------------------------

    async def _ask(
        self,
        query: Callable[[LockHandle, asyncio.Task[Any]], Coroutine[Any, Any, T]],
        decided: Callable[[list[T]], bool] = lambda answers: False,
    ) -> list[T]:
        """The members' answers to ``query`` (``members.ask``)."""
        return await ask(self, self._members, query, decided, self._unanswered)

    def _unanswered(self, member: LockHandle, error: BaseException) -> bool:
        """Whether a member whose query failed with ``error`` counts as not held.

        Otherwise the error is raised: a MultiLock needs every member, so it raises.
        """
        return False

    def _enough(self, flags: list[bool]) -> bool:
        return sum(flags) >= self._quorum

    def _settled(self, flags: list[bool]) -> bool:
        """Whether ``flags`` so far decide ``_enough`` whatever the others answer."""
        return self._enough(flags) or len(self._members) - sum(not f for f in flags) < self._quorum

    async def is_locked(self) -> bool:
        """Whether enough members are held (all for a MultiLock, a majority for a RedLock).

        A member that does not answer within 1.5 s counts as not held: the answer says
        what the servers confirm, and comes within that bound even with one frozen.
        """
        return self._enough(await self._ask(_is_locked, self._settled))

    async def is_held_by_current_task(self) -> bool:
        """Whether the calling task (or owner=) holds enough members.

        A member that does not answer within 1.5 s counts as not held, so an answer of
        True is one the servers confirmed: a MultiLock with a member's server frozen is
        not held, a RedLock is while a majority answers held.
        """
        return self._enough(await self._ask(held_by, self._settled))

    async def hold_count(self) -> int:
        """How many times the calling holder holds it: the count enough members reach.

        A member that does not answer within 1.5 s counts as 0 (so a MultiLock with one
        unanswered member reports 0).
        """
        counts = await self._ask(hold_count_of)
        counts += [0] * (len(self._members) - len(counts))
        return sorted(counts, reverse=True)[self._quorum - 1]

    async def remaining_lease(self) -> float | None:
        """The shortest lease left among the members held; None if none has a lease.

        Members that do not answer within 1.5 s are left out, as members not held.
        """
        leases = [lease for lease in await self._ask(_remaining_lease) if lease]
        return min(leases) if leases else None

    def statistics(self) -> LockStatistics:
        """What this client knows locally: the members' beliefs, as for ``hold_count``."""
        members = [member.statistics() for member in self._members]
        counts = sorted((m.hold_count for m in members), reverse=True)
        count = counts[self._quorum - 1]
        return LockStatistics(
            name=self._name,
            held_by_current_task=count > 0,
            hold_count=count,
            tasks_waiting=max(m.tasks_waiting for m in members),
        )


async def _is_locked(member: LockHandle, _task: asyncio.Task[Any]) -> bool:
    return await member.is_locked()


async def _remaining_lease(member: LockHandle, _task: asyncio.Task[Any]) -> float | None:
    return await member.remaining_lease()


def _place(member: LockHandle) -> tuple[str, str, str, str, str]:
    """A member's place in the order every process agrees on.

    By name and lock type first (the order of earlier releases, which it keeps wherever
    that was total), then by what tells apart members that share both: the full key
    (``key_prefix`` included), the server as the client's settings name it
    (``_timing.server_of``; processes must name a server alike, "localhost" and
    "127.0.0.1" count as one) and the owner. "As given" is no order processes agree on:
    two tasks listing the same name on two servers in opposite orders would each take
    one and wait for the other for good.
    """
    return (
        member.name,
        type(member).__name__,
        *member._member_place(),
        member.owner or "",
    )


class MultiLock(Composite):
    """All of several locks, or none: ``aiolock.MultiLock(lock_a, lock_b, ...)``.

    Members may be of any lock type and on different clients and servers. The calling task
    takes every member (in a fixed order, so that two MultiLocks over the same locks never
    deadlock); if one cannot be had within ``wait``, or the call is cancelled or fails, the
    members already taken are given back. With an explicit ``lease`` each member gets it;
    an acquisition that took longer than the lease (the first members may have expired) is
    given back and tried again within ``wait``. A member's server that does not answer
    holds the call no longer than the wait (plus 0.25 s) or the lease; a query no longer
    than 1.5 s (the member counts as not held: the MultiLock is not confirmed held, its
    hold count 0), an unlock 1.5 s for that member (its release then finishes in the
    background, once the server answers).
    """

    __slots__ = ()

    def __init__(self, *locks: LockHandle) -> None:
        super().__init__("MultiLock", locks)
