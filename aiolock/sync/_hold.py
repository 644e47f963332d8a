"""Blocks run in the calling thread around an async context manager run in the loop thread.

``with lock.acquired():`` and ``with lock:`` enter and leave the async block in two calls.
A guarded block cannot: its cancel scope belongs to the task that entered it. So a guarded
block's async side is one task (`_task_side()`) that enters the async block, reports
its hold, and waits for the thread's body to end; a lost hold cancels that wait as it would
cancel an async body, and the async side ends at once (LockLostError, the release in the
background) while the thread's body runs on, to learn of it from ``hold.lost``,
``hold.check()``, ``hold.wait_lost()`` or, at the latest, the block's exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._config import TimeArg, wait_seconds
from .._engine.guard import guarding_of
from .._exceptions import LockLostError

if TYPE_CHECKING:
    from .._engine.guard import Hold as AsyncHold
    from ._portal import Portal

__all__ = ("Block", "GuardedBlock", "Hold", "TaskBlock")

log = logging.getLogger("aiolock")

T = TypeVar("T")


class Block(Generic[T]):
    """``with ...:`` over an async context manager, entered and left in two calls."""

    __slots__ = ("_cm", "_entered", "_portal", "_value")

    def __init__(
        self, portal: Portal, cm: AbstractAsyncContextManager[Any], value: T | None = None
    ) -> None:
        self._portal = portal
        self._cm = cm
        self._value = value
        self._entered = False

    def __enter__(self) -> T:
        cm = self._cm
        got = self._portal.run(cm.__aenter__(), undo=lambda _: cm.__aexit__(None, None, None))
        self._entered = True
        return self._value if self._value is not None else got

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return self._portal.run(self._cm.__aexit__(exc_type, exc, tb), finish=True)


class Hold:
    """A sync guarded hold (``with lock.guarded() as hold``): what the thread can be told.

    A thread cannot be cancelled safely, so a lost hold does NOT stop the body: the body
    learns of it by asking. ``lost`` (a plain read, no I/O: cheap enough for every loop
    iteration), ``check()`` (raises ``LockLostError`` if lost), ``sleep(seconds)`` (sleeps,
    but raises ``LockLostError`` the moment the hold is lost), ``wait_lost(timeout)``
    (blocks until lost or over; for a watcher thread), and the block's exit, which raises
    ``LockLostError`` (or notes it on the body's exception) if the hold was lost at any
    time. ``confirmed_until`` is on ``time.monotonic()``'s clock: the lock is confirmed held
    until then (drift margin deducted). ``token``: a fenced lock's fencing token.
    """

    __slots__ = ("_hold", "_holder", "_name", "_portal")

    def __init__(self, portal: Portal, hold: AsyncHold, name: str, holder: str) -> None:
        self._portal = portal
        self._hold = hold
        self._name = name
        self._holder = holder

    def __repr__(self) -> str:
        return repr(self._hold).replace("aiolock.Hold", "aiolock.sync.Hold")

    @property
    def lost(self) -> bool:
        """Whether the hold was lost (found gone or taken, or no longer confirmed)."""
        return self._hold.lost

    @property
    def confirmed_until(self) -> float:
        """Until when (``time.monotonic()``) the lock is confirmed held."""
        return self._hold.confirmed_until

    @property
    def token(self) -> int | None:
        """A fenced lock's fencing token (None for other kinds)."""
        return self._hold.token

    def check(self) -> None:
        """Raise ``LockLostError`` if the hold was lost: a checkpoint for long bodies."""
        why = guarding_of(self._hold).why
        if why is not None:
            raise LockLostError(self._name, self._holder, why)

    def sleep(self, seconds: TimeArg) -> None:
        """Sleep ``seconds`` s; raise ``LockLostError`` at once if the hold is, or gets, lost.

        The checkpoint of a loop that waits between steps (a leader's tick): it never
        sleeps through a loss. An interruption (Ctrl-C) ends it as any sync call.
        """
        if seconds is None:
            raise TypeError("seconds must be a number of seconds or a timedelta, not None")
        delay = wait_seconds(seconds, "seconds")
        assert delay is not None
        self.check()
        if delay > 0:
            self.wait_lost(delay)
            self.check()

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the hold is lost or over, or ``timeout`` s passed; whether it was lost."""
        hold = self._hold

        async def wait() -> None:
            async with asyncio.timeout(timeout):
                await hold.wait_lost()

        with contextlib.suppress(TimeoutError):
            self._portal.run(wait())
        return hold.lost


async def _task_side(
    cm: AbstractAsyncContextManager[Any],
    entered: concurrent.futures.Future[tuple[Any] | None],
    left: asyncio.Future[BaseException | None],
) -> None:
    """The async side of a task-backed block: enter, report, wait for the thread, leave."""
    value = await cm.__aenter__()
    entered.set_result((value,))
    try:
        body_error = await left
    except BaseException as exc:
        # Cancelled: by the loss (a guarded scope; __aexit__ raises LockLostError) or from
        # outside (an interrupted thread, a closing client; CancelledError goes on).
        if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
            raise
        return
    await cm.__aexit__(
        type(body_error) if body_error is not None else None,
        body_error,
        body_error.__traceback__ if body_error is not None else None,
    )


class TaskBlock(Generic[T]):
    """``with ...:`` whose async block is entered and left by ONE task, alive meanwhile.

    For async blocks bound to the task that entered them: a guarded hold's cancel scope,
    a permit renewed while its task lives (``PermitExpirableSemaphore.acquired()``). A
    `Block` would enter in a task that ends at once, and what it bound ends with it.
    """

    __slots__ = ("_call", "_cm", "_left", "_portal")

    def __init__(self, portal: Portal, cm: AbstractAsyncContextManager[Any]) -> None:
        self._portal = portal
        self._cm = cm
        self._call: Any = None
        self._left: asyncio.Future[BaseException | None] | None = None

    def _wrap(self, value: Any) -> T:
        """What the ``with`` statement gives, from what the async block gave."""
        result: T = value
        return result

    def __enter__(self) -> T:
        if self._call is not None:
            raise RuntimeError("this block is entered once: make a new one")
        portal = self._portal
        # Done with (value,) once entered, or with None when the call ends without it.
        entered: concurrent.futures.Future[tuple[Any] | None] = concurrent.futures.Future()
        left: asyncio.Future[BaseException | None] = portal.loop.create_future()
        self._left = left
        call = self._call = portal.prepare(_task_side(self._cm, entered, left), entered)
        try:
            call.schedule()
            got = entered.result()
            if got is not None:
                # Returned from within the try: an interruption in _wrap (a signal handler
                # runs at a call) still leaves the block; none can land after the return.
                return self._wrap(got[0])
        except BaseException:
            # Interrupted while acquiring (or just after): the task ends and releases
            # before this goes on (at exit if a second interruption cuts this short).
            portal.abandoned.add(call)
            call.interrupt()
            portal.abandoned.discard(call)
            portal.forget(call)
            raise
        portal.forget(call)
        call.result()  # the acquire's error (LockTimeoutError, ...)
        raise AssertionError("unreachable")  # pragma: no cover - a call without a hold

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        call, left, portal = self._call, self._left, self._portal
        assert call is not None
        assert left is not None

        def leave() -> None:
            if not left.done():
                left.set_result(exc)

        try:
            with contextlib.suppress(RuntimeError):  # the loop is gone, the call with it
                portal.loop.call_soon_threadsafe(leave)
            call.wait()
        except BaseException:
            # Interrupted while leaving (even before `leave` was sent): the cancel makes
            # the async side leave (release) and this waits for it (or the exit does).
            portal.abandoned.add(call)
            call.interrupt()
            portal.abandoned.discard(call)
            raise
        finally:
            portal.forget(call)
        self._ended(call, exc)
        return None

    def _ended(self, call: Any, exc: BaseException | None) -> None:
        """The async side's outcome, once it ended: its error raised."""
        call.result()


class GuardedBlock(TaskBlock[Hold]):
    """``with lock.guarded() as hold:`` in a thread (see the module docstring)."""

    __slots__ = ("_holder", "_name")

    def __init__(
        self, portal: Portal, cm: AbstractAsyncContextManager[AsyncHold], name: str, holder: str
    ) -> None:
        super().__init__(portal, cm)
        self._name = name
        self._holder = holder

    def _wrap(self, value: Any) -> Hold:
        return Hold(self._portal, value, self._name, self._holder)

    def _ended(self, call: Any, exc: BaseException | None) -> None:
        try:
            call.result()
        except LockLostError as error:
            if exc is None:
                raise
            if isinstance(exc, LockLostError) and (exc.name, exc.holder) == (
                error.name,
                error.holder,
            ):
                return  # the body stopped on this very loss (check(), sleep()): told
            # Never hides the body's own exception: the loss is noted on it.
            log.warning("aiolock: %s (the block raised %r)", error, exc)
            exc.add_note(f"aiolock: {error}")
