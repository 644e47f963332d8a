"""One adapter per implementation, all with the same small interface.

An adapter is built per measurement (and per process) with the server URL and a tag unique
to the measurement, so key and channel names never collide with an earlier measurement.
``setup()`` opens connections, ``worker(index, total)`` gives each task (or thread) its own
worker with ``acquire(name)`` / ``release(name)`` / ``warm()``, and ``teardown()`` closes.

Async adapters run one asyncio task per worker; sync adapters (``mode = "thread"``) run one
thread per worker. Peers are imported with :func:`importlib.import_module`, so a peer that is
missing or broken turns into "cannot run: <reason>" in the table rather than a crash, and so
the type checker needs no stubs for libraries that ship none.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import redis
import redis.asyncio

from . import _redisson
from ._baseline import NAME, on_path
from ._instrument import RoundTrips

on_path()  # a baseline installed by the parent process (--baseline), in a spawned child

__all__ = (
    "ADAPTERS",
    "AsyncAdapter",
    "AsyncWorker",
    "SyncAdapter",
    "SyncWorker",
    "Unavailable",
    "availability",
)

LEASE_S = 30  # lease of every peer lock: far longer than any measurement


class Unavailable(Exception):
    """The implementation cannot be measured here; ``str(exc)`` is the table's text."""


class _LockLike(Protocol):
    async def lock(self) -> None: ...
    async def unlock(self) -> None: ...


class AsyncWorker(ABC):
    """What one asyncio task uses to take and give back locks."""

    def __init__(self, warm_name: str) -> None:
        self.warm_name = warm_name

    @abstractmethod
    async def acquire(self, name: str) -> None:
        """Wait until ``name`` is held by this worker."""

    @abstractmethod
    async def release(self, name: str) -> None:
        """Give ``name`` back."""

    async def warm(self) -> None:
        """One pair on a private name: scripts loaded, connections open."""
        await self.acquire(self.warm_name)
        await self.release(self.warm_name)


class SyncWorker(ABC):
    """What one thread uses to take and give back locks."""

    def __init__(self, warm_name: str) -> None:
        self.warm_name = warm_name

    @abstractmethod
    def acquire(self, name: str) -> None:
        """Block until ``name`` is held by this worker."""

    @abstractmethod
    def release(self, name: str) -> None:
        """Give ``name`` back."""

    def warm(self) -> None:
        """One pair on a private name."""
        self.acquire(self.warm_name)
        self.release(self.warm_name)


class _Adapter:
    key: ClassVar[str]
    label: ClassVar[str]
    mode: ClassVar[str] = "async"
    #: which scenario kinds apply: uncontended, contended, handoff, multiproc
    cases: ClassVar[frozenset[str]] = frozenset(
        {"uncontended", "contended", "handoff", "multiproc"}
    )
    note: ClassVar[str] = ""
    #: "server": measured on the run's one server; "cluster": on the local cluster only.
    topology: ClassVar[str] = "server"
    #: The scenario variants it runs in (``None``: every variant of its ``cases``).
    variants: ClassVar[frozenset[str] | None] = None
    #: "python": workers in this process (or spawned ones); "jvm": Java processes that
    #: benchmarks/_redisson.py starts and reads.
    runner: ClassVar[str] = "python"

    def __init__(self, url: str, tag: str) -> None:
        self.url = url
        self.tag = tag
        self.extra: dict[str, int] = {}

    @classmethod
    def check(cls) -> str | None:
        """``None`` if it can run here, else the reason (for the table)."""
        return None


class AsyncAdapter(_Adapter, ABC):
    """Adapter whose workers are asyncio tasks."""

    async def setup(self) -> None:
        """Open connections."""

    @abstractmethod
    async def worker(self, index: int, total: int) -> AsyncWorker:
        """The worker for task ``index`` of ``total`` (across all processes)."""

    async def ready(self) -> None:
        """Called once every worker exists, before warm-up."""

    async def teardown(self) -> None:
        """Close connections."""


class SyncAdapter(_Adapter, ABC):
    """Adapter whose workers are threads (one per task)."""

    mode: ClassVar[str] = "thread"

    def setup(self) -> None:
        """Open connections."""

    @abstractmethod
    def worker(self, index: int, total: int) -> SyncWorker:
        """The worker for thread ``index`` of ``total``."""

    def teardown(self) -> None:
        """Close connections."""


