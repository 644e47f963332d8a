"""The release path: one unlock, its hand-over, and its completion when cut off.

A release runs in the holder's turn, with a latch of its own (every resend of it replays the
first result, so it never releases twice). Cut off in flight (a cancel, no answer, a
refusal past the retries), it is finished in the background, resent until answered, so
``async with`` never exits holding and the bookkeeping follows the server's answer. The
release of a holder's last hold may hand the lock to a parked waiter of this client
(``waiting.py``: the hand-over's rules): the offer is made here and settled by the
script's answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._exceptions import LockLostError, LockNotOwnedError
from .._keys import unlock_latch_key
from .cancel import cancel_requested
from .failures import Failure, failure
from .primitive import Call, Release, decode_release, script_error
from .waiting import Offer

if TYPE_CHECKING:
    from .engine import Engine
    from .holds import HoldRecord
    from .ordering import Ticket
    from .primitive import Call, Invocation, Primitive

__all__ = ("hold_of", "release", "release_later", "release_soon")

log = logging.getLogger("aiolock")


async def release(
    engine: Engine,
    primitive: Primitive,
    owner: str | None,
    task: asyncio.Task[Any] | None = None,
) -> None:
    """Release one hold of ``owner`` (None: ``task``, else the calling task) on ``primitive``."""
    mark, calling = engine.call_starts()
    try:
        holder, _ = engine.holder(owner, task or calling)
        # Looked up once: the services change only with the event loop, never under a call.
        services = engine.services
        field = primitive.field(holder)
        # One line per holder, not per field: a read-write lock's read and write calls of
        # one holder take turns too (the upgrade rule depends on their order).
        ticket = services.order.join((primitive.key, holder))
        try:
            # An earlier call of this holder (a cut-off release finishing in the
            # background, another task's call with the same owner=) lands first, or this
            # call would decide on stale bookkeeping.
            if not ticket.ready:  # spares a coroutine when the turn is free
                await ticket.wait()
        except BaseException:
            # Cancelled while waiting its turn: the release was asked for, so it is made,
            # in the background once the turn comes (async with must never exit holding).
            services.background.complete(ticket, release_later(engine, primitive, holder, field))
            raise
        hold, latch, reapply, offer, invocation = _prepare(engine, primitive, holder, field)
        runner = services.runner
        # Its reply's future awaited here (no coroutine of the runner's per unlock).
        reply_of = runner.send(*invocation)
        try:
            try:
                raw = await (runner.run(*invocation) if reply_of is None else reply_of)
            except Exception as exc:
                if reply_of is None:
                    raise
                # What run() does after a failed first send: retries, a reload.
                raw = await runner.rerun(exc, *invocation)
            result = decode_release(raw)
        except BaseException as exc:
            error = _failed(
                engine,
                primitive,
                holder,
                exc,
                ticket=ticket,
                hold=hold,
                invocation=invocation,
                latch=latch,
                reapply=reapply,
                offer=offer,
            )
            if error is not None:
                raise error from exc
            raise
        if hold is not None:
            hold.release_ends(kept=result is Release.KEPT)
        _settle_offer(engine, primitive, offer, result)
        try:
            _settle_release(engine, primitive, holder, hold, latch, result)
        finally:
            ticket.release()
    except Exception as exc:
        # A cancel request came while the call ran (swallowed below aiolock, then
        # another error): the cancel wins, as it would have had it been delivered.
        if cancel_requested(calling, mark):
            raise asyncio.CancelledError from exc
        raise
    finally:
        engine.services.background.call_ended()
    if cancel_requested(calling, mark):
        # Released, but a cancel came meanwhile (swallowed below aiolock): say so.
        raise asyncio.CancelledError


def _prepare(
    engine: Engine, primitive: Primitive, holder: str, field: str
) -> tuple[HoldRecord | None, str, int, Offer | None, Invocation]:
    """The unlock's script call, in the holder's turn: with its latch, lease, offer."""
    hold = engine.services.holds.get(primitive.key, field)
    # One latch per unlock call: every resend of this call replays the first result.
    latch = unlock_latch_key(primitive.key, engine.request_id())
    reapply = engine.services.holds.reapply_ms(hold)
    offer = _offer(engine, primitive, holder, hold)
    invocation = primitive.release(field, reapply, latch, None if offer is None else offer.call)
    if hold is not None:
        # While a release is in flight the watchdog may find the key gone: not a loss.
        hold.release_begins(_reapply_until(hold, reapply))
    return hold, latch, reapply, offer, invocation


def _reapply_until(hold: HoldRecord, reapply: int) -> float | None:
    """Until when an unlock's re-applied lease runs at least, for a guarded hold.

    Holds that remain get ``reapply`` ms from the unlock, perhaps shorter than the
    lease confirmed: the guard must know. A plain hold spares itself the clock.
    """
    if not hold.guards:
        return None
    return asyncio.get_running_loop().time() + reapply / 1000


def _failed(
    engine: Engine,
    primitive: Primitive,
    holder: str,
    exc: BaseException,
    *,
    ticket: Ticket,
    hold: HoldRecord | None,
    invocation: Invocation,
    latch: str,
    reapply: int,
    offer: Offer | None,
) -> Exception | None:
    """An unlock's script raised ``exc``: what to raise instead (None: ``exc`` itself)."""
    services = engine.services
    kind = failure(exc)
    if kind.may_have_run:
        if hold is not None and not isinstance(exc, asyncio.CancelledError):
            # Not renewed from now on: should the release never land, the lock then
            # runs out with its lease instead of staying held by nobody's knowledge.
            services.renewal.untrack(hold)
        # Cancelled with the script in flight, or no answer within the retries: the
        # release may or may not have happened; or the server refused it past the
        # retries (BUSY, TRYAGAIN, OOM...: not run). Finish it in the background (a
        # resend with the same latch never releases twice), so the bookkeeping follows
        # the server's answer and no hold is left held, and renewed, that nobody
        # tracks. The caller still sees its error (the contract leaves connection
        # errors be).
        services.background.complete(
            ticket,
            _finish_release(
                engine,
                primitive,
                holder,
                hold=hold,
                invocation=invocation,
                latch=latch,
                reapply=reapply,
                offer=offer,
            ),
        )
        return None
    # Refused (a login), or the script failed: nothing was done.
    if hold is not None:
        hold.release_ends(kept=False)
    _settle_offer(engine, primitive, offer, Release.NOT_HELD)
    ticket.release()
    if kind is Failure.FAILED and isinstance(exc, ResponseError):
        return script_error(primitive.name, primitive.key, exc)
    return None


