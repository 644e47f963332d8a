"""Holder identity: which asyncio task (or explicit owner) a hold belongs to.

Each task gets ``"{client.id}:{n}"`` the first time it touches a lock of the client, with
``n`` from a per-client counter. Tasks are looked up through a WeakKeyDictionary: not by
``id(task)``, which the interpreter reuses, and not by a ContextVar, which a child task
would inherit from its parent.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any

__all__ = ("HolderIds",)


class HolderIds:
    """Assigns holder ids to tasks for one client."""

    __slots__ = ("_counter", "_ids", "client_id")

    def __init__(self, client_id: str) -> None:
        #: The client's id, the first part of every holder id it hands out.
        self.client_id = client_id
        self._counter = itertools.count(1)
        self._ids: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = weakref.WeakKeyDictionary()

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
        holder = self._ids.get(task)
        if holder is None:
            holder = self._ids[task] = f"{self.client_id}:{next(self._counter)}"
        return holder

    def owner(self, owner: str) -> str:
        """The holder id of an explicit ``owner=``: never equal to a task's (API.md)."""
        return f"{self.client_id}:owner:{owner}"
