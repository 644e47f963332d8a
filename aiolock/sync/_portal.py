"""The event-loop thread the synchronous API runs the async client in, and its calls.

Why the stdlib and not anyio's blocking portal: the project's only runtime dependency is
redis[hiredis], and a sync API that needed an extra would surprise the Django, Flask and
Celery users it is for. Nothing anyio's portal does is missing here: ``call_soon_threadsafe``
starts a task in the loop thread, and the task's last step stores its outcome and releases
a bare lock the calling thread blocks on (`Call`: one hand-off each way, cheaper
than a ``concurrent.futures.Future``). The part a portal does not do had to be written
anyway: when the waiting thread is
interrupted (KeyboardInterrupt from Ctrl-C, a Celery soft time limit, any exception a
signal handler raises) anyio's portal, like ``run_coroutine_threadsafe``, marks its future
cancelled and returns at once, while the task may still be acquiring in the loop. Here the
task is cancelled and its end waited for before the interruption is re-raised, with the
undo the cancel started (a rollback, a fair queue exit: the tasks it spawned, filed by the
loop's task factory), and a call that had already succeeded (an acquire) is undone:
nothing is left behind, even by a process that exits on the interruption.

ONE loop thread per process serves every sync client of the process (each client has its
own async client, connections and renewal in it): a MultiLock or RedLock over handles of
several clients (a RedLock's members are on independent servers) runs in one task, which
needs every member's async client in one loop. The thread starts with the first call of a
client and stops when the last client using it is closed; it is a daemon, so an
interpreter exit never waits for it. A forked child gets a loop thread of its own for the
clients it uses first; those its parent used refuse (``RuntimeError``), as the async
client does.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import itertools
import os
import sys
import threading
from _thread import allocate_lock as _allocate_lock
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .._engine.engine import PROCESS, THREAD_OWNER_PREFIX
from .._exceptions import ClientClosedError

__all__ = ("Call", "Portal", "portal", "thread_owner")

T = TypeVar("T")

# Holder ids of threads: ``{client.id}:owner:{THREAD_PREFIX}{n}``, owner-form (so never a
# task's id) with a per-process counter (threads' idents are reused, these are not). The
# engine knows the prefix: a thread makes one call at a time, so it may be handed a lock.
THREAD_PREFIX = THREAD_OWNER_PREFIX
_numbers = itertools.count(1)
_local = threading.local()

#: How long an interrupted call waits for its undo (a rollback, a queue exit, a release the
#: cancel cut off) before the interruption goes on to the caller: long enough for a few
#: round trips and a reconnect; bounded so that Ctrl-C with Redis gone still ends. Those
#: left running then are waited for once more (as long again) at interpreter exit.
UNDO_BOUND = 5.0

#: How long a Ctrl-C that came just before the main thread blocked waits to be handled.
_SIGNAL_POLL = 0.1

# The call a task runs for (its own task and every task it starts, which inherit the
# context): the loop's task factory files the tasks a cancelled call starts as its undo.
_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("aiolock_sync_call")


def thread_owner() -> str:
    """The calling thread's ``owner=`` as a holder: a new one for each thread."""
    owner: str | None = getattr(_local, "owner", None)
    if owner is None or getattr(_local, "forks", None) != PROCESS.forks:
        # A forked child's copy of this thread is another holder than the parent's.
        owner = _local.owner = f"{THREAD_PREFIX}{os.getpid()}-{next(_numbers)}"
        _local.forks = PROCESS.forks
    return owner


