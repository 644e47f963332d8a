"""What every lock handle shares: the acquire loop, cancellation rules, unlock and queries.

A lock type supplies its scripts through a handful of hooks (``_try_once``, ``_rollback``,
``_release_once``, ``_force_once``, ``_channel``); everything about waiting, leases, holder
identity and cancellation lives here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypeVar

from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._cancel import cancel_mark, cancelled_since
from ._config import TimeArg, check_name, check_owner, lease_seconds, wait_seconds
from ._exceptions import (
    ClientClosedError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
)
from ._keys import prefixed, unlock_latch_key
from ._ordering import in_turn
from ._pubsub import lock_wake_count

if TYPE_CHECKING:
    from types import TracebackType

    from ._client import Client
    from ._holds import Hold
    from ._ordering import Ticket
    from ._pubsub import Subscription, Waiter, WakeCount
    from ._scripts import AcquireReply, Script

__all__ = ("LockBase", "LockStatistics")

log = logging.getLogger("aiolock")
T = TypeVar("T")

# The server did not answer (after the client's own retries): the call may or may not have
# taken effect. Background completions resend through these; anything else is an answer.
_UNANSWERED = (RedisConnectionError, RedisTimeoutError, OSError)
# A refused login is a ConnectionError to redis-py, but the command never ran: there is
# nothing to complete or undo, and resending cannot succeed.
_REFUSED = (AuthenticationError,)


@dataclass(frozen=True, slots=True)
class _Attempt:
    """What one acquire call fixed before its first round trip."""

    holder: str
    task: asyncio.Task[Any] | None
    field: str
    lease_ms: int
    won_lease: int | None  # the lease recorded for the hold: None means the watchdog
    wait: float | None
    deadline: float | None
    # The task's count of cancel requests when the call started (see _cancel.py).
    mark: int


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """A snapshot of what this client knows locally about one lock handle's name.

    ``held_by_current_task`` and ``hold_count`` are this client's belief for the calling
    holder (Redis is the truth: use ``is_held_by_current_task()`` to ask it);
    ``tasks_waiting`` counts this client's tasks waiting to acquire the name.
    """

    name: str
    held_by_current_task: bool
    hold_count: int
    tasks_waiting: int


class LockBase:
    """Base of the lock handles: cheap, stateless apart from name and owner."""

    __slots__ = ("__weakref__", "_client", "_key", "_name", "_owner")

    _wake_count: WakeCount = staticmethod(lock_wake_count)
    #: Whether newcomers queue behind this client's waiters instead of barging: without it
    #: the task that just released, trying at once, re-takes the lock before the waiter
    #: woken by the release message can (lock types whose release wakes one waiter).
    _no_barging = False
    #: Whether a waiter that gives up must tell the server (the fair lock's queue).
    _leaves_queue = False
    #: Whether waiters are shared: woken by every message, as what lets one in lets them
    #: all in (readers), rather than only when the message's count reaches them.
    _shared_waits = False

    def __init__(self, client: Client, name: str, *, owner: str | None = None) -> None:
        self._client = client
        self._name = check_name(name)
        self._owner = check_owner(owner)
        self._key = client._options.key_prefix + name

    @property
    def name(self) -> str:
        """The lock's name as given (without ``key_prefix``)."""
        return self._name

    def __repr__(self) -> str:
        waiting = self._client._waiting.get(self._key, 0)
        owner = f" owner={self._owner!r}" if self._owner else ""
        return f"<aiolock.{type(self).__name__} {self._name!r}{owner}, {waiting} waiting>"

    # -- hooks a lock type provides -------------------------------------------------------

    def _field(self, holder: str) -> str:
        """The hash field of ``holder`` (the write lock appends ``:write``)."""
        return holder

    def _channel(self, holder: str) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _try_once(
        self, field: str, lease_ms: int, target: int, tombstone: str, *, wait: float | None
    ) -> AcquireReply:  # pragma: no cover - abstract
        """Run the acquire script once; ``wait`` is the call's (None: forever, 0: no wait)."""
        raise NotImplementedError

    async def _rollback(
        self, field: str, target: int, tombstone: str
    ) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _release_once(
        self, field: str, reapply_ms: int, latch: str
    ) -> int | None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _force_once(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _leave_queue(self, holder: str) -> None:
        """Tell the server a waiter gave up (only lock types with a queue need it)."""

    def _check_acquire(self, holder: str) -> None:
        """Refuse an acquire that can never succeed (the read-write lock's upgrade)."""

    def _hold_kind(self, holder: str) -> tuple[str, str]:
        """The renewal kind of a hold and the extra data it needs."""
        return "hash", ""

    # -- holder identity ------------------------------------------------------------------

    def _holder(self) -> tuple[str, asyncio.Task[Any] | None]:
        if self._owner is not None:
            return self._client._ids.owner(self._owner), None
        return self._client._ids.current()

    # -- acquiring ------------------------------------------------------------------------

    async def lock(self, lease: TimeArg = None) -> None:
        """Wait until acquired. ``lease`` None: the watchdog keeps the lease alive."""
        await self._acquire(None, lease_seconds(lease))

    async def try_lock(self, wait: TimeArg = 0, lease: TimeArg = None) -> bool:
        """Try for up to ``wait`` seconds (0: one attempt, None: forever); True if acquired."""
        return await self._acquire(wait_seconds(wait), lease_seconds(lease))

    def acquired(
        self, wait: TimeArg = None, lease: TimeArg = None
    ) -> contextlib.AbstractAsyncContextManager[Self]:
        """``async with lock.acquired(wait=5):`` raises LockTimeoutError after ``wait``."""
        return self._acquired(wait_seconds(wait), lease_seconds(lease))

    @contextlib.asynccontextmanager
    async def _acquired(self, wait: float | None, lease: float | None) -> AsyncIterator[Self]:
        if not await self._acquire(wait, lease):
            assert wait is not None
            raise LockTimeoutError(self._name, wait)
        try:
            yield self
        finally:
            await self.unlock()

    async def __aenter__(self) -> Self:
        await self._acquire(None, None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A body cancelled (even twice, the second time during this release) still
        # releases: unlock() finishes a cancelled release in the background.
        await self.unlock()

    async def _acquire(self, wait: float | None, lease: float | None) -> bool:
        mark = cancel_mark()
        client = self._client
        client._check_open()
        client._call_started()
        try:
            return await self._acquire_call(wait, lease, mark)
        except Exception as exc:
            # A cancel request came while the call ran (swallowed below aiolock, then
            # another error): the cancel wins, as it would have had it been delivered.
            if cancelled_since(mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            client._call_ended()

    async def _acquire_call(self, wait: float | None, lease: float | None, mark: int) -> bool:
        client = self._client
        holder, task = self._holder()
        self._check_acquire(holder)
        field = self._field(holder)
        lease_ms = client._lease_ms if lease is None else max(1, round(lease * 1000))
        loop = asyncio.get_running_loop()
        deadline = None if wait is None else loop.time() + wait
        won_lease = None if lease is None else lease_ms
        call = _Attempt(holder, task, field, lease_ms, won_lease, wait, deadline, mark)

        # Others of this client already wait on this lock: join their subscription and
        # register before the first attempt, so no second attempt is needed to close the
        # race with a release published in between.
        sub = None if wait == 0 else client._dispatcher.join(self._channel(holder))
        waiter = None
        if sub is not None:
            # No barging: local waiters are handed the lock in turn as it is released, so
            # a newcomer (often the task that just released it) waits its turn. One ahead
            # that leaves without the lock passes its turn on (remove_waiter). The holder
            # itself re-enters at once: it is not competing for a lock it has.
            # Nor does a call whose holder has another call under way: that one may take
            # the lock, and no message would then wake this one to re-enter.
            holding = client._holds.holding(self._key, field) or client._order.busy(
                (self._key, holder)
            )
            queue_behind = self._no_barging and sub.has_waiters() and not holding
            waiter = sub.add_waiter(shared=self._shared_waits)
            if queue_behind:
                return await self._wait(call, sub, waiter, client._lease_left_ms(self._key))
        try:
            reply = await self._attempt(call)
        except BaseException:
            if sub is not None and waiter is not None:
                sub.remove_waiter(waiter, leaving=True, mid_attempt=True)
                sub.release()
            raise
        if reply.acquired or (deadline is not None and loop.time() >= deadline):
            if sub is not None and waiter is not None:
                sub.remove_waiter(waiter, leaving=not reply.acquired)
                sub.release()
            if reply.acquired:
                return True
            await self._give_up(call)
            return False
        return await self._wait(call, sub, waiter, reply.ttl_ms)

    async def _wait(
        self,
        call: _Attempt,
        sub: Subscription | None,
        waiter: Waiter | None,
        ttl_ms: int,
    ) -> bool:
        client = self._client
        loop = asyncio.get_running_loop()
        waiting = client._waiting
        waiting[self._key] = waiting.get(self._key, 0) + 1
        line = (self._key, call.field)
        client._waiting_holders[line] = client._waiting_holders.get(line, 0) + 1
        if ttl_ms >= 0:
            client._lease_until[self._key] = loop.time() + ttl_ms / 1000
        try:
            if sub is None:
                remaining = None if call.deadline is None else call.deadline - loop.time()
                try:
                    sub = await client._dispatcher.subscribe(
                        self._channel(call.holder), self._wake_count, remaining
                    )
                except ResponseError as exc:
                    # An ACL refusing SUBSCRIBE: name the lock, as for its scripts.
                    raise self._script_error(exc) from exc
                if sub is None:
                    await self._give_up(call)
                    return False
                waiter = None  # subscribed only now: attempt again before waiting
            try:
                return await self._wait_subscribed(call, sub, waiter, ttl_ms)
            finally:
                sub.release()
        except BaseException:
            if self._leaves_queue and client._waiting_holders[line] == 1:
                # The queue exit takes its place in the holder's line now, so the holder's
                # next call (a new wait, say) cannot overtake it and be removed by it.
                client._complete_in_background(
                    client._order.join((self._key, call.holder)),
                    self._leave_queue(call.holder),
                )
            raise
        finally:
            count = waiting[self._key] - 1
            if count:
                waiting[self._key] = count
            else:
                del waiting[self._key]
                client._lease_until.pop(self._key, None)
            held = client._waiting_holders[line] - 1
            if held:
                client._waiting_holders[line] = held
            else:
                del client._waiting_holders[line]

    async def _wait_subscribed(
        self,
        call: _Attempt,
        sub: Subscription,
        waiter: Waiter | None,
        ttl_ms: int,
    ) -> bool:
        client = self._client
        loop = asyncio.get_running_loop()
        while True:
            if waiter is None:
                # Register before the attempt: a release published while the script is in
                # flight then wakes this very waiter, so it is never missed.
                waiter = sub.add_waiter(shared=self._shared_waits)
                try:
                    reply = await self._attempt(call)
                except BaseException:
                    sub.remove_waiter(waiter, leaving=True, mid_attempt=True)
                    raise
                if reply.acquired:
                    sub.remove_waiter(waiter, leaving=False)
                    return True
                ttl_ms = reply.ttl_ms
                if ttl_ms >= 0:
                    client._lease_until[self._key] = loop.time() + ttl_ms / 1000
            # A lost message costs at most the holder's remaining lease.
            bound = ttl_ms / 1000 if ttl_ms >= 0 else client._ttl_cap
            if call.deadline is not None:
                remaining = call.deadline - loop.time()
                if remaining <= 0:
                    sub.remove_waiter(waiter, leaving=True)
                    await self._give_up(call)
                    return False
                bound = min(bound, remaining)
            try:
                client._check_open()
                await waiter.wait(bound)
                client._check_open()
            except BaseException:
                sub.remove_waiter(waiter, leaving=True)
                raise
            sub.remove_waiter(waiter, leaving=False)
            waiter = None

    async def _give_up(self, call: _Attempt) -> None:
        """The call's wait ran out: leave the queue if it has one, then return False."""
        client = self._client
        if self._leaves_queue and not client._waiting_holders.get((self._key, call.field), 0) > 1:
            ticket = client._order.join((self._key, call.holder))
            await client._shielded(in_turn(ticket, self._leave_queue(call.holder)))
        if cancelled_since(call.mark):
            raise asyncio.CancelledError

    async def _attempt(self, call: _Attempt) -> AcquireReply:
        """Run the acquire script once, in the holder's turn, and record a hold it took."""
        client = self._client
        ticket = client._order.join((self._key, call.holder))
        try:
            # An earlier call of this holder (a rollback or release finishing in the
            # background, another task's call with the same owner=) must land first: this
            # attempt's target count depends on its outcome.
            await ticket.wait()
            client._check_open()
            # The holder's calls before this one may have changed what it holds (a write
            # unlock of the same owner=, say): judge the upgrade rule again, in turn.
            self._check_acquire(call.holder)
        except BaseException:
            ticket.release()
            raise
        while True:
            hold = client._holds.get(self._key, call.field)
            # The count this holder has once the attempt succeeds: a resend that finds it
            # already there does not count twice, and a rollback undoes exactly this
            # attempt (a script takes a hold only from the count the holder believes).
            # A hold known lost counts for nothing: the server no longer has it.
            target = (hold.count if hold and hold.lost is None else 0) + 1
            tombstone = f"{prefixed('aiolock_acquire_cancel', self._key)}:{client._next_call()}"
            try:
                reply = await self._try_once(
                    call.field, call.lease_ms, target, tombstone, wait=call.wait
                )
            except ResponseError as exc:
                # The script failed before it changed anything: nothing to roll back.
                ticket.release()
                raise self._script_error(exc) from exc
            except _REFUSED:
                ticket.release()
                raise
            except BaseException:
                # Cancelled (or cut off) with the script in flight: it may have taken a
                # hold that nobody will ever release. Give it back in the background, in
                # this holder's turn; were the server unreachable until the lease ends,
                # that hold ends with it.
                self._undo_later(ticket, call, target, tombstone)
                raise
            if not reply.stale or cancelled_since(call.mark) or client.closed:
                break
            # The holder's count on the server is not what this client believed: a hold
            # lost unnoticed (force_unlock, expiry). Believe the server, and try again.
            self._resync(call, reply.count)
        closed = client.closed
        if closed or cancelled_since(call.mark):
            # The caller was cancelled meanwhile (a cancel swallowed below aiolock) or the
            # client closed: never return a hold, and never go on to wait. Undo what the
            # script did: give a hold back, or void the call and leave a fair queue.
            self._undo_later(ticket, call, reply.count if reply.acquired else target, tombstone)
            if closed:
                raise ClientClosedError
            raise asyncio.CancelledError
        if reply.acquired:
            try:
                self._won(call, reply.count)
            finally:
                ticket.release()
            return reply
        ticket.release()
        return reply

    def _resync(self, call: _Attempt, count: int) -> None:
        """Make this client's belief the server's ``count`` of the holder's holds."""
        client = self._client
        hold = client._holds.get(self._key, call.field)
        believed = hold.count if hold else 0
        if hold is not None and hold.count and hold.lost is None:
            # Lost without the watchdog noticing yet: report it now, once. The hold stays,
            # known lost, so that the holder's next unlock() raises LockLostError.
            client._lease_lost(
                hold, f"the server had {count} of its {believed} hold(s); found by lock()"
            )
        if count:
            if hold is not None:
                client._holds.drop(hold)
            # Holds of this holder that it does not know of (a release that never got an
            # answer): count them, never renew them; they expire with their lease.
            log.warning(
                "aiolock: %s has %d hold(s) on lock %r it did not know of; they are counted "
                "and expire with their lease",
                call.holder,
                count,
                self._name,
            )
            self._won(call, count, lease_ms=client._lease_ms)

    def _undo_later(self, ticket: Ticket, call: _Attempt, target: int, tombstone: str) -> None:
        client = self._client
        client._complete_in_background(
            ticket,
            self._until_answered(
                f"undo a cut-off acquire of lock {self._name!r}",
                lambda: self._rollback(call.field, target, tombstone),
                call.lease_ms,
            ),
        )

    def _won(self, call: _Attempt, count: int, *, lease_ms: int | None = None) -> None:
        """Record the holder's ``count`` holds; ``lease_ms`` overrides the call's lease."""
        kind, extra = self._hold_kind(call.holder)
        self._client._holds.acquired(
            key=self._key,
            field=call.field,
            name=self._name,
            holder=call.holder,
            task=call.task,
            count=count,
            lease_ms=call.won_lease if lease_ms is None else lease_ms,
            kind=kind,
            extra=extra,
        )

    def _script_error(self, exc: ResponseError) -> Exception:
        message = str(exc)
        if message.startswith("WRONGTYPE"):
            # The reply does not say which key: a fair lock's queue or timeout key, or a
            # read hold's timeout key, can be the culprit as well as the lock key.
            return LockError(
                f"lock {self._name!r}: a key it uses ({self._key!r}, or one derived from "
                "that name) holds a value of another type, not lock state: is the name "
                f"used for something else? ({message})"
            )
        # NOPERM replies (redis-py's NoPermissionError) and ACL refusals inside a script
        # (an ERR reply) both say "no permissions"; neither names the lock.
        # Redis 7.0 words a refusal inside a script differently, without the command.
        lowered = message.lower()
        if "no permissions" in lowered or "can't run this command" in lowered:
            return LockError(
                f"lock {self._name!r}: the server refused a command for lack of permission "
                f"({message}); aiolock's ACL user needs EVALSHA, SCRIPT LOAD, PUBLISH and "
                "SUBSCRIBE, and access to the lock's keys and channels"
            )
        return exc

    # -- releasing ------------------------------------------------------------------------

    async def unlock(self) -> None:
        """Release one hold; raise LockNotOwnedError / LockLostError if there is none."""
        mark = cancel_mark()
        client = self._client
        client._check_open()
        client._call_started()
        try:
            await self._unlock_call(mark)
        except Exception as exc:
            # As in _acquire: a cancel request that came while the call ran wins. The
            # release itself was made or is being completed (a loss was logged).
            if cancelled_since(mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            client._call_ended()

    async def _unlock_call(self, mark: int) -> None:
        client = self._client
        holder, _ = self._holder()
        field = self._field(holder)
        # One line per holder, not per field: a read-write lock's read and write calls of
        # one holder take turns too (the upgrade rule depends on their order).
        ticket = client._order.join((self._key, holder))
        try:
            # An earlier call of this holder (a cut-off release finishing in the
            # background, another task's call with the same owner=) lands first, or this
            # call would decide on stale bookkeeping.
            await ticket.wait()
        except BaseException:
            # Cancelled while waiting its turn: the release was asked for, so it is made,
            # in the background once the turn comes (async with must never exit holding).
            client._complete_in_background(ticket, self._release_later(holder, field))
            raise
        hold = client._holds.get(self._key, field)
        # One latch per unlock call: every resend of this call replays the first result.
        latch = unlock_latch_key(self._key, secrets.token_hex(16))
        reapply = hold.reapply_ms(client._lease_ms) if hold else client._lease_ms
        if hold is not None:
            # While a release is in flight the watchdog may find the key gone: not a loss.
            hold.releasing += 1
        try:
            result = await self._release_once(field, reapply, latch)
        except _REFUSED:
            if hold is not None:
                hold.releasing -= 1
            ticket.release()
            raise
        except (asyncio.CancelledError, *_UNANSWERED) as exc:
            if hold is not None and not isinstance(exc, asyncio.CancelledError):
                # Not renewed from now on: should the release never land, the lock then
                # runs out with its lease instead of staying held by nobody's knowledge.
                client._renewal.untrack(hold)
            # Cancelled with the script in flight, or no answer within the retries: the
            # release may or may not have happened. Finish it in the background (a resend
            # with the same latch never releases twice), so the bookkeeping follows the
            # server's answer and no hold is left held, and renewed, that nobody tracks.
            # The caller still sees its error (the contract leaves connection errors be).
            client._complete_in_background(
                ticket, self._finish_unlock(holder, field, hold, reapply, latch)
            )
            raise
        except BaseException as exc:
            if hold is not None:
                hold.releasing -= 1
            ticket.release()
            if isinstance(exc, ResponseError):
                raise self._script_error(exc) from exc
            raise
        if hold is not None:
            hold.releasing -= 1
        try:
            self._settle_unlock(holder, field, hold, latch, result)
        finally:
            ticket.release()
        if cancelled_since(mark):
            # Released, but a cancel came meanwhile (swallowed below aiolock): say so.
            raise asyncio.CancelledError

    async def _release_later(self, holder: str, field: str) -> None:
        """An unlock() cancelled before its turn: release in the background when it comes."""
        client = self._client
        hold = client._holds.get(self._key, field)
        latch = unlock_latch_key(self._key, secrets.token_hex(16))
        reapply = hold.reapply_ms(client._lease_ms) if hold else client._lease_ms
        if hold is not None:
            hold.releasing += 1
        await self._finish_unlock(holder, field, hold, reapply, latch)

    async def _finish_unlock(
        self, holder: str, field: str, hold: Hold | None, reapply: int, latch: str
    ) -> None:
        client = self._client

        def stop_renewing() -> None:
            # While the server does not answer, renewing would only keep a lock alive
            # that its holder already let go of: let the lease run out instead.
            if hold is not None:
                client._renewal.untrack(hold)

        try:
            answered = await self._until_answered(
                f"release lock {self._name!r} held by {holder}",
                lambda: self._release_once(field, reapply, latch),
                reapply,
                on_unanswered=stop_renewing,
            )
        finally:
            if hold is not None:
                hold.releasing -= 1
        if answered is None:
            if hold is not None:
                client._holds.drop(hold)
            return
        try:
            self._settle_unlock(holder, field, hold, latch, answered[0])
        except LockLostError:
            # _settle_unlock logged the loss; the caller already had its error.
            pass
        except LockNotOwnedError as exc:
            # The caller, cancelled or cut off, is not there to be told: nothing was held.
            log.info("aiolock: a cut-off unlock() found nothing to release: %s", exc)

    async def _until_answered(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        give_up_ms: int,
        *,
        on_unanswered: Callable[[], None] | None = None,
    ) -> tuple[T] | None:
        """Resend an idempotent ``call`` until the server answers, as a 1-tuple.

        None once ``give_up_ms`` have passed without an answer (a lease that long has run
        out by then), once the client's resend window is over (every latch and tombstone
        outlives it, so no resend can count twice) or once the client closed.
        """
        client = self._client
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + min(give_up_ms, client._resend_window_ms) / 1000
        while True:
            try:
                return (await call(),)
            except _REFUSED as exc:
                log.warning("aiolock: could not %s: %s", what, exc)
                return None
            except _UNANSWERED as exc:
                if on_unanswered is not None:
                    on_unanswered()
                if client._closed or loop.time() >= give_up_at:
                    log.warning(
                        "aiolock: could not %s: the server did not answer (%s); what it "
                        "holds expires with its lease",
                        what,
                        exc,
                    )
                    return None
                await asyncio.sleep(client._options.retry_interval)

    def _settle_unlock(
        self, holder: str, field: str, hold: Hold | None, latch: str, result: int | None
    ) -> None:
        client = self._client
        if result is None:
            if hold is not None and hold.count:
                why = hold.lost or "its lease ran out or was taken before unlock()"
                if hold.lost is None:
                    # The watchdog did not see it first (an explicit lease, a starved
                    # event loop): log it here, so every loss is logged once.
                    client._lease_lost(hold, f"{why}; found by unlock()")
                client._holds.drop(hold)
                raise LockLostError(self._name, holder, why)
            raise LockNotOwnedError(self._name, holder, self._held_by_sibling(holder))
        client._latches.add(latch)
        if hold is not None:
            lost = hold.lost
            client._holds.released(hold, fully=result == 1)
            if lost is not None:
                # The server still had the holder's entry (a read hold whose own timeout
                # key ran out), but the watchdog had found the hold dead: say so.
                raise LockLostError(self._name, holder, lost)

    def _held_by_sibling(self, holder: str) -> str:
        """Why a non-holder's unlock fails, when another task of this client holds it."""
        for hold in self._client._holds.on_key(self._key):
            if hold.holder != holder and hold.count and hold.task is not None:
                return (
                    f"it is held by another task of this client ({hold.task.get_name()}): "
                    "a lock belongs to the task that acquired it (a child task of gather() "
                    "or shield() is another task); use owner= to hand a lock over"
                )
        return ""

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held."""
        mark = cancel_mark()
        self._client._check_open()
        sent_at = self._client._holds.clock()
        try:
            deleted = await self._force_once()
        except ResponseError as exc:
            raise self._script_error(exc) from exc
        if deleted:
            # Only what was deleted is lost (a read-write lock's force_unlock() of the other
            # mode deletes nothing, and this client's holds on it stay valid).
            self._client._holds.mark_key_lost(
                self._key, "force_unlock() deleted it", begun_by=sent_at
            )
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    # -- queries --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """Whether anyone holds the lock."""
        # HLEN, not Redisson's EXISTS: the same answer for a lock (a hash exists while it
        # has a field), and a WRONGTYPE error for a key of another type instead of True.
        return bool(await self._query("HLEN", self._key))

    async def is_held_by_current_task(self) -> bool:
        """Whether the calling task (or this handle's owner) holds the lock, per Redis."""
        holder, _ = self._holder()
        return bool(await self._query("HEXISTS", self._key, self._field(holder)))

    async def hold_count(self) -> int:
        """The calling holder's reentrancy count, per Redis; 0 if it does not hold it."""
        holder, _ = self._holder()
        count = await self._query("HGET", self._key, self._field(holder))
        return int(count) if count is not None else 0

    async def remaining_lease(self) -> float | None:
        """Seconds left on the lease; None if the lock is absent or has no expiry."""
        # PTTL alone answers for a key of any type: HLEN in the same round trip fails with
        # WRONGTYPE for one that is not a lock, where PTTL would report one without expiry.
        _, ms = await self._query_all(("HLEN", self._key), ("PTTL", self._key))
        return None if int(ms) < 0 else int(ms) / 1000

    async def _query(self, *args: str) -> Any:
        mark = cancel_mark()
        self._client._check_open()
        try:
            reply = await self._client._runner.command(*args)
        except ResponseError as exc:
            raise self._script_error(exc) from exc
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return reply

    async def _query_all(self, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands in one round trip (a pipeline), as _query runs one."""
        mark = cancel_mark()
        self._client._check_open()
        replies = await self._client._runner.pipeline(*commands)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        for reply in replies:
            if isinstance(reply, ResponseError):
                error = self._script_error(reply)
                if error is reply:
                    raise reply
                raise error from reply
        return replies

    def statistics(self) -> LockStatistics:
        """What this client knows locally; call it from the task whose hold you ask about."""
        holder, _ = self._holder()
        hold = self._client._holds.get(self._key, self._field(holder))
        return LockStatistics(
            name=self._name,
            held_by_current_task=hold is not None and hold.count > 0,
            hold_count=hold.count if hold else 0,
            tasks_waiting=self._client._waiting.get(self._key, 0),
        )

    # -- shared script plumbing -----------------------------------------------------------

    async def _run(self, script: Script, keys: list[str], args: list[str | int]) -> Any:
        return await self._client._runner.run(script, keys, args)
