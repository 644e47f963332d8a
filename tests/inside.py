"""The tests' one way into aiolock's private attributes.

Some tests must look inside: how many holds the renewal service renews, who waits in the
waiting room, what the dispatcher is subscribed to. This is the only test module that
reads an aiolock object's private attributes (tests/test_layout.py checks it), so when
an internal piece moves or is renamed, this file is the one the tests need changed.
Each function is named for what a test wants to know or do, not for the attribute.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiolock._net import resp
from aiolock._net import wire as wires
from aiolock._net.pubsub import Dispatcher

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.connection import AbstractConnection

    import aiolock
    import aiolock.sync
    from aiolock._config import ClientOptions, Settings
    from aiolock._engine.background import Background, LatchSweeper
    from aiolock._engine.engine import Engine
    from aiolock._engine.guard import Guard, Guarded, Guarding
    from aiolock._engine.holds import HoldRegistry
    from aiolock._engine.ordering import CallOrder
    from aiolock._engine.primitive import Primitive
    from aiolock._engine.renewal import RenewalService
    from aiolock._engine.waiting import WaitingRoom
    from aiolock._net.cluster import Cluster, _Node
    from aiolock._net.scripts import ScriptRunner
    from aiolock._net.sentinel import SentinelWatch
    from aiolock._net.subscriptions import Channel, PubSub
    from aiolock._net.topology import OneServer
    from aiolock._net.transport import CommandTransport
    from aiolock._net.wire import Wire
    from aiolock._objects.count_down_latch import CountDownLatch
    from aiolock._objects.handle import LockHandle
    from aiolock._objects.multilock import Composite
    from aiolock._objects.semaphore import Permits
    from aiolock.sync._runtime import Runtime


# -- the client's pieces -----------------------------------------------------------------


def engine(obj: aiolock.Client | LockHandle | Permits | CountDownLatch) -> Engine:
    """The engine a client or a handle calls through."""
    return obj._engine


def renewal(client: aiolock.Client) -> RenewalService:
    """The client's renewal service (the watchdog)."""
    return client._services.renewal


def runner(client: aiolock.Client) -> ScriptRunner:
    """The client's script runner: run a Lua script as aiolock sends it."""
    return client._services.runner


def waiting_room(client: aiolock.Client) -> WaitingRoom:
    """The client's waiting room: who waits on which channel."""
    return client._services.waiting


def holds(client: aiolock.Client) -> HoldRegistry:
    """The client's registry of the holds it believes in."""
    return client._services.holds


def dispatcher(client: aiolock.Client) -> Dispatcher:
    """The client's pub/sub dispatcher (one server)."""
    dispatcher = client._services.dispatcher
    assert dispatcher is not None, "a cluster client has one per primary"
    return dispatcher


def background(client: aiolock.Client) -> Background:
    """The client's background tasks."""
    return client._services.background


def transport(client: aiolock.Client) -> CommandTransport:
    """The client's command connection (one server)."""
    transport = client._services.transport
    assert transport is not None, "a cluster client has one per primary"
    return transport


def settings(client: aiolock.Client) -> Settings:
    """The settings the client's engine works with (lease, latch TTL, ...)."""
    return client._settings


def options(client: aiolock.Client) -> ClientOptions:
    """The client's options, validated."""
    return client._options


def latches(client: aiolock.Client) -> LatchSweeper:
    """The client's sweeper of released count-down latches."""
    return client._services.latches


def ordering(client: aiolock.Client) -> CallOrder:
    """The client's per-name call ordering (calls still to land)."""
    return client._services.order


def pubsub(client: aiolock.Client) -> PubSub:
    """The client's subscriptions, whatever the topology."""
    return client._services.pubsub


def topology(client: aiolock.Client) -> OneServer | Cluster:
    """The client's topology: one server or a cluster."""
    return client._services.topology


def sentinel(client: aiolock.Client) -> SentinelWatch:
    """The client's Sentinel watch (the client must be made for a Sentinel primary)."""
    watch = client._services.sentinel
    assert watch is not None, "the client has no Sentinel watch"
    return watch


def redis_of(client: aiolock.Client) -> Redis | RedisCluster:
    """The redis-py client the aiolock client was made from."""
    return client._redis


def connected_to(client: aiolock.Client) -> list[str]:
    """Where the client's open connections go ("host:port")."""
    return client._connected_to()


