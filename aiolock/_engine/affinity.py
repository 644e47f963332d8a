"""Where a client may run: the process and the event loop that first used it.

A client's connections are sockets of one process, read and written by one event loop.

- **Another process** (a child of ``os.fork()``: gunicorn ``--preload``, multiprocessing's
  fork start method) holds copies of its parent's sockets. A command the child wrote would
  go out on the parent's connection and its reply be read by the parent, as the answer to a
  call of its own: a ``try_lock()`` of the parent could return True for a lock another
  client holds. So any call of a client in a process other than the one that first used it
  raises ``RuntimeError`` before anything is sent, and the parent never notices.
- **Another event loop** (a thread's, a second loop while the first still runs) cannot
  wait on the first loop's futures or sockets: a call from it raises ``RuntimeError``
  before anything is sent, rather than sending the acquire and failing once the server has
  taken the lock.
- **A new event loop once the first is closed** (``asyncio.run()`` per job with a
  module-level client, a per-test loop): nothing of the old loop can run again, so the
  client moves to the new one (``on_new_loop``: the client rebuilds every loop-bound piece
  and reconnects there) and belongs to it from then on.
- **A new process, before any call** (a client made at import, then forked: Celery's
  prefork pool, gunicorn ``--preload``, multiprocessing's fork start method): the child's
  copy is the child's client, but it must not be the parent's *identity* too. Holder ids
  and request ids (the names of acquire receipts and unlock latches) start with the
  client's id: two children with one id would each hold a lock as a re-entry of the
  other's hold, and one child's acquire would be answered with another's receipt, as a
  resend. So in the child every client never used yet takes a new identity
  (``on_new_process``) right at the fork, before any code of the child runs; should that
  fail, its first call does it instead, before anything is sent.

Forks are counted with ``os.register_at_fork``, so the process check compares two
integers (``os.getpid()`` is a system call, ~190 ns, on glibc since 2.25). The whole check
costs ~0.25 us a call on Python 3.11 (whose ``_get_running_loop`` itself calls getpid) and
less from 3.12 on: not measurable on a lock+unlock pair (~125 us against a local server).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Callable

__all__ = ("PROCESS", "Affinity")


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
