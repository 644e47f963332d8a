"""The acquire path of a lock: attempt, subscribe, wait, be woken or handed the lock.

* **attempt** (``attempt.py``): in the holder's turn, from the count this client believes;
* **wait**: subscribe, register the waiter *before* the next attempt (a release published
  while it is in flight wakes it), wait bounded by the lease seen (a lost message costs
  latency, never liveness), try again; no barging past local waiters where the primitive
  asks; a waiter that leaves passes its turn to try on; a release of this client may hand
  the lock straight to a parked waiter (``handover.py``);
* **deadline** and **cancellation**: a call that got a cancel request while it ran never
  returns normally (``cancel.py``); what its script may have done is undone in the
  background (``attempt.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from time import monotonic
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._exceptions import ClientClosedError
from .attempt import Attempts
from .cancel import cancel_requested
from .core import Part
from .handover import Offer
from .primitive import Call
from .release import Releases
from .replies import script_error

if TYPE_CHECKING:
    from .._net.subscriptions import Subscription
    from .core import Core
    from .primitive import Primitive
    from .waiting import Waiter

__all__ = ("CUT_OFF", "Acquirer")

# How long past its wait an acquire may last (seconds) before its round trip under way is
# cut off: one round trip and a connect on a loaded machine. Without it a call waited for
# a server that stopped answering as long as the connection's timeouts and retries allowed
# (a frozen cluster shard: 20 s for try_lock(wait=1)).
CUT_OFF = 0.5


async def _bounded(call: Coroutine[Any, Any, bool], bound: float) -> bool:
    """``call``'s result, or False once ``bound`` seconds have passed.

    Cut off, the call is cancelled as by a caller's ``asyncio.timeout``: its engine undoes
    what its attempt may have taken (now, or once the server answers again). Its deadline
    ends it first whenever the server answers, so this only cuts off a round trip that
    is not answered in time. An outer cancel still raises CancelledError.
    """
    scope = asyncio.timeout(bound)
    try:
        async with scope:
            return await call
    except TimeoutError:
        if scope.expired():
            return False
        raise


class Acquirer(Part):
    """Acquiring a lock (every primitive but the counting ones): the handles' lock() path."""

    def __init__(self, core: Core, attempts: Attempts, releases: Releases) -> None:
        super().__init__(core)
        self._attempts = attempts
        self._releases = releases

    def acquire(
        self,
        p: Primitive,
        owner: str | None,
        wait: float | None,
        lease: float | None,
        *,
        receipt: list[int] | None = None,
        timed: bool = False,
        bounded: bool = True,
    ) -> Coroutine[Any, Any, bool]:
        """Acquire ``p`` for ``owner`` (None: the calling task); False if ``wait`` ran out.

        ``receipt``: the acquisition's token is appended to it (a fenced lock's).
        ``timed``: a guarded hold's: its confirmation time is recorded (see ``_attempt``).
        With a ``wait``, the call returns within it plus ``CUT_OFF`` whatever the server
        does (``_bounded``), unless not ``bounded``: a composite's member, whose call its
        composite bounds (side by side in one task, where a timeout scope of its own
        would cancel the whole task).
        """
        call = self._acquire(p, owner, wait, lease, receipt=receipt, timed=timed)
        return call if wait is None or not bounded else _bounded(call, wait + CUT_OFF)

    async def _acquire(
        self,
        p: Primitive,
        owner: str | None,
        wait: float | None,
        lease: float | None,
        *,
        receipt: list[int] | None,
        timed: bool,
    ) -> bool:
        started = monotonic()
        mark, task = self._core.call_starts()
        # One coroutine for the whole call (no inner one per acquire): its body is inline.
        try:
            services = self._s
            call = self._call(
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
            if p.polls:
                won = await self._acquire_polling(p, call)
            else:
                channel = p.channel(call.holder)
                room = services.waiting
                sub, waiter, queue_behind = self._join(p, call, channel)
                if queue_behind:
                    won = await self._wait(p, call, sub, waiter, room.lease_left_ms(p.key))
                else:
                    try:
                        reply = await self._attempts.attempt(p, call)
                    except BaseException:
                        self._unjoin(channel, sub, waiter, leaving=True, mid_attempt=True)
                        raise
                    if reply.acquired or (
                        call.deadline is not None
                        and asyncio.get_running_loop().time() >= call.deadline
                    ):
                        self._unjoin(channel, sub, waiter, leaving=not reply.acquired)
                        if reply.acquired:
                            return True
                        await self._attempts.give_up(p, call)
                        won = False
                    else:
                        won = await self._wait(p, call, sub, waiter, reply.ttl_ms)
        except BaseException as exc:
            # A cancel request came while the call ran (swallowed below aiolock, then
            # another error): the cancel wins, as it would have had it been delivered.
            if self._failed(p, exc, task, mark, started):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self._s.background.call_ended()
        if not won:
            self._core.events.acquire_failed(p.lock_kind, p.name, monotonic() - started, "timeout")
        return won

    def _join(
        self, p: Primitive, call: Call, channel: str
    ) -> tuple[Subscription | None, Waiter | None, bool]:
        """Join the lock's subscription before the first attempt, if others wait on it.

        Others of this client already wait on the lock: the call joins their subscription
        and registers before its first attempt, so that no second attempt is needed to
        close the race with a release published in between. Also whether it queues behind
        them.
        """
        services = self._s
        sub = None if call.wait == 0 else services.dispatcher.join(channel)
        if sub is None:
            return None, None, False
        # No barging: local waiters are handed the lock in turn as it is released, so a
        # newcomer (often the task that just released it) waits its turn. One ahead that
        # leaves without the lock passes its turn on (WaitingRoom.remove). The holder itself
        # re-enters at once: it is not competing for a lock it has. Nor does a call whose
        # holder has another call under way: that one may take the lock, and no message
        # would then wake this one to re-enter.
        room = services.waiting
        holding = services.holds.holding(p.key, call.field) or services.order.busy(
            (p.key, call.holder)
        )
        queue_behind = p.no_barging and room.has_waiters(channel) and not holding
        return sub, room.add(channel, p.wake_count, shared=p.shared_waits), queue_behind

    def _unjoin(
        self,
        channel: str,
        sub: Subscription | None,
        waiter: Waiter | None,
        *,
        leaving: bool,
        mid_attempt: bool = False,
    ) -> None:
        """Undo ``_join``: the first attempt took the lock, or the call ends without it."""
        if sub is not None and waiter is not None:
            self._s.waiting.remove(channel, waiter, leaving=leaving, mid_attempt=mid_attempt)
            sub.release()

    def _call(
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
    ) -> Call:
        """What the acquire call fixes before its first round trip (``Call``)."""
        holder, task = self._core.holder(owner, calling)
        if not self._s.order.busy((p.key, holder)):
            # Nothing of this holder's under way on the lock: an upgrade is refused now,
            # without a round trip. Else (a cut-off unlock() finishing in the background,
            # say) the holds it counts may be on their way out: the attempt judges the rule
            # in the holder's turn, once they have settled.
            p.check_acquire(holder, self._s.holds)
        lease_ms = self.settings.lease_ms if lease is None else max(1, round(lease * 1000))
        # The loop is looked up only for a deadline (each lookup is a getpid() on 3.11).
        deadline = None if wait is None else asyncio.get_running_loop().time() + wait
        return Call(
            holder,
            task,
            p.field(holder),
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
        self,
        p: Primitive,
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
        self._core.events.acquire_failed(
            p.lock_kind,
            p.name,
            monotonic() - started,
            "cancelled"
            if cancelled
            else "closed"
            if isinstance(exc, ClientClosedError)
            else "error",
        )
        return cancelled and not isinstance(exc, asyncio.CancelledError)

    async def _acquire_polling(self, p: Primitive, call: Call) -> bool:
        """Acquire a lock that publishes nothing (the spin lock): try, pause, try again.

        Each pause is a waiter's bounded wait on the lock's channel in this client's
        waiting room, never subscribed: nothing from the server wakes it, but this
        client's own releases do (``_settle_release``), and so does ``aclose()``.
        """
        reply = await self._attempts.attempt(p, call)
        if reply.acquired:
            return True
        loop = asyncio.get_running_loop()
        room = self._s.waiting
        channel = p.channel(call.holder)
        room.enter(p.key, call.field)
        self._core.events.wait_started(p.lock_kind, p.name)
        try:
            for pause in p.pauses():
                if call.deadline is not None:
                    remaining = call.deadline - loop.time()
                    if remaining <= 0:
                        await self._attempts.give_up(p, call)
                        return False
                    pause = min(pause, remaining)  # noqa: PLW2901 - bounded by the deadline
                waiter = room.add(channel, p.wake_count, shared=False)
                try:
                    self._core.check_open()
                    await waiter.wait(pause)
                    self._core.check_open()
                finally:
                    room.remove(channel, waiter, leaving=False)
                if (await self._attempts.attempt(p, call)).acquired:
                    return True
        finally:
            room.leave(p.key, call.field)
            self._core.events.wait_ended(p.lock_kind, p.name)
        raise AssertionError("pauses() ended")  # pragma: no cover - an endless iterator

    async def _wait(
        self,
        p: Primitive,
        call: Call,
        sub: Subscription | None,
        waiter: Waiter | None,
        ttl_ms: int,
    ) -> bool:
        waiting = self._s.waiting
        waiting.enter(p.key, call.field)
        self._core.events.wait_started(p.lock_kind, p.name)
        waiting.saw_lease(p.key, ttl_ms)
        try:
            if sub is None:
                sub = await self._subscribe(p, call)
                if sub is None:
                    await self._attempts.give_up(p, call)
                    return False
                waiter = None  # subscribed only now: attempt again before waiting
            while True:
                # The subscription stays referenced (and so subscribed) while this waits.
                outcome = await self._wait_subscribed(p, call, sub, waiter, ttl_ms)
                if outcome is not None:
                    return outcome
                sub = await self._subscribe(p, call)
                if sub is None:
                    await self._attempts.give_up(p, call)
                    return False
                waiter = None
        except BaseException:
            if p.leaves_queue and waiting.field_waiting(p.key, call.field) == 1:
                # The queue exit takes its place in the holder's line now, so the holder's
                # next call (a new wait, say) cannot overtake it and be removed by it.
                self._s.background.complete(
                    self._s.order.join((p.key, call.holder)), self._attempts.leave(p, call)
                )
            raise
        finally:
            waiting.leave(p.key, call.field)
            self._core.events.wait_ended(p.lock_kind, p.name)

    async def _subscribe(self, p: Primitive, call: Call) -> Subscription | None:
        """Subscribe to ``call``'s channel; None if its deadline came first."""
        loop = asyncio.get_running_loop()
        remaining = None if call.deadline is None else call.deadline - loop.time()
        try:
            return await self._s.dispatcher.subscribe(p.channel(call.holder), remaining)
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
        room = self._s.waiting
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
                        reply = await self._attempts.attempt(p, call)
                    except BaseException:
                        room.remove(channel, waiter, leaving=True, mid_attempt=True)
                        raise
                    if reply.acquired:
                        room.remove(channel, waiter, leaving=False)
                        return True
                    ttl_ms = reply.ttl_ms
                    self._s.waiting.saw_lease(p.key, ttl_ms)
                # A lost message costs at most the holder's remaining lease.
                bound = ttl_ms / 1000 if ttl_ms >= 0 else self.settings.ttl_cap
                if call.deadline is not None:
                    remaining = call.deadline - loop.time()
                    if remaining <= 0:
                        room.remove(channel, waiter, leaving=True)
                        await self._attempts.give_up(p, call)
                        return False
                    bound = min(bound, remaining)
                try:
                    self._core.check_open()
                    waiter.park(p, call)  # from now on a release may hand it the lock
                    try:
                        await waiter.wait(bound)
                    finally:
                        waiter.unpark()
                    self._core.check_open()
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
                        await self._attempts.give_up(p, call)
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
        if self._core.closed:
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
            self._core.disown(p, call)

        async def release_if_handed() -> None:
            if await offer.outcome:
                await self._releases.release_later(p, call.holder, call.field)

        self._s.background.complete(self._s.order.join((p.key, call.holder)), release_if_handed())
