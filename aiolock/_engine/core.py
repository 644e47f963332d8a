"""The engine's core: the client's state that every path of the engine shares.

The paths (``acquire.py``, ``release.py``, ``counting.py``...) each reach through ONE core:
the settings, the event stream, the holder ids, whether the client is closed, and the
services of the event loop the client runs in (``services.py``: connections, bookkeeping,
tasks; rebuilt when the client moves to a new loop, so read through the core each time).
Here too are the rules they all follow: how a public call starts (its cancel mark, the
client open and in its own loop), how a hold the server granted is recorded, and how a
call cut off is resent until the server answers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from .._exceptions import ClientClosedError
from .failures import Failure, failure
from .guard import Guard
from .handover import HandOvers

if TYPE_CHECKING:
    from .._config import Settings
    from .._emitter import Emitter
    from .affinity import Affinity
    from .holders import HolderIds
    from .holds import Expiry, HoldRecord
    from .primitive import Call, Primitive
    from .services import Services

__all__ = ("Core", "Part")

log = logging.getLogger("aiolock")
T = TypeVar("T")


class Core:
    """One client's engine state, shared by every path of its engine."""

    def __init__(
        self,
        *,
        settings: Settings,
        ids: HolderIds,
        affinity: Affinity,
        events: Emitter,
        services: Services,
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
        # The paths of the engine: each keeps the services at hand (see Part).
        self._parts: list[Part] = []
        self.attach(services)

    def attach(self, services: Services) -> None:
        """Use ``services`` from now on: the event loop's pieces of the client.

        Called once they are built, and again when the client moves to a new event loop
        (``Client._rebind``): the handles keep their engine, which then reaches the new
        loop's connections, tasks and bookkeeping.
        """
        self.services = services
        for part in self._parts:
            part._s = services
        self.handovers = HandOvers()
        #: The guarded holds' watch (``guard.py``): aclose() calls ``guard.cancel_all()``.
        #: Its timer is the loop's, so a new loop gets a new one.
        self.guard = Guard(self.settings.lease_ms / 1000)

    @property
    def client_id(self) -> str:
        """The client's id, the first part of every holder id it makes."""
        return self._ids.client_id

    def check_open(self) -> None:
        """Raise ClientClosedError once the client is closed.

        RuntimeError if called in another process or event loop than the client's
        (``affinity.py``): before any I/O.
        """
        if self.closed:
            raise ClientClosedError
        self._affinity.check()
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

        The call counts as under way (aclose() waits for it). Each caller writes the rest
        of the guard inline: a wrapper coroutine would cost every call a frame.
        """
        # check_open(), with the loop looked up once for it and the task (each lookup is
        # a getpid() call on 3.11; asyncio.current_task() would look it up again).
        if self.closed:
            raise ClientClosedError
        loop = asyncio._get_running_loop()
        self._affinity.check_loop(loop)
        self.started = True
        task = None if loop is None else asyncio.current_task(loop)
        mark = task.cancelling() if task is not None else 0
        self.services.background.call_started()
        return mark, task

    def won(
        self,
        p: Primitive,
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
        extra = p.hold_extra(call.holder)
        holds = self.services.holds
        prior = holds.get(p.key, call.field)
        # Reentrant: it adds to a hold already announced and still believed held.
        reentrant = (
            prior is not None
            and len(prior.leases) > 0
            and prior.lost is None
            and prior.began is not None
        )
        hold = holds.acquired(
            key=p.key,
            field=call.field,
            name=p.name,
            holder=call.holder,
            task=call.task,
            count=count,
            lease_ms=call.won_lease if lease_ms is None else lease_ms,
            renewing=p.renewing,
            extra=extra,
            confirmed=confirmed,
            expiry=expiry,
        )
        hold.primitive = p
        if announce:
            now = monotonic()
            if not reentrant:
                hold.began = now
                hold.began_as = p.lock_kind
                hold.leader = p.leader
                hold.slow_hold = p.slow_hold(self.events.slow_hold)
                hold.slow_logged = False
            self.events.acquired(
                p.lock_kind,
                p.name,
                call.holder,
                now - call.started,
                reentrant=reentrant,
                leader=p.leader,
            )

    def disown(self, p: Primitive, call: Call) -> None:
        hold = self.services.holds.get(p.key, call.field)
        if hold is not None:
            self.services.holds.disown(hold)

    def reapply_ms(self, hold: HoldRecord | None) -> int:
        lease_ms = self.settings.lease_ms
        return hold.reapply_ms(lease_ms) if hold else lease_ms

    def held_by_sibling(self, key: str, holder: str) -> str:
        """Why a non-holder's unlock fails, when another task of this client holds it."""
        for hold in self.services.holds.on_key(key):
            if hold.holder != holder and hold.count and hold.task is not None:
                return (
                    f"it is held by another task of this client ({hold.task.get_name()}): "
                    "a lock belongs to the task that acquired it (a child task of gather() "
                    "or shield() is another task); use owner= to hand a lock over"
                )
        return ""

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


class Part:
    """One path of the engine: the core's state, and the services of the client's loop."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.settings = core.settings
        #: The services of the client's loop: replaced by ``Core.attach`` when the client
        #: moves to a new event loop. An attribute, not a property reading the core: the
        #: hot paths read it a dozen times per lock/unlock pair.
        self._s: Services = core.services
        core._parts.append(self)
