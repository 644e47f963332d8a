"""The engine: one client's state, and the calls every handle makes through it.

A primitive (``primitive.Primitive``) describes itself: which scripts, keys and channel, how
it renews. The engine runs those scripts and keeps every rule that makes a call correct,
each path in the module named for it and written once for every primitive: **acquire**
(``acquire.py``), **release** (``release.py``), the **counting objects** (``counting.py``),
all waiting in one waiting room (``waiting.py``). What they share is here: a public call's
start (the client open, in its own process and loop, the caller's cancel mark), holder and
request ids, the record of a hold the server granted, the resend of a call cut off until
it is answered; and the calls that need no path of their own: ``extend()``,
``force_unlock()``, ``delete()`` and the queries, ``aclose()``'s releases, a guarded
hold's watch of its channel. The handles hold an ``Engine`` and call the paths with it; the
services of the client's event loop reach it as one bundle (``LoopServices``).

* **Holders** are asyncio tasks, each named ``"{client.id}:{n}"`` the first time it touches
  a lock (``HolderIds``), looked up by a weak reference: not by ``id(task)``, which the
  interpreter reuses, nor by a ContextVar, which a child task would inherit.
* **Affinity**: a client's connections are sockets of one process, read by one loop
  (``Affinity``). A call from another process (a forked child) or from another running loop
  raises ``RuntimeError`` before anything is sent; a new loop once the first is closed
  takes the client over (its loop-bound services are rebuilt); a client never used before
  a fork takes a new identity in the child, since two children sharing holder and request
  ids would hold one lock as re-entries and answer each other's resends.
* **A guarded hold's watch**: nobody else releases a lock while its holder holds it, so a
  message on its channel then means a ``force_unlock()`` (Redisson's ``forceUnlock()``)
  and ends the term on the message itself. A barrier (a PING on the pub/sub connection,
  answered in order with its messages) tells such a message from a stale one published
  before the acquire; one before it, and every resubscription, looks the hold up once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from .._emitter import Announcement
from .._exceptions import ClientClosedError, LockLostError, LockNotOwnedError
from .._keys import unlock_latch_key
from .cancel import cancel_mark, cancel_requested, cancelled_since
from .failures import Failure, failure
from .primitive import Release, decode_force, decode_release, script_error

if TYPE_CHECKING:
    from .._config import Settings
    from .._emitter import Emitter
    from .._net.cluster import Cluster
    from .._net.pubsub import Dispatcher
    from .._net.restarts import RestartGrace
    from .._net.scripts import ScriptRunner
    from .._net.sentinel import SentinelWatch
    from .._net.subscriptions import Barrier, PubSub
    from .._net.topology import OneServer
    from .._net.transport import CommandTransport
    from .background import Background, LatchSweeper
    from .guard import Guard
    from .holds import Expiry, HoldRecord, HoldRegistry
    from .ordering import CallOrder
    from .primitive import Call, Invocation, Primitive, Waitable
    from .renewal import RenewalService
    from .waiting import HandOvers, Waiter, WaitingRoom

__all__ = ("PROCESS", "THREAD_OWNER_PREFIX", "Affinity", "Engine", "HolderIds", "LoopServices")

log = logging.getLogger("aiolock")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LoopServices:
    """The pieces of a client that belong to one event loop, each in its module.

    Built together by the client (``_services.build_services``), again when it moves to a
    new event loop; nothing connects until the first call, in its loop.
    """

    #: Runs the scripts and commands on the server that serves each key.
    runner: ScriptRunner
    #: What this client believes it holds.
    holds: HoldRegistry
    #: The watchdog: renews every watchdog-held lease.
    renewal: RenewalService
    #: Each holder's calls on each lock, one after the other.
    order: CallOrder
    #: Which calls wait on which channel, and who a message wakes.
    waiting: WaitingRoom
    #: The pub/sub connection(s): subscriptions by channel.
    pubsub: PubSub
    #: The work done beside the callers' calls, and the calls aclose() waits for.
    background: Background
    #: The deferred deletion of unlock latches.
    latches: LatchSweeper
    #: The hand-over policy of this client's releases.
    handovers: HandOvers
    #: The guarded holds' timer (the loop's own).
    guard: Guard
    #: The servers: one (Sentinel's included) or a cluster.
    topology: OneServer | Cluster
    #: The Sentinel watch (None unless the redis client's pool is a Sentinel pool).
    sentinel: SentinelWatch | None = None
    #: On one server (Sentinel's included) only: its command and pub/sub connections.
    transport: CommandTransport | None = None
    dispatcher: Dispatcher | None = None
    #: Strict restarts: how long acquires on a server must wait still (None: off).
    restarts: RestartGrace | None = None


class Engine:
    """One client's engine: its state, and the handles' only way to the server."""

    def __init__(
        self,
        *,
        settings: Settings,
        ids: HolderIds,
        affinity: Affinity,
        events: Emitter,
        services: LoopServices,
    ) -> None:
        self.settings = settings
        #: The client's event stream and slow-lock log: told of every acquisition and of
        #: every acquire call that fails (the holds' ends are told by the registry).
        self.events = events
        self._affinity = affinity
        self._ids = ids
        # Request ids: the client's id and a count (request_id).
        self._request_prefix = f"{ids.client_id}:"
        self._calls = itertools.count(1)
        self.closed = False
        # Whether a call was ever made: only then is a client never closed worth a warning.
        self.started = False
        #: The services of the client's current event loop (``attach``).
        self.services = services

    def attach(self, services: LoopServices) -> None:
        """Use ``services`` from now on: the client moved to a new event loop.

        The handles keep their engine, which then reaches the new loop's connections,
        tasks and bookkeeping (``Client._rebind``).
        """
        self.services = services

    def new_identity(self, client_id: str) -> None:
        """Hand out ids under ``client_id`` from now on: a forked child's (``Affinity``).

        Holder ids and request ids both: a child sharing its parent's (or a sibling's)
        would hold a lock as a re-entry of another process's hold, and have its acquire
        answered with another process's receipt. Called before the client's first call.
        """
        self._ids.renew(client_id)
        self._request_prefix = f"{client_id}:"

    @property
    def guard(self) -> Guard:
        """The guarded holds' watch (``guard.py``) of the client's current event loop."""
        return self.services.guard

    @property
    def client_id(self) -> str:
        """The client's id, the first part of every holder id it makes."""
        return self._ids.client_id

    def check_open(self) -> None:
        """Raise ClientClosedError once the client is closed.

        RuntimeError if called in another process or event loop than the client's
        (``Affinity``): before any I/O.
        """
        self._check_open_in(asyncio._get_running_loop())

    def _check_open_in(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """``check_open()`` where the caller has looked up the running loop (None: none)."""
        if self.closed:
            raise ClientClosedError
        self._affinity.check_loop(loop)
        self.started = True

    def check_not_closed(self) -> None:
        """check_open() within a call already checked: only whether it was closed since."""
        if self.closed:
            raise ClientClosedError

    def close(self) -> None:
        """Refuse new calls from now on; the client then winds down what runs."""
        self.closed = True

    def is_thread(self, holder: str) -> bool:
        """Whether ``holder`` is a thread of aiolock.sync: one call at a time, as a task."""
        return self._ids.is_thread(holder)

    def holder(
        self, owner: str | None, task: asyncio.Task[Any] | None = None
    ) -> tuple[str, asyncio.Task[Any] | None]:
        """The holder id of ``owner``, or of the calling task (and the task).

        ``task``: the calling task, if the caller has looked it up already.
        """
        if owner is not None:
            return self._ids.owner(owner), None
        if task is not None:
            return self._ids.of(task), task
        return self._ids.current()

    def request_id(self) -> str:
        """A name for one script call's latch or tombstone, unique across clients.

        The client's UUID and a count: cheaper than random bytes from the OS per call.
        """
        return f"{self._request_prefix}{next(self._calls)}"

    def call_starts(self) -> tuple[int, asyncio.Task[Any] | None]:
        """Start a public acquire or release: the task's cancel mark (cancel.py), and the task.

        The task (None outside one) is looked up once for the whole call.

        The call counts as under way (aclose() waits for it); each caller ends it
        (``Background.call_ended``) in a ``finally`` of its own coroutine.
        """
        # Looked up once for the check and the task: on 3.11 each lookup calls getpid().
        loop = asyncio._get_running_loop()
        self._check_open_in(loop)
        task = None if loop is None else asyncio.current_task(loop)
        mark = task.cancelling() if task is not None else 0
        self.services.background.call_started()
        return mark, task

    def won(
        self,
        primitive: Primitive,
        call: Call,
        count: int,
        *,
        lease_ms: int | None = None,
        token: int | None = None,
        sent: float | None = None,
        expiry: Expiry | None = None,
        announce: bool = True,
    ) -> None:
        """Record the holder's ``count`` holds; ``lease_ms`` overrides the call's lease.

        ``token``: what the acquisition took (a fenced lock's), for the call's receipt.
        ``sent``: when the call that took it (with ``call.lease_ms``) was sent;
        ``expiry``: its ticket, when it was sent for a hold already recorded.
        ``announce``: the call acquired the lock (an ``Acquired`` event, the slow-wait
        log); not for holds merely found on the server.
        """
        confirmed = None if sent is None else sent + call.lease_ms / 1000
        if token is not None and call.receipt is not None:
            call.receipt.append(token)
        now = monotonic()
        reentrant = self.services.holds.acquired(
            key=primitive.key,
            field=call.field,
            name=primitive.name,
            holder=call.holder,
            task=call.task,
            count=count,
            lease_ms=call.won_lease if lease_ms is None else lease_ms,
            renewing=primitive.renewing,
            extra=primitive.hold_extra(call.holder),
            confirmed=confirmed,
            expiry=expiry,
            primitive=primitive,
            announced=(
                Announcement(
                    now,
                    primitive.lock_kind,
                    leader=primitive.leader,
                    slow_hold=primitive.slow_hold(self.events.slow_hold),
                )
                if announce
                else None
            ),
        )
        if announce:
            self.events.acquired(
                primitive.lock_kind,
                primitive.name,
                call.holder,
                now - call.started,
                reentrant=reentrant,
                leader=primitive.leader,
            )

    async def until_answered(
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
            except Exception as exc:
                kind = failure(exc)
                if kind is Failure.LOGIN_REFUSED:
                    log.warning("aiolock: could not %s: %s", what, exc)
                    return None
                if not kind.resend:
                    raise
                if on_unanswered is not None:
                    on_unanswered()
                if self.closed or loop.time() >= give_up_at:
                    log.warning(
                        "aiolock: could not %s: the server %s (%r); %s",
                        what,
                        "refused it" if kind is Failure.REFUSED else "did not answer",
                        exc,
                        lost,
                    )
                    return None
                await asyncio.sleep(self.settings.retry_interval)

    def believed(self, primitive: Primitive, owner: str | None) -> int:
        """The calling holder's count of holds as this client believes it."""
        holder, _ = self.holder(owner)
        hold = self.services.holds.get(primitive.key, primitive.field(holder))
        return hold.count if hold else 0

    def waiting(self, key: str) -> int:
        """How many of this client's calls wait on ``key``."""
        return self.services.waiting.waiting(key)

    # Extending a held lease.

    async def extend(self, primitive: Primitive, owner: str | None, lease_ms: int) -> None:
        """Give the hold of ``owner`` (None: the calling task) a lease of ``lease_ms`` from now.

        LockNotOwnedError / LockLostError as release() raises them. A watchdog hold stays
        renewed: only its current expiry moves (the watchdog's next renewal gives it the
        watchdog's lease again); explicit leases become ``lease_ms`` (what an unlock of a
        reentrant hold re-applies). Cancelled in flight it raises CancelledError: the
        script may have run, which only moved an expiry of a hold the holder still has,
        so there is nothing to undo.
        """
        mark, task = self.call_starts()
        try:
            await self._extend(primitive, owner, lease_ms, mark, task)
        except Exception as exc:
            if cancel_requested(task, mark):
                raise asyncio.CancelledError from exc
            raise
        finally:
            self.services.background.call_ended()

    async def _extend(
        self,
        primitive: Primitive,
        owner: str | None,
        lease_ms: int,
        mark: int,
        calling: asyncio.Task[Any] | None,
    ) -> None:
        holder, _ = self.holder(owner, calling)
        field = primitive.field(holder)
        # In the holder's turn, as its unlock: after a release of the same holder lands,
        # never racing it.
        ticket = self.services.order.join((primitive.key, holder))
        try:
            if not ticket.ready:
                await ticket.wait()
            hold = self.services.holds.get(primitive.key, field)
            if hold is None or not hold.count:
                raise LockNotOwnedError(
                    primitive.name,
                    holder,
                    self.services.holds.held_by_sibling(primitive.key, holder),
                )
            if hold.lost is not None:
                # Known gone: the holder's unlock() raises it too (the hold is kept for it).
                raise LockLostError(primitive.name, holder, hold.lost)
            # The new lease may be shorter than the one confirmed: bracketed for the guard.
            expiry = hold.expiry_sent(asyncio.get_running_loop().time() + lease_ms / 1000)
            applied = False
            try:
                reply = await self.services.runner.run(*primitive.extend(hold, lease_ms))
                applied = bool(int(reply[0]))
            except ResponseError as exc:
                raise script_error(primitive.name, primitive.key, exc) from exc
            finally:
                hold.expiry_settled(expiry, applied=applied)
            if not applied:
                why = "its lease ran out or was taken before extend()"
                self.services.holds.report_lost(hold, f"{why}; found by extend()", "extend")
                raise LockLostError(primitive.name, holder, why)
            self.services.holds.extended(hold, lease_ms)
        finally:
            ticket.release()
        if cancel_requested(calling, mark):
            raise asyncio.CancelledError

    # force_unlock(), delete() and the queries: calls that run once, a cancel wins over their result

    async def force(self, primitive: Primitive) -> bool:
        """Delete ``primitive`` whoever holds it and wake its waiters; True if it was held."""
        mark = cancel_mark()
        self.check_open()
        sent_at = self.services.holds.clock()
        try:
            deleted = decode_force(await self.services.runner.run(*primitive.force()))
        except ResponseError as exc:
            raise script_error(primitive.name, primitive.key, exc) from exc
        if deleted and primitive.polls:
            # Nothing was published: wake this client's own waiters here.
            self.services.waiting.deliver(primitive.channel(""), b"0", heard=False)
        if deleted:
            # Only what was deleted is lost (a read-write lock's force_unlock() of the other
            # mode deletes nothing, and this client's holds on it stay valid).
            self.services.holds.mark_key_lost(
                primitive.key, "force_unlock() deleted it", begun_by=sent_at
            )
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    async def delete(self, waitable: Waitable, *keys: str) -> bool:
        """Remove ``waitable``'s ``keys`` as Redisson's delete does; True if any of them existed.

        This client's renewed holds on ``waitable`` (a semaphore's permits) are gone with them:
        marked lost, so the watchdog stops and their release raises LockLostError.
        """
        mark = cancel_mark()
        self.check_open()
        sent_at = self.services.holds.clock()
        try:
            deleted = int(await self.services.runner.command("DEL", *keys)) > 0
        except ResponseError as exc:
            raise script_error(waitable.name, waitable.key, exc) from exc
        if deleted:
            self.services.holds.mark_key_lost(waitable.key, "delete() deleted it", begun_by=sent_at)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return deleted

    async def query(self, primitive: Waitable, *args: str) -> Any:
        """Run one plain command about ``primitive``."""
        return await self._one_shot(primitive, lambda: self.services.runner.command(*args))

    async def ask(self, primitive: Waitable, invocation: Invocation) -> Any:
        """Run a read-only script about ``primitive``."""
        return await self._one_shot(primitive, lambda: self.services.runner.run(*invocation))

    async def _one_shot(self, primitive: Waitable, send: Callable[[], Awaitable[T]]) -> T:
        """A call that changes nothing: an error reply names ``primitive``, a cancel wins."""
        mark = cancel_mark()
        self.check_open()
        try:
            reply = await send()
        except ResponseError as exc:
            raise script_error(primitive.name, primitive.key, exc) from exc
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return reply

    async def query_all(self, primitive: Primitive, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands about ``primitive`` in one round trip (a pipeline), as query() one."""
        mark = cancel_mark()
        self.check_open()
        replies = await self.services.runner.pipeline(*commands)
        if cancelled_since(mark):
            raise asyncio.CancelledError
        for reply in replies:
            if isinstance(reply, ResponseError):
                error = script_error(primitive.name, primitive.key, reply)
                if error is reply:
                    raise reply
                raise error from reply
        return replies

    # aclose()'s releases of the holds whose tasks ended, and the end of the rest

    async def release_ended(self) -> None:
        """aclose()'s release of every hold whose holder can no longer release it.

        The holds of tasks that ended holding them (a guarded body that aclose() cancelled
        releases its own, in the background): each released at once, so another process takes the
        lock over without waiting out the lease. Each is sent once, with the client's
        retries (so this is bounded with the server unreachable); a failure is logged,
        and that lock then runs out with its lease.
        """
        loop = asyncio.get_running_loop()
        ended = self.services.holds.ended(loop.time())
        for hold in self.services.holds:
            # A task ended whose done-callback has not run yet.
            done = hold.task is not None and hold.task.done()
            if done and hold.count and hold.lost is None:
                ended.append((hold, hold.count - hold.releasing))
                self.services.holds.drop(hold, ended="task_ended")
        if ended:
            await asyncio.gather(*(self._release_ended(hold, kept) for hold, kept in ended))

    async def _release_ended(self, hold: HoldRecord, kept: int) -> None:
        primitive: Primitive | None = hold.primitive
        if primitive is None or kept <= 0:
            return
        try:
            # One release per hold left, as its unlocks would have been: a reentrant
            # hold's last one frees the lock and wakes its waiters.
            for _ in range(kept):
                latch = unlock_latch_key(primitive.key, self.request_id())
                invocation = primitive.release(hold.field, self.settings.lease_ms, latch)
                result = decode_release(await self.services.runner.run(*invocation))
                self.services.latches.add(latch)
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

    def end_held(self) -> None:
        """aclose()'s last word on the holds still held by running tasks: each is ended.

        They are not released (their tasks may still be in their critical sections; the
        lock expires with its lease), but nothing of this client renews or releases them
        any more: each is logged at WARNING and ends here with a ``Lost`` event
        (``how="closed"``), so that every ``Acquired`` has its end and a metric of the
        holds held (OpenTelemetry's ``aiolock.held``) falls back to 0.
        """
        for hold in list(self.services.holds):
            if hold.count and hold.lost is None:
                task = f"task {hold.task.get_name()} " if hold.task is not None else ""
                log.warning(
                    "aiolock: client closed while %s(%s) holds lock %r; it is not released "
                    "and expires with its lease",
                    task,
                    hold.holder,
                    hold.name,
                )
                self.services.holds.drop(hold, ended="closed")

    # A guarded hold's watch of its lock's channel

    async def watch_taken(self, primitive: Primitive, holder: str, armed: asyncio.Event) -> None:
        """Until cancelled: end ``holder``'s hold of ``primitive`` as soon as it is forced away.

        A message on ``primitive``'s channel after this watch's barrier passed reports the hold
        lost at once (the guard then cancels a guarded body); one before it, and every
        resubscription, runs the renewal now, which finds a forced hold gone. ``armed``
        is set once the barrier is back and every message before it was checked (or the
        barrier broke, or the watch ended): the term's body starts then. Ends by itself
        once the hold is lost. The subscription is shared with this client's waiters, and
        released at the end.
        """
        try:
            await self._watch(primitive, holder, armed)
        finally:
            armed.set()  # the term goes on without the watch (the client closes, say)

    async def _watch(self, primitive: Primitive, holder: str, armed: asyncio.Event) -> None:
        channel = primitive.channel(holder)
        room = self.services.waiting
        hold = self.services.holds.get(primitive.key, primitive.field(holder))
        if hold is None:  # pragma: no cover - the term's acquire recorded it
            return
        forced = partial(self._watch_forced, hold)
        while True:
            sub = await self.services.pubsub.subscribe(channel, None)
            if sub is None:  # pragma: no cover - only a caller's limit gives None
                return
            try:
                # Sent before anything else: the sooner it is back, the sooner the term
                # starts, and a forced unlock ends it without a round trip.
                barrier = sub.barrier()
                waiter = self._watcher(channel, primitive, barrier, forced)
                try:
                    # A message published before the server took the SUBSCRIBE was never
                    # heard (a force_unlock() just as the hold began): look once now.
                    await self._watch_check(hold)
                    while not sub.stale and not _lost(hold):
                        if not await _woken(waiter, barrier, armed):
                            continue  # the barrier is back: armed now
                        room.remove(channel, waiter, leaving=False)
                        if _lost(hold):
                            return
                        if barrier.broken:
                            # Woken by a resubscription on a new connection: a barrier there.
                            barrier = sub.barrier()
                        # Registered before the renewal: a message while it flies wakes it.
                        waiter = self._watcher(channel, primitive, barrier, forced)
                        await self._watch_check(hold)
                finally:
                    room.remove(channel, waiter, leaving=False)
            finally:
                sub.release()
            if _lost(hold):
                return

    def _watcher(
        self, channel: str, primitive: Primitive, barrier: Barrier, forced: Callable[[], None]
    ) -> Waiter:
        """A fresh watcher on ``channel``: told at once of a message after ``barrier``."""
        waiter = self.services.waiting.add(channel, primitive.wake_count, shared=True, watch=True)
        waiter.barrier = barrier
        waiter.forced = forced
        return waiter

    async def _watch_check(self, hold: HoldRecord) -> None:
        """Look once whether the hold is still on the server (one plain command).

        Not a renewal round: that would renew every hold of the client, and give a hold
        of an explicit lease the watchdog's. A hold found gone while none of its releases
        ran meanwhile is reported lost.
        """
        self.check_open()
        releases = hold.releases
        held = await self.services.runner.command("HEXISTS", hold.key, hold.field)
        if (
            not int(held)
            and hold.lost is None
            and hold.count
            and not hold.releasing
            and hold.releases == releases
            and self.services.holds.get(hold.key, hold.field) is hold
        ):
            self.services.holds.report_lost(hold, "its watch found it gone", "renewal")

    def _watch_forced(self, hold: HoldRecord) -> None:
        """A message heard after the barrier passed: the hold was deleted while held."""
        holds = self.services.holds
        if (
            hold.lost is None
            and hold.count
            # Its own release in flight publishes too (the watch ends before the term's
            # release, but a body may release a hold of its own).
            and not hold.releasing
            and holds.get(hold.key, hold.field) is hold
        ):
            # "forced", not "renewal": the message itself tells a force (nothing else
            # publishes while it is held), whoever sent it.
            holds.report_lost(
                hold,
                "its lock was deleted while it held it (force_unlock()), said its channel",
                "forced",
            )


def _lost(hold: HoldRecord) -> bool:
    # A function: the type checker does not carry an earlier check across an await.
    return hold.lost is not None


async def _woken(waiter: Waiter, barrier: Barrier, armed: asyncio.Event) -> bool:
    """Wait until ``waiter`` is woken (True); until ``armed``, or ``barrier`` settles (False).

    A settled barrier arms the watch: back, or broken (the term goes on without it).
    """
    if not armed.is_set() and barrier.settled.is_set():
        armed.set()
    if armed.is_set():
        await waiter.wait(None)
        return True
    await _either(waiter.event, barrier.settled)
    return waiter.event.is_set()


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Wait until either event is set (a term's first moments only: two small tasks)."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


# Holder identity

#: The ``owner=`` of a thread of ``aiolock.sync`` starts with this (a sync handle refuses
#: it as a user's ``owner=``).
#: Such a holder makes one call at a time (its thread blocks on each), as a task does, so
#: a release may hand it the lock (``waiting.Offer``); other ``owner=`` holders may have calls
#: under way in several tasks, and never are heirs.
THREAD_OWNER_PREFIX = "aiolock-thread:"


class HolderIds:
    """Assigns holder ids to tasks for one client."""

    __slots__ = ("_counter", "_ids", "_threads", "client_id")

    def __init__(self, client_id: str) -> None:
        #: The client's id, the first part of every holder id it hands out.
        self.client_id = client_id
        self._threads = self.owner(THREAD_OWNER_PREFIX)
        self._counter = itertools.count(1)
        # Weak by task, as a WeakKeyDictionary but without its Python-level get() on every
        # call: a lookup is a dict lookup by a fresh reference (equal to the stored one
        # while the task lives); the stored reference's callback drops the entry.
        self._ids: dict[weakref.ref[asyncio.Task[Any]], str] = {}

    def renew(self, client_id: str) -> None:
        """Start again as ``client_id``: a forked child's own ids (``Affinity``)."""
        self.client_id = client_id
        self._threads = self.owner(THREAD_OWNER_PREFIX)
        self._counter = itertools.count(1)
        self._ids = {}

    def current(self) -> tuple[str, asyncio.Task[Any]]:
        """The calling task's holder id, and the task."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            # No asyncio loop in this thread: most likely trio, or anyio on its trio
            # backend, where asyncio's own "no running event loop" would only confuse.
            raise RuntimeError(
                "aiolock runs on asyncio (and on anyio with its asyncio backend): no asyncio "
                "event loop is running here (trio and anyio's trio backend are not supported)"
            ) from None
        if task is None:
            raise RuntimeError("aiolock locks must be used from inside an asyncio task")
        return self.of(task), task

    def of(self, task: asyncio.Task[Any]) -> str:
        """The holder id of ``task`` (a new one the first time)."""
        holder = self._ids.get(weakref.ref(task))
        if holder is None:
            holder = f"{self.client_id}:{next(self._counter)}"
            self._ids[weakref.ref(task, self._forget)] = holder
        return holder

    def _forget(self, ref: weakref.ref[asyncio.Task[Any]]) -> None:
        # A dead reference still finds its own entry (its hash was kept; it equals itself).
        self._ids.pop(ref, None)

    def owner(self, owner: str) -> str:
        """The holder id of an explicit ``owner=``: never equal to a task's (API.md)."""
        return f"{self.client_id}:owner:{owner}"

    def is_thread(self, holder: str) -> bool:
        """Whether ``holder`` is a thread of aiolock.sync (one call at a time)."""
        return holder.startswith(self._threads)


# Affinity


class _Process:
    """The running process, as a client sees it: how many forks away from its first."""

    __slots__ = ("forks",)

    def __init__(self) -> None:
        self.forks = 0


#: Bumped in every child of ``os.fork()`` (and so of multiprocessing's fork start method).
PROCESS = _Process()


# Every affinity not bound to a process and a loop yet (a client never used): each takes a
# new identity in a forked child. Weak: a client forgotten unused is not kept.
_unbound: weakref.WeakSet[Affinity] = weakref.WeakSet()


def _forked() -> None:
    PROCESS.forks += 1
    # In the child, which runs only this thread: nothing else can touch the set.
    for affinity in list(_unbound):
        affinity.new_process()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forked)


class Affinity:
    """The process and the event loop a client belongs to: those of its first call."""

    __slots__ = ("__weakref__", "_forks", "_loop", "_on_new_loop", "_on_new_process", "_pid")

    def __init__(
        self,
        on_new_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None,
        on_new_process: Callable[[], None] | None = None,
    ) -> None:
        """``on_new_loop(dead)`` moves the client off its closed loop ``dead``.

        It runs before the first call in a new loop. None: such calls are refused too.
        ``on_new_process()`` gives the client a new identity in a forked child that never
        used it (``new_process``).
        """
        self._on_new_loop = on_new_loop
        self._on_new_process = on_new_process
        self._loop: asyncio.AbstractEventLoop | None = None
        self._forks = PROCESS.forks
        self._pid = os.getpid()
        _unbound.add(self)

    def new_process(self) -> None:
        """In a forked child, a client not used yet becomes the child's own: a new identity.

        Called at the fork (``_forked``), and by the first call should that have failed.
        The process is recorded only once the identity is new, so a failure is retried.
        """
        if self._loop is not None or self._forks == PROCESS.forks:
            return
        if self._on_new_process is not None:
            self._on_new_process()
        self._forks = PROCESS.forks
        self._pid = os.getpid()

    def check(self) -> None:
        """Raise ``RuntimeError`` unless called in the client's process and event loop.

        The first call binds the client to its loop (and to its process, if the client was
        made in another one and never used there). Outside an asyncio loop (no running loop)
        nothing is checked: the call fails just after, with a message that says why.
        """
        self.check_loop(asyncio._get_running_loop())

    def check_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """``check()`` for a caller that looked up the running loop (None: none) already."""
        if loop is self._loop and self._forks == PROCESS.forks:
            return
        self._refuse_or_bind(loop)

    @property
    def foreign(self) -> bool:
        """Whether this is a forked child of the process the client was used in."""
        return self._forks != PROCESS.forks and self._loop is not None

    def _refuse_or_bind(self, loop: asyncio.AbstractEventLoop | None) -> None:
        if self._loop is None:
            if loop is not None:
                # Made in one process, used first in another (a client made at import and
                # forked before any call): it is the child's, with an identity of its own
                # (new_process, done at the fork already unless that failed), and the
                # parent's copy is the parent's own.
                self.new_process()
                self._loop = loop
                _unbound.discard(self)
            return
        if self._forks != PROCESS.forks:
            raise RuntimeError(self._fork_message())
        if loop is None:
            return
        if self._loop.is_closed() and self._on_new_loop is not None:
            # Moved, then bound: were the move to fail, the next call tries it again.
            self._on_new_loop(self._loop)
            self._loop = loop
            return
        closed = " (now closed)" if self._loop.is_closed() else ""
        raise RuntimeError(
            f"this aiolock client belongs to the event loop that first used it{closed}, "
            "and was called from another one while that loop still exists: its "
            "connections are that loop's. Close that loop first, or create one "
            "client per event loop, inside it (in the coroutine given to asyncio.run(), in "
            "an async fixture or an app's lifespan), not at module level"
        )

    def _fork_message(self) -> str:
        return (
            f"this aiolock client was first used in process {self._pid} and cannot be used "
            f"in process {os.getpid()}, a child forked from it: its connections are the "
            "parent's. Create a new client after the fork (in the child); the parent's "
            "client is unaffected"
        )
