"""Holder identity: which asyncio task (or explicit owner) a hold belongs to.

Each task gets ``"{client.id}:{n}"`` the first time it touches a lock of the client, with
``n`` from a per-client counter. Tasks are looked up through a WeakKeyDictionary: not by
``id(task)``, which the interpreter reuses, and not by a ContextVar, which a child task
would inherit from its parent. (A composite lock's member calls run in the calling task
itself: ``_objects/side_by_side.py``.)
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any

__all__ = ("THREAD_OWNER_PREFIX", "HolderIds")

#: The ``owner=`` of a thread of ``aiolock.sync`` starts with this (a sync handle refuses
#: it as a user's ``owner=``).
#: Such a holder makes one call at a time (its thread blocks on each), as a task does, so
#: a release may hand it the lock (_handover.py); other ``owner=`` holders may have calls
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
        """Start again as ``client_id``: a forked child's own ids (``affinity.py``)."""
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
