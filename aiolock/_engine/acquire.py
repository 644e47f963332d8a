"""The acquire path of a lock: attempt, subscribe, wait, be woken or handed the lock.

* **attempt** (``attempt``): one run of the acquire script in the holder's turn. It targets
  the count this client believes the holder has plus one, so a resend that finds it there
  already does not count twice; a stale belief is corrected from the server's answer and
  reported (``_resync``). An attempt cut off in flight (a cancel, no answer, a refusal past
  the retries) or answered after a cancel is rolled back in the background, in the holder's
  turn, by its target and tombstone: a cancelled acquire never keeps a hold. A waiter that
  gives up leaves the primitive's queue (a fair lock's) the same way;
* **wait** (``acquire``): subscribe, register the waiter *before* the next attempt (a
  release published while it is in flight wakes it), wait bounded by the lease seen (a lost
  message costs latency, never liveness), try again; no barging past local waiters where
  the primitive asks; a waiter that leaves passes its turn to try on; a release of this
  client may hand the lock straight to a parked waiter (``release.py``'s hand-over);
* **deadline** and **cancellation**: a call that got a cancel request while it ran never
  returns normally (``cancel.py``); what its script may have done is undone in the
  background (``_undo``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from time import monotonic
from typing import TYPE_CHECKING, Any, NoReturn

from redis.exceptions import ResponseError

from .._exceptions import ClientClosedError, LockError, LockUpgradeError, ReplicaAckError
from .._keys import acquire_tombstone_key
from .cancel import cancel_requested, within
from .failures import failure
from .primitive import AcquireReply, Call, script_error
from .release import release_later
from .waiting import Offer, Step, wait_in_line

if TYPE_CHECKING:
    from .._net.subscriptions import Subscription
    from .engine import Engine
    from .holds import Expiry, HoldRecord
    from .ordering import Ticket
    from .primitive import Invocation, Primitive
    from .waiting import Waiter

__all__ = ("CUT_OFF", "acquire", "attempt", "give_up", "leave")

log = logging.getLogger("aiolock")

# The longest pause between two sends of an acquire that the server refused for a state
# that passes (a slot migration, a cluster restart): Redisson resends TRYAGAIN 1 s apart.
_BACKOFF_CAP = 1.0


async def attempt(engine: Engine, primitive: Primitive, call: Call) -> AcquireReply:
    """Run the acquire script once, in the holder's turn, and record a hold it took."""
    restarts = engine.services.restarts
    if restarts is not None and (left := await restarts.left_ms(primitive.key)):
        # Strict restarts: the server came up too recently for the holds it forgot to
        # have ended. Not taken; the call waits that long as for a held lock.
        return AcquireReply(acquired=False, ttl_ms=left)
    ticket = engine.services.order.join((primitive.key, call.holder))
    # An earlier call of this holder (a rollback or release finishing in the
    # background, another task's call with the same owner=) must land first: this
    # attempt's target count depends on its outcome.
    if not ticket.ready:  # spares a coroutine when the turn is free
        await _wait_turn(ticket)
    _in_turn(engine, primitive, call, ticket)
    runner = engine.services.runner
    while True:
        hold = engine.services.holds.get(primitive.key, call.field)
        # The count this holder has once the attempt succeeds: a resend that finds it
        # already there does not count twice, and a rollback undoes exactly this
        # attempt (a script takes a hold only from the count the holder believes).
        # A hold known lost counts for nothing: the server no longer has it.
        target = (hold.count if hold and hold.lost is None else 0) + 1
        tombstone = acquire_tombstone_key(primitive.key, engine.request_id())
        invocation = primitive.acquire(call, target, tombstone)
        # The clock is read before the send, which may write at once: the server runs the
        # command after this moment whatever the process does between the two.
        sent = _send_time(call, hold)
        # Sent here, its reply's future awaited here; a failed send is taken up by _resent.
        reply_of = None if runner.acks else runner.send(*invocation)
        # Bracketed once the send is queued, in the same step: a send that raises leaves
        # no call in flight on the hold's record.
        pending = _expiring(call, hold, sent)
        try:
            try:
                raw, acked = (
                    (await reply_of, None)
                    if reply_of is not None
                    else await _sent(engine, call, invocation)
                )
            except Exception as exc:
                if reply_of is None:
                    raise
                raw, acked = await _resent(engine, call, invocation, exc)
            reply = AcquireReply.decode(raw)
        except BaseException as exc:
            _unsettled(pending)
            if not failure(exc).ran_nothing:
                # Cancelled (or cut off) with the script in flight: it may have taken a
                # hold that nobody will ever release. Give it back in the background, in
                # this holder's turn; were the server unreachable until the lease ends,
                # that hold ends with it. So too when the server refused it past the
                # retries (TRYAGAIN, OOM...): an earlier send that timed out may have run.
                _undo_later(engine, primitive, ticket, call, target, tombstone)
                raise
            ticket.release()
            if isinstance(exc, ResponseError):
                # The script failed before it changed anything: nothing to roll back.
                raise script_error(primitive.name, primitive.key, exc) from exc
            raise
        # The attempt's expiry ticket is settled where each outcome is taken up: by the
        # record of a hold won, else as not applied.
        if reply.acquired and acked is not None and acked < engine.settings.replica_acks:
            # Taken on a primary whose replicas may not have it: a failover now could
            # lose it unnoticed. Give it back (in turn, to the end even if the caller
            # is cancelled meanwhile), then say so.
            _unsettled(pending)
            giving_back = _undo(engine, primitive, call, reply.count, tombstone)
            await engine.services.background.shielded(ticket, giving_back)
            raise ReplicaAckError(
                primitive.name,
                acked or 0,
                engine.settings.replica_acks,
                engine.settings.replica_ack_timeout,
            )
        if not reply.stale or cancel_requested(call.caller, call.mark) or engine.closed:
            break
        _unsettled(pending)
        _after_stale(engine, primitive, call, reply.count, ticket)
    if engine.closed or cancel_requested(call.caller, call.mark):
        _unsettled(pending)
        _cut_short(engine, primitive, call, reply, ticket, target=target, tombstone=tombstone)
    if reply.acquired:
        _won_in_turn(engine, primitive, call, reply, ticket, tombstone, sent=sent, pending=pending)
        return reply
    _unsettled(pending)
    ticket.release()
    return reply


