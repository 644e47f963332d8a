"""The client's event stream and the slow-lock log: one ``Emitter`` per client.

The pieces that keep the client's bookkeeping (the engine, the holds, the renewal, the
connections) are handed this one object and tell it what they recorded; it never reaches
back into them. Each hook is a plain sync method: it logs a slow wait or hold (``slow_wait``,
``slow_hold``) and, only when a listener is registered, builds the event and calls the
listeners. With none, the cost is a comparison or two and an attribute check.

An announced acquisition leaves the emitter's own record of it (``Announcement``: when, of
which kind, a leader's or not, its slow-hold threshold, whether it was logged slow). The
hold's record keeps it, opaque, and hands it back when the hold ends: every ``Released``
or ``Lost`` matches one ``Acquired``.

A listener runs inside aiolock's own calls and tasks (an ``Acquired`` inside ``lock()``, a
``RenewalRound`` inside the renewal task), so nothing it does may reach them: whatever it
raises is logged, never propagated, as asyncio does for its callbacks (``Handle._run``):
every exception, ``BaseException`` subclasses included, except ``KeyboardInterrupt`` and
``SystemExit``, which end the program as they would anywhere. A ``CancelledError`` raised
by a listener is the listener's own error, never a cancel of the task that emitted: a
cancel reaches a task only at an ``await``, and a listener is a plain call. The log of a
listener's errors tells listeners apart by identity, so one that is unhashable (a
``@dataclass`` with ``__call__``) works as any other. An ``async def`` is refused by ``add``; a
callable that still returns a coroutine was never run: the coroutine is closed and the
mistake logged as the listener's error.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, TypeAlias

from ._exceptions import ClientClosedError
from .events import (
    Acquired,
    AcquireFailed,
    Event,
    Lost,
    Reconnected,
    Released,
    RenewalRound,
    Waiting,
)

if TYPE_CHECKING:
    from .events import AcquireKind, FailReason, Kind

__all__ = ("Announcement", "Emitter", "Listener", "fail_reason")

log = logging.getLogger("aiolock")

Listener: TypeAlias = Callable[[Event], object]

# A listener that keeps raising is logged at most this often (seconds), with a count.
_ERROR_LOG_INTERVAL = 60.0


def fail_reason(exc: BaseException, *, cancelled: bool) -> FailReason:
    """Why an acquire call that raised ``exc`` ended without what it asked for."""
    if cancelled:
        return "cancelled"
    return "closed" if isinstance(exc, ClientClosedError) else "error"


def _described(fn: Listener) -> str:
    """``repr(fn)``, made at once; its type and address if its repr raises.

    Not left to the log handler, which formats later, outside any guard.
    """
    try:
        return repr(fn)
    except Exception:
        return f"<{type(fn).__qualname__} object at {id(fn):#x}>"


class Announcement:
    """The emitter's record of one announced acquisition (an ``Acquired``), for its hold's end.

    Made as the acquisition is announced; the hold's record keeps it, unread, until the
    hold's end is announced (a ``Released`` or a ``Lost``), once.
    """

    __slots__ = ("at", "kind", "leader", "slow_hold", "slow_logged")

    def __init__(self, at: float, kind: Kind, *, leader: bool, slow_hold: float | None) -> None:
        #: When (``time.monotonic()``) it was announced.
        self.at = at
        #: The lock kind that began it (the events' ``kind``): one hold may be re-entered
        #: through handles of other kinds on the same key (a lock and a spin lock share the
        #: layout).
        self.kind = kind
        #: A leader's term: its events say ``leader=True``.
        self.leader = leader
        #: Past how long (s) the hold is logged as slow (None: never): the client's
        #: ``slow_hold``, or its object's (a term's default is never: a term is meant to last).
        self.slow_hold = slow_hold
        #: Logged as held past ``slow_hold`` already (``Emitter.held_long``): its release
        #: says so at INFO only.
        self.slow_logged = False


class Emitter:
    """Tells the listeners what happened; logs waits and holds past the slow thresholds.

    ``slow_wait``, ``slow_hold``: seconds, None for no log.
    """

    __slots__ = ("_errors", "_waiting", "listeners", "on_reconnected", "slow_hold", "slow_wait")

    def __init__(self, *, slow_wait: float | None = None, slow_hold: float | None = None) -> None:
        self.slow_wait = slow_wait
        self.slow_hold = slow_hold
        #: Told first of every connection lost or made again, listeners or not: the
        #: client's renewal, which settles the holds on a server whose connection came back
        #: (a restart), trying from the moment it was lost.
        self.on_reconnected: Callable[[], None] | None = None
        #: The listeners, in the order added; a tuple, so that one added or removed while
        #: an event is delivered takes effect from the next event on.
        self.listeners: tuple[Listener, ...] = ()
        # Per listener that raised, by identity (a listener need not be hashable): the
        # listener, when its last error was logged, and how many since.
        self._errors: dict[int, tuple[Listener, list[float]]] = {}
        # The calls waiting per (kind, name): counted with or without listeners, so that a
        # listener added while calls wait sees the count fall back to 0, never below.
        self._waiting: dict[tuple[AcquireKind, str], int] = {}

    # -- listeners ------------------------------------------------------------------------

    def add(self, fn: Listener) -> None:
        """Call ``fn(event)`` for every event from now on (once, however often added)."""
        if not callable(fn):
            raise TypeError(f"listener must be callable, not {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"listener {fn!r} is a coroutine function: listeners are called, never "
                "awaited (use a plain function; start a task from it if it must await)"
            )
        if fn not in self.listeners:
            self.listeners = (*self.listeners, fn)

    def remove(self, fn: Listener) -> None:
        """Stop calling ``fn``; nothing if it is not a listener.

        By equality, as ``add`` (a bound method is a new object at each attribute access).
        """
        kept = []
        for listener in self.listeners:
            if listener == fn:
                self._errors.pop(id(listener), None)
            else:
                kept.append(listener)
        self.listeners = tuple(kept)

    def emit(self, event: Event) -> None:
        """Call every listener with ``event``; whatever one raises is logged, never propagated.

        ``KeyboardInterrupt`` and ``SystemExit`` excepted (see the module's docstring).
        """
        for fn in self.listeners:
            try:
                result = fn(event)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # a listener's bug never reaches the emitting call
                self._listener_failed(fn, event, exc)
            else:
                if result is not None and inspect.iscoroutine(result):
                    result.close()  # never run: no "never awaited" warning later, anywhere
                    self._listener_failed(
                        fn, event, TypeError("the listener returned a coroutine: never awaited")
                    )

    def _listener_failed(self, fn: Listener, event: Event, exc: BaseException) -> None:
        # Nothing of the logging may raise either (a handler's own failure included).
        with contextlib.suppress(Exception):
            self._log_failure(fn, event, exc)

    def _log_failure(self, fn: Listener, event: Event, exc: BaseException) -> None:
        # The first error with its traceback; then at most one line a minute, with a count:
        # a listener that fails on every event would otherwise flood the log.
        now = monotonic()
        entry = self._errors.get(id(fn))
        seen = entry[1] if entry is not None and entry[0] is fn else None
        if seen is None:
            self._errors[id(fn)] = (fn, [now, 0])
            log.error(
                "aiolock: event listener %s raised on %s; the call goes on (further errors "
                "of this listener are logged at most every %g s)",
                _described(fn),
                type(event).__name__,
                _ERROR_LOG_INTERVAL,
                exc_info=exc,
            )
            return
        seen[1] += 1
        if now - seen[0] >= _ERROR_LOG_INTERVAL:
            log.error(
                "aiolock: event listener %s raised %d more time(s) in the last %.0f s, last on %s",
                _described(fn),
                int(seen[1]),
                now - seen[0],
                type(event).__name__,
                exc_info=exc,
            )
            self._errors[id(fn)] = (fn, [now, 0])

    # -- the bookkeeping's hooks ----------------------------------------------------------

    def acquired(
        self,
        kind: AcquireKind,
        name: str,
        holder: str,
        waited: float,
        *,
        reentrant: bool,
        leader: bool = False,
    ) -> None:
        """An acquire call took the lock after ``waited`` seconds (``leader``: a term)."""
        slow = self.slow_wait
        if slow is not None and waited > slow:
            log.warning(
                "aiolock: %s %r was acquired by %s after waiting %.3f s (slow_wait: %g s)",
                kind,
                name,
                holder,
                waited,
                slow,
            )
        if self.listeners:
            self.emit(Acquired(kind, name, holder, waited, reentrant, leader))

    def wait_started(self, kind: AcquireKind | None, name: str) -> None:
        """An acquire call starts waiting for the lock (only calls that wait: no cost else).

        ``kind`` None: a wait that is no acquire (a latch's await): not told.
        """
        if kind is None:
            return
        key = (kind, name)
        waiting = self._waiting[key] = self._waiting.get(key, 0) + 1
        if self.listeners:
            self.emit(Waiting(kind, name, waiting))

    def wait_ended(self, kind: AcquireKind | None, name: str) -> None:
        """A call that ``wait_started`` stops waiting (its Acquired/AcquireFailed follows)."""
        if kind is None:
            return
        key = (kind, name)
        waiting = self._waiting.get(key, 1) - 1
        if waiting > 0:
            self._waiting[key] = waiting
        else:
            self._waiting.pop(key, None)
        if self.listeners:
            self.emit(Waiting(kind, name, waiting))

    def acquire_failed(
        self, kind: AcquireKind, name: str, waited: float, reason: FailReason
    ) -> None:
        """An acquire call ended without the lock."""
        if self.listeners:
            self.emit(AcquireFailed(kind, name, waited, reason))

    def held_long(self, announced: Announcement, name: str, holder: str, held: float) -> None:
        """A hold still held ``held`` s past its announcement, beyond its ``slow_hold``.

        Logged once per hold: ``announced`` remembers it, and its release then logs at INFO.
        """
        announced.slow_logged = True
        log.warning(
            "aiolock: %s %r has been held by %s for %.1f s and is still held (slow_hold: %g s)",
            announced.kind,
            name,
            holder,
            held,
            announced.slow_hold,
        )

    def released(self, announced: Announcement, name: str, holder: str) -> None:
        """The holder released the last hold of the acquisition ``announced``.

        Logged if held past the hold's own ``slow_hold`` (the client's, or its object's: a
        leader's term has none unless asked), at INFO if ``held_long`` logged it already.
        """
        held = monotonic() - announced.at
        slow = announced.slow_hold
        if slow is not None and held > slow:
            log.log(
                logging.INFO if announced.slow_logged else logging.WARNING,
                "aiolock: %s %r was released by %s after being held %.3f s (slow_hold: %g s)",
                announced.kind,
                name,
                holder,
                held,
                slow,
            )
        if self.listeners:
            self.emit(Released(announced.kind, name, holder, held, announced.leader))

    def lost(self, announced: Announcement, name: str, holder: str, how: str) -> None:
        """The hold of ``announced`` ended without its holder's release (logged by _holds)."""
        held = monotonic() - announced.at
        if self.listeners:
            self.emit(Lost(announced.kind, name, holder, held, how, announced.leader))

    def renewal_round(self, servers: int, holds: int, duration: float, failed: int) -> None:
        """A watchdog round ended."""
        if self.listeners:
            self.emit(RenewalRound(servers, holds, duration, failed))

    def connection_lost(self) -> None:
        """A command connection was lost (not closed): its holds are to be settled."""
        if self.on_reconnected is not None:
            self.on_reconnected()

    def reconnected(self, server: str, after: float) -> None:
        """A connection to ``server`` was made again, ``after`` seconds after it was lost."""
        if self.on_reconnected is not None:
            self.on_reconnected()
        if self.listeners:
            self.emit(Reconnected(server, after))
