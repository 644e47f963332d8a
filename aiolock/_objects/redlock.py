"""The RedLock: a majority of locks on independent servers (the Redlock algorithm).

What it shares with the MultiLock (members, order, taking and giving back at once) is
``multilock.Composite``; this module holds what differs: the quorum, each member's share
of the time left, the clock-drift allowance, and a server down counted as a member not
taken.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import RedisError

from .._exceptions import LockLostError
from .handle import LockHandle
from .members import UNBOUNDED_CALL, try_member
from .multilock import MIN_CALL, Composite, Left

__all__ = ("RedLock",)

log = logging.getLogger("aiolock")

# RedLock's allowance for clock drift between the servers: 1 % of the lease plus 2 ms,
# as the Redlock algorithm suggests.
_DRIFT_FACTOR = 0.01
_DRIFT_MS = 2


class RedLock(Composite):
    """A majority of locks on independent servers: ``aiolock.RedLock(lock_1, lock_2, lock_3)``.

    The Redlock algorithm: the calling task tries each member within the time left; the
    RedLock is held once a majority (n // 2 + 1) is, provided that, with an explicit lease,
    the time taken plus a clock-drift allowance (1 % of the lease + 2 ms) is shorter than
    the lease. Every member is tried at once; if fewer than a majority were free, the
    members not free are waited for one after another in a fixed order (as a MultiLock
    does, so that two tasks never wait for each other's members in a circle), each for
    its share of the time left (of the wait and of the validity, split evenly among the
    members; 1.5 s when neither bounds it); the tries at once share the whole time left
    (side by side, a majority answers within one round trip). A member whose server
    fails, or does not answer within its time, counts as one not taken: its call is
    cancelled, and whatever it took is undone once the server answers. Without a
    majority, every member taken is given back and, within ``wait``, it tries again. The
    queries ask the members at once and count one that fails or does not answer within
    1.5 s as not held (the RedLock is held while a majority answers held, which returns
    as soon as it does); an unlock waits 1.5 s at most for a member, whose release then
    finishes in the background. The members should be locks of clients on independent
    servers (the same name on each); on one server a RedLock is just a slower lock.
    Redlock assumes a member's server never forgets a hold early: one restarted empty
    (no persistence) within a lease can grant its member again (see guarantees.md,
    restarts).
    """

    __slots__ = ()

    def __init__(self, *locks: LockHandle) -> None:
        super().__init__("RedLock", locks)

    @staticmethod
    def _quorum_of(count: int) -> int:
        return count // 2 + 1

    def _call_of(self, left: Left, *, at_once: bool) -> tuple[float | None, float | None]:
        if at_once:
            # The tries at once wait for no lock and run side by side: together they
            # take one round trip, the slowest majority's, so they share the whole time
            # left (as a MultiLock's do), not a 1/N slice each as if asked one after
            # another. A hung server still costs no more than the validity or the wait.
            if left.wait is None and left.valid is None:
                return 0.0, UNBOUNDED_CALL
            return super()._call_of(left, at_once=True)
        # In turn, each member gets an equal share of the time left (of the wait and of
        # the validity, whichever is shorter), so that one busy, slow or hung server does
        # not eat the time the others need: the Redlock algorithm's per-server timeout.
        # Each member in turn waits for its lock for its share.
        limits = [time / left.members for time in (left.wait, left.valid) if time is not None]
        share = min(limits) if limits else None
        if share is None:
            # Neither a wait nor a lease: no time runs out, but a hung server must not
            # hold the round up for good, nor a member held long keep the others from
            # being tried: Redisson's RedLock allows 1.5 s a member, as here.
            share = UNBOUNDED_CALL
        # Beyond its wait, a member's round trip gets the minimum any call needs.
        return share, share + MIN_CALL

    async def _take(
        self,
        member: LockHandle,
        wait: float | None,
        lease: float | None,
        *,
        timed: bool,
        task: asyncio.Task[Any] | None = None,
    ) -> bool:
        try:
            return await try_member(member, wait, lease, timed=timed, task=task)
        except (RedisError, OSError) as exc:
            # A server down is what a RedLock tolerates: the member is not taken. (Were
            # its acquire on its way when the connection failed, its client undoes it.)
            log.info("aiolock: RedLock %r: member %r failed: %r", self._name, member.name, exc)
            return False

    def _unanswered(self, member: LockHandle, error: BaseException) -> bool:
        # As when taking it: a server down is a member not held.
        if isinstance(error, (RedisError, OSError)):
            log.info("aiolock: %r: member %r failed: %r", self, member.name, error)
            return True
        return False

    def _budget(self, lease: float | None) -> float | None:
        if lease is None:
            return None
        return lease - (lease * _DRIFT_FACTOR + _DRIFT_MS / 1000)

    def _to_release(self) -> list[LockHandle]:
        # A minority may never have been taken (a server down): those this client does not
        # believe held are left alone, rather than sent an unlock a down server would make
        # it resend for a lease. (A hold it does not know of, an acquire whose answer was
        # lost, its client gives back by itself.)
        held = [member for member in self._members if _believed_held(member)]
        return held if len(held) >= self._quorum else self._members

    def _check_release(self, released: int, errors: list[BaseException]) -> None:
        # Only fewer than a majority released is a failure.
        if released >= self._quorum:
            return
        for error in errors:
            if isinstance(error, LockLostError):
                raise error
        if errors:
            raise errors[0]


def _believed_held(member: LockHandle) -> bool:
    """Whether this client believes the calling holder holds ``member`` (no round trip)."""
    record = member._record()
    return record is not None and record.count > 0
