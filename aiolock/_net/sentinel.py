"""Sentinel: follow the group's primary when the sentinels switch it.

A connection opened through a Sentinel pool asks the sentinels for the primary when it
connects, and then stays where it is. After a failover the old primary keeps accepting
writes for seconds, until the sentinels demote it: a client still talking to it and a
client already on the new primary could then both hold one lock. So, as Redisson does, the
client listens to every sentinel's events and moves its command and pub/sub connections
(it drops them; their next connect asks where to go). Calls in flight fail and are resent
there (every script is idempotent); the pub/sub connection subscribes again and wakes every
waiter.

It moves at the promotion, not at ``+switch-master``: the sentinel that leads a failover
announces ``+failover-state-send-slaveof-noone`` (naming the replica it is about to
promote) a sentinel tick before it sends ``REPLICAOF NO ONE``, and ``+switch-master`` only
after every replica is reconfigured, a second or more later. A write the old primary takes
after the promotion never reaches the new one: a lock taken there is lost, and may be
granted again on the new primary meanwhile. Moving at the announcement, while the replica
still copies the old primary, keeps every write of this client on the side that survives;
the replica refuses writes (READONLY) for the moment until it is promoted, which the script
runner resends. Only the leading sentinel announces it, hence a subscription to each. Until
the sentinels name the promoted replica themselves, connections go to it; an abort
(``-failover-abort-slave-timeout``, or no sentinel reporting a failover under way in two
polls in a row) hands them back to what the sentinels name.

An event can be missed: the sentinels may be stalled (a paused host), refuse the
subscription (an ACL user without channel rights), or the switch may happen while the watch
reconnects. So, as Redisson does (``SentinelConnectionManager.checkMasterChange``), the
watch also asks the sentinels for the current primary after every (re)subscription and then
once a second; an answer that differs from where the client's connections go is a switch.
One command per second to each sentinel, at once, each bounded by a short timeout: a stalled
sentinel costs nothing. With the events missed the client follows within the poll interval
plus the query bound (under 2 s), at ``+switch-master`` time.

A write refused with READONLY (a demoted primary) drops the command connection as well
(``topology.OneServer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import RedisError

from .._exceptions import ClientClosedError
from .resp import pack
from .transport import CommandTransport
from .wire import Wire, open_wire

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection
    from redis.asyncio.sentinel import SentinelConnectionPool

__all__ = ("SentinelWatch",)

log = logging.getLogger("aiolock")

# The switch; the promotion about to be sent (leader only); the promotion given up.
_SWITCH = "+switch-master"
_PROMOTING = "+failover-state-send-slaveof-noone"
_ABORTED = "-failover-abort-slave-timeout"
_SUBSCRIBE = pack("SUBSCRIBE", _SWITCH, _PROMOTING, _ABORTED)
_PING = pack("PING")
# A sentinel that answers nothing (not even a PING) for this long is left for the next.
_KEEPALIVE = 5.0
# Pause before a sentinel that failed (or ended the connection) is connected to again.
_ROUND_PAUSE = 1.0
# Pause after a sentinel refused the subscription (an ACL): asking again each second
# would only log and reconnect; polling follows the switches meanwhile.
_REFUSED_PAUSE = 30.0
# How often the sentinels are asked for the current primary (Redisson's scanInterval), and
# how long one sentinel may take to answer before the next one is asked. Together they bound
# the follow when the event is missed: 1 s + 0.5 s (+ 0.5 s per stalled sentinel in a row).
POLL_INTERVAL = 1.0
QUERY_TIMEOUT = 0.5
# A poll connection whose reply is this late is dropped (the next poll reconnects); and
# how long a connect waits for a sentinel to name the primary.
_QUERY_DEADLINE = 5.0
# What ``_ask`` returns when the sentinel did not answer.
_NO_ANSWER = object()
# After the first sentinel names a primary, how long the others have to answer too. In a
# failover the sentinels disagree for a moment (those that have not heard of it yet still
# name the old primary, which stays a primary until it is reconfigured, seconds later):
# the answer with the newest config epoch wins, so a client never goes back to the old
# primary. A paused sentinel costs a connect this much at most.
_AGREE = 0.05


class SentinelWatch:
    """Listens to every sentinel of the group for its primary's promotion and switch."""

    def __init__(
        self,
        pool: SentinelConnectionPool,
        on_switch: Callable[[str], None],
        spawn: Callable[[Any], asyncio.Task[Any]],
        connected: Callable[[], list[str]],
        *,
        poll_interval: float = POLL_INTERVAL,
        query_timeout: float = QUERY_TIMEOUT,
    ) -> None:
        self._service = pool.service_name
        self._manager = pool.sentinel_manager
        # In redis-py's order at the start (redis-py reorders its own list as it goes).
        self._redis_sentinels = list(self._manager.sentinels)
        self._sentinels: list[Callable[[], AbstractConnection]] = [
            sentinel.connection_pool.make_connection for sentinel in self._redis_sentinels
        ]
        self._on_switch = on_switch
        self._spawn = spawn
        # "host:port" of every connection of the client open now (command and pub/sub).
        self._connected = connected
        self._poll_interval = poll_interval
        self._query_timeout = query_timeout
        # SENTINEL MASTER, not GET-MASTER-ADDR-BY-NAME: the latter names the promoted replica
        # before the switch is announced, while the sentinels still hand the old primary to
        # a connection that asks them (redis-py's discovery reads SENTINEL MASTERS): the
        # connections would be moved to where they cannot yet go, again and again.
        self._query = pack("SENTINEL", "MASTER", self._service)
        # The primary the last move went to (a repeated move is logged quietly).
        self._followed: str | None = None
        # The replica being promoted, (host, port), from its announcement until the
        # sentinels name it (or give it up): connections go there meanwhile.
        self._promoting: tuple[str, int] | None = None
        # Polls in a row that found no failover under way while ``_promoting`` was set.
        self._quiet_polls = 0
        # A refused subscription was logged, and no sentinel has accepted one since.
        self._refusal_logged = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[_Listener] = []
        # One command connection per sentinel asked, opened when first asked.
        self._polls: dict[int, CommandTransport] = {}
        # The sentinel asked first: the last one that answered.
        self._poll_from = 0
        # Set to poll at once (a subscription confirmed) rather than at the interval.
        self._poll_now = asyncio.Event()
        self.closed = False
        #: Switches of this group's primary heard so far (a promotion and its switch: one).
        self.switches = 0
        #: Switches found by asking the sentinels (every event missed).
        self.polled_switches = 0
        #: Moves made at a promotion's announcement, before the switch.
        self.early_switches = 0
        #: How many times the sentinels were asked for the primary and one answered.
        self.polls = 0
        #: Whether some sentinel has confirmed the subscription (tests wait for it).
        self.listening = asyncio.Event()

    def start(self) -> None:
        """Begin listening and polling (once; the command connection calls it on connect)."""
        if not self._tasks and not self.closed and self._sentinels:
            for make_connection in self._sentinels:
                listener = _Listener(self, make_connection)
                self._listeners.append(listener)
                self._tasks.append(self._spawn(listener.run()))
            self._tasks.append(self._spawn(self._poll()))

    # -- what the sentinels announce ---------------------------------------------------------

    def subscribed(self) -> None:
        """A sentinel confirmed the subscription (once per channel)."""
        if self._refusal_logged:
            log.info("aiolock: a sentinel accepts the +switch-master subscription again")
            self._refusal_logged = False
        self.listening.set()
        # A switch may have happened while that sentinel was not listened to.
        self._poll_now.set()

    def unsubscribed(self) -> None:
        """A sentinel's connection ended."""
        if not any(listener.subscribed for listener in self._listeners):
            self.listening.clear()

    def heard(self, channel: str, message: str) -> None:
        """A message on one of the channels, from any sentinel."""
        fields = message.split()
        if channel == _SWITCH:
            # "<name> <old ip> <old port> <new ip> <new port>"
            if len(fields) >= 5 and fields[0] == self._service:
                self._switched(f"{fields[3]}:{fields[4]}")
        elif channel == _PROMOTING:
            # The replica, then "@", the group's name and its primary's address.
            if len(fields) >= 6 and fields[5] == self._service:
                self._promotion(fields[2], int(fields[3]))
        elif (
            # "master", the group's name and its primary's address.
            channel == _ABORTED
            and self._promoting is not None
            and len(fields) >= 2
            and fields[1] == self._service
        ):
            self._given_up("-failover-abort-slave-timeout")

    def refused(self, peer: str, exc: Exception) -> None:
        """A sentinel refused the subscription (an ACL user without channel rights).

        A WARNING the first time, until a sentinel accepts it again: each sentinel refuses
        alike, and each asks again every ``_REFUSED_PAUSE``.
        """
        report = log.debug if self._refusal_logged else log.warning
        report(
            "aiolock: sentinel %s refused the +switch-master subscription (%s); switches "
            "of %r are found by polling the sentinels every %g s instead",
            peer,
            exc,
            self._service,
            self._poll_interval,
        )
        self._refusal_logged = True

    def _switched(self, new: str) -> None:
        self._promoting = None
        if new == self._followed:
            return  # moved already: at the promotion, by polling, or heard from another sentinel
        self.switches += 1
        self._move(new, "aiolock: the sentinels switched %r's primary to %s; reconnecting")

    def _promotion(self, host: str, port: int) -> None:
        new = f"{host}:{port}"
        self._promoting = (host, port)
        self._quiet_polls = 0
        if new == self._followed:
            return
        self.switches += 1
        self.early_switches += 1
        self._move(new, "aiolock: a sentinel is promoting %r's primary to %s; reconnecting there")

    def _given_up(self, why: str) -> None:
        log.warning(
            "aiolock: the promotion of %s to %r's primary was given up (%s); reconnecting "
            "where the sentinels say",
            self._followed,
            self._service,
            why,
        )
        self._promoting = None
        self._followed = None
        self._poll_now.set()

    def _move(self, new: str, message: str, *, level: int = logging.WARNING) -> None:
        """Send every connection to ``new`` ("host:port"); ``message`` names the group and it."""
        log.log(level, message, self._service, new)
        self._followed = new
        self._on_switch(new)

    # -- polling: the backstop for a missed event -------------------------------------------

    async def _poll(self) -> None:
        while not self.closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._poll_now.wait()
            self._poll_now.clear()
            if self.is_closed():
                return
            # During a promotion every sentinel is heard out: only the leading one says that
            # a failover is under way, and a slow answer must not read as an abort.
            named, under_way = await self._newest(
                self._query_timeout, everyone=self._promoting is not None
            )
            if named is not None:
                self._compare(f"{named[0]}:{named[1]}", under_way=under_way)

    async def ask_primary(self) -> str | None:
        """The group's primary ("host:port") as the sentinels name it now.

        Every sentinel is asked at once, each with ``query_timeout`` (see ``_newest``).
        None: no sentinel answered (the next poll asks again), or those that did hold the
        primary down (a failover is coming: its switch is awaited).
        """
        named, _ = await self._newest(self._query_timeout)
        return None if named is None else f"{named[0]}:{named[1]}"

    async def _ask(self, index: int, bound: float) -> Any:
        """Sentinel ``index``'s SENTINEL MASTER reply, or ``_NO_ANSWER``.

        No answer: the query failed, was refused, or got no reply within ``bound``.
        """
        if self.is_closed():
            return _NO_ANSWER  # aclose() closes the transports it finds: open no new one
        transport = self._polls.get(index)
        if transport is None:
            transport = self._polls[index] = CommandTransport(
                self._sentinels[index], deadline=_QUERY_DEADLINE
            )
        try:
            async with asyncio.timeout(bound):
                reply = await transport.call(self._query)
        except (RedisError, OSError, TimeoutError, ClientClosedError) as exc:
            log.debug("aiolock: sentinel query failed: %r", exc)
            return _NO_ANSWER
        if isinstance(reply, Exception):
            # An error reply (the group unknown to this sentinel): as no answer.
            log.debug("aiolock: sentinel query refused: %r", reply)
            return _NO_ANSWER
        return reply

    def _answered(self, index: int) -> None:
        """Sentinel ``index`` answered: from now on it is asked first.

        By the poll, and by redis-py's discovery (the user's own clients), as redis-py
        itself reorders after a discovery.
        """
        self.polls += 1
        if index != self._poll_from:
            self._poll_from = index
            self._ask_first(self._redis_sentinels[index])

    # -- connecting: where the client's connections go ---------------------------------------

    def connections(
        self, make_connection: Callable[[], AbstractConnection]
    ) -> Callable[[], AbstractConnection]:
        """``make_connection``, its connections sent to the primary ``locate()`` names.

        redis-py's discovery asks the sentinels one after another, in its list's order,
        each with the Sentinel's own timeouts (none by default): one paused sentinel first
        in that list held every connect (and so every call) for a minute, and the watch
        had noticed it long before. The client's connections (commands, pub/sub) ask all
        sentinels at once instead and go where the first one to answer says: a paused or
        dead sentinel costs nothing, noticed or not.
        """

        def make() -> AbstractConnection:
            conn = make_connection()
            connect_to = getattr(conn, "connect_to", None)
            if connect_to is None:
                return conn  # not a Sentinel-managed connection: its own discovery

            async def connect() -> None:
                await connect_to(await self.locate())

            # This connection is aiolock's own (never the user's pool's): its connect,
            # and redis-py's reconnect through it, ask the sentinels here.
            conn.connect = connect  # type: ignore[method-assign]
            return conn

        return make

    async def locate(self) -> tuple[str, int]:
        """Where the client's connections go now.

        The replica being promoted, if one is announced; else the primary as the sentinels
        name it now (``_newest``, all asked at once), waiting ``_QUERY_DEADLINE`` at most
        for one. MasterNotFoundError (a connection error: the call's own retries apply) if
        none names a primary by then, or every one that answered holds it down.
        """
        if self._promoting is not None:
            # The sentinels name the old primary until the switch: writes there are lost.
            return self._promoting
        named, _ = await self._newest(_QUERY_DEADLINE)
        if named is None:
            raise MasterNotFoundError(f"aiolock: no sentinel named a primary for {self._service!r}")
        return named

    async def _newest(
        self, bound: float, *, everyone: bool = False
    ) -> tuple[tuple[str, int] | None, bool]:
        """The primary the sentinels name, and whether one reports a failover under way.

        Every sentinel is asked at once, each within ``bound``; once one has named a
        primary the others have ``_AGREE`` more to answer (``everyone``: all of ``bound``).
        Of the answers that name one, the highest ``config-epoch`` wins (a sentinel that
        has not heard of a failover yet names the old primary, with the old epoch); on a
        tie one not leading a failover, then the sentinel asked first.
        """
        count = len(self._sentinels)
        order = [(self._poll_from + step) % count for step in range(count)]
        asks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(self._ask(index, bound)): index for index in order
        }
        pending = set(asks)
        named: list[tuple[int, bool, int, tuple[str, int], int]] = []
        under_way = False
        loop = asyncio.get_running_loop()
        until: float | None = None
        try:
            while pending:
                left = None if until is None else until - loop.time()
                if left is not None and left <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                for asked in done:
                    reply = asked.result()
                    leading = _failing_over(reply)
                    under_way = under_way or leading
                    address = _address_of(reply)
                    if address is not None:
                        index = asks[asked]
                        # The leader of a failover names the old primary, at the new epoch,
                        # until the switch: the others' answer of that epoch wins.
                        named.append(
                            (_epoch_of(reply), not leading, -order.index(index), address, index)
                        )
                if named and until is None and not everyone:
                    until = loop.time() + _AGREE
        finally:
            # The slower sentinels' queries are no longer needed (read-only: cancelled).
            for asked in pending:
                asked.cancel()
        if not named:
            return None, under_way
        *_, address, index = max(named)
        self._answered(index)
        return address, under_way

    def _compare(self, primary: str, *, under_way: bool = False) -> None:
        """Move every connection not going to ``primary`` (a switch whose event was missed).

        While a failover is under way some sentinels still name the old primary: the
        connections stay where the last move sent them. After an announced promotion they
        stay on the promoted replica until the sentinels name it, or until two polls in a
        row find no failover under way (given up, its event missed).
        """
        promoting = self._promoting
        if promoting is not None:
            if primary == f"{promoting[0]}:{promoting[1]}":
                self._promoting = None
            elif under_way:
                self._quiet_polls = 0
                return
            else:
                self._quiet_polls += 1
                if self._quiet_polls < 2:
                    return
                self._given_up("no sentinel reports it under way any more")
        if self.closed or (under_way and self._followed is not None):
            return
        if all(peer == primary for peer in self._connected()):
            return
        again = primary == self._followed
        if not again:
            self.switches += 1
            self.polled_switches += 1
        # Again: the sentinel the reconnect asked had not heard of the switch yet; moved
        # once a second until it has.
        self._move(
            primary,
            "aiolock: the sentinels name %r's primary %s; reconnecting there",
            level=logging.DEBUG if again else logging.WARNING,
        )

    def _ask_first(self, sentinel: Any) -> None:
        # The reconnect asks redis-py's sentinels in their order, each with redis-py's
        # timeouts and retries: a stalled one first costs seconds per connect. The one that
        # just answered goes first, as redis-py itself reorders after a discovery.
        order = self._manager.sentinels
        if order and order[0] is not sentinel and sentinel in order:
            index = order.index(sentinel)
            order[0], order[index] = order[index], order[0]

    def is_closed(self) -> bool:
        """Whether aclose() was called (a method: the type checker keeps no earlier check)."""
        return self.closed

    async def aclose(self) -> None:
        """Stop listening and polling."""
        self.closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for listener in self._listeners:
            listener.close()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        polls, self._polls = list(self._polls.values()), {}
        for transport in polls:
            await transport.aclose()


