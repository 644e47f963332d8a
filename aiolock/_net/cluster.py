"""Redis Cluster: the slot map, and a command and a pub/sub connection per primary.

Every key of one aiolock object hashes to one slot (Redisson's names put the object name in
a ``{hash tag}``), so each script runs whole on the primary of that slot. The map is read
with ``CLUSTER SLOTS`` when first needed and again whenever a node redirects a call, fails
to answer, or drops a subscription:

- **MOVED** updates the slot at once (and re-reads the map soon); **ASK** sends that one
  call to the importing node behind ``ASKING``; TRYAGAIN and CLUSTERDOWN are resent after
  the retry interval. Every script is idempotent, so a resend to the new owner is harmless.
- **Waiting** uses sharded pub/sub: the scripts publish with SPUBLISH, and each primary
  has one dispatcher (``pubsub.py``; ``cluster_pubsub.py`` picks it per channel) that
  SSUBSCRIBEs the channels of its slots, as Redisson does where the servers support it
  (probed with ``PUBSUB SHARDNUMSUB``). A server that loses a slot pushes ``sunsubscribe``
  for its channels: the dispatcher lets them go and wakes their waiters, the map is read
  again, and each waiter subscribes where the slot is served now.
- A node that is no longer a primary is retired: its calls fail over to the new owner and
  its channels move.
- **Polling**: none of the above happens when the client has no traffic to a node that
  stopped answering (frozen, partitioned): its replica is promoted, and the client's
  waiters stay subscribed where no release will ever be published. So, as Redisson scans
  every second, the map is also read once a second from ONE node (``CLUSTER INFO`` and
  ``CLUSTER SLOTS`` in one write, bounded by 0.5 s, then the next node is asked); a map
  that differs is taken, unless that node's current epoch is older than one already seen
  (a node that has not heard of a failover yet). Channels of slots that changed owner move
  there and their waiters re-check. Waiters so follow a failover within ~1-2 s of the map
  change, and the cost is one small read per second per client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    MovedError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .._exceptions import ClientClosedError
from .acked import AckedTransport
from .resp import pack
from .transport import CommandTransport

if TYPE_CHECKING:
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.connection import AbstractConnection
    from redis.exceptions import AskError

    from .._emitter import Emitter
    from .pubsub import Dispatcher

__all__ = (
    "Cluster",
    "ShardedPubSubUnsupportedError",
    "node_connector",
    "seeds_of",
)

log = logging.getLogger("aiolock")

_SLOTS = 16384
_CLUSTER_SLOTS = pack("CLUSTER", "SLOTS")
_CLUSTER_INFO = pack("CLUSTER", "INFO")
# How often the map is read without a reason (Redisson's scanInterval), and how long one
# node may take to answer before the next is asked (see the module's docstring).
POLL_INTERVAL = 1.0
QUERY_TIMEOUT = 0.5
_PROBE = pack("PUBSUB", "SHARDNUMSUB")
# Slots of keys seen, cached: CRC16 per call would cost more than the map lookup.
_SLOT_CACHE = 65536
# How long a map read waits for an answer that agrees with a MOVED once an older one came.
_AGREEING_ANSWER_GRACE = 1.0

Address = tuple[str, int]
Connector = Callable[[str, int], Callable[[], "AbstractConnection"]]
MakeDispatcher = Callable[[Callable[[], "AbstractConnection"], Callable[[], None]], "Dispatcher"]


class ShardedPubSubUnsupportedError(ResponseError):
    """The cluster's servers have no sharded pub/sub (Redis before 7.0)."""


def node_connector(redis: RedisCluster) -> Connector:
    """How to open a connection to any node, with the settings of ``redis``'s nodes.

    The connection class and keyword arguments of a startup node (TLS, password or
    credential provider, RESP version, client name), for another host and port.
    """
    seed = next(iter(redis.nodes_manager.startup_nodes.values()))
    connection_class = seed.connection_class
    settings = dict(seed.connection_kwargs)
    # The cluster client's READONLY hook is for reads from replicas; aiolock talks to
    # primaries only.
    settings.pop("redis_connect_func", None)

    def connector(host: str, port: int) -> Callable[[], AbstractConnection]:
        def make() -> AbstractConnection:
            return connection_class(**{**settings, "host": host, "port": port})

        return make

    return connector


def seeds_of(redis: RedisCluster) -> list[Address]:
    """The startup nodes ``redis`` was given."""
    return [(node.host, int(node.port)) for node in redis.nodes_manager.startup_nodes.values()]