def release_soon(engine: Engine, primitive: Primitive, owner: str | None) -> None:
    """Release one hold of ``owner`` (None: the calling task) in the background.

    For a guarded hold found lost: its block raises at once, whether or not the server
    answers, and the release lands (or finds nothing) in the holder's turn.
    """
    holder, _ = engine.holder(owner)
    field = primitive.field(holder)
    engine.services.background.complete(
        engine.services.order.join((primitive.key, holder)),
        release_later(engine, primitive, holder, field),
    )


def hold_of(engine: Engine, primitive: Primitive, owner: str | None) -> HoldRecord | None:
    """The calling holder's hold on ``primitive`` as this client records it (None: none)."""
    holder, _ = engine.holder(owner)
    return engine.services.holds.get(primitive.key, primitive.field(holder))


async def release_later(engine: Engine, primitive: Primitive, holder: str, field: str) -> None:
    """An unlock() cancelled before its turn: release in the background when it comes."""
    hold = engine.services.holds.get(primitive.key, field)
    latch = unlock_latch_key(primitive.key, engine.request_id())
    reapply = engine.services.holds.reapply_ms(hold)
    if hold is not None:
        hold.release_begins(_reapply_until(hold, reapply))
    invocation = primitive.release(field, reapply, latch)
    await _finish_release(
        engine,
        primitive,
        holder,
        hold=hold,
        invocation=invocation,
        latch=latch,
        reapply=reapply,
        offer=None,
    )