class _Listener:
    """One sentinel's subscription, reconnected until the watch closes (the wire's listener)."""

    def __init__(
        self, watch: SentinelWatch, make_connection: Callable[[], AbstractConnection]
    ) -> None:
        self._watch = watch
        self._make_connection = make_connection
        self._wire: Wire | None = None
        self._ended: asyncio.Future[Exception] | None = None
        self._heard = False
        # This sentinel refused the subscription since it last accepted it.
        self._refused = False
        self.subscribed = False

    def on_reply(self, reply: Any) -> None:
        self._heard = True
        if isinstance(reply, Exception):
            self._refusal(reply)
            return
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind = _text(reply[0])
        if kind == "subscribe":
            self._refused = False
            self.subscribed = True
            self._watch.subscribed()
        elif kind == "message":
            self._watch.heard(_text(reply[1]), _text(reply[2]))

    on_push = on_reply

    def _refusal(self, exc: Exception) -> None:
        # An error reply: to SUBSCRIBE most likely (an ACL user without channel rights).
        # The watch would hear nothing from this sentinel: say so, and close.
        wire = self._wire
        peer = "?" if wire is None else wire.peer
        self._watch.refused(peer, exc)
        self._refused = True
        if wire is not None:
            wire.close(RedisError(f"aiolock: sentinel {peer} refused: {exc}"))

    def on_lost(self, wire: Wire, exc: Exception) -> None:
        if wire is self._wire:
            self._wire = None
            if self.subscribed:
                self.subscribed = False
                self._watch.unsubscribed()
            ended = self._ended
            if ended is not None and not ended.done():
                ended.set_result(exc)

    def close(self) -> None:
        wire = self._wire
        if wire is not None:
            wire.close()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        watch = self._watch
        while not watch.is_closed():
            wire: Wire | None = None
            try:
                self._ended = loop.create_future()
                wire = await open_wire(self._make_connection, self, pushes=True)
                if watch.is_closed():
                    # Closed while it connected (on 3.11 redis-py's connect() can swallow
                    # the cancel that aclose() sent): use it for nothing.
                    return
                self._wire = wire
                wire.write(_SUBSCRIBE)
                await self._listen(wire)
            except (RedisError, OSError) as exc:
                log.debug("aiolock: sentinel connection failed: %r", exc)
            finally:
                if wire is not None:
                    if not wire.closed:
                        wire.close()
                    await wire.dispose()
            if not watch.is_closed():
                await asyncio.sleep(_REFUSED_PAUSE if self._refused else _ROUND_PAUSE)

    async def _listen(self, wire: Wire) -> None:
        """Until the connection ends: a PING each quiet period, the end if none is heard."""
        ended = self._ended
        assert ended is not None
        self._heard = True
        while not ended.done() and not self._watch.is_closed():
            if not self._heard:
                wire.close()
                return
            self._heard = False
            wire.write(_PING)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_KEEPALIVE):
                    await asyncio.shield(ended)


