"""One attempt at a lock: its script run in the holder's turn, and its undoing.

The attempt targets the count this client believes the holder has plus one, so a resend that
finds it there already does not count twice; a stale belief is corrected from the server's
answer and reported (``_resync``). An attempt cut off in flight (a cancel, no answer, a
refusal past the retries) or answered after a cancel is rolled back in the background, in
the holder's turn, by its target and tombstone: a cancelled acquire never keeps a hold.
A waiter that gives up leaves the primitive's queue (a fair lock's) the same way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, NoReturn

from redis.exceptions import ResponseError

from .._exceptions import ClientClosedError, LockError, LockUpgradeError, ReplicaAckError
from .._keys import acquire_tombstone_key
from .cancel import cancel_requested
from .core import Part
from .failures import Failure, failure
from .ordering import in_turn
from .primitive import Call
from .replies import AcquireReply, script_error

if TYPE_CHECKING:
    from .holds import Expiry, Hold
    from .ordering import Ticket
    from .primitive import Invocation, Primitive

__all__ = ("Attempts",)

log = logging.getLogger("aiolock")

# The longest pause between two sends of an acquire that the server refused for a state
# that passes (a slot migration, a cluster restart): Redisson resends TRYAGAIN 1 s apart.
_BACKOFF_CAP = 1.0


class Attempts(Part):
    """The acquire script's runs and their rollbacks, for the acquire paths."""

    async def attempt(self, p: Primitive, call: Call) -> AcquireReply:
        """Run the acquire script once, in the holder's turn, and record a hold it took."""
        restarts = self._s.restarts
        if restarts is not None and (left := await restarts.left_ms(p.key)):
            # Strict restarts: the server came up too recently for the holds it forgot to
            # have ended. Not taken; the call waits that long as for a held lock.
            return AcquireReply(acquired=False, ttl_ms=left)
        ticket = self._s.order.join((p.key, call.holder))
        # An earlier call of this holder (a rollback or release finishing in the
        # background, another task's call with the same owner=) must land first: this
        # attempt's target count depends on its outcome.
        if not ticket.ready:  # spares a coroutine when the turn is free
            await _wait_turn(ticket)
        self._in_turn(p, call, ticket)
        runner = self._s.runner
        while True:
            hold = self._s.holds.get(p.key, call.field)
            # The count this holder has once the attempt succeeds: a resend that finds it
            # already there does not count twice, and a rollback undoes exactly this
            # attempt (a script takes a hold only from the count the holder believes).
            # A hold known lost counts for nothing: the server no longer has it.
            target = (hold.count if hold and hold.lost is None else 0) + 1
            tombstone = acquire_tombstone_key(p.key, self._core.request_id())
            sent, pending = _send_time(call, hold)
            invocation = p.acquire(call, target, tombstone)
            # Sent here, its reply's future awaited here (no coroutine of the runner's or
            # of _sent's per attempt); a failed send is taken up by _resent.
            reply_of = None if runner.acks else runner.send(*invocation)
            try:
                try:
                    raw, acked = (
                        (await reply_of, None)
                        if reply_of is not None
                        else await self._sent(call, invocation)
                    )
                except Exception as exc:
                    if reply_of is None:
                        raise
                    raw, acked = await self._resent(call, invocation, exc)
                reply = AcquireReply.decode(raw)
            except BaseException as exc:
                _unsettled(pending)
                error = self._unanswered(p, call, exc, ticket, target=target, tombstone=tombstone)
                if error is not None:
                    raise error from exc
                raise
            short = reply.acquired and acked is not None and acked < self.settings.replica_acks
            if not reply.acquired or reply.stale or short:
                _unsettled(pending)
                pending = None
            if short:
                # Taken on a primary whose replicas may not have it: a failover now could
                # lose it unnoticed. Give it back (in turn, to the end even if the caller
                # is cancelled meanwhile), then say so.
                giving_back = self._undo(p, call, reply.count, tombstone)
                await self._s.background.shielded(in_turn(ticket, giving_back))
                raise ReplicaAckError(
                    p.name,
                    acked or 0,
                    self.settings.replica_acks,
                    self.settings.replica_ack_timeout,
                )
            if not reply.stale or cancel_requested(call.caller, call.mark) or self._core.closed:
                break
            self._after_stale(p, call, reply.count, ticket)
        caller = call.caller
        # cancel_requested(), inline: asked on every attempt.
        if self._core.closed or (caller is not None and caller.cancelling() > call.mark):
            _unsettled(pending)
            self._cut_short(p, call, reply, ticket, target=target, tombstone=tombstone)
        if reply.acquired:
            self._won_in_turn(p, call, reply, ticket, tombstone, sent=sent, pending=pending)
            return reply
        ticket.release()
        return reply

    def _in_turn(self, p: Primitive, call: Call, ticket: Ticket) -> None:
        """What is checked once the holder's turn came (its end on an error)."""
        try:
            # Closed meanwhile? (The process and loop were checked as the call started:
            # the same task cannot have moved since.)
            self._core.check_not_closed()
            # The holder's calls before this one may have changed what it holds (a write
            # unlock of the same owner=, say): judge the upgrade rule again, in turn.
            p.check_acquire(call.holder, self._s.holds)
        except BaseException:
            ticket.release()
            raise

    def _unanswered(
        self,
        p: Primitive,
        call: Call,
        exc: BaseException,
        ticket: Ticket,
        *,
        target: int,
        tombstone: str,
    ) -> Exception | None:
        """The attempt's script raised ``exc``: what to raise instead (None: ``exc``)."""
        kind = failure(exc)
        if kind is Failure.LOGIN_REFUSED:
            ticket.release()
            return None
        if kind is Failure.FAILED and isinstance(exc, ResponseError):
            # The script failed before it changed anything: nothing to roll back.
            ticket.release()
            return script_error(p.name, p.key, exc)
        # Cancelled (or cut off) with the script in flight: it may have taken a hold that
        # nobody will ever release. Give it back in the background, in this holder's turn;
        # were the server unreachable until the lease ends, that hold ends with it. So too
        # when the server refused it past the retries (TRYAGAIN, OOM...): an earlier send
        # that timed out may have run.
        self._undo_later(p, ticket, call, target, tombstone)
        return None

    def _cut_short(
        self,
        p: Primitive,
        call: Call,
        reply: AcquireReply,
        ticket: Ticket,
        *,
        target: int,
        tombstone: str,
    ) -> NoReturn:
        """Never return a hold, nor go on to wait: the caller was cancelled, or the client closed.

        A cancel swallowed below aiolock, or aclose() while the script was in flight. Undo
        what the script did: give a hold back, or void the call and leave a fair queue.
        """
        undo = reply.count if reply.acquired else target
        self._undo_later(p, ticket, call, undo, tombstone)
        if self._core.closed:
            raise ClientClosedError
        raise asyncio.CancelledError

    def _won_in_turn(
        self,
        p: Primitive,
        call: Call,
        reply: AcquireReply,
        ticket: Ticket,
        tombstone: str,
        *,
        sent: float | None,
        pending: tuple[Hold, Expiry] | None,
    ) -> None:
        """Record the hold an attempt took, and end the holder's turn."""
        if call.receipt is not None and reply.token is None:
            # A fenced acquisition always takes a token: one answered without any (its
            # counter deleted by hand between a send and its resend) is given back, in
            # turn, and never returned as held.
            _unsettled(pending)
            self._undo_later(p, ticket, call, reply.count, tombstone)
            raise LockError(f"lock {p.name!r}: the server took the hold but gave no token")
        try:
            expiry = None if pending is None else pending[1]
            self._core.won(p, call, reply.count, token=reply.token, sent=sent, expiry=expiry)
        finally:
            ticket.release()

    async def _resent(
        self, call: Call, invocation: Invocation, exc: Exception
    ) -> tuple[Any, int | None]:
        """After a first send (``runner.send``) whose reply raised ``exc``.

        The runner's own retries (``rerun``: NOSCRIPT, a redirect, a lost connection),
        then _sent's resends while the server refuses it for a passing state.
        """
        runner = self._s.runner
        try:
            return await runner.rerun(exc, *invocation), None
        except Exception as again:
            if call.wait == 0 or not runner.passing(again):
                raise
            return await self._sent(call, invocation, again)

    async def _sent(
        self, call: Call, invocation: Invocation, refusal: Exception | None = None
    ) -> tuple[Any, int | None]:
        """Run an acquire script; resend it while the server refuses it for a passing state.

        The states: TRYAGAIN in a slot migration, CLUSTERDOWN in a restart, MASTERDOWN,
        LOADING, BUSY. Resent with a growing pause, within the call's wait (forever with
        none). A call that does not wait (``wait=0``) gets the refusal after the client's own
        retries. Each resend is the same command: it counts once whatever an earlier send
        did (the target count), and its tombstone voids it all for a rollback.
        ``refusal``: the first send's (made by the caller), to pause after before resending.
        """
        runner = self._s.runner
        pause = None  # looked up at the first refusal: the plain path spares it
        while True:
            if refusal is None:
                try:
                    return await runner.run_acked(*invocation)
                except Exception as exc:
                    if call.wait == 0 or not runner.passing(exc):
                        raise
                    refusal = exc
            if pause is None:
                pause = self.settings.retry_interval
            sleep = pause
            if call.deadline is not None:
                sleep = min(sleep, call.deadline - asyncio.get_running_loop().time())
                if sleep <= 0:
                    raise refusal
            log.debug("aiolock: acquire refused (%r); sent again in %.2f s", refusal, sleep)
            refusal = None
            await asyncio.sleep(sleep)
            self._core.check_open()
            pause = min(max(pause, 0.01) * 2, _BACKOFF_CAP)

    def _after_stale(self, p: Primitive, call: Call, count: int, ticket: Ticket) -> None:
        """Believe the server's count of the holder's holds after a stale reply.

        The count was not what this client believed: a hold lost unnoticed (force_unlock,
        expiry). The attempt is made again unless it is now an upgrade (a write hold lost
        beside read holds): that is refused, never left to wait for the holder's own read
        holds.
        """
        self._resync(p, call, count)
        try:
            p.check_acquire(call.holder, self._s.holds)
        except LockUpgradeError:
            ticket.release()
            raise

    def _resync(self, p: Primitive, call: Call, count: int) -> None:
        """Make this client's belief the server's ``count`` of the holder's holds."""
        hold = self._s.holds.get(p.key, call.field)
        believed = hold.count if hold else 0
        if hold is not None and hold.count and hold.lost is None:
            # Lost without the watchdog noticing yet: report it now, once. The hold stays,
            # known lost, so that the holder's next unlock() raises LockLostError.
            self._s.holds.report_lost(
                hold, f"the server had {count} of its {believed} hold(s); found by lock()", "lock"
            )
        if count:
            if hold is not None:
                self._s.holds.drop(hold)
            # Holds of this holder that it does not know of (a release that never got an
            # answer): count them, never renew them; they expire with their lease.
            log.warning(
                "aiolock: %s has %d hold(s) on lock %r it did not know of; they are counted "
                "and expire with their lease",
                call.holder,
                count,
                p.name,
            )
            self._core.won(p, call, count, lease_ms=self.settings.lease_ms, announce=False)

    def _undo_later(
        self, p: Primitive, ticket: Ticket, call: Call, target: int, tombstone: str
    ) -> None:
        self._s.background.complete(ticket, self._undo(p, call, target, tombstone))

    async def _undo(self, p: Primitive, call: Call, target: int, tombstone: str) -> None:
        """Roll back an attempt of ``call`` (by its ``target`` count and tombstone)."""

        async def undo() -> None:
            # Built in turn: the lease it re-applies depends on the holds left by then.
            hold = self._s.holds.get(p.key, call.field)
            reapply = hold.reapply_ms(self.settings.lease_ms) if hold else self.settings.lease_ms
            # Holds left get that lease again, perhaps shorter than the one a guarded hold
            # has confirmed: bracketed (whether it re-applied is not told: never raised).
            expiry = (
                hold.expiry_sent(asyncio.get_running_loop().time() + reapply / 1000)
                if hold is not None and hold.guards
                else None
            )
            try:
                await self._s.runner.run(*p.rollback(call, target, tombstone, reapply))
            finally:
                if expiry is not None:
                    assert hold is not None
                    hold.expiry_settled(expiry, applied=False)

        await self._core.until_answered(f"undo an acquire of lock {p.name!r}", undo, call.lease_ms)

    async def give_up(self, p: Primitive, call: Call) -> None:
        """The call's wait ran out: leave the queue if it has one, then return False."""
        if p.leaves_queue and not self._s.waiting.field_waiting(p.key, call.field) > 1:
            ticket = self._s.order.join((p.key, call.holder))
            await self._s.background.shielded(in_turn(ticket, self.leave(p, call)))
        if cancel_requested(call.caller, call.mark):
            raise asyncio.CancelledError

    async def leave(self, p: Primitive, call: Call) -> None:
        leave = p.leave(call)
        if leave is None:
            return
        invocation, lives_ms = leave
        # Left in the queue, the entry would hold up everyone behind it until it times
        # out: resend through connection errors (leaving twice removes nothing more).
        await self._core.until_answered(
            f"take a waiter of lock {p.name!r} out of its queue",
            lambda: self._s.runner.run(*invocation),
            lives_ms,
        )


async def _wait_turn(ticket: Ticket) -> None:
    """Wait for the holder's turn; cancelled meanwhile, its turn ends unused."""
    try:
        await ticket.wait()
    except BaseException:
        ticket.release()
        raise


def _send_time(call: Call, hold: Hold | None) -> tuple[float | None, tuple[Hold, Expiry] | None]:
    """An attempt's send time, where a guarded hold relies on it, and its expiry ticket.

    The lease runs at least until the send time plus the lease (the guard's confirmation):
    taken before the call, which may queue for a connection. Only where a guarded hold
    relies on it: a plain lock() spares itself the clock. A re-entry of a guarded hold
    may set a shorter lease than the one confirmed: its expiry is bracketed
    (``holds.Hold.expiry_sent``).
    """
    if not call.timed and (hold is None or not hold.guards):
        return None, None
    sent = asyncio.get_running_loop().time()
    if hold is None:
        return sent, None
    return sent, (hold, hold.expiry_sent(sent + call.lease_ms / 1000))


def _unsettled(pending: tuple[Hold, Expiry] | None) -> None:
    """An attempt's expiry ticket, settled without an answer that it applied."""
    if pending is not None:
        hold, expiry = pending
        hold.expiry_settled(expiry, applied=False)