async def _finish_release(
    engine: Engine,
    primitive: Primitive,
    holder: str,
    *,
    hold: HoldRecord | None,
    invocation: Invocation,
    latch: str,
    reapply: int,
    offer: Offer | None,
) -> None:
    def stop_renewing() -> None:
        # While the server does not answer, renewing would only keep a lock alive
        # that its holder already let go of: let the lease run out instead.
        if hold is not None:
            engine.services.renewal.untrack(hold)

    answered: tuple[Any] | None = None
    try:
        answered = await engine.until_answered(
            f"release lock {primitive.name!r} held by {holder}",
            lambda: engine.services.runner.run(*invocation),
            reapply,
            on_unanswered=stop_renewing,
        )
    finally:
        if hold is not None:
            hold.release_ends(
                kept=answered is not None and decode_release(answered[0]) is Release.KEPT
            )
        if answered is None:
            _settle_offer(engine, primitive, offer, None)
    if answered is None:
        if hold is not None:
            engine.services.holds.drop(hold, ended="release_unanswered")
        return
    result = decode_release(answered[0])
    _settle_offer(engine, primitive, offer, result)
    try:
        _settle_release(engine, primitive, holder, hold, latch, result)
    except LockLostError:
        # _settle_release logged the loss; the caller already had its error.
        pass
    except LockNotOwnedError as exc:
        # The caller, cancelled or cut off, is not there to be told: nothing was held.
        log.info("aiolock: a cut-off unlock() found nothing to release: %s", exc)


def _settle_release(
    engine: Engine,
    primitive: Primitive,
    holder: str,
    hold: HoldRecord | None,
    latch: str,
    result: Release,
) -> None:
    services = engine.services
    if result is Release.NOT_HELD:
        if hold is not None and hold.count:
            why = hold.lost or "its lease ran out or was taken before unlock()"
            if hold.lost is None:
                # The watchdog did not see it first (an explicit lease, a starved
                # event loop): log it here, so every loss is logged once.
                services.holds.report_lost(hold, f"{why}; found by unlock()", "unlock")
            services.holds.drop(hold)
            raise LockLostError(primitive.name, holder, why)
        raise LockNotOwnedError(
            primitive.name, holder, engine.services.holds.held_by_sibling(primitive.key, holder)
        )
    services.latches.add(latch)
    if result is Release.FREED and primitive.polls:
        # Nothing was published: this client's own waiters need not wait out a pause.
        services.waiting.deliver(primitive.channel(holder), b"0", heard=False)
    if result is Release.DOWNGRADED:
        # Nothing was published (as in Redisson: the wire must match), yet this
        # client's own readers can get in now: wake them here rather than after their
        # lease-bounded wait. Writers stay parked: the read holds left keep them out.
        services.waiting.wake_shared(primitive.channel(holder))
    if hold is not None:
        lost = hold.lost
        services.holds.released(hold, fully=result is not Release.KEPT)
        if lost is not None:
            # The server still had the holder's entry (a read hold whose own timeout
            # key ran out), but the watchdog had found the hold dead: say so.
            raise LockLostError(primitive.name, holder, lost)


def _offer(
    engine: Engine, primitive: Primitive, holder: str, hold: HoldRecord | None
) -> Offer | None:
    """A hand-over for this release of ``holder``'s last hold, if one is due."""
    if (
        not primitive.hands_over
        # A hand-over is an acquisition by the release script: no WAIT follows it.
        or engine.settings.replica_acks
        or hold is None
        or len(hold.leases) != 1
        or hold.lost is not None
        or engine.closed
    ):
        return None
    channel = primitive.channel(holder)
    if not engine.services.waiting.has_waiters(channel) or not engine.services.handovers.allowed(
        primitive.key
    ):
        # The common case, nobody of this client waiting: no closure, no scan.
        return None

    def eligible(call: Call) -> bool:
        return (
            (call.task is not None or engine.is_thread(call.holder))
            and call.holder != holder
            and not engine.services.order.busy((primitive.key, call.holder))
        )

    heir = engine.services.waiting.heir(channel, primitive, eligible)
    if heir is None:
        return None
    waiter, call, heir_p = heir
    waiter.offer = offer = Offer(call, heir_p, waiter.offer_settled)
    return offer


def _settle_offer(
    engine: Engine, primitive: Primitive, offer: Offer | None, result: Release | None
) -> None:
    """The release's outcome for its hand-over; None: the release went unanswered."""
    if result is Release.FREED:
        engine.services.handovers.freed(primitive.key)
    if offer is None:
        return
    if result is Release.HANDED:
        engine.services.handovers.handed(primitive.key)
        # Recorded now, whether the waiter takes it or has left (then its leaving
        # releases it, in its holder's turn, once it sees this outcome). As the heir's
        # hold: the kind it waits for (which takes a hand-over from this one).
        engine.won(offer.heir, offer.call, 1, sent=offer.sent)
        if offer.abandoned:
            engine.services.holds.disown(offer.heir.key, offer.call.field)
        offer.settle(handed=True)
        return
    offer.settle(handed=None if result is None else False)
