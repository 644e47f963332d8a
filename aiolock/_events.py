"""The client's event stream and the slow-lock log: one ``Emitter`` per client.

The pieces that keep the client's bookkeeping (the engine, the holds, the renewal, the
connections) are handed this one object and tell it what they recorded; it never reaches
back into them. Each hook is a plain sync method: it logs a slow wait or hold (``slow_wait``,
``slow_hold``) and, only when a listener is registered, builds the event and calls the
listeners. With none, the cost is a comparison or two and an attribute check.
"""

from __future__ import annotations

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

__all__ = ("Emitter", "Listener", "fail_reason")

log = logging.getLogger("aiolock")

Listener: TypeAlias = Callable[[Event], object]

# A listener that keeps raising is logged at most this often (seconds), with a count.
_ERROR_LOG_INTERVAL = 60.0


def fail_reason(exc: BaseException, *, cancelled: bool) -> FailReason:
    """Why an acquire call that raised ``exc`` ended without what it asked for."""
    if cancelled:
        return "cancelled"
    return "closed" if isinstance(exc, ClientClosedError) else "error"


class Emitter:
    """Tells the listeners what happened; logs waits and holds past the slow thresholds.

    ``slow_wait``, ``slow_hold``: seconds, None for no log.
    """

    __slots__ = ("_errors", "_waiting", "listeners", "slow_hold", "slow_wait")

    def __init__(self, *, slow_wait: float | None = None, slow_hold: float | None = None) -> None:
        self.slow_wait = slow_wait
        self.slow_hold = slow_hold
        #: The listeners, in the order added; a tuple, so that one added or removed while
        #: an event is delivered takes effect from the next event on.
        self.listeners: tuple[Listener, ...] = ()
        # Per listener that raised: when its last error was logged, and how many since.
        self._errors: dict[Listener, list[float]] = {}
        # The calls waiting per (kind, name): counted with or without listeners, so that a
        # listener added while calls wait sees the count fall back to 0, never below.
        self._waiting: dict[tuple[AcquireKind, str], int] = {}

    # -- listeners ------------------------------------------------------------------------

    def add(self, fn: Listener) -> None:
        """Call ``fn(event)`` for every event from now on (once, however often added)."""
        if not callable(fn):
            raise TypeError(f"listener must be callable, not {type(fn).__name__}")
        if fn not in self.listeners:
            self.listeners = (*self.listeners, fn)

    def remove(self, fn: Listener) -> None:
        """Stop calling ``fn``; nothing if it is not a listener."""
        self.listeners = tuple(listener for listener in self.listeners if listener != fn)
        self._errors.pop(fn, None)

    def emit(self, event: Event) -> None:
        """Call every listener with ``event``; one that raises is logged, never propagated."""
        for fn in self.listeners:
            try:
                fn(event)
            except Exception as exc:  # a listener's bug must never break the call that emitted
                self._listener_failed(fn, event, exc)

    def _listener_failed(self, fn: Listener, event: Event, exc: Exception) -> None:
        # The first error with its traceback; then at most one line a minute, with a count:
        # a listener that fails on every event would otherwise flood the log.
        now = monotonic()
        seen = self._errors.get(fn)
        if seen is None:
            self._errors[fn] = [now, 0]
            log.error(
                "aiolock: event listener %r raised on %s; the call goes on (further errors "
                "of this listener are logged at most every %g s)",
                fn,
                type(event).__name__,
                _ERROR_LOG_INTERVAL,
                exc_info=exc,
            )
            return
        seen[1] += 1
        if now - seen[0] >= _ERROR_LOG_INTERVAL:
            log.error(
                "aiolock: event listener %r raised %d more time(s) in the last %.0f s, last on %s",
                fn,
                int(seen[1]),
                now - seen[0],
                type(event).__name__,
                exc_info=exc,
            )
            self._errors[fn] = [now, 0]

    # -- the bookkeeping's hooks ----------------------------------------------------------

    def acquired(
        self, kind: AcquireKind, name: str, holder: str, waited: float, *, reentrant: bool
    ) -> None:
        """An acquire call took the lock after ``waited`` seconds."""
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
            self.emit(Acquired(kind, name, holder, waited, reentrant))

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

    def held_long(self, kind: Kind, name: str, holder: str, held: float) -> None:
        """A hold still held past ``slow_hold`` (once per hold: the caller remembers)."""
        log.warning(
            "aiolock: %s %r has been held by %s for %.1f s and is still held (slow_hold: %g s)",
            kind,
            name,
            holder,
            held,
            self.slow_hold,
        )

    def released(
        self, kind: Kind, name: str, holder: str, held: float, *, warned: bool = False
    ) -> None:
        """The holder released its last hold, ``held`` seconds after it began.

        ``warned``: ``held_long`` was logged for this hold already (then INFO, not WARNING).
        """
        slow = self.slow_hold
        if slow is not None and held > slow:
            log.log(
                logging.INFO if warned else logging.WARNING,
                "aiolock: %s %r was released by %s after being held %.3f s (slow_hold: %g s)",
                kind,
                name,
                holder,
                held,
                slow,
            )
        if self.listeners:
            self.emit(Released(kind, name, holder, held))

    def lost(self, kind: Kind, name: str, holder: str, held: float, how: str) -> None:
        """A hold ended without its holder's release (the loss itself is logged by _holds)."""
        if self.listeners:
            self.emit(Lost(kind, name, holder, held, how))

    def renewal_round(self, servers: int, holds: int, duration: float, failed: int) -> None:
        """A watchdog round ended."""
        if self.listeners:
            self.emit(RenewalRound(servers, holds, duration, failed))

    def reconnected(self, server: str, after: float) -> None:
        """A connection to ``server`` was made again, ``after`` seconds after it was lost."""
        if self.listeners:
            self.emit(Reconnected(server, after))
