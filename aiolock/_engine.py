"""The acquire engine: one acquire and one release path for every primitive.

A primitive (``_primitive.Primitive``) describes itself; the engine runs its scripts and
carries every rule that makes a call correct:

* **attempt**: in the holder's turn (``_ordering``), from the count this client believes
  the holder has; a stale belief is corrected from the server's answer and reported;
* **wait**: subscribe, register the waiter *before* the next attempt (a release published
  while it is in flight wakes it), wait bounded by the lease seen (a lost message costs
  latency, never liveness), try again; no barging past local waiters where the primitive
  asks; a waiter that leaves passes its turn to try on;
* **deadline** and **cancellation**: a call that got a cancel request while it ran never
  returns normally (``_cancel``); whatever its script may have done is undone in the
  background, in the holder's turn, resent until answered; a release cut off is finished
  the same way, so ``async with`` never exits holding;
* **bookkeeping** (``_holds``) changes only after the server answered; a hold found gone is
  reported once, and the holder's next unlock raises ``LockLostError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._cancel import calling_task, cancel_mark, cancel_requested, cancelled_since
from ._exceptions import (
    ClientClosedError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockUpgradeError,
    ReplicaAckError,
)
from ._guard import Guard
from ._handover import HandOvers, Offer
from ._keys import acquire_tombstone_key, unlock_latch_key
from ._ordering import in_turn
from ._primitive import Call, Outcome
from ._replies import AcquireReply, Release, decode_force, decode_release, script_error
from ._scripts import refused

if TYPE_CHECKING:
    from ._affinity import Affinity
    from ._background import Background
    from ._config import Settings
    from ._events import Emitter
    from ._holders import HolderIds
    from ._holds import Hold, HoldRegistry
    from ._latches import LatchSweeper
    from ._ordering import CallOrder, Ticket
    from ._primitive import Invocation, Primitive, Waitable
    from ._pubsub import PubSub, Subscription
    from ._renewal import RenewalService
    from ._scripts import ScriptRunner
    from ._waiting import Waiter, WaitingRoom

__all__ = ("Engine",)

log = logging.getLogger("aiolock")
T = TypeVar("T")

# The server did not answer (after the client's own retries): the call may or may not have
# taken effect. Background completions resend through these and through refusals (BUSY,
# TRYAGAIN, OOM...: ``_scripts.refused``, the command did not run); the rest is an answer.
_UNANSWERED = (RedisConnectionError, RedisTimeoutError, OSError)
# A wait for a semaphore or a latch re-reads the state at least this often (seconds): a
# lost message then costs at most this much latency. Their state has no lease to bound by.
_RECHECK = 5.0
# The turn of a call queued behind this client's waiters (no barging): it waits, untried.
_QUEUED = Outcome(done=False)
# A refused login is a ConnectionError to redis-py, but the command never ran: there is
# nothing to complete or undo, and resending cannot succeed.
_REFUSED = (AuthenticationError,)
# The longest pause between two sends of an acquire that the server refused for a state
# that passes (a slot migration, a cluster restart): Redisson resends TRYAGAIN 1 s apart.
_BACKOFF_CAP = 1.0


def _cut_off(exc: BaseException) -> bool:
    """Whether a call that raised ``exc`` may or may not have reached the server."""
    return isinstance(exc, (asyncio.CancelledError, *_UNANSWERED)) and not isinstance(exc, _REFUSED)


class Engine:
    """One client's acquire engine; the handles' only way to the server."""

    def __init__(
        self,
        *,
        settings: Settings,
        ids: HolderIds,
        runner: ScriptRunner,
        holds: HoldRegistry,
        renewal: RenewalService,
        order: CallOrder,
        waiting: WaitingRoom,
        dispatcher: PubSub,
        background: Background,
        latches: LatchSweeper,
        affinity: Affinity,
        events: Emitter,
    ) -> None:
        self.settings = settings
        #: The client's event stream and slow-lock log: told of every acquisition and of
        #: every acquire call that fails (the holds' ends are told by the registry).
        self.events = events
        self._affinity = affinity
        self._ids = ids
        self._calls = 0
        self.closed = False
        # Whether a call was ever made: only then is a client never closed worth a warning.
        self.started = False
        self.attach(
            runner=runner,
            holds=holds,
            renewal=renewal,
            order=order,
            waiting=waiting,
            dispatcher=dispatcher,
            background=background,
            latches=latches,
        )

    def attach(
        self,
        *,
        runner: ScriptRunner,
        holds: HoldRegistry,
        renewal: RenewalService,
        order: CallOrder,
        waiting: WaitingRoom,
        dispatcher: PubSub,
        background: Background,
        latches: LatchSweeper,
    ) -> None:
        """Use these services from now on: the event loop's pieces of the client.

        Called once they are built, and again when the client moves to a new event loop
        (``Client._rebind``): the handles keep this engine, which then reaches the new
        loop's connections, tasks and bookkeeping.
        """
        self._runner = runner
        self._holds = holds
        self._renewal = renewal
        self._order = order
        self._waiting = waiting
        self._dispatcher = dispatcher
        self._background = background
        self._latches = latches
        self._handovers = HandOvers()
        #: The guarded holds' watch (``_guard.py``): aclose() calls ``guard.cancel_all()``.
        #: Its timer is the loop's, so a new loop gets a new one.
        self.guard = Guard(self.settings.lease_ms / 1000)

    # -- the client's side ----------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """The client's id, the first part of every holder id it makes."""
        return self._ids.client_id

    def check_open(self) -> None:
        """Raise ClientClosedError once the client is closed.

        RuntimeError if called in another process or event loop than the client's
        (``_affinity.py``): before any I/O.
        """
        if self.closed:
            raise ClientClosedError
        self._affinity.check()
        self.started = True

    def close(self) -> None:
        """Refuse new calls from now on; the client then winds down what runs."""
        self.closed = True

    def holder(
        self, owner: str | None, task: asyncio.Task[Any] | None = None
    ) -> tuple[str, asyncio.Task[Any] | None]:
        """The holder id of ``owner``, or of the calling task (and the task).

        ``task``: the calling task, if the caller has looked it up already.
        """
        if owner is not None:
            return self._ids.owner(owner), None
        if task is not None:
            return self._ids.of_calling(task)
        return self._ids.current()

    def believed(self, p: Primitive, owner: str | None) -> int:
        """The calling holder's count of holds as this client believes it."""
        holder, _ = self.holder(owner)
        hold = self._holds.get(p.key, p.field(holder))
        return hold.count if hold else 0

    def waiting(self, key: str) -> int:
        """How many of this client's calls wait on ``key``."""
        return self._waiting.waiting(key)

    # -- acquiring ------------------------------------------------------------------------

    async def acquire(
        self,
        p: Primitive,
        owner: str | None,
        wait: float | None,
        lease: float | None,
        *,
        receipt: list[int] | None = None,
        timed: bool = False,
    ) -> bool:
        """Acquire ``p`` for ``owner`` (None: the calling task); False if ``wait`` ran out.

        ``receipt``: the acquisition's token is appended to it (a fenced lock's).
        ``timed``: a guarded hold's: its confirmation time is recorded (see ``_attempt``).
        """
        started = monotonic()
        mark, task = self._call_starts()
        try:
            won = await self._acquire(
                p,
                owner,
                wait,
                lease,
                mark=mark,
                calling=task,
                receipt=receipt,
                timed=timed,
                started=started,
            )
        except BaseException as exc:
            # A cancel request came while the call ran (swallowed below aiolock, then
            # another error): the cancel wins, as it would have had it been delivered.
            cancelled = isinstance(exc, asyncio.CancelledError) or cancel_requested(task, mark)
            self.events.acquire_failed(
                p.lock_kind,
                p.name,
                monotonic() - started,
                "cancelled"
                if cancelled
                else "closed"
                if isinstance(exc, ClientClosedError)
                else "error",
            )
            if cancelled and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._background.call_ended()
        if not won:
            self.events.acquire_failed(p.lock_kind, p.name, monotonic() - started, "timeout")
        return won

    def _request_id(self) -> str:
        """A name for one script call's latch or tombstone, unique across clients.

        The client's UUID and a count: cheaper than random bytes from the OS per call.
        """
        self._calls += 1
        return f"{self._ids.client_id}:{self._calls}"

    def _call_starts(self) -> tuple[int, asyncio.Task[Any] | None]:
        """Start a public acquire or release: the task's cancel mark (_cancel.py), and the task.

        The task (None outside one) is looked up once for the whole call.

        The call counts as under way (aclose() waits for it). Each caller writes the rest
        of the guard inline: a wrapper coroutine would cost every call a frame.
        """
        task = calling_task()
        mark = task.cancelling() if task is not None else 0
        self.check_open()
        self._background.call_started()
        return mark, task

    async def _acquire(
        self,
        p: Primitive,
        owner: str | None,
        wait: float | None,
        lease: float | None,
        *,
        mark: int,
        calling: asyncio.Task[Any] | None,
        receipt: list[int] | None,
        timed: bool,
        started: float,
    ) -> bool:
        holder, task = self.holder(owner, calling)
        if not self._order.busy((p.key, holder)):
            # Nothing of this holder's under way on the lock: an upgrade is refused now,
            # without a round trip. Else (a cut-off unlock() finishing in the background,
            # say) the holds it counts may be on their way out: _attempt judges the rule
            # in the holder's turn, once they have settled.
            p.check_acquire(holder, self._holds)
        field = p.field(holder)
        lease_ms = self.settings.lease_ms if lease is None else max(1, round(lease * 1000))
        loop = asyncio.get_running_loop()
        deadline = None if wait is None else loop.time() + wait
        won_lease = None if lease is None else lease_ms
        call = Call(
            holder,
            task,
            field,
            lease_ms,
            won_lease,
            wait,
            deadline,
            mark,
            receipt,
            calling,
            timed,
            started,
        )
        if p.polls:
            return await self._acquire_polling(p, call)

        # Others of this client already wait on this lock: join their subscription and
        # register before the first attempt, so no second attempt is needed to close the
        # race with a release published in between.
        channel = p.channel(holder)
        room = self._waiting
        sub = None if wait == 0 else self._dispatcher.join(channel)
        waiter = None
        if sub is not None:
            # No barging: local waiters are handed the lock in turn as it is released, so
            # a newcomer (often the task that just released it) waits its turn. One ahead
            # that leaves without the lock passes its turn on (WaitingRoom.remove). The
            # holder itself re-enters at once: it is not competing for a lock it has.
            # Nor does a call whose holder has another call under way: that one may take
            # the lock, and no message would then wake this one to re-enter.
            holding = self._holds.holding(p.key, field) or self._order.busy((p.key, holder))
            queue_behind = p.no_barging and room.has_waiters(channel) and not holding
            waiter = room.add(channel, p.wake_count, shared=p.shared_waits)
            if queue_behind:
                return await self._wait(p, call, sub, waiter, room.lease_left_ms(p.key))
        try:
            reply = await self._attempt(p, call)
        except BaseException:
            if sub is not None and waiter is not None:
                room.remove(channel, waiter, leaving=True, mid_attempt=True)
                sub.release()
            raise
        if reply.acquired or (deadline is not None and loop.time() >= deadline):
            if sub is not None and waiter is not None:
                room.remove(channel, waiter, leaving=not reply.acquired)
                sub.release()
            if reply.acquired:
                return True
            await self._give_up(p, call)
            return False
        return await self._wait(p, call, sub, waiter, reply.ttl_ms)

    async def _acquire_polling(self, p: Primitive, call: Call) -> bool:
        """Acquire a lock that publishes nothing (the spin lock): try, pause, try again.

        Each pause is a waiter's bounded wait on the lock's channel in this client's
        waiting room, never subscribed: nothing from the server wakes it, but this
        client's own releases do (``_settle_release``), and so does ``aclose()``.
        """
        reply = await self._attempt(p, call)
        if reply.acquired:
            return True
        loop = asyncio.get_running_loop()
        room = self._waiting
        channel = p.channel(call.holder)
        room.enter(p.key, call.field)
        try:
            for pause in p.pauses():
                if call.deadline is not None:
                    remaining = call.deadline - loop.time()
                    if remaining <= 0:
                        await self._give_up(p, call)
                        return False
                    pause = min(pause, remaining)  # noqa: PLW2901 - bounded by the deadline
                waiter = room.add(channel, p.wake_count, shared=False)
                try:
                    self.check_open()
                    await waiter.wait(pause)
                    self.check_open()
                finally:
                    room.remove(channel, waiter, leaving=False)
                if (await self._attempt(p, call)).acquired:
                    return True
        finally:
            room.leave(p.key, call.field)
        raise AssertionError("pauses() ended")  # pragma: no cover - an endless iterator

    async def _wait(
        self,
        p: Primitive,
        call: Call,
        sub: Subscription | None,
        waiter: Waiter | None,
        ttl_ms: int,
    ) -> bool:
        waiting = self._waiting
        waiting.enter(p.key, call.field)
        waiting.saw_lease(p.key, ttl_ms)
        try:
            if sub is None:
                sub = await self._subscribe(p, call)
                if sub is None:
                    await self._give_up(p, call)
                    return False
                waiter = None  # subscribed only now: attempt again before waiting
            while True:
                # The subscription stays referenced (and so subscribed) while this waits.
                outcome = await self._wait_subscribed(p, call, sub, waiter, ttl_ms)
                if outcome is not None:
                    return outcome
                sub = await self._subscribe(p, call)
                if sub is None:
                    await self._give_up(p, call)
                    return False
                waiter = None
        except BaseException:
            if p.leaves_queue and waiting.field_waiting(p.key, call.field) == 1:
                # The queue exit takes its place in the holder's line now, so the holder's
                # next call (a new wait, say) cannot overtake it and be removed by it.
                self._background.complete(
                    self._order.join((p.key, call.holder)), self._leave(p, call)
                )
            raise
        finally:
            waiting.leave(p.key, call.field)

    async def _subscribe(self, p: Primitive, call: Call) -> Subscription | None:
        """Subscribe to ``call``'s channel; None if its deadline came first."""
        loop = asyncio.get_running_loop()
        remaining = None if call.deadline is None else call.deadline - loop.time()
        try:
            return await self._dispatcher.subscribe(p.channel(call.holder), remaining)
        except ResponseError as exc:
            # An ACL refusing SUBSCRIBE: name the lock, as for its scripts.
            raise script_error(p.name, p.key, exc) from exc

    async def _wait_subscribed(
        self, p: Primitive, call: Call, sub: Subscription, waiter: Waiter | None, ttl_ms: int
    ) -> bool | None:
        """Wait on ``sub`` (released at the end) until the lock is taken or time is up.

        None: ``sub`` went stale (its cluster slot moved); subscribe again and go on.
        """
        loop = asyncio.get_running_loop()
        room = self._waiting
        channel = p.channel(call.holder)
        try:
            # Until the channel's cluster slot moves (its waiters are woken then): the
            # caller then subscribes where it is served now, before the next attempt.
            while waiter is not None or not sub.stale:
                if waiter is None:
                    # Register before the attempt: a release published while the script is in
                    # flight then wakes this very waiter, so it is never missed.
                    waiter = room.add(channel, p.wake_count, shared=p.shared_waits)
                    try:
                        reply = await self._attempt(p, call)
                    except BaseException:
                        room.remove(channel, waiter, leaving=True, mid_attempt=True)
                        raise
                    if reply.acquired:
                        room.remove(channel, waiter, leaving=False)
                        return True
                    ttl_ms = reply.ttl_ms
                    self._waiting.saw_lease(p.key, ttl_ms)
                # A lost message costs at most the holder's remaining lease.
                bound = ttl_ms / 1000 if ttl_ms >= 0 else self.settings.ttl_cap
                if call.deadline is not None:
                    remaining = call.deadline - loop.time()
                    if remaining <= 0:
                        room.remove(channel, waiter, leaving=True)
                        await self._give_up(p, call)
                        return False
                    bound = min(bound, remaining)
                try:
                    self.check_open()
                    waiter.park(p, call)  # from now on a release may hand it the lock
                    try:
                        await waiter.wait(bound)
                    finally:
                        waiter.unpark()
                    self.check_open()
                    taken = None if waiter.offer is None else await self._take(call, waiter.offer)
                except BaseException:
                    self._leave_offer(p, call, waiter.offer)
                    room.remove(channel, waiter, leaving=True)
                    raise
                if taken is not None:
                    # Handed the lock (True), or the deadline passed while the hand-over was
                    # still being decided (False).
                    if not taken:
                        self._leave_offer(p, call, waiter.offer)
                    room.remove(channel, waiter, leaving=not taken)
                    if not taken:
                        await self._give_up(p, call)
                    return taken
                room.remove(channel, waiter, leaving=False)
                waiter = None
            return None
        finally:
            sub.release()

    async def _take(self, call: Call, offer: Offer) -> bool | None:
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
        if self.closed:
            raise ClientClosedError
        if cancel_requested(call.caller, call.mark):
            raise asyncio.CancelledError
        return True

    def _leave_offer(self, p: Primitive, call: Call, offer: Offer | None) -> None:
        """A waiter leaves with an offer it will not take: release what it is handed.

        In the holder's turn, so that its next call waits for that release.
        """
        if offer is None or (offer.outcome.done() and offer.outcome.result() is False):
            return
        offer.abandoned = True
        if offer.outcome.done() and offer.outcome.result():
            self._disown(p, call)

        async def release_if_handed() -> None:
            if await offer.outcome:
                await self._release_later(p, call.holder, call.field)

        self._background.complete(self._order.join((p.key, call.holder)), release_if_handed())

    async def _give_up(self, p: Primitive, call: Call) -> None:
        """The call's wait ran out: leave the queue if it has one, then return False."""
        if p.leaves_queue and not self._waiting.field_waiting(p.key, call.field) > 1:
            ticket = self._order.join((p.key, call.holder))
            await self._background.shielded(in_turn(ticket, self._leave(p, call)))
        if cancel_requested(call.caller, call.mark):
            raise asyncio.CancelledError

    async def _leave(self, p: Primitive, call: Call) -> None:
        leave = p.leave(call)
        if leave is None:
            return
        invocation, lives_ms = leave
        # Left in the queue, the entry would hold up everyone behind it until it times
        # out: resend through connection errors (leaving twice removes nothing more).
        await self._until_answered(
            f"take a waiter of lock {p.name!r} out of its queue",
            lambda: self._runner.run(*invocation),
            lives_ms,
        )

    async def _attempt(self, p: Primitive, call: Call) -> AcquireReply:
        """Run the acquire script once, in the holder's turn, and record a hold it took."""
        ticket = self._order.join((p.key, call.holder))
        try:
            # An earlier call of this holder (a rollback or release finishing in the
            # background, another task's call with the same owner=) must land first: this
            # attempt's target count depends on its outcome.
            if not ticket.ready:  # spares a coroutine when the turn is free
                await ticket.wait()
            self.check_open()
            # The holder's calls before this one may have changed what it holds (a write
            # unlock of the same owner=, say): judge the upgrade rule again, in turn.
            p.check_acquire(call.holder, self._holds)
        except BaseException:
            ticket.release()
            raise
        while True:
            hold = self._holds.get(p.key, call.field)
            # The count this holder has once the attempt succeeds: a resend that finds it
            # already there does not count twice, and a rollback undoes exactly this
            # attempt (a script takes a hold only from the count the holder believes).
            # A hold known lost counts for nothing: the server no longer has it.
            target = (hold.count if hold and hold.lost is None else 0) + 1
            tombstone = acquire_tombstone_key(p.key, self._request_id())
            # The lease runs at least until the send time plus the lease (the guard's
            # confirmation): taken before the call, which may queue for a connection. Only
            # where a guarded hold relies on it: a plain lock() spares itself the clock.
            sent = (
                asyncio.get_running_loop().time()
                if call.timed or (hold is not None and hold.guards)
                else None
            )
            try:
                raw, acked = await self._sent(call, p.acquire(call, target, tombstone))
                reply = AcquireReply.decode(raw)
            except _REFUSED:
                ticket.release()
                raise
            except BaseException as exc:
                if isinstance(exc, ResponseError) and not refused(exc):
                    # The script failed before it changed anything: nothing to roll back.
                    ticket.release()
                    raise script_error(p.name, p.key, exc) from exc
                # Cancelled (or cut off) with the script in flight: it may have taken a
                # hold that nobody will ever release. Give it back in the background, in
                # this holder's turn; were the server unreachable until the lease ends,
                # that hold ends with it. So too when the server refused it past the
                # retries (TRYAGAIN, OOM...): an earlier send that timed out may have run.
                self._undo_later(p, ticket, call, target, tombstone)
                raise
            if reply.acquired and acked is not None and acked < self.settings.replica_acks:
                # Taken on a primary whose replicas may not have it: a failover now could
                # lose it unnoticed. Give it back (in turn, to the end even if the caller
                # is cancelled meanwhile), then say so.
                giving_back = self._undo(p, call, reply.count, tombstone)
                await self._background.shielded(in_turn(ticket, giving_back))
                settings = self.settings
                raise ReplicaAckError(
                    p.name, acked, settings.replica_acks, settings.replica_ack_timeout
                )
            if not reply.stale or cancel_requested(call.caller, call.mark) or self.closed:
                break
            self._after_stale(p, call, reply.count, ticket)
        closed = self.closed
        if closed or cancel_requested(call.caller, call.mark):
            # The caller was cancelled meanwhile (a cancel swallowed below aiolock) or the
            # client closed: never return a hold, and never go on to wait. Undo what the
            # script did: give a hold back, or void the call and leave a fair queue.
            undo = reply.count if reply.acquired else target
            self._undo_later(p, ticket, call, undo, tombstone)
            if closed:
                raise ClientClosedError
            raise asyncio.CancelledError
        if reply.acquired:
            self._won_in_turn(p, call, reply, ticket, tombstone, sent=sent)
            return reply
        ticket.release()
        return reply

    def _won_in_turn(
        self,
        p: Primitive,
        call: Call,
        reply: AcquireReply,
        ticket: Ticket,
        tombstone: str,
        *,
        sent: float | None,
    ) -> None:
        """Record the hold an attempt took, and end the holder's turn."""
        if call.receipt is not None and reply.token is None:
            # A fenced acquisition always takes a token: one answered without any (its
            # counter deleted by hand between a send and its resend) is given back, in
            # turn, and never returned as held.
            self._undo_later(p, ticket, call, reply.count, tombstone)
            raise LockError(f"lock {p.name!r}: the server took the hold but gave no token")
        try:
            self._won(p, call, reply.count, token=reply.token, sent=sent)
        finally:
            ticket.release()

    async def _sent(self, call: Call, invocation: Invocation) -> tuple[Any, int | None]:
        """Run an acquire script; resend it while the server refuses it for a passing state.

        The states: TRYAGAIN in a slot migration, CLUSTERDOWN in a restart, MASTERDOWN,
        LOADING, BUSY. Resent with a growing pause, within the call's wait (forever with
        none). A call that does not wait (``wait=0``) gets the refusal after the client's own
        retries. Each resend is the same command: it counts once whatever an earlier send
        did (the target count), and its tombstone voids it all for a rollback.
        """
        runner = self._runner
        pause = self.settings.retry_interval
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await runner.run_acked(*invocation)
            except Exception as exc:
                if call.wait == 0 or not runner.passing(exc):
                    raise
                sleep = pause
                if call.deadline is not None:
                    sleep = min(sleep, call.deadline - loop.time())
                    if sleep <= 0:
                        raise
                log.debug("aiolock: acquire refused (%r); sent again in %.2f s", exc, sleep)
            await asyncio.sleep(sleep)
            self.check_open()
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
            p.check_acquire(call.holder, self._holds)
        except LockUpgradeError:
            ticket.release()
            raise

    def _resync(self, p: Primitive, call: Call, count: int) -> None:
        """Make this client's belief the server's ``count`` of the holder's holds."""
        hold = self._holds.get(p.key, call.field)
        believed = hold.count if hold else 0
        if hold is not None and hold.count and hold.lost is None:
            # Lost without the watchdog noticing yet: report it now, once. The hold stays,
            # known lost, so that the holder's next unlock() raises LockLostError.
            self._holds.report_lost(
                hold, f"the server had {count} of its {believed} hold(s); found by lock()", "lock"
            )
        if count:
            if hold is not None:
                self._holds.drop(hold)
            # Holds of this holder that it does not know of (a release that never got an
            # answer): count them, never renew them; they expire with their lease.
            log.warning(
                "aiolock: %s has %d hold(s) on lock %r it did not know of; they are counted "
                "and expire with their lease",
                call.holder,
                count,
                p.name,
            )
            self._won(p, call, count, lease_ms=self.settings.lease_ms, announce=False)

    def _undo_later(
        self, p: Primitive, ticket: Ticket, call: Call, target: int, tombstone: str
    ) -> None:
        self._background.complete(ticket, self._undo(p, call, target, tombstone))

    async def _undo(self, p: Primitive, call: Call, target: int, tombstone: str) -> None:
        """Roll back an attempt of ``call`` (by its ``target`` count and tombstone)."""

        async def undo() -> None:
            # Built in turn: the lease it re-applies depends on the holds left by then.
            hold = self._holds.get(p.key, call.field)
            reapply = hold.reapply_ms(self.settings.lease_ms) if hold else self.settings.lease_ms
            await self._runner.run(*p.rollback(call, target, tombstone, reapply))

        await self._until_answered(f"undo an acquire of lock {p.name!r}", undo, call.lease_ms)

    def _won(
        self,
        p: Primitive,
        call: Call,
        count: int,
        *,
        lease_ms: int | None = None,
        token: int | None = None,
        sent: float | None = None,
        announce: bool = True,
    ) -> None:
        """Record the holder's ``count`` holds; ``lease_ms`` overrides the call's lease.

        ``token``: what the acquisition took (a fenced lock's), for the call's receipt.
        ``sent``: when the call that took it (with ``call.lease_ms``) was sent.
        ``announce``: the call acquired the lock (an ``Acquired`` event, the slow-wait
        log); not for holds merely found on the server.
        """
        confirmed = None if sent is None else sent + call.lease_ms / 1000
        if token is not None and call.receipt is not None:
            call.receipt.append(token)
        kind, extra = p.hold_kind(call.holder)
        prior = self._holds.get(p.key, call.field)
        # Reentrant: it adds to a hold already announced and still believed held.
        reentrant = (
            prior is not None and prior.count > 0 and prior.lost is None and prior.began is not None
        )
        hold = self._holds.acquired(
            key=p.key,
            field=call.field,
            name=p.name,
            holder=call.holder,
            task=call.task,
            count=count,
            lease_ms=call.won_lease if lease_ms is None else lease_ms,
            kind=kind,
            extra=extra,
            confirmed=confirmed,
        )
        hold.primitive = p
        if announce:
            now = monotonic()
            if not reentrant:
                hold.began = now
                hold.began_as = p.lock_kind
                hold.slow_logged = False
            self.events.acquired(
                p.lock_kind, p.name, call.holder, now - call.started, reentrant=reentrant
            )

    # -- releasing ------------------------------------------------------------------------

    async def release(self, p: Primitive, owner: str | None) -> None:
        """Release one hold of ``owner`` (None: the calling task) on ``p``."""
        mark, task = self._call_starts()
        try:
            await self._release(p, owner, mark, task)
        except Exception as exc:
            # A cancel request came while the call ran (swallowed below aiolock, then
            # another error): the cancel wins, as it would have had it been delivered.
            if cancel_requested(task, mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._background.call_ended()

    async def _release(
        self, p: Primitive, owner: str | None, mark: int, calling: asyncio.Task[Any] | None
    ) -> None:
        holder, _ = self.holder(owner, calling)
        field = p.field(holder)
        # One line per holder, not per field: a read-write lock's read and write calls of
        # one holder take turns too (the upgrade rule depends on their order).
        ticket = self._order.join((p.key, holder))
        try:
            # An earlier call of this holder (a cut-off release finishing in the
            # background, another task's call with the same owner=) lands first, or this
            # call would decide on stale bookkeeping.
            if not ticket.ready:  # spares a coroutine when the turn is free
                await ticket.wait()
        except BaseException:
            # Cancelled while waiting its turn: the release was asked for, so it is made,
            # in the background once the turn comes (async with must never exit holding).
            self._background.complete(ticket, self._release_later(p, holder, field))
            raise
        hold = self._holds.get(p.key, field)
        # One latch per unlock call: every resend of this call replays the first result.
        latch = unlock_latch_key(p.key, self._request_id())
        reapply = self._reapply_ms(hold)
        offer = self._offer(p, holder, hold)
        invocation = p.release(field, reapply, latch, None if offer is None else offer.call)
        if hold is not None:
            # While a release is in flight the watchdog may find the key gone: not a loss.
            hold.releasing += 1
        try:
            result = decode_release(await self._runner.run(*invocation))
        except BaseException as exc:
            if _cut_off(exc) or refused(exc):
                if hold is not None and not isinstance(exc, asyncio.CancelledError):
                    # Not renewed from now on: should the release never land, the lock
                    # then runs out with its lease instead of staying held by nobody's
                    # knowledge.
                    self._renewal.untrack(hold)
                # Cancelled with the script in flight, or no answer within the retries:
                # the release may or may not have happened; or the server refused it past
                # the retries (BUSY, TRYAGAIN, OOM...: not run). Finish it in the
                # background (a resend with the same latch never releases twice), so the
                # bookkeeping follows the server's answer and no hold is left held, and
                # renewed, that nobody tracks. The caller still sees its error (the
                # contract leaves connection errors be).
                self._background.complete(
                    ticket,
                    self._finish_release(
                        p,
                        holder,
                        hold=hold,
                        invocation=invocation,
                        latch=latch,
                        reapply=reapply,
                        offer=offer,
                    ),
                )
                raise
            # Refused (a login), or the script failed: nothing was done.
            if hold is not None:
                hold.releasing -= 1
            self._settle_offer(p, offer, Release.NOT_HELD)
            ticket.release()
            if isinstance(exc, ResponseError):
                raise script_error(p.name, p.key, exc) from exc
            raise
        if hold is not None:
            hold.releasing -= 1
        self._settle_offer(p, offer, result)
        try:
            self._settle_release(p, holder, hold, latch, result)
        finally:
            ticket.release()
        if cancel_requested(calling, mark):
            # Released, but a cancel came meanwhile (swallowed below aiolock): say so.
            raise asyncio.CancelledError

    # -- closing --------------------------------------------------------------------------

    async def release_ended(self) -> None:
        """aclose()'s release of every hold whose holder can no longer release it.

        The holds of tasks that ended holding them (a guarded body that aclose() cancelled
        releases its own, in the background): each released at once, so another process takes the
        lock over without waiting out the lease. Each is sent once, with the client's
        retries (so this is bounded with the server unreachable); a failure is logged,
        and that lock then runs out with its lease.
        """
        loop = asyncio.get_running_loop()
        ended = self._holds.ended(loop.time())
        for hold in self._holds:
            # A task ended whose done-callback has not run yet.
            done = hold.task is not None and hold.task.done()
            if done and hold.count and hold.lost is None:
                ended.append((hold, hold.count - hold.releasing))
                self._holds.drop(hold, ended="task_ended")
        if ended:
            await asyncio.gather(*(self._release_ended(hold, kept) for hold, kept in ended))

    async def _release_ended(self, hold: Hold, kept: int) -> None:
        p: Primitive | None = hold.primitive
        if p is None or kept <= 0:
            return
        try:
            # One release per hold left, as its unlocks would have been: a reentrant
            # hold's last one frees the lock and wakes its waiters.
            for _ in range(kept):
                latch = unlock_latch_key(p.key, self._request_id())
                invocation = p.release(hold.field, self.settings.lease_ms, latch)
                result = decode_release(await self._runner.run(*invocation))
                self._latches.add(latch)
                if result is not Release.KEPT:
                    break
        except Exception as exc:
            log.warning(
                "aiolock: could not release lock %r of %s, whose task has ended, at close "
                "(%r): it expires with its lease",
                hold.name,
                hold.holder,
                exc,
            )
            return
        log.info("aiolock: released lock %r of %s, whose task had ended", hold.name, hold.holder)

    # -- extending ------------------------------------------------------------------------

    async def extend(self, p: Primitive, owner: str | None, lease_ms: int) -> None:
        """Give the hold of ``owner`` (None: the calling task) a lease of ``lease_ms`` from now.

        LockNotOwnedError / LockLostError as release() raises them. A watchdog hold stays
        renewed: only its current expiry moves (the watchdog's next renewal gives it the
        watchdog's lease again); explicit leases become ``lease_ms`` (what an unlock of a
        reentrant hold re-applies). Cancelled in flight it raises CancelledError: the
        script may have run, which only moved an expiry of a hold the holder still has,
        so there is nothing to undo.
        """
        mark, task = self._call_starts()
        try:
            await self._extend(p, owner, lease_ms, mark, task)
        except Exception as exc:
            if cancel_requested(task, mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._background.call_ended()

    async def _extend(
        self,
        p: Primitive,
        owner: str | None,
        lease_ms: int,
        mark: int,
        calling: asyncio.Task[Any] | None,
    ) -> None:
        holder, _ = self.holder(owner, calling)
        field = p.field(holder)
        # In the holder's turn, as its unlock: after a release of the same holder lands,
        # never racing it.
        ticket = self._order.join((p.key, holder))
        try:
            if not ticket.ready:
                await ticket.wait()
            hold = self._holds.get(p.key, field)
            if hold is None or not hold.count:
                raise LockNotOwnedError(p.name, holder, self._held_by_sibling(p.key, holder))
            if hold.lost is not None:
                # Known gone: the holder's unlock() raises it too (the hold is kept for it).
                raise LockLostError(p.name, holder, hold.lost)
            _, extra = p.hold_kind(holder)
            try:
                reply = await self._runner.run(*p.extend(field, extra, hold.count, lease_ms))
            except ResponseError as exc:
                raise script_error(p.name, p.key, exc) from exc
            if not int(reply[0]):
                why = "its lease ran out or was taken before extend()"
                self._holds.report_lost(hold, f"{why}; found by extend()", "extend")
                raise LockLostError(p.name, holder, why)
            self._holds.extended(hold, lease_ms)
        finally:
            ticket.release()
        if cancel_requested(calling, mark):
            raise asyncio.CancelledError

    def _reapply_ms(self, hold: Hold | None) -> int:
        lease_ms = self.settings.lease_ms
        return hold.reapply_ms(lease_ms) if hold else lease_ms

    def _offer(self, p: Primitive, holder: str, hold: Hold | None) -> Offer | None:
        """A hand-over for this release of ``holder``'s last hold, if one is due."""
        if (
            not p.hands_over
            # A hand-over is an acquisition by the release script: no WAIT follows it.
            or self.settings.replica_acks
            or hold is None
            or hold.count != 1
            or hold.lost is not None
            or self.closed
            or not self._handovers.allowed(p.key)
        ):
            return None
        channel = p.channel(holder)
        if not self._waiting.has_waiters(channel):
            # The common case, nobody of this client waiting: no closure, no scan.
            return None

        def eligible(call: Call) -> bool:
            return (
                call.task is not None
                and call.holder != holder
                and not self._order.busy((p.key, call.holder))
            )

        heir = self._waiting.heir(channel, p, eligible)
        if heir is None:
            return None
        waiter, call, heir_p = heir
        waiter.offer = offer = Offer(call, heir_p, waiter.offer_settled)
        return offer

    def _settle_offer(self, p: Primitive, offer: Offer | None, result: Release | None) -> None:
        """The release's outcome for its hand-over; None: the release went unanswered."""
        if result is Release.FREED:
            self._handovers.freed(p.key)
        if offer is None:
            return
        if result is Release.HANDED:
            self._handovers.handed(p.key)
            # Recorded now, whether the waiter takes it or has left (then its leaving
            # releases it, in its holder's turn, once it sees this outcome). As the heir's
            # hold: the kind it waits for (which takes a hand-over from this one).
            self._won(offer.heir, offer.call, 1, sent=offer.sent)
            if offer.abandoned:
                self._disown(offer.heir, offer.call)
            offer.settle(handed=True)
            return
        offer.settle(handed=None if result is None else False)

    def _disown(self, p: Primitive, call: Call) -> None:
        hold = self._holds.get(p.key, call.field)
        if hold is not None:
            self._holds.disown(hold)

    def release_soon(self, p: Primitive, owner: str | None) -> None:
        """Release one hold of ``owner`` (None: the calling task) in the background.

        For a guarded hold found lost: its block raises at once, whether or not the server
        answers, and the release lands (or finds nothing) in the holder's turn.
        """
        holder, _ = self.holder(owner)
        field = p.field(holder)
        self._background.complete(
            self._order.join((p.key, holder)), self._release_later(p, holder, field)
        )

    def hold_of(self, p: Primitive, owner: str | None) -> Hold | None:
        """The calling holder's hold on ``p`` as this client records it (None: none)."""
        holder, _ = self.holder(owner)
        return self._holds.get(p.key, p.field(holder))

    async def _release_later(self, p: Primitive, holder: str, field: str) -> None:
        """An unlock() cancelled before its turn: release in the background when it comes."""
        hold = self._holds.get(p.key, field)
        latch = unlock_latch_key(p.key, self._request_id())
        reapply = self._reapply_ms(hold)
        if hold is not None:
            hold.releasing += 1
        invocation = p.release(field, reapply, latch)
        await self._finish_release(
            p, holder, hold=hold, invocation=invocation, latch=latch, reapply=reapply, offer=None
        )

    async def _finish_release(
        self,
        p: Primitive,
        holder: str,
        *,
        hold: Hold | None,
        invocation: Invocation,
        latch: str,
        reapply: int,
        offer: Offer | None,
    ) -> None:
        def stop_renewing() -> None:
            # While the server does not answer, renewing would only keep a lock alive
            # that its holder already let go of: let the lease run out instead.
            if hold is not None:
                self._renewal.untrack(hold)

        answered: tuple[Any] | None = None
        try:
            answered = await self._until_answered(
                f"release lock {p.name!r} held by {holder}",
                lambda: self._runner.run(*invocation),
                reapply,
                on_unanswered=stop_renewing,
            )
        finally:
            if hold is not None:
                hold.releasing -= 1
            if answered is None:
                self._settle_offer(p, offer, None)
        if answered is None:
            if hold is not None:
                self._holds.drop(hold, ended="release_unanswered")
            return
        result = decode_release(answered[0])
        self._settle_offer(p, offer, result)
        try:
            self._settle_release(p, holder, hold, latch, result)
        except LockLostError:
            # _settle_release logged the loss; the caller already had its error.
            pass
        except LockNotOwnedError as exc:
            # The caller, cancelled or cut off, is not there to be told: nothing was held.
            log.info("aiolock: a cut-off unlock() found nothing to release: %s", exc)

    def _settle_release(
        self, p: Primitive, holder: str, hold: Hold | None, latch: str, result: Release
    ) -> None:
        if result is Release.NOT_HELD:
            if hold is not None and hold.count:
                why = hold.lost or "its lease ran out or was taken before unlock()"
                if hold.lost is None:
                    # The watchdog did not see it first (an explicit lease, a starved
                    # event loop): log it here, so every loss is logged once.
                    self._holds.report_lost(hold, f"{why}; found by unlock()", "unlock")
                self._holds.drop(hold)
                raise LockLostError(p.name, holder, why)
            raise LockNotOwnedError(p.name, holder, self._held_by_sibling(p.key, holder))
        self._latches.add(latch)
        if result is Release.FREED and p.polls:
            # Nothing was published: this client's own waiters need not wait out a pause.
            self._waiting.deliver(p.channel(holder), b"0")
        if result is Release.DOWNGRADED:
            # Nothing was published (as in Redisson: the wire must match), yet this
            # client's own readers can get in now: wake them here rather than after their
            # lease-bounded wait. Writers stay parked: the read holds left keep them out.
            self._waiting.wake_shared(p.channel(holder))
        if hold is not None:
            lost = hold.lost
            self._holds.released(hold, fully=result is not Release.KEPT)
            if lost is not None:
                # The server still had the holder's entry (a read hold whose own timeout
                # key ran out), but the watchdog had found the hold dead: say so.
                raise LockLostError(p.name, holder, lost)

    def _held_by_sibling(self, key: str, holder: str) -> str:
        """Why a non-holder's unlock fails, when another task of this client holds it."""
        for hold in self._holds.on_key(key):
            if hold.holder != holder and hold.count and hold.task is not None:
                return (
                    f"it is held by another task of this client ({hold.task.get_name()}): "
                    "a lock belongs to the task that acquired it (a child task of gather() "
                    "or shield() is another task); use owner= to hand a lock over"
                )
        return ""

    async def watch_taken(self, p: Primitive, holder: str) -> None:
        """Until cancelled: renew this client's holds after each message on ``p``'s channel.

        (And after every resubscription, when messages may have been lost.) Nobody else
        releases a lock while its holder holds it: a message then means it was forced away
        (``force_unlock()``). The renewal finds such a hold gone now rather than at its
        next period, and the guard cancels a guarded body at once. A stale message (a
        release from before the hold began, delivered late) costs one renewal. The
        subscription is shared with this client's waiters, and released at the end.
        """
        channel = p.channel(holder)
        room = self._waiting
        while True:
            sub = await self._dispatcher.subscribe(channel, None)
            if sub is None:  # pragma: no cover - only a caller's limit gives None
                return
            try:
                # Registered before each renewal: a message while it flies wakes the next.
                waiter = room.add(channel, p.wake_count, shared=True, watch=True)
                try:
                    # A message published before the server took the SUBSCRIBE was never
                    # heard (a force_unlock() just as the term began): look once now.
                    self.check_open()
                    await self._renewal.renew_once()
                    while not sub.stale:
                        await waiter.wait(None)
                        room.remove(channel, waiter, leaving=False)
                        waiter = room.add(channel, p.wake_count, shared=True, watch=True)
                        self.check_open()
                        await self._renewal.renew_once()
                finally:
                    room.remove(channel, waiter, leaving=False)
            finally:
                sub.release()

    async def force(self, p: Primitive) -> bool:
        """Delete ``p`` whoever holds it and wake its waiters; True if it was held."""
        mark = cancel_mark()
        self.check_open()
        sent_at = self._holds.clock()
        try:
            deleted = decode_force(await self._runner.run(*p.force()))
        except ResponseError as exc:
            raise script_error(p.name, p.key, exc) from exc
        if deleted and p.polls:
            # Nothing was published: wake this client's own waiters here.
            self._waiting.deliver(p.channel(""), b"0")
        if deleted:
            # Only what was deleted is lost (a read-write lock's force_unlock() of the other
            # mode deletes nothing, and this client's holds on it stay valid).
            self._holds.mark_key_lost(p.key, "force_unlock() deleted it", begun_by=sent_at)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    async def delete(self, w: Waitable, *keys: str) -> bool:
        """Remove ``w``'s ``keys`` as Redisson's delete does; True if any of them existed.

        This client's renewed holds on ``w`` (a semaphore's permits) are gone with them:
        marked lost, so the watchdog stops and their release raises LockLostError.
        """
        mark = cancel_mark()
        self.check_open()
        sent_at = self._holds.clock()
        try:
            deleted = int(await self._runner.command("DEL", *keys)) > 0
        except ResponseError as exc:
            raise script_error(w.name, w.key, exc) from exc
        if deleted:
            self._holds.mark_key_lost(w.key, "delete() deleted it", begun_by=sent_at)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    # -- queries --------------------------------------------------------------------------

    async def query(self, p: Waitable, *args: str) -> Any:
        """Run one plain command about ``p``."""
        return await self._one_shot(p, lambda: self._runner.command(*args))

    async def ask(self, p: Waitable, invocation: Invocation) -> Any:
        """Run a read-only script about ``p``."""
        return await self._one_shot(p, lambda: self._runner.run(*invocation))

    async def _one_shot(self, p: Waitable, send: Callable[[], Awaitable[T]]) -> T:
        """A call that changes nothing: an error reply names ``p``, a cancel wins."""
        mark = cancel_mark()
        self.check_open()
        try:
            reply = await send()
        except ResponseError as exc:
            raise script_error(p.name, p.key, exc) from exc
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return reply

    async def query_all(self, p: Primitive, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands about ``p`` in one round trip (a pipeline), as query() one."""
        mark = cancel_mark()
        self.check_open()
        replies = await self._runner.pipeline(*commands)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        for reply in replies:
            if isinstance(reply, ResponseError):
                error = script_error(p.name, p.key, reply)
                if error is reply:
                    raise reply
                raise error from reply
        return replies

    # -- the counting objects: the semaphore and the count-down latch ---------------------

    async def change(
        self, w: Waitable, invocation_for: Callable[[str], Invocation], what: str
    ) -> Any:
        """Run a change of ``w`` (a release of permits, a count-down), exactly once.

        ``invocation_for(latch)`` is the script call; ``latch`` is a key of this call alone
        in which the script keeps its first answer, so that a resend replays it instead of
        changing ``w`` twice. Cancelled or cut off in flight, the change is finished in the
        background, resent until answered, as an unlock is; the caller still gets its error.
        """
        mark, _ = self._call_starts()
        try:
            reply = await self._change(w, invocation_for, what)
        except Exception as exc:
            if cancelled_since(mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._background.call_ended()
        if cancelled_since(mark):
            # Made, but a cancel came meanwhile (swallowed below aiolock): say so.
            raise asyncio.CancelledError
        return reply

    async def _change(
        self, w: Waitable, invocation_for: Callable[[str], Invocation], what: str
    ) -> Any:
        latch = unlock_latch_key(w.key, self._request_id())
        invocation = invocation_for(latch)
        try:
            reply = await self._runner.run(*invocation)
        except BaseException as exc:
            # Refused past the retries (BUSY, TRYAGAIN...), an earlier send may yet have
            # run (a timeout): finished in the background too, its latch replaying it.
            if _cut_off(exc) or refused(exc):
                self._background.spawn(self._finish_change(w, invocation, latch, what))
            elif isinstance(exc, ResponseError):
                raise script_error(w.name, w.key, exc) from exc
            raise
        self._latches.add(latch)
        return reply

    async def _finish_change(
        self, w: Waitable, invocation: Invocation, latch: str, what: str
    ) -> None:
        """Resend a cut-off change (its latch replays a first send that landed)."""
        answered = await self._until_answered(
            f"{what} {w.name!r}",
            lambda: self._runner.run(*invocation),
            self.settings.resend_window_ms,
            lost="the change may not have been made",
        )
        if answered is not None:
            self._latches.add(latch)

    async def take(
        self,
        w: Waitable,
        attempt_for: Callable[[str], tuple[Invocation, Invocation]],
        wait: float | None,
        decode: Callable[[Any], Outcome],
    ) -> bool:
        """Take from ``w`` (a semaphore's permits) once its script lets, within ``wait``.

        ``attempt_for(tombstone)``: one attempt, and the call that undoes it (gives back
        what it took, if anything, and voids any copy of it still on its way, by the
        tombstone). A resend of an attempt answers what its first send did. ``decode``
        reads an attempt's reply: whether it took, and how long at most to wait before
        the next attempt (None: until woken or re-checking). An attempt cut off in flight,
        or answered after a cancel, is undone in the background: a cancelled take never
        keeps what it took.
        """
        mark, _ = self._call_starts()

        async def attempt() -> Outcome:
            tombstone = acquire_tombstone_key(w.key, self._request_id())
            invocation, undo_invocation = attempt_for(tombstone)

            def undo() -> None:
                self._background.spawn(
                    self._until_answered(
                        f"give back what a cancelled call took from {w.name!r}",
                        lambda: self._runner.run(*undo_invocation),
                        self.settings.resend_window_ms,
                        lost="it stays taken",
                    )
                )

            try:
                outcome = decode(await self._runner.run(*invocation))
            except _REFUSED:
                raise
            except BaseException as exc:
                if isinstance(exc, ResponseError) and not refused(exc):
                    raise script_error(w.name, w.key, exc) from exc
                # Cut off, or refused past the retries after a send that may have run.
                undo()
                raise
            if self.closed or cancelled_since(mark):
                if outcome.done:
                    undo()
                if self.closed:
                    raise ClientClosedError
                raise asyncio.CancelledError
            if outcome.done and w.receipts:
                # Taken for good: no resend or undo will look for the receipt any more.
                self._latches.add(tombstone)
            return outcome

        try:
            return await self._wait_for(w, attempt, wait)
        except Exception as exc:
            if cancelled_since(mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._background.call_ended()

    def took_permit(self, w: Waitable, permit: str, timeouts: str) -> None:
        """Record a permit (its hex id) that the watchdog renews while the calling task lives.

        Called right after the take returned, with no await in between: a cancel cannot
        come between the permit taken and its renewal. ``timeouts``: the ZSET whose score
        of the permit the renewal moves forward (``psem_renew.lua``).
        """
        self._holds.acquired(
            key=w.key,
            field=permit,
            name=w.name,
            holder=f"permit {permit}",
            task=asyncio.current_task(),
            count=1,
            lease_ms=None,
            kind="permit",
            extra=timeouts,
        )

    def let_go_permit(self, w: Waitable, permit: str) -> tuple[bool, str | None]:
        """Stop renewing a permit about to be released: was it renewed, why was it lost.

        The reason is None if it was not found lost. Called before the release is sent:
        should the release never land, the permit runs out with its lease instead of
        staying taken, renewed, by nobody's knowledge.
        """
        hold = self._holds.get(w.key, permit)
        if hold is None or hold.kind != "permit":
            return False, None
        lost = hold.lost
        self._holds.drop(hold)
        return True, lost

    async def await_condition(
        self, w: Waitable, holds: Callable[[], Awaitable[bool]], wait: float | None
    ) -> bool:
        """Wait until ``holds()`` (a read: a latch at zero) is true, within ``wait``."""
        mark, _ = self._call_starts()

        async def attempt() -> Outcome:
            return Outcome(await holds())

        try:
            done = await self._wait_for(w, attempt, wait)
        finally:
            self._background.call_ended()
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return done

    async def _wait_for(
        self,
        w: Waitable,
        attempt: Callable[[], Awaitable[Outcome]],
        wait: float | None,
    ) -> bool:
        """Attempt until one succeeds, woken by ``w``'s channel; False once ``wait`` ran out.

        As a lock's wait: the waiter registers before each attempt, so a message published
        while it is in flight wakes it; each wait is bounded (``_RECHECK``), so a lost
        message costs latency, never liveness (and by the attempt's own hint: the next
        permit to expire); a waiter woken for nothing passes its turn
        on, so a message that lets someone in is never spent on one that cannot use it.

        No barging (``w.no_barging``): a call that finds this client's waiters on the
        channel queues behind them without trying, and a take that leaves some available
        wakes as many waiters as that lets in (``Outcome.left``), so the queue never sits
        on something free.
        """
        room = self._waiting
        channel = w.channel("")
        queue = wait != 0 and w.no_barging and room.queues_behind(channel)
        if not queue:
            first = await self._first_look(channel, attempt)
            if first or wait == 0:
                return first
        loop = asyncio.get_running_loop()
        deadline = None if wait is None else loop.time() + wait
        room.enter(w.key, "")
        settled = False
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                sub = await self._dispatcher.subscribe(channel, remaining)
                if sub is None:
                    return False
                try:
                    while not sub.stale:
                        # Decided with no await before the waiter is in line: those ahead
                        # wake it as they leave (or take, leaving some).
                        behind = queue and room.queues_behind(channel)
                        queue = False
                        waiter = room.add(
                            channel,
                            w.wake_count,
                            shared=w.shared_waits,
                            counts_available=w.counts_available,
                        )
                        leaving = True
                        try:
                            outcome = _QUEUED if behind else await _in_line(waiter, attempt)
                            # A message that is itself what the wait waits for (a latch's
                            # "0") settles it, whatever the attempt found since.
                            if outcome.done or settled or waiter.settled:
                                leaving = False
                                self._took(w, channel, waiter, outcome.left)
                                return True
                            if outcome.spare:
                                # Too little left for this call, but some: a waiter behind
                                # may fit. It gets this call's wake-up, and this call waits
                                # behind it (nothing is delivered in between: no await).
                                room.remove(channel, waiter, leaving=True, mid_attempt=True)
                                waiter = room.add(
                                    channel,
                                    w.wake_count,
                                    shared=w.shared_waits,
                                    counts_available=w.counts_available,
                                )
                                waiter.short = True
                            hint = outcome.wait
                            bound = _RECHECK if hint is None else min(_RECHECK, hint)
                            if deadline is not None:
                                bound = min(bound, deadline - loop.time())
                                if bound <= 0:
                                    return False
                            self.check_open()
                            await waiter.wait(bound)
                            self.check_open()
                            leaving = False
                            settled = waiter.settled
                        finally:
                            # Leaving without what it waits for (deadline, cancel, close):
                            # a wake-up it was given goes on, as a lock waiter's does, and
                            # so does the turn of an attempt cut off (calls queued behind
                            # it count on it).
                            room.remove(channel, waiter, leaving=leaving, mid_attempt=waiter.trying)
                finally:
                    sub.release()
        finally:
            room.leave(w.key, "")

    async def _first_look(self, channel: str, attempt: Callable[[], Awaitable[Outcome]]) -> bool:
        """The attempt a call makes before it waits (if it does not queue): True if done."""
        outcome = await attempt()
        if outcome.left:
            # This client's waiters came after it was sent: let in what it left.
            self._waiting.wake_left(channel, outcome.left)
        return outcome.done

    def _took(self, w: Waitable, channel: str, waiter: Waiter, left: int) -> None:
        """A waiter took (or found) what it waits for, ``left`` left: wake whom that lets in.

        Only where messages count what is available (the semaphore): else the waiter's
        leaving is all.

        A message that came while its take was in flight counted on it (it is awake).
        Whether the take ran before that message's release (the permit is still there,
        and ``left`` does not count it) or after it (the take may have had it) the reply
        cannot tell: its wake-up goes on, at the price of one take for nothing at most.
        """
        if not w.counts_available:
            return
        room = self._waiting
        counted_on = waiter.event.is_set()
        # Out of line first: the wake-ups below are for others.
        room.remove(channel, waiter, leaving=False)
        if left:
            room.wake_left(channel, left)
        if counted_on:
            room.pass_turn(channel)

    # -- plumbing -------------------------------------------------------------------------

    async def _until_answered(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        give_up_ms: int,
        *,
        on_unanswered: Callable[[], None] | None = None,
        lost: str = "what it holds expires with its lease",
    ) -> tuple[T] | None:
        """Resend an idempotent ``call`` until the server answers, as a 1-tuple.

        A refusal (BUSY, TRYAGAIN, OOM...: the command was not run) is no answer either.
        None once ``give_up_ms`` have passed without an answer (a lease that long has run
        out by then), once the client's resend window is over (every latch and tombstone
        outlives it, so no resend can count twice) or once the client closed.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + min(give_up_ms, self.settings.resend_window_ms) / 1000
        while True:
            try:
                return (await call(),)
            except _REFUSED as exc:
                log.warning("aiolock: could not %s: %s", what, exc)
                return None
            except Exception as exc:
                if not (isinstance(exc, _UNANSWERED) or refused(exc)):
                    raise
                if on_unanswered is not None:
                    on_unanswered()
                if self.closed or loop.time() >= give_up_at:
                    log.warning(
                        "aiolock: could not %s: the server %s (%r); %s",
                        what,
                        "refused it" if refused(exc) else "did not answer",
                        exc,
                        lost,
                    )
                    return None
                await asyncio.sleep(self.settings.retry_interval)


async def _in_line(waiter: Waiter, attempt: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """``attempt()`` by a call in line: a message meanwhile counts on it (``trying``)."""
    waiter.trying = True
    outcome = await attempt()
    waiter.trying = False
    return outcome