def _import_reason(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"cannot run: import {module} failed: {type(exc).__name__}: {exc}"
    return None


# --------------------------------------------------------------------------- aiolock


class _HandleWorker(AsyncWorker):
    """Caches one handle per name; ``lock()``/``unlock()`` in the calling task."""

    def __init__(self, warm_name: str, make: Callable[[str], _LockLike]) -> None:
        super().__init__(warm_name)
        self._make = make
        self._handles: dict[str, _LockLike] = {}

    async def acquire(self, name: str) -> None:
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = self._make(name)
        await handle.lock()

    async def release(self, name: str) -> None:
        await self._handles[name].unlock()


class _AiolockAdapter(AsyncAdapter):
    #: Client method that makes the handle, and the view of a read-write lock to use
    factory: ClassVar[str] = "lock"
    view: ClassVar[str | None] = None
    client_options: ClassVar[dict[str, Any]] = {}
    #: The package measured: aiolock, or the earlier one installed beside it (--baseline).
    package: ClassVar[str] = "aiolock"

    @classmethod
    def check(cls) -> str | None:
        reason = _import_reason(cls.package)
        if reason is not None:
            return reason
        aiolock: Any = importlib.import_module(cls.package)
        if not hasattr(aiolock, "Client"):
            return "cannot run: aiolock.Client does not exist yet"
        if not hasattr(aiolock.Client, cls.factory):
            return f"n/a: aiolock.Client.{cls.factory} is not implemented yet"
        return None

    async def setup(self) -> None:
        aiolock: Any = importlib.import_module(self.package)
        self.client = aiolock.Client.from_url(self.url, **self.client_options)
        try:
            self._make(f"{self.tag}:probe")
        except NotImplementedError as exc:
            await self.client.aclose()
            raise Unavailable(f"n/a: {self.factory} raises NotImplementedError") from exc

    def _make(self, name: str) -> _LockLike:
        handle: Any = getattr(self.client, self.factory)(name)
        if self.view is not None:
            handle = getattr(handle, self.view)()
        lock: _LockLike = handle
        return lock

    async def worker(self, index: int, total: int) -> AsyncWorker:
        return _HandleWorker(f"{self.tag}:warm:{index}", self._make)

    async def teardown(self) -> None:
        await self.client.aclose()


class AiolockLock(_AiolockAdapter):
    key = "aiolock"
    label = "aiolock Lock"


class AiolockCluster(_AiolockAdapter):
    key = "aiolock-cluster"
    label = "aiolock Lock (cluster)"
    client_options: ClassVar[dict[str, Any]] = {"cluster": True}
    cases = frozenset({"uncontended", "contended"})
    topology: ClassVar[str] = "cluster"


class AiolockBaseline(_AiolockAdapter):
    key = "aiolock-baseline"
    label = "aiolock Lock (baseline)"
    package = NAME
    note = "the code at --baseline REF, installed beside"


class AiolockFair(_AiolockAdapter):
    key = "aiolock-fair"
    label = "aiolock FairLock"
    factory = "fair_lock"


class AiolockRead(_AiolockAdapter):
    key = "aiolock-read"
    label = "aiolock RWLock.read_lock"
    factory = "read_write_lock"
    view = "read_lock"
    cases = frozenset({"uncontended"})  # contended readers share: see the rw case
    note = "readers share the lock, so only the uncontended case applies"


class AiolockWrite(_AiolockAdapter):
    key = "aiolock-write"
    label = "aiolock RWLock.write_lock"
    factory = "read_write_lock"
    view = "write_lock"


class _RWWorker(AsyncWorker):
    def __init__(self, warm_name: str, make: Callable[[str], Any], writer: bool) -> None:
        super().__init__(warm_name)
        self._make = make
        self._writer = writer
        self._handles: dict[str, _LockLike] = {}

    async def acquire(self, name: str) -> None:
        handle = self._handles.get(name)
        if handle is None:
            rw = self._make(name)
            handle = self._handles[name] = rw.write_lock() if self._writer else rw.read_lock()
        await handle.lock()

    async def release(self, name: str) -> None:
        await self._handles[name].unlock()


class AiolockRWMixed(_AiolockAdapter):
    """Case 4: the last worker writes, all others read the same read-write lock."""

    key = "aiolock-rw-mixed"
    label = "aiolock RWLock 8 readers + 1 writer"
    factory = "read_write_lock"
    cases = frozenset({"rw"})

    async def worker(self, index: int, total: int) -> AsyncWorker:
        make: Callable[[str], Any] = getattr(self.client, self.factory)
        return _RWWorker(f"{self.tag}:warm:{index}", make, writer=index == total - 1)


# --------------------------------------------------------------------------- redis-py


class _RedisPyWorker(AsyncWorker):
    def __init__(self, warm_name: str, client: redis.asyncio.Redis, sleep: float) -> None:
        super().__init__(warm_name)
        self._client = client
        self._sleep = sleep
        self._locks: dict[str, Any] = {}

    async def acquire(self, name: str) -> None:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = self._client.lock(
                name, timeout=LEASE_S, sleep=self._sleep, blocking_timeout=None
            )
        if not await lock.acquire():
            raise RuntimeError("redis-py Lock.acquire returned False without a timeout")

    async def release(self, name: str) -> None:
        await self._locks[name].release()


class RedisPy(AsyncAdapter):
    key = "redis-py"
    label = "redis-py asyncio Lock (sleep=0.1)"
    note = "polls with SET NX every `sleep` s (library default 0.1)"
    sleep: ClassVar[float] = 0.1

    async def setup(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.url)

    async def worker(self, index: int, total: int) -> AsyncWorker:
        return _RedisPyWorker(f"{self.tag}:warm:{index}", self.client, self.sleep)

    async def teardown(self) -> None:
        await self.client.aclose()


class RedisPyTuned(RedisPy):
    key = "redis-py-tuned"
    label = "redis-py asyncio Lock (sleep=0.001)"
    note = "polls with SET NX every 1 ms"
    sleep = 0.001


# --------------------------------------------------------------------------- pottery


class _PotteryWorker(AsyncWorker):
    def __init__(self, warm_name: str, cls: Any, master: redis.asyncio.Redis) -> None:
        super().__init__(warm_name)
        self._cls = cls
        self._master = master
        self._locks: dict[str, Any] = {}

    async def acquire(self, name: str) -> None:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = self._cls(
                key=name, masters={self._master}, auto_release_time=LEASE_S
            )
        if not await lock.acquire():
            raise RuntimeError("pottery AIORedlock.acquire returned False")

    async def release(self, name: str) -> None:
        await self._locks[name].release()


class Pottery(AsyncAdapter):
    key = "pottery"
    label = "pottery AIORedlock (1 master)"
    note = "retries after a random 0-0.2 s sleep"

    @classmethod
    def check(cls) -> str | None:
        return _import_reason("pottery")

    async def setup(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.url)
        self._cls = importlib.import_module("pottery").AIORedlock

    async def worker(self, index: int, total: int) -> AsyncWorker:
        return _PotteryWorker(f"{self.tag}:warm:{index}", self._cls, self.client)

    async def teardown(self) -> None:
        await self.client.aclose()


# --------------------------------------------------------------------------- aioredlock


class _AioredlockWorker(AsyncWorker):
    def __init__(self, warm_name: str, adapter: Aioredlock) -> None:
        super().__init__(warm_name)
        self._adapter = adapter
        self._held: dict[str, Any] = {}

    async def acquire(self, name: str) -> None:
        adapter = self._adapter
        # aioredlock gives up (LockError) after retry_count=3 tries, ~0.1-0.6 s: a user who
        # needs the lock calls again, so do that and count every give-up.
        while True:
            try:
                self._held[name] = await adapter.manager.lock(name, lock_timeout=LEASE_S)
            except adapter.lock_error:
                adapter.extra["give_ups"] = adapter.extra.get("give_ups", 0) + 1
            else:
                return

    async def release(self, name: str) -> None:
        await self._adapter.manager.unlock(self._held.pop(name))


class Aioredlock(AsyncAdapter):
    key = "aioredlock"
    label = "aioredlock (1 instance)"
    note = "3 tries 0.1-0.3 s apart, then LockError (a give-up; the worker calls again)"

    @classmethod
    def check(cls) -> str | None:
        return _import_reason("aioredlock")

    async def setup(self) -> None:
        module: Any = importlib.import_module("aioredlock")
        RoundTrips.install_aioredis()
        self.lock_error: type[Exception] = module.LockError
        self.manager: Any = module.Aioredlock([self.url])
        self.extra["give_ups"] = 0

    async def worker(self, index: int, total: int) -> AsyncWorker:
        return _AioredlockWorker(f"{self.tag}:warm:{index}", self)

    async def teardown(self) -> None:
        await self.manager.destroy()


# --------------------------------------------------------------------------- python-redis-lock


class _RedisLockWorker(SyncWorker):
    def __init__(self, warm_name: str, cls: Any, client: redis.Redis) -> None:
        super().__init__(warm_name)
        self._cls = cls
        self._client = client
        self._locks: dict[str, Any] = {}

    def acquire(self, name: str) -> None:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = self._cls(self._client, name, expire=LEASE_S)
        if not lock.acquire(blocking=True):
            raise RuntimeError("redis_lock.Lock.acquire returned False")

    def release(self, name: str) -> None:
        self._locks[name].release()


class PythonRedisLock(SyncAdapter):
    key = "python-redis-lock"
    label = "python-redis-lock (sync, 1 thread/task)"
    note = "sync only: one thread per task; waits on BLPOP of a signal list"

    @classmethod
    def check(cls) -> str | None:
        return _import_reason("redis_lock")

    def setup(self) -> None:
        self.client = redis.Redis.from_url(self.url)
        self._cls = importlib.import_module("redis_lock").Lock

    def worker(self, index: int, total: int) -> SyncWorker:
        return _RedisLockWorker(f"{self.tag}:warm:{index}", self._cls, self.client)

    def teardown(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- sync peers


class _SyncHandleWorker(SyncWorker):
    """One handle per name, made by ``make``; ``acquire``/``release`` in the calling thread."""

    def __init__(
        self,
        warm_name: str,
        make: Callable[[str], Any],
        acquire: Callable[[Any], object],
        release: Callable[[Any], object],
    ) -> None:
        super().__init__(warm_name)
        self._make = make
        self._acquire = acquire
        self._release = release
        self._handles: dict[str, Any] = {}

    def acquire(self, name: str) -> None:
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = self._make(name)
        if self._acquire(handle) is False:
            raise RuntimeError(f"{type(handle).__name__}: acquire returned False without a timeout")

    def release(self, name: str) -> None:
        self._release(self._handles[name])


class AiolockSync(SyncAdapter):
    key = "aiolock-sync"
    label = "aiolock.sync Lock (1 thread/task)"
    note = "the async client run in one loop thread per process; holders are the threads"

    @classmethod
    def check(cls) -> str | None:
        return _import_reason("aiolock.sync")

    def setup(self) -> None:
        self.client: Any = importlib.import_module("aiolock.sync").Client.from_url(self.url)

    def worker(self, index: int, total: int) -> SyncWorker:
        # One handle per thread and name, as a view function would make it.
        return _SyncHandleWorker(
            f"{self.tag}:warm:{index}",
            self.client.lock,
            lambda handle: handle.lock(),
            lambda handle: handle.unlock(),
        )

    def teardown(self) -> None:
        self.client.close()


class RedisPySync(SyncAdapter):
    key = "redis-py-sync"
    label = "redis-py Lock (sync, sleep=0.1, 1 thread/task)"
    note = "polls with SET NX every `sleep` s (library default 0.1)"

    def setup(self) -> None:
        self.client = redis.Redis.from_url(self.url)

    def worker(self, index: int, total: int) -> SyncWorker:
        return _SyncHandleWorker(
            f"{self.tag}:warm:{index}",
            lambda name: self.client.lock(name, timeout=LEASE_S, blocking_timeout=None),
            lambda lock: lock.acquire(),
            lambda lock: lock.release(),
        )

    def teardown(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- baselines

_SET_SCRIPT = "redis.call('set', KEYS[1], ARGV[1], 'px', 30000) return 1"
_DEL_SCRIPT = "redis.call('del', KEYS[1]) return 1"
_DEL_PUBLISH_SCRIPT = "redis.call('del', KEYS[1]) redis.call('publish', ARGV[1], ARGV[2]) return 1"


class _FloorWorker(AsyncWorker):
    def __init__(self, warm_name: str, adapter: Floor, token: str) -> None:
        super().__init__(warm_name)
        self._a = adapter
        self._token = token

    async def acquire(self, name: str) -> None:
        await self._a.set_script(keys=[name], args=[self._token])

    async def release(self, name: str) -> None:
        await self._a.del_script(keys=[name])


class Floor(AsyncAdapter):
    key = "floor-2xevalsha"
    label = "baseline: 2x EVALSHA (not a lock)"
    note = "SET then DEL, each one EVALSHA round trip: the floor for one pair"
    cases = frozenset({"uncontended"})

    async def setup(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.url)
        self.set_script = self.client.register_script(_SET_SCRIPT)
        self.del_script = self.client.register_script(_DEL_SCRIPT)

    async def worker(self, index: int, total: int) -> AsyncWorker:
        return _FloorWorker(f"{self.tag}:warm:{index}", self, f"w{index}")

    async def teardown(self) -> None:
        await self.client.aclose()


class FloorCluster(Floor):
    key = "floor-cluster"
    label = "baseline: 2x EVALSHA via RedisCluster (not a lock)"
    note = "the floor through redis-py's cluster client, which routes each call by its key"
    topology: ClassVar[str] = "cluster"

    async def setup(self) -> None:
        self.client = redis.asyncio.RedisCluster.from_url(self.url)  # type: ignore[assignment]
        self.set_script = self.client.register_script(_SET_SCRIPT)
        self.del_script = self.client.register_script(_DEL_SCRIPT)


class _RingWorker(AsyncWorker):
    def __init__(self, adapter: TokenRing, index: int, total: int) -> None:
        super().__init__(f"{adapter.tag}:warm:{index}")
        self._a = adapter
        self._token = f"w{index}"
        self._next = adapter.channel((index + 1) % total)
        self.inbox: asyncio.Queue[None] = asyncio.Queue()
        if index == 0:
            self.inbox.put_nowait(None)  # worker 0 starts with the token

    async def acquire(self, name: str) -> None:
        await self.inbox.get()
        await self._a.set_script(keys=[name], args=[self._token])

    async def release(self, name: str) -> None:
        await self._a.del_publish(keys=[name], args=[self._next, "1"])

    async def warm(self) -> None:
        await self._a.set_script(keys=[self.warm_name], args=[self._token])
        await self._a.del_publish(keys=[self.warm_name], args=[f"{self._a.tag}:void", "1"])


class TokenRing(AsyncAdapter):
    key = "ring"
    label = "baseline: pub/sub token ring (not a lock)"
    note = "hop = EVALSHA SET + EVALSHA DEL+PUBLISH to the next task: the handoff floor"
    cases = frozenset({"contended", "handoff", "multiproc"})

    def channel(self, index: int) -> str:
        return f"{self.tag}:ring:{index}"

    async def setup(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.url)
        self.set_script = self.client.register_script(_SET_SCRIPT)
        self.del_publish = self.client.register_script(_DEL_PUBLISH_SCRIPT)
        self.pubsub: Any = self.client.pubsub()  # PubSub.aclose is untyped upstream
        self._inboxes: dict[bytes, asyncio.Queue[None]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def worker(self, index: int, total: int) -> AsyncWorker:
        worker = _RingWorker(self, index, total)
        channel = self.channel(index)
        self._inboxes[channel.encode()] = worker.inbox
        await self.pubsub.subscribe(channel)
        return worker

    async def ready(self) -> None:
        # Read the subscribe confirmations so every channel is live before the start.
        for _ in range(len(self._inboxes)):
            await self.pubsub.get_message(timeout=5.0)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            if message is not None and message["type"] == "message":
                self._inboxes[message["channel"]].put_nowait(None)

    async def teardown(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self.pubsub.aclose()
        await self.client.aclose()


# --------------------------------------------------------------------------- Redisson: Java


class Redisson(_Adapter):
    """Redisson's RLock, in JVMs of interop/redisson's Bench (benchmarks/_redisson.py)."""

    key = "redisson"
    label = "Redisson RLock (Java)"
    mode = "thread"
    cases = frozenset({"uncontended", "contended", "multiproc"})
    variants = _redisson.VARIANTS
    runner = "jvm"
    note = "Java: one JVM per process, threads; JIT warmed up before the window"

    @classmethod
    def check(cls) -> str | None:
        return _redisson.reason()


ADAPTERS: dict[str, type[AsyncAdapter] | type[SyncAdapter] | type[Redisson]] = {
    cls.key: cls
    for cls in (
        AiolockLock,
        AiolockBaseline,
        AiolockFair,
        AiolockRead,
        AiolockWrite,
        AiolockRWMixed,
        RedisPy,
        RedisPyTuned,
        Pottery,
        Aioredlock,
        PythonRedisLock,
        AiolockSync,
        RedisPySync,
        Floor,
        TokenRing,
        AiolockCluster,
        FloorCluster,
        Redisson,
    )
}


def availability(key: str) -> str | None:
    """``None`` if the implementation can run here, else its "cannot run"/"n/a" text."""
    return ADAPTERS[key].check()