def runtime(client: aiolock.sync.Client) -> Runtime:
    """The sync client's runtime (its event loop thread and async client)."""
    return client._rt


# -- inside the pieces -------------------------------------------------------------------


def task_of(service: RenewalService | LatchSweeper) -> asyncio.Task[None] | None:
    """The service's own lasting background task, if running."""
    return service._task


def replace_renewal_runner(client: aiolock.Client, runner: Any) -> None:
    """Give the renewal service ``runner`` (duck-typed as a ScriptRunner) to renew with."""
    client._services.renewal._runner = runner


def tasks_holding(registry: HoldRegistry) -> dict[weakref.ref[asyncio.Task[Any]], set[Any]]:
    """The registry's holds by the task that holds them."""
    return registry._by_task


def armed_at(guard: Guard) -> float:
    """When the guard's timer fires next (inf: not armed)."""
    return guard._armed


def hold_of(guarded: Guarded) -> Guarding | None:
    """The guard's side of a guarded block's hold, once acquired."""
    return guarded._hold


def slots_of(cluster: Cluster) -> list[_Node | None]:
    """The cluster's slot table: the node that serves each slot."""
    return cluster._slots


def channels_of(dispatcher: Dispatcher) -> dict[str, Channel]:
    """The dispatcher's channels by name."""
    return dispatcher._channels


def reader_of(dispatcher: Dispatcher) -> asyncio.Task[None] | None:
    """The dispatcher's reader task, if running."""
    return dispatcher._reader


def sent_of(dispatcher: Dispatcher) -> dict[str, deque[bool]]:
    """The (UN)SUBSCRIBEs the dispatcher sent and awaits replies to, by channel."""
    return dispatcher._sent


def unconnected_dispatcher(room: WaitingRoom, channels: Sequence[Channel]) -> Dispatcher:
    """A dispatcher with no connection, subscribed to ``channels``, delivering to ``room``."""
    made = Dispatcher.__new__(Dispatcher)
    made.closed = False
    made._room = room
    made._channels = {channel.name: channel for channel in channels}
    made._sent = {}
    return made


def deliver(dispatcher: Dispatcher, reply: Any) -> None:
    """Hand the dispatcher one pub/sub reply, as its reader does."""
    dispatcher._on_reply(reply)


def wire_of(transport: CommandTransport) -> Wire | None:
    """The transport's current connection, if any."""
    return transport._wire


def connection_of(wire: Wire) -> AbstractConnection:
    """The redis-py connection under one of aiolock's wires."""
    return wire._conn


async def ready_wire(transport: CommandTransport, size: int) -> Wire:
    """A connection with room for ``size`` more commands, as the transport waits for it."""
    return await transport._ready(size)


def put(transport: CommandTransport, wire: Wire, data: bytes, sink: Any) -> None:
    """Write ``data`` on ``wire``, its reply going to ``sink``, as the transport does."""
    transport._put(wire, data, sink)


def wrap_put(transport: CommandTransport, around: Callable[..., None]) -> Callable[..., None]:
    """Make ``around`` the transport's writer; returns the writer it replaces."""
    original: Callable[..., None] = transport._put
    transport._put = around  # type: ignore[method-assign]
    return original


# -- handles -----------------------------------------------------------------------------


def key_of(handle: LockHandle) -> str:
    """The key the handle's lock lives at (with the key prefix)."""
    return handle._key


def primitive_of(handle: LockHandle) -> Primitive:
    """The handle's primitive: its lock kind's scripts, keys and channel."""
    return handle._primitive


def owner_of(handle: LockHandle) -> str | None:
    """The owner the handle was made with (None: the calling task)."""
    return handle._owner


def members_of(composite: Composite) -> list[LockHandle]:
    """A MultiLock's or RedLock's member locks, in the order it takes them."""
    return composite._members


def open_wires() -> list[Wire]:
    """Every aiolock connection still open in this process."""
    return list(wires._open_wires)


# -- the EVALSHA packer ------------------------------------------------------------------


def pack_command(parts: tuple[str | int | bytes, ...]) -> bytes:
    """The bytes hiredis packs for one command: what aiolock's own packer must match."""
    return resp._pack_command(parts)


def packed_arguments_cached() -> int:
    """How many packed arguments the EVALSHA packer keeps now."""
    return len(resp._bulks)


def packed_arguments_limit() -> int:
    """How many packed arguments the EVALSHA packer keeps at most before it clears them."""
    return resp._BULKS_LIMIT
