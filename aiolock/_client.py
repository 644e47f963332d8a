"""The aiolock client: one command pool, ONE pub/sub connection, ONE renewal task."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
import warnings
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Self, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._config import ClientOptions, TimeArg
from ._exceptions import ClientClosedError, LockError
from ._fair_lock import FairLock
from ._holders import HolderIds
from ._holds import HoldRegistry
from ._latches import LatchSweeper
from ._lock import Lock
from ._ordering import CallOrder, Ticket, in_turn
from ._pool import BoundedPool
from ._pubsub import Dispatcher
from ._renewal import RenewalService
from ._rwlock import ReadWriteLock
from ._scripts import ScriptRunner

if TYPE_CHECKING:
    from types import TracebackType

    from ._holds import Hold

__all__ = ("Client",)

log = logging.getLogger("aiolock")
T = TypeVar("T")

# A send with no socket timeout can wait without bound; past this many seconds a resend
# window is no longer derived from the connection's settings, only assumed.
_UNBOUNDED_SEND = 30.0
_BACKOFF_CAP = 10.0
# Margin on every latch and tombstone beyond the last resend that can still reach the server.
_LATCH_MARGIN = 5.0
# Command connections of a client built from a URL, and how long a call waits for one.
_POOL_SIZE = 64
_POOL_WAIT = 30.0


class Client:
    """An aiolock client: the factory of lock handles over one Redis connection setup.

    ``Client.from_url(url, **options)`` owns its redis client; ``Client(redis, **options)``
    wraps a ``redis.asyncio.Redis`` you own and close yourself. Connections open lazily.
    Close with ``await client.aclose()`` or ``async with client:``.
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        watchdog_timeout: TimeArg = 30.0,
        key_prefix: str = "",
        subscribe_timeout: TimeArg = 7.5,
        retry_attempts: int = 3,
        retry_interval: TimeArg = 0.2,
        fair_lock_wait_timeout: TimeArg = 300.0,
    ) -> None:
        if isinstance(redis, RedisCluster):
            raise NotImplementedError(
                "aiolock does not support Redis Cluster yet; pass a redis.asyncio.Redis"
            )
        if not isinstance(redis, Redis):
            raise TypeError(f"redis must be a redis.asyncio.Redis, not {type(redis).__name__}")
        self._options = ClientOptions.build(
            watchdog_timeout=watchdog_timeout,
            key_prefix=key_prefix,
            subscribe_timeout=subscribe_timeout,
            retry_attempts=retry_attempts,
            retry_interval=retry_interval,
            fair_lock_wait_timeout=fair_lock_wait_timeout,
        )
        options = self._options
        self._redis = redis
        self._owns_redis = False
        self._closed = False
        self._started = False
        #: This client's part of every holder id: a UUID4 in Java's text form.
        self.id = str(uuid.uuid4())
        self._publish = "PUBLISH"
        self._lease_ms = round(options.watchdog_timeout * 1000)
        # A wait for a lock without expiry (a foreign holder) is still bounded.
        self._ttl_cap = options.watchdog_timeout
        # A call cut off by a cancel or an outage is resent in the background for at most
        # a watchdog lease; every unlock latch and acquire tombstone outlives the first send
        # of its call by more than every resend can take, so no resend ever counts twice.
        self._resend_window_ms = self._lease_ms
        self._latch_ttl_ms = round(
            (_call_seconds(redis, options) + options.watchdog_timeout + _LATCH_MARGIN) * 1000
        )
        self._background: set[asyncio.Task[Any]] = set()
        # Each holder's calls on each lock, one after the other (see _ordering.py).
        self._order = CallOrder()
        # Public calls under way: aclose() waits for them, so none succeeds after it.
        self._running = 0
        self._ran_out: asyncio.Future[None] | None = None
        self._calls = itertools.count(1)
        self._waiting: dict[str, int] = {}
        # (lock key, holder field) -> that holder's calls waiting on it: a fair lock's
        # queue entry is one per holder, left only when its last waiting call gives up.
        self._waiting_holders: dict[tuple[str, str], int] = {}
        # Lock key -> loop time its lease runs out, as this client's waiters last saw it.
        self._lease_until: dict[str, float] = {}
        self._ids = HolderIds(self.id)
        self._runner = ScriptRunner(
            redis, retry_attempts=options.retry_attempts, retry_interval=options.retry_interval
        )
        self._dispatcher = Dispatcher(
            redis, subscribe_timeout=options.subscribe_timeout, spawn=self._spawn
        )
        self._renewal = RenewalService(
            self._runner,
            lease_ms=self._lease_ms,
            interval=options.watchdog_timeout / 3,
            spawn=self._spawn,
            on_lost=self._lease_lost,
        )
        self._holds = HoldRegistry(self._renewal)
        self._latches = LatchSweeper(self._runner, self._spawn)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        watchdog_timeout: TimeArg = 30.0,
        key_prefix: str = "",
        subscribe_timeout: TimeArg = 7.5,
        retry_attempts: int = 3,
        retry_interval: TimeArg = 0.2,
        fair_lock_wait_timeout: TimeArg = 300.0,
    ) -> Self:
        """A client that owns a new ``redis.asyncio.Redis`` for ``url`` and closes it."""
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        # A bounded pool: a burst of acquires beyond the pool size waits for a connection
        # instead of failing (the default pool raises MaxConnectionsError at 100 in use).
        redis = Redis.from_pool(
            BoundedPool.from_url(url, max_connections=_POOL_SIZE, timeout=_POOL_WAIT)
        )
        try:
            client = cls(
                redis,
                watchdog_timeout=watchdog_timeout,
                key_prefix=key_prefix,
                subscribe_timeout=subscribe_timeout,
                retry_attempts=retry_attempts,
                retry_interval=retry_interval,
                fair_lock_wait_timeout=fair_lock_wait_timeout,
            )
        except BaseException:
            # Nothing was connected yet; drop the pool without awaiting.
            del redis
            raise
        client._owns_redis = True
        return client

    # -- handles --------------------------------------------------------------------------

    def lock(self, name: str, *, owner: str | None = None) -> Lock:
        """A reentrant lock handle (Redisson RLock layout). Creating it sends nothing."""
        return Lock(self, name, owner=owner)

    def fair_lock(self, name: str, *, owner: str | None = None) -> FairLock:
        """A FIFO reentrant lock handle (Redisson RFairLock layout)."""
        return FairLock(self, name, owner=owner)

    def read_write_lock(self, name: str, *, owner: str | None = None) -> ReadWriteLock:
        """A read-write lock (RReadWriteLock layout): ``.read_lock()``, ``.write_lock()``."""
        return ReadWriteLock(self, name, owner=owner)

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop renewal, wake every waiter with ClientClosedError, close connections.

        Locks still held are not released (they expire with their lease); each is logged
        at WARNING. Releases and rollbacks already under way are allowed to finish.
        """
        if self._closed:
            return
        self._closed = True
        await self._renewal.aclose()
        # Every waiter wakes and raises ClientClosedError; a call whose script is in
        # flight undoes a hold it gets (see LockBase._attempt). Both end before the
        # connections close, and so do releases and rollbacks already under way.
        await self._dispatcher.aclose()
        while self._running:
            if self._ran_out is None or self._ran_out.done():
                self._ran_out = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._ran_out])
        await self._order.drained()
        # Until every background task has ended and been reported (_background_done).
        # Not `while self._background: await gather(*self._background)`: a task that ended
        # in this loop iteration stays in the set until its done-callback runs in the next
        # one, and from Python 3.12 on gather() of futures that are all done completes
        # without yielding to the loop, so that loop spun forever and blocked the event loop.
        # wait() also leaves the tasks running if aclose() is cancelled; gather() cancelled
        # them all.
        while self._background:
            running = [task for task in self._background if not task.done()]
            if running:
                await asyncio.wait(running)
            else:
                await asyncio.sleep(0)  # only their done-callbacks are left to run
        await self._latches.flush()
        for hold in self._holds:
            if hold.count and hold.lost is None:
                log.warning(
                    "aiolock: client closed while %s holds lock %r; it is not released "
                    "and expires with its lease",
                    hold.holder,
                    hold.name,
                )
        if self._owns_redis:
            await self._redis.aclose()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        # getattr: __init__ may have raised before these existed.
        if getattr(self, "_started", False) and not getattr(self, "_closed", True):
            _warn(
                f"aiolock client {self.id} was never closed: call aclose()",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )

    # -- plumbing the handles share -------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError
        self._started = True

    def _lease_left_ms(self, key: str) -> int:
        """Ms left on ``key``'s lease as local waiters last saw it; -1 if unknown."""
        until = self._lease_until.get(key)
        if until is None:
            return -1
        return max(0, round((until - asyncio.get_running_loop().time()) * 1000))

    def _next_call(self) -> str:
        return f"{self.id}:{next(self._calls)}"

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a background task the client keeps (and aclose() awaits)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _complete_in_background(self, ticket: Ticket, coro: Coroutine[Any, Any, Any]) -> None:
        """Finish a holder's cut-off call in the background, in ``ticket``'s turn.

        The holder's later calls on the lock wait for it, so they land in the order they
        were made.
        """
        self._spawn(in_turn(ticket, coro))

    def _call_started(self) -> None:
        self._running += 1

    def _call_ended(self) -> None:
        self._running -= 1
        if not self._running and self._ran_out is not None and not self._ran_out.done():
            self._ran_out.set_result(None)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not getattr(task, "_aiolock_awaited", False):
            level = logging.WARNING if isinstance(exc, LockError) else logging.ERROR
            log.log(level, "aiolock: background operation failed: %r", exc, exc_info=exc)

    async def _shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` to completion even if the caller is cancelled meanwhile."""
        task = self._spawn(coro)
        # The caller sees the outcome; the done-callback only reports it if the caller
        # was cancelled before it could.
        task._aiolock_awaited = True  # type: ignore[attr-defined]
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task._aiolock_awaited = False  # type: ignore[attr-defined]
            raise

    def _lease_lost(self, hold: Hold, why: str) -> None:
        log.warning(
            "aiolock: lock %r held by %s was lost (%s): mutual exclusion is no longer "
            "guaranteed; its unlock() will raise LockLostError",
            hold.name,
            hold.holder,
            why,
        )
        self._holds.mark_lost(hold, why)


def _call_seconds(redis: Redis, options: ClientOptions) -> float:
    """The longest one script call can take from its first send to its last resend.

    Each of the client's tries (``retry_attempts`` + 1) is one redis-py command, which
    redis-py itself may retry on a fresh connection; each send may connect, write and wait
    for the reply, each bounded by the connection's own timeouts. A connection without a
    socket timeout, or a redis-py retry without end, bounds nothing: then a send is assumed
    to take at most ``_UNBOUNDED_SEND`` and redis-py to retry at most 3 times.
    """
    conn = redis.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    socket = conn.socket_timeout or _UNBOUNDED_SEND
    connect = conn.socket_connect_timeout or socket
    # get_retries() is newer than some redis-py releases the package accepts.
    get_retries = getattr(conn.retry, "get_retries", None)
    retries = get_retries() if get_retries is not None else 3
    if retries < 0:
        retries = 3
    # Each pause between redis-py's own tries is at most its backoff cap (10 s by default).
    one_try = (retries + 1) * (connect + 2 * socket) + retries * _BACKOFF_CAP
    tries = options.retry_attempts + 1
    return tries * one_try + options.retry_attempts * options.retry_interval
