"""Coroutines run side by side by the calling task itself, without a task each.

A composite lock calls its members at once, so that members on servers far apart cost one
round trip, not one each. The calls must act for the calling task, whose holds these are,
and the engine knows only the task a call runs in: hence no task per call here (what that
would cost instead is in docs/architecture.md).

Here the calling task steps each coroutine itself, as a Task steps its own: each step runs
in the coroutine's own copy of the caller's context; the future a step waits on wakes the
calling task when it is done; a cancel cancels that future, or is thrown in at the next
step if the future is done already. So each call sees what it would see in a task of its
own, but ``asyncio.current_task()`` is the caller: a lock the call takes is the caller's.

What a coroutine run this way must not do: cancel its task, as ``asyncio.timeout()`` or
``asyncio.wait_for()`` scopes do. That task is the caller's, and a cancel of it is the
caller's cancel. The members' tries at once (they wait for no lock), unlocks and queries
scope no timeout; the bounds are the caller's, here.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

__all__ = ("Side", "SideBySide")

T = TypeVar("T")


class Side(Generic[T]):
    """One coroutine of a ``SideBySide``, and its outcome once it has ended."""

    __slots__ = ("_context", "_coro", "_throw", "_waiting", "done", "error", "value")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._context = contextvars.copy_context()
        #: The future its last step waits on (None: it is about to step, or has ended).
        self._waiting: asyncio.Future[Any] | None = None
        #: Thrown in at its next step: a cancel its future could not take.
        self._throw: BaseException | None = None
        #: Whether it has ended; then ``error`` (a CancelledError too) or ``value``.
        self.done = False
        self.error: BaseException | None = None
        self.value: T | None = None

    def cancelled(self) -> bool:
        """Whether it ended by a cancel."""
        return isinstance(self.error, asyncio.CancelledError)

    def _cancel_pending(self) -> bool:
        """Whether a cancel (or an error) waits to be thrown in at its next step."""
        return self._throw is not None

    def returned(self) -> bool:
        """Whether it ended with a value (no error, no cancel)."""
        return self.done and self.error is None


class SideBySide(Generic[T]):
    """Coroutines stepped by the task that made this, side by side.

    Each starts at once, in the constructor, up to its first wait (its command is on its
    way before the caller waits). Then ``wait()`` runs them until a condition holds, and
    ``finish()`` to their end.
    """

    __slots__ = ("_expired", "_loop", "_ready", "_running", "_wake", "sides")

    def __init__(self, coros: Iterable[Coroutine[Any, Any, T]]) -> None:
        self._loop = asyncio.get_running_loop()
        self.sides = [Side(coro) for coro in coros]
        #: The sides whose future is done (or that yielded to the loop): to step next.
        self._ready: deque[Side[T]] = deque()
        #: How many have not ended.
        self._running = len(self.sides)
        #: What the calling task waits on in ``wait()``: set when a side is ready to step.
        self._wake: asyncio.Future[None] | None = None
        self._expired = False
        for side in self.sides:
            self._step(side)

    @property
    def running(self) -> int:
        """How many have not ended."""
        return self._running

    def cancel(self, side: Side[T]) -> None:
        """Cancel ``side``, as ``Task.cancel()`` would: CancelledError at its wait."""
        if side.done:
            return
        waiting = side._waiting
        if waiting is not None and waiting.cancel():
            return  # it wakes with the CancelledError
        if side._throw is None:
            side._throw = asyncio.CancelledError()

    def cancel_running(self) -> None:
        """Cancel every side that has not ended."""
        for side in self.sides:
            self.cancel(side)

    async def wait(
        self, until: Callable[[], bool] | None = None, deadline: float | None = None
    ) -> None:
        """Step the sides until every one has ended, ``until()`` holds, or ``deadline``.

        The deadline is on the loop's clock. A cancel of the calling task is raised; the
        sides are not cancelled by it (``cancel_running``, then ``finish``).
        """
        loop = self._loop
        self._expired = False
        timer = None if deadline is None else loop.call_at(deadline, self._expire)
        try:
            while True:
                ready = self._ready
                while ready:
                    self._step(ready.popleft())
                if not self._running or self._expired or (until is not None and until()):
                    return
                wake = self._wake = loop.create_future()
                await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def finish(self) -> asyncio.CancelledError | None:
        """Step the sides to their end, through cancels of the calling task.

        Returns the last such cancel (None if none came), for the caller to raise once it
        has dealt with the sides' outcomes.
        """
        cancelled = None
        while self._running:
            try:
                await self.wait()
            except asyncio.CancelledError as exc:
                cancelled = exc
        return cancelled

    # -- stepping -------------------------------------------------------------------------

    def _step(self, side: Side[T]) -> None:
        """Run ``side`` up to its next wait, or its end (as a Task's step)."""
        if side.done:
            return
        side._waiting = None
        throw, side._throw = side._throw, None
        try:
            if throw is None:
                yielded = side._context.run(side._coro.send, None)
            else:
                yielded = side._context.run(side._coro.throw, throw)
        except StopIteration as stop:
            if side._cancel_pending():
                # Cancelled during its last step: as a Task, it ends cancelled.
                self._ended(side, asyncio.CancelledError(), None)
            else:
                self._ended(side, None, stop.value)
            return
        except (KeyboardInterrupt, SystemExit) as exc:
            # As a Task does: the side has ended, and these go on up (through the caller).
            self._ended(side, exc, None)
            raise
        except BaseException as exc:  # its outcome, CancelledError included
            self._ended(side, exc, None)
            return
        if getattr(yielded, "_asyncio_future_blocking", None):
            # It awaits a future (a Task's too): step it again once the future is done.
            future: asyncio.Future[Any] = yielded
            future._asyncio_future_blocking = False
            side._waiting = future
            future.add_done_callback(functools.partial(self._woken, side))
            self._pass_cancel(side, future)
        elif yielded is None:
            # A bare yield (asyncio.sleep(0)): step it again in the loop's next pass.
            self._loop.call_soon(self._woken, side, None)
        else:
            # As a Task: anything else yielded is a bug of the coroutine, thrown back in.
            side._throw = RuntimeError(f"a coroutine run side by side yielded {yielded!r}")
            self._woken(side, None)

    @staticmethod
    def _pass_cancel(side: Side[T], future: asyncio.Future[Any]) -> None:
        """Pass a cancel that came during the step to the future it now waits on.

        As a Task does, if that future can still be cancelled.
        """
        if side._cancel_pending() and future.cancel():
            side._throw = None

    def _ended(self, side: Side[T], error: BaseException | None, value: T | None) -> None:
        side.done = True
        side.error = error
        side.value = value
        self._running -= 1

    def _woken(self, side: Side[T], _future: object) -> None:
        self._ready.append(side)
        self._rouse()

    def _expire(self) -> None:
        self._expired = True
        self._rouse()

    def _rouse(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
