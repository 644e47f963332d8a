"""Noticing a cancel that something below aiolock swallowed.

On Python 3.11, ``asyncio.wait_for`` returns its inner result and drops a cancel that lands
as the inner call completes; redis-py wraps every socket write in it when ``socket_timeout``
is set (its default). A lock call cancelled in that window would then carry on and return
as if nothing happened. ``Task.cancelling()`` still counts the request, so each public call
notes the count when it starts and, before it returns normally, checks that no request came
since; if one did, it undoes what it did and raises ``CancelledError`` itself. An
``asyncio.timeout()`` around the call then turns that into its ``TimeoutError`` as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ("calling_task", "cancel_mark", "cancel_requested", "cancelled_since", "within")


def calling_task() -> asyncio.Task[Any] | None:
    """The calling task; None outside a task or outside an asyncio loop."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def cancel_mark() -> int:
    """The calling task's count of pending cancel requests, taken when a call starts."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        # No asyncio loop: the call fails just after, with a message that says why.
        return 0
    return task.cancelling() if task is not None else 0


def cancelled_since(mark: int) -> bool:
    """Whether the calling task was asked to cancel after ``mark`` was taken."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False
    return cancel_requested(task, mark)


def cancel_requested(task: asyncio.Task[Any] | None, mark: int) -> bool:
    """``cancelled_since(mark)`` for a call that looked up its task when it started.

    The hot paths ask this several times per call; the task never changes under a call,
    and on Python 3.11 ``asyncio.current_task()`` is Python code, not C.
    """
    return task is not None and task.cancelling() > mark


async def within(bound: float | None, call: Coroutine[Any, Any, bool]) -> bool:
    """``call``'s result, or False if it is still under way after ``bound`` s (None: no bound).

    Cut off, the call is cancelled as by a caller's ``asyncio.timeout``: its engine undoes
    what it may have taken (now, or once the server answers again), as for any cancelled
    call. An outer cancel still raises CancelledError.
    """
    if bound is None:
        return await call
    scope = asyncio.timeout(bound)
    try:
        async with scope:
            return await call
    except TimeoutError:
        if scope.expired():
            return False
        raise