def _address_of(reply: Any) -> tuple[str, int] | None:
    """(host, port) of the primary a SENTINEL MASTER reply names.

    None if the sentinel holds it down (or for ``_NO_ANSWER``).
    """
    fields = _fields(reply)
    if fields is None:
        return None
    flags = _text(fields.get("flags", "")).split(",")
    if "ip" not in fields or "port" not in fields or "s_down" in flags or "o_down" in flags:
        return None
    return _text(fields["ip"]), int(fields["port"])


def _failing_over(reply: Any) -> bool:
    """Whether a SENTINEL MASTER reply says this sentinel leads a failover now."""
    fields = _fields(reply)
    return fields is not None and "failover_in_progress" in _text(fields.get("flags", "")).split(
        ","
    )


def _fields(reply: Any) -> dict[str, Any] | None:
    """A SENTINEL MASTER reply as a dict (a map in RESP3, a flat list in RESP2)."""
    if isinstance(reply, dict):
        return {_text(key): value for key, value in reply.items()}
    if isinstance(reply, list):
        return {_text(key): value for key, value in zip(reply[::2], reply[1::2], strict=False)}
    return None


def _epoch_of(reply: Any) -> int:
    """The ``config-epoch`` of a SENTINEL MASTER reply (0 if it has none)."""
    fields = _fields(reply) or {}
    try:
        return int(_text(fields.get("config-epoch", 0)))
    except ValueError:
        return 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