class _Node:
    __slots__ = ("address", "dispatcher", "transport")

    def __init__(self, address: Address, transport: CommandTransport) -> None:
        self.address = address
        self.transport = transport
        self.dispatcher: Dispatcher | None = None


class Cluster:
    """The slot map of one cluster and a connection per primary: a ``Topology``."""

    transient: tuple[type[Exception], ...] = (TryAgainError, ClusterDownError, MasterDownError)

    def __init__(
        self,
        seeds: list[Address],
        connector: Connector,
        *,
        deadline: float,
        make_dispatcher: MakeDispatcher,
        poll_interval: float = POLL_INTERVAL,
        query_timeout: float = QUERY_TIMEOUT,
        events: Emitter | None = None,
    ) -> None:
        # Handed to each node's command connection (its reconnections are events).
        self._events = events
        self._poll_interval = poll_interval
        self._query_timeout = query_timeout
        self._poller: asyncio.Task[None] | None = None
        # The node polled first: the last one that answered.
        self._poll_from: Address | None = None
        # The highest cluster_current_epoch a polled node reported.
        self._epoch = 0
        # The last map taken, as (first, last, host, port) ranges; None once a MOVED
        # patched a slot (the next poll then takes the node's map, whatever it is).
        self._layout: tuple[tuple[int, int, str, int], ...] | None = None
        #: Maps taken by polling that differed from the one held (tests read it).
        self.polled_changes = 0
        self._seeds = seeds
        self._connector = connector
        self._deadline = deadline
        self._make_dispatcher = make_dispatcher
        self._slots: list[_Node | None] = [None] * _SLOTS
        self._nodes: dict[Address, _Node] = {}
        self._slot_of: dict[str, int] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._probed = False
        # The latest MOVED not yet checked against a map read: (slot, its new owner).
        self._moved: tuple[int, Address] | None = None
        self.closed = False
        #: How many times the map was read (tests and the benchmark read it).
        self.refreshes = 0

    # -- the Topology the script runner routes by ------------------------------------------

    def shard(self, key: str) -> int:
        slot = self._slot_of.get(key)
        if slot is None:
            if len(self._slot_of) >= _SLOT_CACHE:
                self._slot_of.clear()
            slot = self._slot_of[key] = key_slot(key.encode())
        return slot

    def route(self, key: str) -> CommandTransport | None:
        node = self._slots[self.shard(key)]
        return None if node is None else node.transport

    async def locate(self, key: str) -> CommandTransport:
        await self.refresh()
        node = self._slots[self.shard(key)]
        if node is None:
            raise ClusterDownError(
                f"aiolock: no primary serves slot {self.shard(key)} (of key {key!r})"
            )
        return node.transport

    def redirected(self, exc: MovedError | AskError) -> CommandTransport:
        node = self._node((exc.host, int(exc.port)))
        if isinstance(exc, MovedError):
            # The slot lives there for good: every later call goes there at once.
            self._slots[exc.slot_id] = node
            self._layout = None
            self._moved = (exc.slot_id, node.address)
            self.refresh_soon()
        return node.transport

    def failed(self, transport: CommandTransport, exc: Exception) -> None:
        # A node lost, or a cluster reconfiguring: the map may have changed.
        self.refresh_soon()

    async def settle(self) -> None:
        # A call redirected again and again: the nodes disagree on the slot's owner while
        # a failover or migration spreads. Resending at once would only bounce; a map read
        # paces the resends by the cluster's own convergence (it waits for an answer that
        # agrees with the latest MOVED, see _agreed).
        await self.refresh()

    def transports(self) -> list[CommandTransport]:
        return [node.transport for node in self._nodes.values()]

    # -- pub/sub: one dispatcher per primary -------------------------------------------------

    def dispatcher_for(self, channel: str) -> Dispatcher | None:
        """The dispatcher of the primary serving ``channel``'s slot (None: not known yet)."""
        node = self._slots[self.shard(channel)]
        if node is None:
            return None
        if node.dispatcher is None:
            node.dispatcher = self._make_dispatcher(
                self._connector(*node.address), self.refresh_soon
            )
        return node.dispatcher

    def dispatchers(self) -> list[Dispatcher]:
        return [node.dispatcher for node in self._nodes.values() if node.dispatcher is not None]

    # -- the map ---------------------------------------------------------------------------

    def _node(self, address: Address) -> _Node:
        node = self._nodes.get(address)
        if node is None:
            transport = AckedTransport(
                self._connector(*address), deadline=self._deadline, events=self._events
            )
            node = self._nodes[address] = _Node(address, transport)
        return node

    async def refresh(self) -> None:
        """Read the slot map now (one read at a time; callers share it)."""
        if self.closed:
            return
        task = self._refreshing
        if task is None:
            task = self._refreshing = asyncio.get_running_loop().create_task(self._read_map())
            task.add_done_callback(self._refreshed)
        # One caller's cancel must not cancel the read every caller shares.
        await asyncio.shield(task)

    def refresh_soon(self) -> None:
        """Read the slot map in the background, unless a read is under way."""
        if self._refreshing is None and not self.closed:
            task = self._refreshing = asyncio.get_running_loop().create_task(self._read_map())
            task.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Task[None]) -> None:
        self._refreshing = None
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("aiolock: reading the cluster's slot map failed: %r", exc)
        if self._moved is not None:
            # A MOVED came while that read was under way: its answers may be older than
            # the MOVED, so check it with a read of its own.
            self.refresh_soon()

    async def _read_map(self) -> None:
        # Ask every primary known (the seeds at first) at once; the first answer wins. A
        # node that is down or stopped then costs nothing while another answers.
        moved, self._moved = self._moved, None
        addresses = list(self._nodes) or list(self._seeds)
        for address in [*self._seeds, *([moved[1]] if moved else [])]:
            if address not in addresses:
                addresses.append(address)
        asks = {asyncio.ensure_future(self._ask(address)): address for address in addresses}
        try:
            self._apply(*await _agreed(asks, moved))
        finally:
            for ask in asks:
                if not ask.done():
                    ask.cancel()
                elif not ask.cancelled():
                    ask.exception()  # retrieved: an answer came first

    async def _ask(self, address: Address) -> Any:
        transport = self._node(address).transport
        reply = await transport.call(_CLUSTER_SLOTS)
        if not self._probed:
            # As Redisson: sharded pub/sub where PUBSUB SHARDNUMSUB is known (Redis 7+).
            try:
                await transport.call(_PROBE)
            except ResponseError as exc:
                raise ShardedPubSubUnsupportedError(
                    "aiolock needs sharded pub/sub (Redis 7.0+, Valkey 7.2+) on a cluster: "
                    f"the server answered PUBSUB SHARDNUMSUB with {exc}"
                ) from exc
            self._probed = True
        return reply

    def _apply(self, reply: Any, asked: Address) -> None:
        """Take the slot map ``reply`` (CLUSTER SLOTS from ``asked``) as the truth."""
        self.refreshes += 1
        slots: list[_Node | None] = [None] * _SLOTS
        primaries: set[Address] = set()
        layout = _layout(reply, asked)
        for start, end, host, port in layout:
            address = (host, port)
            primaries.add(address)
            node = self._node(address)
            slots[start : end + 1] = [node] * (end - start + 1)
        later = self._moved
        if later is not None and not _serves(reply, *later, asked):
            # A MOVED came while this read was under way, and this answer does not know it
            # yet: a node's own redirect is newer news than another node's map. Taken
            # whole, the answer would send the slot's calls back to the old owner and drop
            # the connection to the new one, and each call would bounce between the two
            # until the next read; the slot stays where the MOVED sent it, and the read
            # that follows this one (see _refreshed) checks it.
            slot, address = later
            slots[slot] = self._node(address)
            primaries.add(address)
            self._layout = None
        else:
            self._layout = layout
        self._slots = slots
        for address in [address for address in self._nodes if address not in primaries]:
            self._retire(self._nodes.pop(address))
        for node in self._nodes.values():
            if node.dispatcher is not None:
                # Channels of slots that changed owner: their old owner may never say so
                # (frozen, or it pushed sunsubscribe while unreachable). Their waiters wake
                # and re-check, and subscribe where the slot is now.
                node.dispatcher.let_go(self._elsewhere(slots, node))
        if self._poller is None and not self.closed:
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    def _elsewhere(self, slots: list[_Node | None], node: _Node) -> Callable[[str], bool]:
        def elsewhere(channel: str) -> bool:
            return slots[self.shard(channel)] is not node

        return elsewhere

    # -- polling: the map read without a reason ------------------------------------------------

    async def _poll(self) -> None:
        while not self.closed:
            await asyncio.sleep(self._poll_interval)
            if self._refreshing is not None or self._moved is not None:
                continue  # a read is under way, or due: it is the news
            with contextlib.suppress(RedisError, OSError, ClientClosedError):
                await self.poll_once()

    async def poll_once(self) -> bool:
        """Read the map from one node (the next if it does not answer in time).

        It is taken if it differs and is not older than one seen; returns whether it was.
        """
        candidates = list(self._nodes) or list(self._seeds)
        first = self._poll_from
        if first in candidates:
            candidates.remove(first)
            candidates.insert(0, first)
        for address in candidates:
            node = self._nodes.get(address)
            transport = node.transport if node is not None else self._node(address).transport
            try:
                async with asyncio.timeout(self._query_timeout):
                    info, reply = await transport.call_many([_CLUSTER_INFO, _CLUSTER_SLOTS])
            except (RedisError, OSError, TimeoutError, ClientClosedError) as exc:
                log.debug("aiolock: polling the slot map of %s failed: %r", _name(address), exc)
                continue
            if isinstance(info, Exception) or isinstance(reply, Exception):
                continue
            if self.closed or self._refreshing is not None or self._moved is not None:
                return False
            self._poll_from = address
            epoch = _current_epoch(info)
            if epoch < self._epoch:
                # This node has not heard of a change the cluster made (a failover it
                # missed while frozen): its map is older than one already taken.
                return False
            self._epoch = epoch
            if _layout(reply, address) == self._layout:
                return False
            self.polled_changes += 1
            log.info("aiolock: the cluster's slot map changed (read from %s)", _name(address))
            self._apply(reply, address)
            return True
        return False

    def _retire(self, node: _Node) -> None:
        """``node`` serves no slot now: its calls and its channels go elsewhere."""
        why = f"aiolock: {_name(node.address)} no longer serves a slot of the cluster"
        task = asyncio.get_running_loop().create_task(_retire(node, why))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def aclose(self) -> None:
        """Close every connection (the client closes the dispatchers first)."""
        self.closed = True
        for task in (self._refreshing, self._poller):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.transport.aclose()