def _in_turn(engine: Engine, primitive: Primitive, call: Call, ticket: Ticket) -> None:
    """What is checked once the holder's turn came (its end on an error)."""
    try:
        # Closed meanwhile? (The process and loop were checked as the call started:
        # the same task cannot have moved since.)
        engine.check_not_closed()
        # The holder's calls before this one may have changed what it holds (a write
        # unlock of the same owner=, say): judge the upgrade rule again, in turn.
        primitive.check_acquire(call.holder, engine.services.holds)
    except BaseException:
        ticket.release()
        raise


def _cut_short(
    engine: Engine,
    primitive: Primitive,
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
    _undo_later(engine, primitive, ticket, call, undo, tombstone)
    if engine.closed:
        raise ClientClosedError
    raise asyncio.CancelledError


def _won_in_turn(
    engine: Engine,
    primitive: Primitive,
    call: Call,
    reply: AcquireReply,
    ticket: Ticket,
    tombstone: str,
    *,
    sent: float | None,
    pending: tuple[HoldRecord, Expiry] | None,
) -> None:
    """Record the hold an attempt took, and end the holder's turn."""
    if call.receipt is not None and reply.token is None:
        # A fenced acquisition always takes a token: one answered without any (its
        # counter deleted by hand between a send and its resend) is given back, in
        # turn, and never returned as held.
        _unsettled(pending)
        _undo_later(engine, primitive, ticket, call, reply.count, tombstone)
        raise LockError(f"lock {primitive.name!r}: the server took the hold but gave no token")
    try:
        expiry = None if pending is None else pending[1]
        engine.won(primitive, call, reply.count, token=reply.token, sent=sent, expiry=expiry)
    finally:
        ticket.release()


async def _resent(
    engine: Engine, call: Call, invocation: Invocation, exc: Exception
) -> tuple[Any, int | None]:
    """After a first send (``runner.send``) whose reply raised ``exc``.

    The runner's own retries (``rerun``: NOSCRIPT, a redirect, a lost connection),
    then _sent's resends while the server refuses it for a passing state.
    """
    runner = engine.services.runner
    try:
        return await runner.rerun(exc, *invocation), None
    except Exception as again:
        if call.wait == 0 or not runner.passing(again):
            raise
        return await _sent(engine, call, invocation, again)


async def _sent(
    engine: Engine, call: Call, invocation: Invocation, refusal: Exception | None = None
) -> tuple[Any, int | None]:
    """Run an acquire script; resend it while the server refuses it for a passing state.

    The states: TRYAGAIN in a slot migration, CLUSTERDOWN in a restart, MASTERDOWN,
    LOADING, BUSY. Resent with a growing pause, within the call's wait (forever with
    none). A call that does not wait (``wait=0``) gets the refusal after the client's own
    retries. Each resend is the same command: it counts once whatever an earlier send
    did (the target count), and its tombstone voids it all for a rollback.
    ``refusal``: the first send's (made by the caller), to pause after before resending.
    """
    runner = engine.services.runner
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
            pause = engine.settings.retry_interval
        sleep = pause
        if call.deadline is not None:
            sleep = min(sleep, call.deadline - asyncio.get_running_loop().time())
            if sleep <= 0:
                raise refusal
        log.debug("aiolock: acquire refused (%r); sent again in %.2f s", refusal, sleep)
        refusal = None
        await asyncio.sleep(sleep)
        engine.check_open()
        pause = min(max(pause, 0.01) * 2, _BACKOFF_CAP)


def _after_stale(
    engine: Engine, primitive: Primitive, call: Call, count: int, ticket: Ticket
) -> None:
    """Believe the server's count of the holder's holds after a stale reply.

    The count was not what this client believed: a hold lost unnoticed (force_unlock,
    expiry). The attempt is made again unless it is now an upgrade (a write hold lost
    beside read holds): that is refused, never left to wait for the holder's own read
    holds.
    """
    _resync(engine, primitive, call, count)
    try:
        primitive.check_acquire(call.holder, engine.services.holds)
    except LockUpgradeError:
        ticket.release()
        raise


def _resync(engine: Engine, primitive: Primitive, call: Call, count: int) -> None:
    """Make this client's belief the server's ``count`` of the holder's holds."""
    hold = engine.services.holds.get(primitive.key, call.field)
    believed = hold.count if hold else 0
    if hold is not None and hold.count and hold.lost is None:
        # Lost without the watchdog noticing yet: report it now, once. The hold stays,
        # known lost, so that the holder's next unlock() raises LockLostError.
        engine.services.holds.report_lost(
            hold, f"the server had {count} of its {believed} hold(s); found by lock()", "lock"
        )
    if count:
        if hold is not None:
            engine.services.holds.drop(hold)
        # Holds of this holder that it does not know of (a release that never got an
        # answer): count them, never renew them; they expire with their lease.
        log.warning(
            "aiolock: %s has %d hold(s) on lock %r it did not know of; they are counted "
            "and expire with their lease",
            call.holder,
            count,
            primitive.name,
        )
        engine.won(primitive, call, count, lease_ms=engine.settings.lease_ms, announce=False)


def _undo_later(
    engine: Engine, primitive: Primitive, ticket: Ticket, call: Call, target: int, tombstone: str
) -> None:
    engine.services.background.complete(ticket, _undo(engine, primitive, call, target, tombstone))


async def _undo(
    engine: Engine, primitive: Primitive, call: Call, target: int, tombstone: str
) -> None:
    """Roll back an attempt of ``call`` (by its ``target`` count and tombstone)."""

    async def undo() -> None:
        # Built in turn: the lease it re-applies depends on the holds left by then.
        hold = engine.services.holds.get(primitive.key, call.field)
        reapply = engine.services.holds.reapply_ms(hold)
        # Holds left get that lease again, perhaps shorter than the one a guarded hold
        # has confirmed: bracketed (whether it re-applied is not told: never raised).
        expiry = (
            hold.expiry_sent(asyncio.get_running_loop().time() + reapply / 1000)
            if hold is not None and hold.guards
            else None
        )
        try:
            await engine.services.runner.run(*primitive.rollback(call, target, tombstone, reapply))
        finally:
            if expiry is not None:
                assert hold is not None
                hold.expiry_settled(expiry, applied=False)

    await engine.until_answered(f"undo an acquire of lock {primitive.name!r}", undo, call.lease_ms)


async def give_up(engine: Engine, primitive: Primitive, call: Call) -> None:
    """The call's wait ran out: leave the queue if it has one, then return False."""
    if (
        primitive.leaves_queue
        and not engine.services.waiting.field_waiting(primitive.key, call.field) > 1
    ):
        ticket = engine.services.order.join((primitive.key, call.holder))
        await engine.services.background.shielded(ticket, leave(engine, primitive, call))
    if cancel_requested(call.caller, call.mark):
        raise asyncio.CancelledError


async def leave(engine: Engine, primitive: Primitive, call: Call) -> None:
    leave = primitive.leave(call)
    if leave is None:
        return
    invocation, lives_ms = leave
    # Left in the queue, the entry would hold up everyone behind it until it times
    # out: resend through connection errors (leaving twice removes nothing more).
    await engine.until_answered(
        f"take a waiter of lock {primitive.name!r} out of its queue",
        lambda: engine.services.runner.run(*invocation),
        lives_ms,
    )


async def _wait_turn(ticket: Ticket) -> None:
    """Wait for the holder's turn; cancelled meanwhile, its turn ends unused."""
    try:
        await ticket.wait()
    except BaseException:
        ticket.release()
        raise


def _send_time(call: Call, hold: HoldRecord | None) -> float | None:
    """An attempt's send time, where a guarded hold relies on it (None: nobody does).

    The lease runs at least until the send time plus the lease (the guard's confirmation).
    Only where a guarded hold relies on it: a plain lock() spares itself the clock.
    """
    if not call.timed and (hold is None or not hold.guards):
        return None
    return asyncio.get_running_loop().time()


def _expiring(
    call: Call, hold: HoldRecord | None, sent: float | None
) -> tuple[HoldRecord, Expiry] | None:
    """An attempt's expiry ticket on a hold already recorded (``HoldRecord.expiry_sent``).

    A re-entry of a guarded hold may set a shorter lease than the one confirmed.
    """
    if sent is None or hold is None:
        return None
    return hold, hold.expiry_sent(sent + call.lease_ms / 1000)


def _unsettled(pending: tuple[HoldRecord, Expiry] | None) -> None:
    """An attempt's expiry ticket, settled without an answer that it applied."""
    if pending is not None:
        hold, expiry = pending
        hold.expiry_settled(expiry, applied=False)


# How long past its wait an acquire may last (seconds) before its round trip under way is
# cut off: one round trip and a connect on a loaded machine. Without it a call waited for
# a server that stopped answering as long as the connection's timeouts and retries allowed
# (a frozen cluster shard: 20 s for try_lock(wait=1)).
CUT_OFF = 0.5


def acquire(
    engine: Engine,
    primitive: Primitive,
    owner: str | None,
    wait: float | None,
    lease: float | None,
    *,
    receipt: list[int] | None = None,
    timed: bool = False,
    bounded: bool = True,
    task: asyncio.Task[Any] | None = None,
) -> Coroutine[Any, Any, bool]:
    """Acquire ``primitive`` for ``owner`` (None: the calling task); False if ``wait`` ran out.

    ``receipt``: the acquisition's token is appended to it (a fenced lock's).
    ``timed``: a guarded hold's: its confirmation time is recorded (see ``_attempt``).
    With a ``wait``, the call returns within it plus ``CUT_OFF`` whatever the server
    does (``cancel.within``), unless not ``bounded``: a composite's member, whose call its
    composite bounds (one deadline for all its members). ``task``: the task the hold is
    for, when the call runs in another (a composite's member call, in a task of its own).
    """
    call = _acquire(engine, primitive, owner, wait, lease, receipt=receipt, timed=timed, task=task)
    return call if wait is None or not bounded else within(wait + CUT_OFF, call)


async def _acquire(
    engine: Engine,
    primitive: Primitive,
    owner: str | None,
    wait: float | None,
    lease: float | None,
    *,
    receipt: list[int] | None,
    timed: bool,
    task: asyncio.Task[Any] | None,
) -> bool:
    started = monotonic()
    mark, calling = engine.call_starts()
    # One coroutine for the whole call, which its deadline (``within``) can cut.
    try:
        call = _call(
            engine,
            primitive,
            owner,
            wait,
            lease,
            mark=mark,
            calling=calling,
            holding=task,
            receipt=receipt,
            timed=timed,
            started=started,
        )
        if primitive.polls:
            won = await _acquire_polling(engine, primitive, call)
        else:
            channel = primitive.channel(call.holder)
            sub, waiter, queue_behind = _join(engine, primitive, call, channel)
            if queue_behind:
                won = await _wait(engine, primitive, call, sub, waiter, None)
            else:
                try:
                    reply = await attempt(engine, primitive, call)
                except BaseException:
                    _unjoin(engine, channel, sub, waiter, leaving=True, mid_attempt=True)
                    raise
                if reply.acquired or (
                    call.deadline is not None and asyncio.get_running_loop().time() >= call.deadline
                ):
                    _unjoin(engine, channel, sub, waiter, leaving=not reply.acquired)
                    if reply.acquired:
                        return True
                    await give_up(engine, primitive, call)
                    won = False
                else:
                    won = await _wait(engine, primitive, call, sub, waiter, reply.ttl_ms)
    except BaseException as exc:
        # A cancel request came while the call ran (swallowed below aiolock, then
        # another error): the cancel wins, as it would have had it been delivered.
        if _failed(engine, primitive, exc, calling, mark, started):
            raise asyncio.CancelledError from exc
        raise
    finally:
        engine.services.background.call_ended()
    if not won:
        engine.events.acquire_failed(
            primitive.lock_kind, primitive.name, monotonic() - started, "timeout"
        )
    return won


def _join(
    engine: Engine, primitive: Primitive, call: Call, channel: str
) -> tuple[Subscription | None, Waiter | None, bool]:
    """Join the lock's subscription before the first attempt, if others wait on it.

    Others of this client already wait on the lock: the call joins their subscription
    and registers before its first attempt, so that no second attempt is needed to
    close the race with a release published in between. Also whether it queues behind
    them.
    """
    services = engine.services
    sub = None if call.wait == 0 else services.pubsub.join(channel)
    if sub is None:
        return None, None, False
    # No barging: local waiters are handed the lock in turn as it is released, so a
    # newcomer (often the task that just released it) waits its turn. One ahead that
    # leaves without the lock passes its turn on (WaitingRoom.remove). The holder itself
    # re-enters at once: it is not competing for a lock it has. Nor does a call whose
    # holder has another call under way: that one may take the lock, and no message
    # would then wake this one to re-enter.
    room = services.waiting
    holding = services.holds.holding(primitive.key, call.field) or services.order.busy(
        (primitive.key, call.holder)
    )
    queue_behind = primitive.no_barging and room.has_waiters(channel) and not holding
    return sub, room.add(channel, primitive.wake_count, shared=primitive.shared_waits), queue_behind


def _unjoin(
    engine: Engine,
    channel: str,
    sub: Subscription | None,
    waiter: Waiter | None,
    *,
    leaving: bool,
    mid_attempt: bool = False,
) -> None:
    """Undo ``_join``: the first attempt took the lock, or the call ends without it."""
    if sub is not None and waiter is not None:
        engine.services.waiting.remove(channel, waiter, leaving=leaving, mid_attempt=mid_attempt)
        sub.release()


def _call(
    engine: Engine,
    primitive: Primitive,
    owner: str | None,
    wait: float | None,
    lease: float | None,
    *,
    mark: int,
    calling: asyncio.Task[Any] | None,
    holding: asyncio.Task[Any] | None,
    receipt: list[int] | None,
    timed: bool,
    started: float,
) -> Call:
    """What the acquire call fixes before its first round trip (``Call``)."""
    holder, task = engine.holder(owner, holding or calling)
    if not engine.services.order.busy((primitive.key, holder)):
        # Nothing of this holder's under way on the lock: an upgrade is refused now,
        # without a round trip. Else (a cut-off unlock() finishing in the background,
        # say) the holds it counts may be on their way out: the attempt judges the rule
        # in the holder's turn, once they have settled.
        primitive.check_acquire(holder, engine.services.holds)
    lease_ms = engine.settings.lease_ms if lease is None else max(1, round(lease * 1000))
    # The loop is looked up only for a deadline (each lookup is a getpid() on 3.11).
    deadline = None if wait is None else asyncio.get_running_loop().time() + wait
    return Call(
        holder,
        task,
        primitive.field(holder),
        lease_ms,
        None if lease is None else lease_ms,
        wait,
        deadline,
        mark,
        receipt,
        calling,
        timed,
        started,
    )


def _failed(
    engine: Engine,
    primitive: Primitive,
    exc: BaseException,
    task: asyncio.Task[Any] | None,
    mark: int,
    started: float,
) -> bool:
    """Report an acquire call that raised ``exc``; whether a cancel must be raised instead.

    A cancel request came while the call ran (swallowed below aiolock, then another
    error): the cancel wins, as it would have had it been delivered.
    """
    cancelled = isinstance(exc, asyncio.CancelledError) or cancel_requested(task, mark)
    engine.events.acquire_failed(
        primitive.lock_kind,
        primitive.name,
        monotonic() - started,
        "cancelled" if cancelled else "closed" if isinstance(exc, ClientClosedError) else "error",
    )
    return cancelled and not isinstance(exc, asyncio.CancelledError)


async def _acquire_polling(engine: Engine, primitive: Primitive, call: Call) -> bool:
    """Acquire a lock that publishes nothing (the spin lock): try, pause, try again.

    Each pause is a waiter's bounded wait on the lock's channel in this client's
    waiting room, never subscribed: nothing from the server wakes it, but this
    client's own releases do (``_settle_release``), and so does ``aclose()``.
    """
    reply = await attempt(engine, primitive, call)
    if reply.acquired:
        return True
    loop = asyncio.get_running_loop()
    room = engine.services.waiting
    channel = primitive.channel(call.holder)
    room.enter(primitive.key, call.field)
    engine.events.wait_started(primitive.lock_kind, primitive.name)
    try:
        for pause in primitive.pauses():
            if call.deadline is not None:
                remaining = call.deadline - loop.time()
                if remaining <= 0:
                    await give_up(engine, primitive, call)
                    return False
                pause = min(pause, remaining)  # noqa: PLW2901 - bounded by the deadline
            waiter = room.add(channel, primitive.wake_count, shared=False)
            try:
                engine.check_open()
                await waiter.wait(pause)
                engine.check_open()
            finally:
                room.remove(channel, waiter, leaving=False)
            if (await attempt(engine, primitive, call)).acquired:
                return True
    finally:
        room.leave(primitive.key, call.field)
        engine.events.wait_ended(primitive.lock_kind, primitive.name)
    raise AssertionError("pauses() ended")  # pragma: no cover - an endless iterator


async def _wait(
    engine: Engine,
    primitive: Primitive,
    call: Call,
    sub: Subscription | None,
    waiter: Waiter | None,
    ttl_ms: int | None,
) -> bool:
    """Wait in the one wait loop (``waiting.wait_in_line``) until acquired or late.

    ``ttl_ms``: the lease the call's attempt found; None: the call queued behind this
    client's waiters without an attempt, and goes by the lease they last saw.
    """
    turn = _LockTurn(engine, primitive, call)
    bound = turn.saw(ttl_ms)
    waiting = engine.services.waiting
    waiting.enter(primitive.key, call.field)
    engine.events.wait_started(primitive.lock_kind, primitive.name)
    try:
        return await wait_in_line(turn, sub, waiter, bound)
    except BaseException:
        if primitive.leaves_queue and waiting.field_waiting(primitive.key, call.field) == 1:
            # The queue exit takes its place in the holder's line now, so the holder's
            # next call (a new wait, say) cannot overtake it and be removed by it.
            engine.services.background.complete(
                engine.services.order.join((primitive.key, call.holder)),
                leave(engine, primitive, call),
            )
        raise
    finally:
        waiting.leave(primitive.key, call.field)
        engine.events.wait_ended(primitive.lock_kind, primitive.name)


class _LockTurn:
    """A lock's steps in the one wait loop: its attempt, and a hand-over to take."""

    __slots__ = ("_channel", "_room", "call", "deadline", "engine", "primitive")

    def __init__(self, engine: Engine, primitive: Primitive, call: Call) -> None:
        self.engine = engine
        self.primitive = primitive
        self.call = call
        self.deadline = call.deadline
        self._room = engine.services.waiting
        self._channel = primitive.channel(call.holder)

    def saw(self, ttl_ms: int | None) -> float:
        """Keep the lease an attempt found for newcomers; how long the next wait may last.

        ``ttl_ms``: -1 for no expiry; None: the lease this client's waiters last saw. The
        bound is how long a lost message may cost: the holder's remaining lease.
        """
        key = self.primitive.key
        if ttl_ms is None:
            ttl_ms = self._room.lease_left_ms(key)
        self._room.saw_lease(key, ttl_ms)
        return ttl_ms / 1000 if ttl_ms >= 0 else self.engine.settings.ttl_cap

    async def subscribe(self) -> Subscription | None:
        return await _subscribe(self.engine, self.primitive, self.call)

    def register(self) -> Waiter:
        primitive = self.primitive
        return self._room.add(self._channel, primitive.wake_count, shared=primitive.shared_waits)

    async def attempt(self, waiter: Waiter) -> Step:
        reply = await attempt(self.engine, self.primitive, self.call)
        if reply.acquired:
            return Step(done=True)
        return Step(done=False, bound=self.saw(reply.ttl_ms))

    def took(self, waiter: Waiter, step: Step) -> None:
        self._room.remove(self._channel, waiter, leaving=False)

    def check_open(self) -> None:
        self.engine.check_open()

    def park(self, waiter: Waiter) -> None:
        waiter.park(self.primitive, self.call)

    async def woken(self, waiter: Waiter) -> bool | None:
        offer = waiter.offer
        return None if offer is None else await _take(self.engine, self.call, offer)

    def leave(self, waiter: Waiter, *, leaving: bool, mid_attempt: bool = False) -> None:
        self._room.remove(self._channel, waiter, leaving=leaving, mid_attempt=mid_attempt)

    def abandon(self, waiter: Waiter) -> None:
        _leave_offer(self.engine, self.primitive, self.call, waiter.offer)

    async def give_up(self) -> None:
        await give_up(self.engine, self.primitive, self.call)


async def _subscribe(engine: Engine, primitive: Primitive, call: Call) -> Subscription | None:
    """Subscribe to ``call``'s channel; None if its deadline came first."""
    loop = asyncio.get_running_loop()
    remaining = None if call.deadline is None else call.deadline - loop.time()
    try:
        return await engine.services.pubsub.subscribe(primitive.channel(call.holder), remaining)
    except ResponseError as exc:
        # An ACL refusing SUBSCRIBE: name the lock, as for its scripts.
        raise script_error(primitive.name, primitive.key, exc) from exc


async def _take(engine: Engine, call: Call, offer: Offer) -> bool | None:
    """A waiter offered a hand-over: wait for its outcome, bounded by the deadline.

    True: the lock was handed to it (and recorded). False: the deadline came first.
    None: not handed, or unknown: the waiter goes on as if woken (an attempt of its
    finds a hold handed to it nonetheless: the script counts it as the target reached).
    """
    outcome = offer.outcome
    if not outcome.done():
        remaining = None
        if call.deadline is not None:
            remaining = call.deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
        done, _ = await asyncio.wait([outcome], timeout=remaining)
        if not done:
            return False
    if outcome.result() is not True:
        return None
    if engine.closed:
        raise ClientClosedError
    if cancel_requested(call.caller, call.mark):
        raise asyncio.CancelledError
    return True


def _leave_offer(engine: Engine, primitive: Primitive, call: Call, offer: Offer | None) -> None:
    """A waiter leaves with an offer it will not take: release what it is handed.

    In the holder's turn, so that its next call waits for that release.
    """
    if offer is None or (offer.outcome.done() and offer.outcome.result() is False):
        return
    offer.abandoned = True
    if offer.outcome.done() and offer.outcome.result():
        engine.services.holds.disown(primitive.key, call.field)

    async def release_if_handed() -> None:
        if await offer.outcome:
            await release_later(engine, primitive, call.holder, call.field)

    engine.services.background.complete(
        engine.services.order.join((primitive.key, call.holder)), release_if_handed()
    )
