"""aiolock.sync seen through the async client's interface, for the async conformance checks.

Each asyncio task of a test gets a thread of its own (:class:`TaskThreads`) and every sync
call of that task runs in it: the task's calls have one holder, its thread, and another task
is another holder, as the checks expect of tasks. Nothing here decides anything: each
method is the sync handle's, called in the task's thread.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import aiolock
import aiolock.sync

__all__ = ("SyncView", "TaskThreads", "composite")

T = TypeVar("T")


class TaskThreads:
    """One worker thread per asyncio task; ``close()`` ends them (calls ended first)."""

    def __init__(self) -> None:
        self._of: weakref.WeakKeyDictionary[asyncio.Task[Any], ThreadPoolExecutor] = (
            weakref.WeakKeyDictionary()
        )
        self._all: list[ThreadPoolExecutor] = []

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        task = asyncio.current_task()
        assert task is not None
        executor = self._of.get(task)
        if executor is None:
            executor = self._of[task] = ThreadPoolExecutor(1, thread_name_prefix="task")
            self._all.append(executor)
        return await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(fn, *args)
        )

    def close(self) -> None:
        for executor in self._all:
            executor.shutdown(wait=False)


class SyncView:
    """A sync client with the async client's handle factories (``client.lock(name)`` ...)."""

    def __init__(self, client: aiolock.sync.Client, threads: TaskThreads) -> None:
        self.sync = client
        self.threads = threads

    @property
    def id(self) -> str:
        return self.sync.id

    def _view(self, handle: Any) -> HandleView:
        return HandleView(handle, self.threads)

    def lock(self, name: str, **kw: Any) -> HandleView:
        return self._view(self.sync.lock(name, **kw))

    def fair_lock(self, name: str, **kw: Any) -> HandleView:
        return self._view(self.sync.fair_lock(name, **kw))

    def fenced_lock(self, name: str, **kw: Any) -> HandleView:
        return self._view(self.sync.fenced_lock(name, **kw))

    def spin_lock(self, name: str, **kw: Any) -> HandleView:
        return self._view(self.sync.spin_lock(name, **kw))

    def read_write_lock(self, name: str, **kw: Any) -> PairView:
        return PairView(self.sync.read_write_lock(name, **kw), self.threads)

    def fair_read_write_lock(self, name: str, **kw: Any) -> PairView:
        return PairView(self.sync.fair_read_write_lock(name, **kw), self.threads)


class PairView:
    def __init__(self, pair: Any, threads: TaskThreads) -> None:
        self._pair = pair
        self._threads = threads

    def read_lock(self) -> HandleView:
        return HandleView(self._pair.read_lock(), self._threads)

    def write_lock(self) -> HandleView:
        return HandleView(self._pair.write_lock(), self._threads)


class HandleView:
    """A sync lock handle with the async handle's methods, each run in the task's thread."""

    def __init__(self, handle: Any, threads: TaskThreads) -> None:
        self.sync = handle
        self.threads = threads
        self._run = threads.run

    @property
    def name(self) -> str:
        return str(self.sync.name)

    async def lock(self, lease: float | None = None) -> None:
        await self._run(self.sync.lock, lease)

    async def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool:
        return bool(await self._run(self.sync.try_lock, wait, lease))

    async def unlock(self) -> None:
        await self._run(self.sync.unlock)

    async def extend(self, lease: float) -> None:
        await self._run(self.sync.extend, lease)

    async def force_unlock(self) -> bool:
        return bool(await self._run(self.sync.force_unlock))

    async def is_locked(self) -> bool:
        return bool(await self._run(self.sync.is_locked))

    async def is_held_by_current_task(self) -> bool:
        return bool(await self._run(self.sync.is_held_by_current_task))

    async def hold_count(self) -> int:
        return int(await self._run(self.sync.hold_count))

    async def remaining_lease(self) -> float | None:
        left: float | None = await self._run(self.sync.remaining_lease)
        return left

    def statistics(self) -> aiolock.LockStatistics:
        # No I/O; the per-name counts (tasks waiting) are every thread's.
        stats: aiolock.LockStatistics = self.sync.statistics()
        return stats

    def acquired(self, wait: float | None = None, lease: float | None = None) -> Block:
        return Block(self, lambda: self.sync.acquired(wait, lease))

    async def __aenter__(self) -> HandleView:
        await self._run(self.sync.__enter__)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._run(self.sync.__exit__, exc_type, exc, tb)


class Block:
    """``async with view.acquired():`` over the sync ``with handle.acquired():``."""

    def __init__(self, view: HandleView, make: Callable[[], Any]) -> None:
        self._view = view
        self._make = make
        self._cm: Any = None

    async def __aenter__(self) -> HandleView:
        def enter() -> None:
            # Made in the task's thread too: a sync block belongs to the thread making it.
            self._cm = self._make()
            self._cm.__enter__()

        await self._view._run(enter)
        return self._view

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._view._run(self._cm.__exit__, exc_type, exc, tb)


def composite(kind: type[aiolock.MultiLock] | type[aiolock.RedLock], *handles: Any) -> Any:
    """``kind(*handles)``, or its aiolock.sync twin over the sync handles of views."""
    if handles and isinstance(handles[0], HandleView):
        sync_kind = aiolock.sync.MultiLock if kind is aiolock.MultiLock else aiolock.sync.RedLock
        return HandleView(sync_kind(*(h.sync for h in handles)), handles[0].threads)
    return kind(*handles)