class Call:
    """One call running as a task in the loop thread, seen from the thread that made it.

    Why not ``run_coroutine_threadsafe``: it costs a Task, a ``concurrent.futures.Future``
    (a Condition, whose wait allocates a lock), a done callback that runs one loop
    iteration after the task ends and a second callback copying the outcome across. Here
    the task runs `_drive()`, which stores the outcome and releases ``_lock`` (a bare
    ``_thread`` lock the caller blocks on) in the task's own last step: one hand-off each way.
    """

    __slots__ = (
        "_cancelled",
        "_coro",
        "_listener",
        "_lock",
        "_loop",
        "_task",
        "_undoing",
        "error",
        "undos",
        "value",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> None:
        self._loop = loop
        self._coro: Coroutine[Any, Any, Any] | None = coro
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False
        # Set in the loop thread just before the task is cancelled: the tasks the call
        # starts from then on (its rollbacks, a queue exit, a cut-off release) are its undo.
        self._undoing = False
        self.undos: set[asyncio.Task[Any]] = set()
        self._listener: Callable[[], object] | None = None
        self.value: Any = None
        #: The call's exception (CancelledError if it was cancelled); None if it returned.
        self.error: BaseException | None = None
        self._lock = _allocate_lock()
        self._lock.acquire()  # held until the call has ended: released by the loop thread

    def schedule(self) -> None:
        self._loop.call_soon_threadsafe(self._start)

    # -- in the loop thread ---------------------------------------------------------------

    def _start(self) -> None:
        coro = self._coro
        if coro is None or self._task is not None:
            # Ended already (failed when the loop stopped), or scheduled twice (a call
            # that must finish, rescheduled after an interruption in its scheduling).
            return
        if self._cancelled:
            self._end(None, asyncio.CancelledError())  # cancelled before it began
            return
        self._task = _task(_drive(self, coro), self._loop)

    def _end(self, value: Any, error: BaseException | None) -> None:
        """Record the outcome and wake the caller (once; always in the loop thread)."""
        coro = self._coro
        if coro is None:
            return
        self.value = value
        self.error = error
        self._coro = None  # after the outcome: a caller that sees done() reads it whole
        coro.close()  # a no-op once it ran; one that never started is not warned about
        listener = self._listener
        self._lock.release()
        if listener is not None:
            listener()

    def _cancel_task(self) -> None:
        task = self._task
        self._undoing = True
        if task is None:
            # Never started: not scheduled (an interruption came before), or started and
            # ended already; either way it ends here, cancelled (once: _end is idempotent).
            self._end(None, asyncio.CancelledError())
            return
        if task.cancel():
            # A task cancelled before its first step never runs _drive's body: end it here.
            task.add_done_callback(lambda _: self._end(None, asyncio.CancelledError()))

    def on_end(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` in the loop thread when the call ends (set before it starts)."""
        self._listener = listener

    # -- in the calling thread ------------------------------------------------------------

    def done(self) -> bool:
        return self._coro is None

    def wait(self) -> None:
        """Block until the call has ended (interruptible: KeyboardInterrupt gets through)."""
        if self._coro is None:
            # Ended (set before the lock is released): return without the lock, which an
            # earlier wait, interrupted between its acquire and its release, may hold.
            return
        lock = self._lock
        if threading.current_thread() is threading.main_thread():
            # A signal that comes just before the thread blocks in acquire() is handled
            # only when acquire() returns (CPython cannot wake it then): a Ctrl-C would
            # wait for the call's end, for ever for lock(). Short waits in a loop, whose
            # every turn runs pending signal handlers, bound that delay.
            while not lock.acquire(timeout=_SIGNAL_POLL):
                pass
        else:
            lock.acquire()
        lock.release()  # stays released: later waits return at once

    def result(self) -> Any:
        """The call's value, or its exception raised (once it has ended)."""
        error = self.error
        if error is not None:
            raise error
        return self.value

    def interrupt(self) -> None:
        """Cancel the call and wait until it has ended, its undo finished (bounded).

        The undo (a rollback, a queue exit, a release the cancel cut off) runs in tasks the
        call started as it was cancelled; the call ends once they have, or after
        ``UNDO_BOUND`` s. So an interruption reaches the caller with nothing left behind,
        and a process that exits on it (what Ctrl-C does) leaves nothing either. A second
        interruption while waiting (a second Ctrl-C) stops the wait at once.
        """
        self._cancelled = True
        try:
            self._loop.call_soon_threadsafe(self._cancel_task)
        except RuntimeError:
            return  # the loop is gone, and the call with it
        self.wait()

    def fail(self, exc: BaseException) -> None:
        """End a call the loop will never run (it stopped); in the loop thread."""
        self._end(None, exc)


if sys.version_info >= (3, 12):

    def _task(
        coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[None]:
        # Its first step runs now, in this callback, which spares each call a pass of the
        # loop (an epoll_wait and its bookkeeping).
        # Keyword public from 3.14; 3.12's eager_task_factory is built on it.
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]

else:

    def _task(
        coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[None]:
        return loop.create_task(coro)


async def _drive(call: Call, coro: Coroutine[Any, Any, Any]) -> None:
    """The task of one call: run it, then hand its outcome to the waiting thread."""
    _CALL.set(call)
    try:
        value = await coro
    except BaseException as exc:  # CancelledError too: the caller raises it, not the loop
        if call._undoing:
            await _settle(call.undos)
        call._end(None, exc)
    else:
        if call._undoing:  # a cancel the call swallowed, or that came as it returned
            await _settle(call.undos)
        call._end(value, None)


async def _settle(undos: set[asyncio.Task[Any]]) -> None:
    """Wait (bounded) for a cancelled call's undo; a second cancel stops the wait.

    Some of the undo starts in callbacks the cancel scheduled (a waiter's future done):
    each round yields to the loop first, until a round finds nothing new to wait for.
    """
    deadline = asyncio.get_running_loop().time() + UNDO_BOUND
    waited: set[asyncio.Task[Any]] = set()
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            await asyncio.sleep(0)
            pending = {task for task in undos if not task.done()}
            if not pending and undos <= waited:
                return
            waited |= undos
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            if pending:
                # asyncio.wait, not wait_for: it never cancels the undo, nor swallows a
                # cancel.
                await asyncio.wait(pending, timeout=left)


def _undo_filing_factory(
    undos: set[asyncio.Task[Any]],
) -> Callable[..., asyncio.Task[Any]]:
    """The loop's task factory: files each task a cancelled call starts as its undo."""

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        # The context the task runs in decides, as it is the task's: a task started in a
        # fresh one (a connection's reader: it outlives the call) is nobody's undo.
        context: contextvars.Context | None = kwargs.get("context")
        call = _CALL.get(None) if context is None else context.get(_CALL)
        if call is not None and call._undoing and not task.done():
            call.undos.add(task)
            undos.add(task)  # the portal's: waited for at interpreter exit
            task.add_done_callback(undos.discard)
        return task

    return factory


class Portal:
    """The loop thread of one process, shared by the sync clients that use it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._calls: set[Call] = set()
        self.loop = asyncio.new_event_loop()
        # Undo tasks of interrupted calls not finished yet (in the loop thread only).
        self._undos: set[asyncio.Task[Any]] = set()
        # Calls whose caller was interrupted, until it is done undoing them: those left
        # here (a second interruption cut that short) are ended and undone at exit.
        self.abandoned: set[Call] = set()
        self.loop.set_task_factory(_undo_filing_factory(self._undos))
        self._ready = threading.Event()
        self.forks = PROCESS.forks
        self.thread = threading.Thread(target=self._main, name="aiolock-sync-loop", daemon=True)
        self.thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
            # As asyncio.run() ends: what is left is cancelled and allowed to finish.
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            with self._lock:
                calls, self._calls = self._calls, set()
            for call in calls:
                call.fail(ClientClosedError("the aiolock client"))
            loop.close()

    def settle_at_exit(self) -> None:
        """At interpreter exit: let the undo of interrupted calls finish (bounded).

        The loop thread is a daemon, stopped mid-step when the interpreter ends: an undo
        still running then (a caller interrupted twice, or past ``UNDO_BOUND``) would be
        lost, leaving a queue entry or a hold for its lease.
        """
        # list() of a set is one step under the GIL: other threads may add meanwhile.
        abandoned = [call for call in list(self.abandoned) if not call.done()]
        if not (self._undos or abandoned) or not self.thread.is_alive() or self.in_loop_thread:
            return  # (plain reads: no hand-off when nothing is left)

        async def settle() -> None:
            # A call whose caller was interrupted again before it was cancelled (a double
            # Ctrl-C) is cancelled now; its task ends once its undo has.
            tasks = set()
            for call in abandoned:
                call._cancelled = True
                call._cancel_task()
                if call._task is not None:
                    tasks.add(call._task)
            if tasks:
                await asyncio.wait(tasks, timeout=UNDO_BOUND)
            if self._undos:
                await _settle(self._undos)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(settle(), self.loop).result(UNDO_BOUND + 1)

    def attach(self) -> bool:
        """One more client uses this loop; False if it is stopping (use a new portal)."""
        with self._lock:
            if self._users < 0:
                return False
            self._users += 1
            return True

    def detach(self) -> None:
        """A client is done with the loop; the last one stops it and waits for its end."""
        with self._lock:
            self._users -= 1
            last = self._users == 0
            if last:
                self._users = -1  # stopping: attach() refuses from now on
        if last:
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self.thread:
                self.thread.join()

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def run(
        self,
        coro: Coroutine[Any, Any, T],
        undo: Callable[[T], Awaitable[object]] | None = None,
        *,
        finish: bool = False,
    ) -> T:
        """Run ``coro`` in the loop; block this thread for its result.

        An exception raised in this thread meanwhile (KeyboardInterrupt, a time limit's)
        cancels the task, waits for its end and, if it had succeeded all the same, runs
        ``undo(result)`` (releasing what it acquired), then propagates. ``finish``: a call
        that must be made whatever happens (a release, a block's exit) is not cancelled:
        the exception propagates once it has ended (a second one stops the wait).
        """
        call = self.prepare(coro)
        try:
            # Scheduled inside the try: an interruption landing anywhere after prepare()
            # cancels the call (one not scheduled yet ends at once, see _cancel_task).
            call.schedule()
            call.wait()
            self._calls.discard(call)
            error = call.error
            result: T = call.value
        except BaseException:
            # First (a second interruption lands after this call at the earliest): if the
            # undo below is cut short, the interpreter's exit finishes it.
            self.abandoned.add(call)
            if finish:
                # Scheduled again in case the interruption came before it was: the loop
                # starts it once.
                with contextlib.suppress(RuntimeError):  # the loop is gone: it failed it
                    call.schedule()
                call.wait()
            self._calls.discard(call)
            if not call.done():
                call.interrupt()
            if undo is not None and call.done() and call.error is None:
                self.run(_awaited(undo(call.value)))
            self.abandoned.discard(call)
            raise
        # No call from here to the caller's next statement: a signal handler's exception
        # (raised at a call, not at a return) cannot land between a success and its caller.
        # Those who return run()'s value likewise return it as it is (no bool()/int()).
        if error is not None:
            raise error
        return result

    def start(
        self,
        coro: Coroutine[Any, Any, Any],
        ended: concurrent.futures.Future[Any] | None = None,
    ) -> Call:
        """Schedule ``coro`` as a call; the caller waits on it and then forgets it.

        ``ended``: a future set to None when the call ends, if nothing set it before.
        """
        call = self.prepare(coro, ended)
        call.schedule()
        return call

    def prepare(
        self,
        coro: Coroutine[Any, Any, Any],
        ended: concurrent.futures.Future[Any] | None = None,
    ) -> Call:
        """``coro`` as a call, listed but not scheduled: the caller schedules it.

        The caller schedules it within its ``try``, so that an interruption landing just
        after the scheduling (a signal handler runs at any call) is one it handles.
        """
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError(
                "a blocking aiolock.sync call was made in the sync client's own event-loop "
                "thread (from an event listener?): it would wait for itself for ever. Use "
                "the async client there, or hand the call to another thread"
            )
        call = Call(self.loop, coro)
        if ended is not None:

            def end() -> None:
                if not ended.done():
                    ended.set_result(None)

            call.on_end(end)
        with self._lock:
            if self._users < 0:
                coro.close()
                raise ClientClosedError("the aiolock client")
            # Listed before it is scheduled: a loop that stops fails what it never ran.
            self._calls.add(call)
        return call

    def forget(self, call: Call) -> None:
        self._calls.discard(call)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


_portal: Portal | None = None
_portal_lock = threading.Lock()


@atexit.register
def _settle_at_exit() -> None:
    current = _portal
    if current is not None and current.forks == PROCESS.forks:
        current.settle_at_exit()


def portal() -> Portal:
    """The process's loop thread, attached for one more client (started if need be)."""
    global _portal  # noqa: PLW0603 - one loop thread per process
    with _portal_lock:
        current = _portal
        if current is None or current.forks != PROCESS.forks or not current.attach():
            # None yet, the parent's (its thread does not exist in a forked child), or
            # stopping: a new one.
            current = _portal = Portal()
            current.attach()
        return current
