"""``aiolock.sync.Client``: the async client, run in the process's event-loop thread."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar, Unpack

from .._client import Client as AsyncClient
from .._config import Options, TimeArg, lease_seconds, wait_seconds
from .._emitter import Listener
from .._exceptions import ClientClosedError
from .._objects.decorator import LockKind, check_kind, locked
from ._locks import (
    FairLock,
    FairReadWriteLock,
    FencedLock,
    Lock,
    LockMethods,
    ReadWriteLock,
    SpinLock,
)
from ._objects import CountDownLatch, Leader, PermitExpirableSemaphore, Semaphore
from ._runtime import Runtime

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ("Client",)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Client:
    """A blocking aiolock client for threads: Django, Flask, Celery, scripts.

    Every object and method of ``aiolock.Client``, blocking; holders are the calling
    threads. It runs an ``aiolock.Client`` in a background event-loop thread (one per
    process, shared by the sync clients; a daemon), so sync, async and Java clients
    exclude and wake each other on the same names. Close with ``close()`` or ``with``.
    """

    __slots__ = ("__weakref__", "_rt")

    def __init__(self, async_client: AsyncClient) -> None:
        # Internal: use from_url(). The async client is this one's alone.
        self._rt = Runtime(async_client)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Unpack[Options]) -> Self:
        """A client for ``url`` with the async client's options.

        ``cluster=True``: ``url`` names a node of a Redis Cluster. Nothing connects until
        the first call.
        """
        return cls(AsyncClient.from_url(url, cluster=cluster, **options))

    @property
    def id(self) -> str:
        """The client's part of every holder id (a UUID4)."""
        return self._rt.client_id

    def __repr__(self) -> str:
        return f"<aiolock.sync.Client {self.id}{' closed' if self.closed else ''}>"

    # -- handles --------------------------------------------------------------------------

    def lock(self, name: str, *, owner: str | None = None) -> Lock:
        """A reentrant lock (Redisson RLock layout), held by the calling thread."""
        client = self._rt.async_client
        return Lock(self._rt, lambda o: client.lock(name, owner=o), owner)

    def fair_lock(self, name: str, *, owner: str | None = None) -> FairLock:
        """A FIFO reentrant lock (Redisson RFairLock layout)."""
        client = self._rt.async_client
        return FairLock(self._rt, lambda o: client.fair_lock(name, owner=o), owner)

    def spin_lock(self, name: str, *, owner: str | None = None) -> SpinLock:
        """A reentrant lock whose waiters poll with back-off (RSpinLock)."""
        client = self._rt.async_client
        return SpinLock(self._rt, lambda o: client.spin_lock(name, owner=o), owner)

    def fenced_lock(self, name: str, *, owner: str | None = None) -> FencedLock:
        """A reentrant lock whose every acquisition takes a growing token (RFencedLock)."""
        client = self._rt.async_client
        return FencedLock(self._rt, lambda o: client.fenced_lock(name, owner=o), owner)

    def read_write_lock(self, name: str, *, owner: str | None = None) -> ReadWriteLock:
        """A read-write lock (RReadWriteLock layout): ``.read_lock()``, ``.write_lock()``."""
        return ReadWriteLock(self._rt, name, owner)

    def fair_read_write_lock(self, name: str, *, owner: str | None = None) -> FairReadWriteLock:
        """A read-write lock serving readers and writers in arrival order."""
        return FairReadWriteLock(self._rt, name, owner)

    def semaphore(self, name: str, permits: int | None = None) -> Semaphore:
        """A counting semaphore (Redisson RSemaphore layout); permits have no owner.

        ``permits``: the permits it is declared with: an acquire that finds no state sets
        them first, atomically (Redisson's trySetPermits), so a restart without
        persistence or a failover re-seeds it. None: set them with ``try_set_permits``.
        """
        return Semaphore(self._rt, self._rt.async_client.semaphore(name, permits))

    def permit_expirable_semaphore(
        self, name: str, permits: int | None = None
    ) -> PermitExpirableSemaphore:
        """A semaphore of permits taken by id, each with a lease.

        ``permits`` as for `semaphore()`.
        """
        return PermitExpirableSemaphore(
            self._rt, self._rt.async_client.permit_expirable_semaphore(name, permits)
        )

    def count_down_latch(self, name: str) -> CountDownLatch:
        """A count-down latch (Redisson RCountDownLatch layout)."""
        return CountDownLatch(self._rt, self._rt.async_client.count_down_latch(name))

    def leader(self, name: str, lease: TimeArg = None, *, slow_hold: TimeArg = None) -> Leader:
        """An election on the reentrant lock ``name``; a term is held by a thread.

        ``slow_hold`` as the async client's: None (the default) never logs a term as slow.
        """
        return Leader(self._rt, name, lease, slow_hold)

    def locked(
        self,
        template: str,
        *,
        wait: TimeArg = None,
        lease: TimeArg = None,
        kind: LockKind = "lock",
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorate a function to run each call under a guarded lock of ``kind``.

        The name is ``template`` formatted from the call's arguments by name; ``wait`` as
        in ``acquired()``. The call is not interrupted if the hold is lost: it raises
        ``LockLostError`` when it returns (see ``guarded()``).
        """
        wait_s = wait_seconds(wait)
        lease_s = lease_seconds(lease)
        lock_kind = check_kind(kind)
        naming = _Naming(template)

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            name_for = naming.of(func)

            @functools.wraps(func)
            def call(*args: P.args, **kwargs: P.kwargs) -> R:
                handle = _of_kind(self, lock_kind, name_for(args, kwargs))
                with handle.guarded(wait=wait_s, lease=lease_s):
                    return func(*args, **kwargs)

            return call

        return decorate

    # -- events ---------------------------------------------------------------------------

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(event)`` with every event of this client (``aiolock.events``).

        ``fn`` runs in the client's event-loop thread: cheap, non-blocking, and never a
        call of the sync client (refused there: it would wait for itself).
        """
        self._rt.async_client.add_listener(fn)

    def remove_listener(self, fn: Listener) -> None:
        """Stop calling ``fn``."""
        self._rt.async_client.remove_listener(fn)

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._rt.closed

    def close(self) -> None:
        """Close as ``aclose()`` does; threads waiting raise ``ClientClosedError``.

        The loop thread stops once the last sync client of the process is closed.
        """
        self._rt.close()

    def __enter__(self) -> Self:
        if self._rt.closed:
            raise ClientClosedError
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Naming:
    """The async decorator's naming rules, on a sync function (checked at decoration)."""

    __slots__ = ("_template",)

    def __init__(self, template: str) -> None:
        self._template = template

    def of(self, func: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], str]:
        # The async decorator checks the template against the function and formats names;
        # borrowed through a stand-in coroutine function of the same signature, so the
        # rules (and their messages) are written once.
        import inspect  # noqa: PLC0415 - only at decoration

        if inspect.iscoroutinefunction(func):
            raise TypeError(
                f"aiolock.sync's @locked decorates plain functions; "
                f"{func.__qualname__!r} is a coroutine function: use the async client's"
            )
        names: list[str] = []

        class _Capture:
            def lock(self, name: str) -> Any:
                names.append(name)
                raise _Named

            fair_lock = fenced_lock = spin_lock = lock

            def read_write_lock(self, name: str) -> Any:
                names.append(name)
                raise _Named

            fair_read_write_lock = read_write_lock

        async def stand_in(*args: Any, **kwargs: Any) -> None:
            pass  # pragma: no cover - never awaited

        functools.update_wrapper(stand_in, func)
        stand_in.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
        decorated = locked(_Capture(), self._template, wait=None, lease=None, kind="lock")(stand_in)

        def name_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            coro = decorated(*args, **kwargs)
            try:
                coro.send(None)
            except _Named:
                return names.pop()
            finally:
                coro.close()
            raise AssertionError("unreachable")  # pragma: no cover

        return name_for


class _Named(Exception):
    """Ends the stand-in's call once the name is formatted."""


def _of_kind(client: Client, kind: LockKind, name: str) -> LockMethods:
    if kind.startswith(("fair_read", "fair_write")):
        pair: FairReadWriteLock | ReadWriteLock = client.fair_read_write_lock(name)
    elif kind in ("read_lock", "write_lock"):
        pair = client.read_write_lock(name)
    else:
        factory: Callable[[str], LockMethods] = getattr(client, kind)
        return factory(name)
    return pair.read_lock() if kind.endswith("read_lock") else pair.write_lock()
