"""The aiolock client: ONE command connection, ONE pub/sub connection, ONE renewal task."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import uuid
import warnings
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar, Unpack

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from ._config import ClientOptions, Options, TimeArg, lease_seconds, wait_seconds
from ._emitter import Emitter, Listener
from ._engine.cancel import cancel_mark, cancelled_since
from ._engine.engine import Affinity, Engine, HolderIds
from ._net.cluster import Address, Connector, node_connector, seeds_of
from ._net.wire import abandon_loop
from ._objects.count_down_latch import CountDownLatch
from ._objects.decorator import LockKind, locked
from ._objects.fair_lock import FairLock
from ._objects.fair_rwlock import FairReadWriteLock
from ._objects.fenced import FencedLock
from ._objects.leader import Leader
from ._objects.lock import Lock
from ._objects.permit_expirable_semaphore import PermitExpirableSemaphore
from ._objects.rwlock import ReadWriteLock
from ._objects.semaphore import Semaphore
from ._objects.spin import SpinLock
from ._services import build_services
from ._timing import send_deadline, settings_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine
    from types import TracebackType

    from redis.asyncio.connection import AbstractConnection


__all__ = ("Client",)

log = logging.getLogger("aiolock")

P = ParamSpec("P")
R = TypeVar("R")

# How long aclose() lets the guarded bodies it cancelled take to leave their blocks: they
# raise at their next await, so this only bounds one that swallows the cancel.
_GUARDED_EXIT = 1.0


_HOST = re.sub(r"[^\x21-\x7e]", "_", socket.gethostname()) or "-"


def connection_name(client_id: str) -> str:
    """The name of a connection of the client ``client_id``: ``aiolock:<id>:<host>:<pid>``.

    The host with anything CLIENT SETNAME refuses (spaces, newlines) as ``_``.
    """
    return f"aiolock:{client_id}:{_HOST}:{os.getpid()}"


class Client:
    """An aiolock client: the factory of lock handles over one Redis connection setup.

    ``Client.from_url(url, **options)`` owns its redis client; ``Client(redis, **options)``
    takes the connection settings of a ``redis.asyncio.Redis`` you own and close yourself.
    Either way aiolock opens connections of its own with those settings (one for commands,
    one for pub/sub), lazily, and never uses or changes the redis client's pool.
    Close with ``await client.aclose()`` or ``async with client:``.
    """

    # On one server (Sentinel's included) only: its one command and pub/sub connections.

    def __init__(self, redis: Redis | RedisCluster, **options: Unpack[Options]) -> None:
        if not isinstance(redis, Redis | RedisCluster):
            raise TypeError(
                f"redis must be a redis.asyncio.Redis or RedisCluster, not {type(redis).__name__}"
            )
        self._options = valid = ClientOptions.build(**options)
        # The event stream and the slow-lock log, handed to every piece that records what
        # happens (the engine, the holds, the renewal, the connections); the listeners
        # outlive a move to a new event loop.
        self._events = Emitter(slow_wait=valid.slow_wait, slow_hold=valid.slow_hold)
        self._redis = redis
        self._owns_redis = False
        #: This client's part of every holder id: a UUID4 in Java's text form.
        self.id = str(uuid.uuid4())
        lease_ms = round(valid.watchdog_timeout * 1000)
        on_cluster = isinstance(redis, RedisCluster)
        # redis-py builds every connection aiolock opens, from the user's settings: the
        # pool's of a Redis (Sentinel's included), a startup node's of a RedisCluster.
        # Kept: every event loop the client moves to connects with them again (_build).
        self._seeds: list[Address] = []
        self._connector: Connector | None = None
        self._make_connection: Callable[[], AbstractConnection] | None = None
        if isinstance(redis, RedisCluster):
            self._seeds = seeds_of(redis)
            node = node_connector(redis)
            self._connector = lambda host, port: self._named(node(host, port))
            sample = self._connector(*self._seeds[0])()
        else:
            self._make_connection = self._named(redis.connection_pool.make_connection)
            sample = self._make_connection()
        self._settings = settings_for(valid, sample, cluster=on_cluster)
        deadline = send_deadline(sample)
        self._deadline = deadline
        self._lease_ms = lease_ms
        # The client's own pieces, whatever the event loop: the engine is the handles' only
        # way to the services, and stays theirs when the client moves to a new loop.
        self._affinity = Affinity(on_new_loop=self._rebind, on_new_process=self._new_process)
        # What aclose() has left to do: None before it is first called.
        self._closing: list[tuple[bool, Callable[[], Awaitable[None] | None]]] | None = None
        # aclose()'s wait for the guarded bodies it cancelled to leave their blocks.
        self._guarded_left: Awaitable[bool] | None = None
        self._build()
        self._engine = Engine(
            settings=self._settings,
            ids=HolderIds(self.id),
            affinity=self._affinity,
            events=self._events,
            services=self._services,
        )

    def _named(self, make: Callable[[], AbstractConnection]) -> Callable[[], AbstractConnection]:
        """``make``, each connection named ``aiolock:<client id>:<host>:<pid>``.

        redis-py's handshake sends it (CLIENT SETNAME): an operator's ``CLIENT LIST`` and
        ``aiolock inspect`` tell which host and process hold a lock, with no key written.
        A name the user gave the redis client is kept. The id and pid are read at each
        connect: a forked child (a new id, a new pid) names its own.
        """

        def make_named() -> AbstractConnection:
            conn = make()
            if getattr(conn, "client_name", None) is None:
                conn.client_name = connection_name(self.id)
            return conn

        return make_named

    def _build(self) -> None:
        """Build the services of the client that belong to an event loop (``_services.py``).

        Nothing connects here; the first call does, in its loop. Called at construction
        and by `_rebind()`. Each piece is kept as an attribute of its own.
        """
        self._services = build_services(
            self._options,
            self._settings,
            self._events,
            redis=self._redis,
            deadline=self._deadline,
            lease_ms=self._lease_ms,
            seeds=self._seeds,
            connector=self._connector,
            make_connection=self._make_connection,
            on_switch=self._switched,
            connected_to=self._connected_to,
        )

    def _new_process(self) -> None:
        """Become a forked child's own client, with a new id, before its first call.

        A client made before ``fork()`` and not used yet (Celery's prefork pool, gunicorn
        ``--preload``) would otherwise give every child the same holder and request ids.
        """
        self.id = str(uuid.uuid4())
        self._engine.new_identity(self.id)

    def _rebind(self, dead: asyncio.AbstractEventLoop) -> None:
        """Move the client to a new event loop, the one it first used being closed.

        Everything of the dead loop is gone with it: its connections are closed here
        (their sockets, without the loop; ``_net.wire.abandon_loop``), and its tasks ended
        with it (``asyncio.run()`` cancels them). So every loop-bound piece is built
        afresh (``_build``) and the engine, which the handles keep, uses the new ones:
        the next call connects in the new loop. Holds of the dead loop are forgotten:
        their tasks are gone and nothing renews them, so they expire with their lease
        (each logged at WARNING).
        """
        for hold in self._services.holds:
            if hold.count and hold.lost is None:
                log.warning(
                    "aiolock: the event loop closed while %s held lock %r; it is not "
                    "released and expires with its lease",
                    hold.holder,
                    hold.name,
                )
        abandon_loop(dead)
        self._build()
        self._engine.attach(self._services)

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Unpack[Options]) -> Self:
        """A client that owns a new redis client for ``url`` and closes it.

        ``cluster=True``: ``url`` names a node of a Redis Cluster (a ``RedisCluster``).
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        if not isinstance(cluster, bool):
            raise TypeError(f"cluster must be a bool, not {type(cluster).__name__}")
        # Only its settings are used: aiolock's connections are its own (see __init__).
        redis: Redis | RedisCluster = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
        try:
            client = cls(redis, **options)
        except BaseException:
            # Nothing was connected yet; drop the pool without awaiting.
            del redis
            raise
        client._owns_redis = True
        return client

    def _switched(self, primary: str) -> None:
        """The sentinels switched the primary: reconnect there, pub/sub included."""
        exc = RedisConnectionError(f"aiolock: the sentinels switched the primary to {primary}")
        services = self._services
        # Only a Sentinel client (one server) is told of a switch.
        assert services.transport is not None
        assert services.dispatcher is not None
        services.transport.reset(exc)
        services.dispatcher.reset(exc)

    def _connected_to(self) -> list[str]:
        """Where the open connections go ("host:port"), for the Sentinel watch to compare."""
        services = self._services
        assert services.transport is not None
        assert services.dispatcher is not None
        peers = (services.transport.peer, services.dispatcher.peer)
        return [peer for peer in peers if peer is not None]

    # -- handles --------------------------------------------------------------------------

    def lock(self, name: str, *, owner: str | None = None) -> Lock:
        """A reentrant lock handle (Redisson RLock layout). Creating it sends nothing."""
        return Lock(self._engine, name, owner=owner)

    def fair_lock(self, name: str, *, owner: str | None = None) -> FairLock:
        """A FIFO reentrant lock handle (Redisson RFairLock layout)."""
        return FairLock(self._engine, name, owner=owner)

    def read_write_lock(self, name: str, *, owner: str | None = None) -> ReadWriteLock:
        """A read-write lock (RReadWriteLock layout): ``.read_lock()``, ``.write_lock()``."""
        return ReadWriteLock(self._engine, name, owner=owner)

    def fair_read_write_lock(self, name: str, *, owner: str | None = None) -> FairReadWriteLock:
        """A read-write lock serving readers and writers in arrival order (aiolock's own)."""
        return FairReadWriteLock(self._engine, name, owner=owner)

    def fenced_lock(self, name: str, *, owner: str | None = None) -> FencedLock:
        """A reentrant lock whose every acquisition takes a growing token (RFencedLock)."""
        return FencedLock(self._engine, name, owner=owner)

    def spin_lock(self, name: str, *, owner: str | None = None) -> SpinLock:
        """A reentrant lock whose waiters poll with back-off, no pub/sub (RSpinLock)."""
        return SpinLock(self._engine, name, owner=owner)

    def semaphore(self, name: str, permits: int | None = None) -> Semaphore:
        """A counting semaphore (Redisson RSemaphore layout); permits have no owner.

        ``permits``: the permits it is declared with: an acquire that finds no state sets
        them first, atomically (Redisson's trySetPermits), so a restart without
        persistence or a failover re-seeds it. None: set them with ``try_set_permits``.
        """
        return Semaphore(self._engine, name, permits)

    def permit_expirable_semaphore(
        self, name: str, permits: int | None = None
    ) -> PermitExpirableSemaphore:
        """A semaphore of permits taken by id, each with a lease (RPermitExpirableSemaphore).

        ``permits`` as for `semaphore()`.
        """
        return PermitExpirableSemaphore(self._engine, name, permits)

    def count_down_latch(self, name: str) -> CountDownLatch:
        """A count-down latch (Redisson RCountDownLatch layout)."""
        return CountDownLatch(self._engine, name)

    # -- events ---------------------------------------------------------------------------

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(event)`` with every event of this client (``aiolock.events``).

        ``fn`` runs in the event loop, inside the call that made the event: it must be
        cheap and must not block. Whatever one raises (``KeyboardInterrupt`` and
        ``SystemExit`` aside) is logged (at most once a minute after the first) and never
        breaks the call nor the renewal. Adding a listener twice adds it once; an ``async
        def`` is refused (``TypeError``): listeners are called, never awaited.
        """
        self._events.add(fn)

    def remove_listener(self, fn: Listener) -> None:
        """Stop calling ``fn``; nothing happens if it is not a listener."""
        self._events.remove(fn)

    # -- leadership and decorators --------------------------------------------------------

    def leader(self, name: str, lease: TimeArg = None, *, slow_hold: TimeArg = None) -> Leader:
        """An election on the reentrant lock ``name``: its holder is the leader.

        ``lease`` None: the watchdog keeps a term alive; a number: a term's longest length.
        ``slow_hold``: a term held longer is logged (WARNING); None (the default): never,
        whatever the client's ``slow_hold`` (a term is meant to last).
        """
        return Leader(self.lock(name), lease_seconds(lease), wait_seconds(slow_hold, "slow_hold"))

    def locked(
        self,
        template: str,
        *,
        wait: TimeArg = None,
        lease: TimeArg = None,
        kind: LockKind = "lock",
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """Decorate a coroutine function to run each call under a guarded lock.

        The lock's name is ``template`` formatted with the call's arguments by name
        (``"orders:{order_id}"``); ``wait`` as in ``acquired()`` (LockTimeoutError when it
        runs out), ``kind`` the lock kind (``"lock"``, ``"fair_lock"``, ``"read_lock"``, ...).
        """
        return locked(self, template, wait=wait, lease=lease, kind=kind)

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `aclose()` was called."""
        return self._engine.closed

    async def __aenter__(self) -> Self:
        self._engine.check_open()
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

        The holds of tasks that have ended (they can no longer unlock) are released at
        once, so another process takes over without waiting out the lease. Locks still
        held by running tasks are not released (they expire with their lease); each is
        logged at WARNING, naming its task. Releases and rollbacks already under way are
        allowed to finish. With the server unreachable, the releases give up within the
        client's retries.

        Every step runs whatever the calling task's cancel state (a task that once caught
        a CancelledError, or ran a TaskGroup whose child failed on Python 3.11/3.12, still
        counts a cancel request): only a cancel that arrives during aclose() raises
        CancelledError, and even then every task and connection is closed first; only the
        waits for calls and releases under way are cut short. An aclose() stopped halfway
        by another exception is finished by the next one.
        """
        # In a forked child, or from another loop, nothing here is this caller's to close.
        self._affinity.check()
        if self._closing is None:
            self._engine.close()
            self._closing = self._close_steps()
        steps = self._closing
        mark = cancel_mark()
        failure: Exception | None = None
        while steps:
            waits, step = steps[0]
            if waits and cancelled_since(mark):
                # Cancelled: close at once; what is still under way fails with
                # ClientClosedError as the connections close.
                del steps[0]
                continue
            try:
                pending = step()
                if pending is not None:
                    await pending
            except asyncio.CancelledError:
                pass  # judged by the mark below: a step must not end the closing
            except Exception as exc:
                log.exception("aiolock: closing the client failed at one step")
                failure = failure or exc
            del steps[0]
        if cancelled_since(mark):
            raise asyncio.CancelledError
        if failure is not None:
            raise failure

    def _close_steps(self) -> list[tuple[bool, Callable[[], Awaitable[None] | None]]]:
        """aclose()'s steps in order, each with whether it only waits (cut short by a cancel)."""
        services = self._services
        return [
            # First: cancel guarded bodies, whose holds are then released at once below.
            (False, self._before_close),
            (True, self._guarded_exits),
            (False, services.renewal.aclose),
            (False, services.sentinel.aclose if services.sentinel is not None else _nothing),
            (False, services.waiting.close),
            # Every waiter wakes and raises ClientClosedError; a call whose script is in
            # flight undoes a hold it gets (see Engine._attempt). Both end before the
            # connections close, and so do releases and rollbacks already under way.
            (False, services.pubsub.aclose),
            (True, services.background.calls_ended),
            (True, services.order.drained),
            # Before the connections close: another process takes these over at once.
            (True, self._release_ended),
            (True, services.background.drain),
            (True, services.latches.flush),
            (False, services.topology.aclose),
            (False, self._warn_held),
            (False, self._redis.aclose if self._owns_redis else _nothing),
        ]

    def _before_close(self) -> None:
        """aclose()'s first step: cancel every guarded body.

        Their blocks raise LockLostError and release in the background, which the later
        steps wait for.
        """
        self._guarded_left = self._engine.guard.cancel_all_and_wait()

    async def _guarded_exits(self) -> None:
        """Let the cancelled guarded bodies leave their blocks, for at most _GUARDED_EXIT.

        A body that swallows its cancel runs on: its hold is then left as any running
        task's (it expires with its lease, with a WARNING), not waited for.
        """
        left = self._guarded_left
        if left is None:
            return
        self._guarded_left = None
        try:
            async with asyncio.timeout(_GUARDED_EXIT):
                await left
        except TimeoutError:
            log.warning(
                "aiolock: a guarded body cancelled by aclose() did not leave its block within %g s",
                _GUARDED_EXIT,
            )

    def _release_ended(self) -> Awaitable[None]:
        return self._engine.release_ended()

    def _warn_held(self) -> None:
        self._engine.end_held()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        # getattr: __init__ may have raised before the engine existed.
        engine = getattr(self, "_engine", None)
        if (
            engine is not None
            and engine.started
            and not engine.closed
            # A forked child's copy: the parent closes the client, not the child.
            and not self._affinity.foreign
        ):
            _warn(
                f"aiolock client {self.id} was never closed: call aclose()",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )


def _nothing() -> None:
    pass