async def _retire(node: _Node, why: str) -> None:
    if node.dispatcher is not None:
        await node.dispatcher.retire()
    await node.transport.aclose(why)


async def _agreed(
    asks: dict[asyncio.Task[Any], Address], moved: tuple[int, Address] | None
) -> tuple[Any, Address]:
    """The first CLUSTER SLOTS answer of ``asks`` that agrees with ``moved``, and who gave it.

    In a failover the nodes learn the new owner of a slot one after another, so the first
    answer may be older than the MOVED that asked for this read. Taken, it would send calls
    back to the old owner and drop the connection to the new one: it is the answer only if
    none agreeing with the MOVED comes soon after.
    """
    errors: list[str] = []
    older: tuple[Any, Address] | None = None
    pending = set(asks)
    while pending:
        done, pending = await asyncio.wait(
            pending,
            timeout=None if older is None else _AGREEING_ANSWER_GRACE,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not done:
            break
        for ask in done:
            exc = ask.exception()
            if isinstance(exc, ShardedPubSubUnsupportedError):
                raise exc
            if exc is not None:
                errors.append(f"{_name(asks[ask])}: {exc}")
            elif moved is None or _serves(ask.result(), *moved, asks[ask]):
                return ask.result(), asks[ask]
            elif older is None:
                older = (ask.result(), asks[ask])
    if older is not None:
        return older
    raise RedisConnectionError(
        "aiolock: no cluster node answered CLUSTER SLOTS (" + "; ".join(errors) + ")"
    )


def _layout(reply: Any, asked: Address) -> tuple[tuple[int, int, str, int], ...]:
    """A CLUSTER SLOTS reply (from ``asked``) as sorted (first, last, host, port) ranges."""
    ranges = []
    for entry in reply:
        primary = entry[2]
        host = _text(primary[0]) or asked[0]
        ranges.append((int(entry[0]), int(entry[1]), host, int(primary[1])))
    return tuple(sorted(ranges))


def _current_epoch(info: Any) -> int:
    """``cluster_current_epoch`` of a CLUSTER INFO reply (0 if absent)."""
    for line in _text(info).splitlines():
        if line.startswith("cluster_current_epoch:"):
            return int(line.split(":", 1)[1])
    return 0


def _serves(reply: Any, slot: int, address: Address, asked: Address) -> bool:
    """Whether the CLUSTER SLOTS ``reply`` (from ``asked``) gives ``slot`` to ``address``."""
    for entry in reply:
        if int(entry[0]) <= slot <= int(entry[1]):
            primary = entry[2]
            return (_text(primary[0]) or asked[0], int(primary[1])) == address
    return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _name(address: Address) -> str:
    return f"{address[0]}:{address[1]}"
