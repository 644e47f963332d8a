"""Blocks run in the calling thread around an async context manager run in the loop thread.

``with lock.acquired():`` and ``with lock:`` enter and leave the async block in two calls.
A guarded block cannot: its cancel scope belongs to the task that entered it. So a guarded
block's async side is one task (:func:`_guarded_side`) that enters the async block, reports
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

from .._exceptions import LockLostError

if TYPE_CHECKING:
    from .._engine.guard import Hold as AsyncHold
    from ._portal import Portal

__all__ = ("Block", "GuardedBlock", "Hold")

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
        return self._portal.run(self._cm.__aexit__(exc_type, exc, tb))


class Hold:
    """A sync guarded hold (``with lock.guarded() as hold``): what the thread can be told.

    A thread cannot be cancelled safely, so a lost hold does NOT stop the body: the body
    learns of it by asking. ``lost`` (a plain read, no I/O: cheap enough for every loop
    iteration), ``check()`` (raises ``LockLostError`` if lost), ``wait_lost(timeout)``
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
        why = self._hold.why
        if why is not None:
            raise LockLostError(self._name, self._holder, why)

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the hold is lost or over, or ``timeout`` s passed; whether it was lost."""
        hold = self._hold

        async def wait() -> None:
            async with asyncio.timeout(timeout):
                await hold.wait_lost()

        with contextlib.suppress(TimeoutError):
            self._portal.run(wait())
        return hold.lost


async def _guarded_side(
    cm: AbstractAsyncContextManager[AsyncHold],
    entered: concurrent.futures.Future[AsyncHold | None],
    left: asyncio.Future[BaseException | None],
) -> None:
    """The async side of a guarded block: enter, report, wait for the thread, leave."""
    hold = await cm.__aenter__()
    entered.set_result(hold)
    try:
        body_error = await left
    except BaseException as exc:
        # Cancelled: by the loss (the scope; __aexit__ raises LockLostError) or from
        # outside (an interrupted thread, a closing client; CancelledError goes on).
        if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
            raise
        return
    await cm.__aexit__(
        type(body_error) if body_error is not None else None,
        body_error,
        body_error.__traceback__ if body_error is not None else None,
    )


class GuardedBlock:
    """``with lock.guarded() as hold:`` in a thread (see the module docstring)."""

    __slots__ = ("_call", "_cm", "_holder", "_left", "_name", "_portal")

    def __init__(
        self, portal: Portal, cm: AbstractAsyncContextManager[AsyncHold], name: str, holder: str
    ) -> None:
        self._portal = portal
        self._cm = cm
        self._name = name
        self._holder = holder
        self._call: Any = None
        self._left: asyncio.Future[BaseException | None] | None = None

    def __enter__(self) -> Hold:
        if self._call is not None:
            raise RuntimeError("a guarded() block is entered once: call guarded() again")
        portal = self._portal
        # Done with the hold once entered, or with None when the call ends without one.
        entered: concurrent.futures.Future[AsyncHold | None] = concurrent.futures.Future()
        left: asyncio.Future[BaseException | None] = portal.loop.create_future()
        self._left = left
        call = self._call = portal.start(_guarded_side(self._cm, entered, left), entered)
        try:
            hold = entered.result()
        except BaseException:
            # Interrupted while acquiring: the task ends (and releases) before this goes on.
            call.interrupt()
            portal.forget(call)
            raise
        if hold is None:
            portal.forget(call)
            call.result()  # the acquire's error (LockTimeoutError, ...)
            raise AssertionError("unreachable")  # pragma: no cover - a call without a hold
        return Hold(portal, hold, self._name, self._holder)

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

        with contextlib.suppress(RuntimeError):  # the loop is gone, the call ended with it
            portal.loop.call_soon_threadsafe(leave)
        try:
            call.wait()
        except BaseException:
            call.interrupt()
            raise
        finally:
            portal.forget(call)
        try:
            call.result()
        except LockLostError as error:
            if exc is None:
                raise
            # Never hides the body's own exception: the loss is noted on it.
            log.warning("aiolock: %s (the block raised %r)", error, exc)
            exc.add_note(f"aiolock: {error}")
        return None
