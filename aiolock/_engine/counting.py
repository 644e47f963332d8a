"""The counting objects' paths: a semaphore's take, a change made once, a latch's wait.

A take is an attempt and the call that undoes it (by its tombstone); a change (a release
of permits, a count-down) runs with a latch of its own, so a resend replays it instead of
changing the count twice; both are finished or undone in the background when cut off, as
a lock's are. Their waits register before each attempt and re-check at least every
``_RECHECK`` seconds: their state has no lease to bound a wait by.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._emitter import fail_reason
from .._exceptions import ClientClosedError
from .._keys import acquire_tombstone_key, unlock_latch_key
from .cancel import cancelled_since
from .failures import Failure, failure
from .primitive import Outcome, Renewing, script_error
from .waiting import Step, wait_in_line

if TYPE_CHECKING:
    from .._net.subscriptions import Subscription
    from ..events import SemaphoreKind
    from .engine import Engine
    from .primitive import Invocation, Waitable
    from .waiting import Waiter

__all__ = ("await_condition", "change", "let_go_permit", "take", "took_permit")


# A wait for a semaphore or a latch re-reads the state at least this often (seconds): a
# lost message then costs at most this much latency. Their state has no lease to bound by.
_RECHECK = 5.0
# The turn of a call queued behind this client's waiters (no barging): it waits, untried.
_QUEUED = Outcome(done=False)


#: A permit of a permit-expirable semaphore: KEYS[i] = the "{name}:timeout" ZSET of permit i
#: (``extra``); ARGV[i+1] = its id, the 16 raw bytes of the hex ``field``.
PERMIT_RENEWAL = Renewing(
    "psem_renew",
    lambda batch: [hold.extra for hold in batch],
    lambda batch: [bytes.fromhex(hold.field) for hold in batch],
)


async def change(
    engine: Engine, waitable: Waitable, invocation_for: Callable[[str], Invocation], what: str
) -> Any:
    """Run a change of ``waitable`` (a release of permits, a count-down), exactly once.

    ``invocation_for(latch)`` is the script call; ``latch`` is a key of this call alone
    in which the script keeps its first answer, so that a resend replays it instead of
    changing ``waitable`` twice. Cancelled or cut off in flight, the change is finished in the
    background, resent until answered, as an unlock is; the caller still gets its error.
    """
    mark, _ = engine.call_starts()
    try:
        reply = await _change(engine, waitable, invocation_for, what)
    except Exception as exc:
        if cancelled_since(mark):
            raise asyncio.CancelledError from exc
        raise
    finally:
        engine.services.background.call_ended()
    if cancelled_since(mark):
        # Made, but a cancel came meanwhile (swallowed below aiolock): say so.
        raise asyncio.CancelledError
    return reply


async def _change(
    engine: Engine, waitable: Waitable, invocation_for: Callable[[str], Invocation], what: str
) -> Any:
    latch = unlock_latch_key(waitable.key, engine.request_id())
    invocation = invocation_for(latch)
    try:
        reply = await engine.services.runner.run(*invocation)
    except BaseException as exc:
        # Refused past the retries (BUSY, TRYAGAIN...), an earlier send may yet have
        # run (a timeout): finished in the background too, its latch replaying it.
        kind = failure(exc)
        if kind.may_have_run:
            engine.services.background.spawn(
                _finish_change(engine, waitable, invocation, latch, what)
            )
        elif kind is Failure.FAILED and isinstance(exc, ResponseError):
            raise script_error(waitable.name, waitable.key, exc) from exc
        raise
    engine.services.latches.add(latch)
    return reply


async def _finish_change(
    engine: Engine, waitable: Waitable, invocation: Invocation, latch: str, what: str
) -> None:
    """Resend a cut-off change (its latch replays a first send that landed)."""
    answered = await engine.until_answered(
        f"{what} {waitable.name!r}",
        lambda: engine.services.runner.run(*invocation),
        engine.settings.resend_window_ms,
        lost="the change may not have been made",
    )
    if answered is not None:
        engine.services.latches.add(latch)


async def take(
    engine: Engine,
    waitable: Waitable,
    attempt_for: Callable[[str], tuple[Invocation, Invocation]],
    wait: float | None,
    decode: Callable[[Any], Outcome],
    *,
    kind: SemaphoreKind | None = None,
) -> bool:
    """Take from ``waitable`` (a semaphore's permits) once its script lets, within ``wait``.

    ``kind``: an acquire of that semaphore kind, told as the acquire events (None:
    a take that is no acquire, drain_permits()).

    ``attempt_for(tombstone)``: one attempt, and the call that undoes it (gives back
    what it took, if anything, and voids any copy of it still on its way, by the
    tombstone). A resend of an attempt answers what its first send did. ``decode``
    reads an attempt's reply: whether it took, and how long at most to wait before
    the next attempt (None: until woken or re-checking). An attempt cut off in flight,
    or answered after a cancel, is undone in the background: a cancelled take never
    keeps what it took.
    """
    mark, _ = engine.call_starts()

    async def attempt() -> Outcome:
        restarts = engine.services.restarts
        if restarts is not None and (left := await restarts.left_ms(waitable.key)):
            # Strict restarts: permits the server forgot may still be in use.
            return Outcome(done=False, wait=left / 1000)
        tombstone = acquire_tombstone_key(waitable.key, engine.request_id())
        invocation, undo_invocation = attempt_for(tombstone)

        def undo() -> None:
            engine.services.background.spawn(
                engine.until_answered(
                    f"give back what a cancelled call took from {waitable.name!r}",
                    lambda: engine.services.runner.run(*undo_invocation),
                    engine.settings.resend_window_ms,
                    lost="it stays taken",
                )
            )

        try:
            outcome = decode(await engine.services.runner.run(*invocation))
        except BaseException as exc:
            if not failure(exc).ran_nothing:
                # Cut off, or refused past the retries after a send that may have run.
                undo()
                raise
            if isinstance(exc, ResponseError):
                raise script_error(waitable.name, waitable.key, exc) from exc
            raise
        if engine.closed or cancelled_since(mark):
            if outcome.done:
                undo()
            if engine.closed:
                raise ClientClosedError
            raise asyncio.CancelledError
        if outcome.done and waitable.receipts:
            # Taken for good: no resend or undo will look for the receipt any more.
            engine.services.latches.add(tombstone)
        return outcome

    started = monotonic()
    events = engine.events
    try:
        taken = await _wait_for(engine, waitable, attempt, wait, kind)
    except BaseException as exc:
        cancelled = isinstance(exc, asyncio.CancelledError) or cancelled_since(mark)
        if kind is not None:
            events.acquire_failed(
                kind, waitable.name, monotonic() - started, fail_reason(exc, cancelled=cancelled)
            )
        if cancelled and not isinstance(exc, asyncio.CancelledError):
            raise asyncio.CancelledError from exc
        raise
    finally:
        engine.services.background.call_ended()
    if kind is not None:
        if taken:
            events.acquired(kind, waitable.name, "", monotonic() - started, reentrant=False)
        else:
            events.acquire_failed(kind, waitable.name, monotonic() - started, "timeout")
    return taken


def took_permit(engine: Engine, waitable: Waitable, permit: str, timeouts: str) -> None:
    """Record a permit (its hex id) that the watchdog renews while the calling task lives.

    Called right after the take returned, with no await in between: a cancel cannot
    come between the permit taken and its renewal. ``timeouts``: the ZSET whose score
    of the permit the renewal moves forward (``psem_renew.lua``).
    """
    engine.services.holds.acquired(
        key=waitable.key,
        field=permit,
        name=waitable.name,
        holder=f"permit {permit}",
        task=asyncio.current_task(),
        count=1,
        lease_ms=None,
        renewing=PERMIT_RENEWAL,
        extra=timeouts,
    )


def let_go_permit(engine: Engine, waitable: Waitable, permit: str) -> tuple[bool, str | None]:
    """Stop renewing a permit about to be released: was it renewed, why was it lost.

    The reason is None if it was not found lost. Called before the release is sent:
    should the release never land, the permit runs out with its lease instead of
    staying taken, renewed, by nobody's knowledge.
    """
    hold = engine.services.holds.get(waitable.key, permit)
    if hold is None or hold.renewing is not PERMIT_RENEWAL:
        return False, None
    lost = hold.lost
    engine.services.holds.drop(hold)
    return True, lost


async def await_condition(
    engine: Engine, waitable: Waitable, holds: Callable[[], Awaitable[bool]], wait: float | None
) -> bool:
    """Wait until ``holds()`` (a read: a latch at zero) is true, within ``wait``."""
    mark, _ = engine.call_starts()

    async def attempt() -> Outcome:
        return Outcome(await holds())

    try:
        done = await _wait_for(engine, waitable, attempt, wait)
    finally:
        engine.services.background.call_ended()
    if cancelled_since(mark):
        raise asyncio.CancelledError
    return done


async def _wait_for(
    engine: Engine,
    waitable: Waitable,
    attempt: Callable[[], Awaitable[Outcome]],
    wait: float | None,
    kind: SemaphoreKind | None = None,
) -> bool:
    """Attempt until one succeeds, woken by ``waitable``'s channel; False once ``wait`` ran out.

    ``kind``: its wait is told as a ``Waiting`` of that kind (None: not told).

    In the one wait loop (``waiting.wait_in_line``), as a lock's: each wait is bounded
    (``_RECHECK``, and the attempt's own hint: the next permit to expire). No barging
    (``waitable.no_barging``): a call that finds this client's waiters on the channel
    queues behind them without trying, and a take that leaves some available wakes as
    many waiters as that lets in (``Outcome.left``), so the queue never sits on something
    free.
    """
    room = engine.services.waiting
    channel = waitable.channel("")
    queue = wait != 0 and waitable.no_barging and room.queues_behind(channel)
    if not queue:
        first = await _first_look(engine, channel, attempt)
        if first or wait == 0:
            return first
    deadline = None if wait is None else asyncio.get_running_loop().time() + wait
    room.enter(waitable.key, "")
    engine.events.wait_started(kind, waitable.name)
    try:
        turn = _CountingTurn(engine, waitable, channel, attempt, deadline, queue=queue)
        return await wait_in_line(turn, None, None, _RECHECK)
    finally:
        room.leave(waitable.key, "")
        engine.events.wait_ended(kind, waitable.name)


class _CountingTurn:
    """A counting object's steps in the one wait loop: a take or a look, and what it left."""

    __slots__ = (
        "_attempt",
        "_behind",
        "_channel",
        "_queue",
        "_room",
        "deadline",
        "engine",
        "waitable",
    )

    def __init__(
        self,
        engine: Engine,
        waitable: Waitable,
        channel: str,
        attempt: Callable[[], Awaitable[Outcome]],
        deadline: float | None,
        *,
        queue: bool,
    ) -> None:
        self.engine = engine
        self.waitable = waitable
        self.deadline = deadline
        self._channel = channel
        self._attempt = attempt
        self._room = engine.services.waiting
        # The call queues behind this client's waiters, untried, at first.
        self._queue = queue
        self._behind = False

    async def subscribe(self) -> Subscription | None:
        loop = asyncio.get_running_loop()
        remaining = None if self.deadline is None else self.deadline - loop.time()
        return await self.engine.services.pubsub.subscribe(self._channel, remaining)

    def register(self) -> Waiter:
        # Decided with no await before the waiter is in line: those ahead wake it as they
        # leave (or take, leaving some).
        self._behind = self._queue and self._room.queues_behind(self._channel)
        self._queue = False
        waitable = self.waitable
        return self._room.add(
            self._channel,
            waitable.wake_count,
            shared=waitable.shared_waits,
            counts_available=waitable.counts_available,
        )

    async def attempt(self, waiter: Waiter) -> Step:
        outcome = _QUEUED if self._behind else await self._attempt()
        hint = outcome.wait
        bound = _RECHECK if hint is None else min(_RECHECK, hint)
        return Step(outcome.done, bound, spare=outcome.spare, left=outcome.left)

    def took(self, waiter: Waiter, step: Step) -> None:
        _took(self.engine, self.waitable, self._channel, waiter, step.left)
        self._room.remove(self._channel, waiter, leaving=False)

    def check_open(self) -> None:
        self.engine.check_open()

    def park(self, waiter: Waiter) -> None:
        """Nothing is handed over to a counting object's waiter."""

    async def woken(self, waiter: Waiter) -> bool | None:
        # A message that is itself what the wait waits for (a latch's "0") settles it.
        return True if waiter.settled else None

    def leave(self, waiter: Waiter, *, leaving: bool, mid_attempt: bool = False) -> None:
        # Leaving without what it waits for (deadline, cancel, close): a wake-up it was
        # given goes on, as a lock waiter's does, and so does the turn of an attempt cut
        # off (calls queued behind it count on it).
        self._room.remove(self._channel, waiter, leaving=leaving, mid_attempt=mid_attempt)

    def abandon(self, waiter: Waiter) -> None:
        """Nothing is handed over to a counting object's waiter."""

    async def give_up(self) -> None:
        """A counting object's wait owes the server nothing."""


async def _first_look(
    engine: Engine, channel: str, attempt: Callable[[], Awaitable[Outcome]]
) -> bool:
    """The attempt a call makes before it waits (if it does not queue): True if done."""
    outcome = await attempt()
    if outcome.left:
        # This client's waiters came after it was sent: let in what it left.
        engine.services.waiting.wake_left(channel, outcome.left)
    return outcome.done


def _took(engine: Engine, waitable: Waitable, channel: str, waiter: Waiter, left: int) -> None:
    """A waiter took (or found) what it waits for, ``left`` left: wake whom that lets in.

    Only where messages count what is available (the semaphore): else the waiter's
    leaving is all.

    A message that came while its take was in flight counted on it (it is awake).
    Whether the take ran before that message's release (the permit is still there,
    and ``left`` does not count it) or after it (the take may have had it) the reply
    cannot tell: its wake-up goes on, at the price of one take for nothing at most.
    """
    if not waitable.counts_available:
        return
    room = engine.services.waiting
    counted_on = waiter.event.is_set()
    # Out of line first: the wake-ups below are for others.
    room.remove(channel, waiter, leaving=False)
    if left:
        room.wake_left(channel, left)
    if counted_on:
        room.pass_turn(channel)
