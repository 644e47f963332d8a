"""``Runtime``: what a sync client's objects run their calls through.

Its own module, so that the sync objects (``_locks``, ``_objects``) and the client that
makes them all depend on it, never on each other.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .._engine.engine import PROCESS
from .._exceptions import ClientClosedError
from ._portal import Portal, portal

if TYPE_CHECKING:
    from .._client import Client as AsyncClient

__all__ = ("Runtime",)

T = TypeVar("T")


class Runtime:
    """What a client's sync objects run their calls through.

    Its async client, in the loop thread, once checked (open, this process).
    """

    __slots__ = ("_lock", "_pid", "_portal", "async_client", "closed")

    def __init__(self, async_client: AsyncClient) -> None:
        self.async_client = async_client
        self._portal: Portal | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.closed = False

    @property
    def client_id(self) -> str:
        """The async client's id: read each time, as a forked child gives it a new one."""
        return self.async_client.id

    def portal(self) -> Portal:
        """The loop thread, attached at the first call; refused once closed or forked."""
        current = self._portal
        if current is not None and current.forks == PROCESS.forks and not self.closed:
            return current
        with self._lock:
            if self.closed:
                raise ClientClosedError
            current = self._portal
            if current is None:
                current = self._portal = portal()
                self._pid = os.getpid()
            elif current.forks != PROCESS.forks:
                raise RuntimeError(
                    f"this aiolock.sync client was first used in process {self._pid} and "
                    f"cannot be used in process {os.getpid()}, a child forked from it: its "
                    "connections are the parent's. Create a new client after the fork (in "
                    "the child, e.g. in Celery's worker_process_init); the parent's client "
                    "is unaffected"
                )
            return current

    def run(
        self,
        coro: Coroutine[Any, Any, T],
        undo: Callable[[T], Awaitable[object]] | None = None,
        *,
        finish: bool = False,
    ) -> T:
        try:
            where = self.portal()
        except BaseException:
            coro.close()
            raise
        return where.run(coro, undo, finish=finish)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            current = self._portal
        if current is None:
            # Never used: nothing connected, no loop to run aclose() in (nor needed).
            return
        if current.forks != PROCESS.forks:
            return  # a forked child's copy: the parent closes the client
        try:
            current.run(self.async_client.aclose())
        finally:
            current.detach()
