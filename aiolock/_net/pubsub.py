"""The client's ONE pub/sub connection: reference-counted subscriptions and the reader.

State changes (counting subscribers, handling a reply) are plain sync methods; the I/O
(SUBSCRIBE/UNSUBSCRIBE, reading) happens at the edges. The connection is a wire of
aiolock's own (``wire.py``): messages are parsed and delivered in the event loop's
callback, with no task and no timeout per message; one timer checks that the connection is
alive (``keepalive.py``). Every message goes to the waiting room (a ``Recipient``,
``subscriptions.py``), which wakes the waiters it concerns; so does every (re)confirmed
subscription, since messages published while it was down are lost. (Barriers: ``barrier.py``.)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot
from redis.exceptions import ClusterDownError, MovedError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._exceptions import ClientClosedError
from .barrier import Barriers
from .keepalive import Keepalive
from .resp import pack
from .subscriptions import Barrier, Channel, Recipient, Subscription, text, wait_event
from .wire import Wire, open_wire

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .._emitter import Emitter

__all__ = ("Dispatcher",)

log = logging.getLogger("aiolock")

# How long aclose() waits for the reader to stop once its connection is closed.
_CLOSE_WAIT = 2.0
# Pauses between reconnect attempts: short after a connection that worked (a dropped one
# is usually back at once), doubling up to the cap while attempts keep failing.
_MIN_BACKOFF = 0.02
_MAX_BACKOFF = 1.0


class Dispatcher:
    """One pub/sub connection per client, shared by every waiter on every channel.

    Subscriptions are reference-counted per channel. After a reconnect every channel is
    subscribed again and, once the server confirms it, every waiter on it is woken to
    re-check: messages published while the connection was down are lost for good.
    """

    def __init__(
        self,
        make_connection: Callable[[], AbstractConnection],
        room: Recipient,
        *,
        subscribe_timeout: float,
        spawn: Callable[[Any], asyncio.Task[Any]],
        keepalive: float = 10.0,
        linger: float = 0.5,
        sharded: bool = False,
        on_change: Callable[[], None] | None = None,
        events: Emitter | None = None,
    ) -> None:
        self._make_connection = make_connection
        # Told of each reconnection (a ``Reconnected`` event), with how long it took.
        self._events = events
        # When (time.monotonic()) the connection was lost; None while it is up.
        self._lost_at: float | None = None
        # Sharded pub/sub (a cluster's SSUBSCRIBE, one channel per command: channels of
        # several slots in one would be refused with CROSSSLOT).
        self._subscribe = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._sharded = sharded
        # Told when the server drops a channel (its slot moved elsewhere) or the connection
        # is lost: on a cluster the layout may have changed (a failover, a node gone).
        self._on_change = on_change or _nothing
        # Where messages and (re)confirmations go: it wakes the waiters they concern.
        self._room = room
        self._linger = linger
        self._subscribe_timeout = subscribe_timeout
        self._spawn = spawn
        self._channels: dict[str, Channel] = {}
        # Replies to (UN)SUBSCRIBE come back in order per channel on one connection; this
        # queue of what was sent tells a reply to an old SUBSCRIBE from the current one.
        self._sent: dict[str, deque[bool]] = {}
        self._wire: Wire | None = None
        self._barriers = Barriers()
        # Bumped for each wire taken into use: tells a subscription sent on the current
        # wire from one the reconnect has since sent again.
        self._generation = 0
        # Set when the current wire ends (the reader task waits on it).
        self._ended: asyncio.Future[Exception] | None = None
        self._proven = False
        # Checks that the connection is alive while nothing comes (keepalive.py).
        self._keepalive = Keepalive(keepalive)
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        self._retired = False
        self.reconnects = 0
        # Since the connection was lost (or first failed to open) and not yet open again.
        self._outage = False
        self._backoff = _MIN_BACKOFF
        # The server's last refusal of a reader command (SUBSCRIBE denied by an ACL), until
        # a connection works again; and how many refusals there were, to tell new ones.
        self._refusal: ResponseError | None = None
        self._refusals = 0

    # -- sync state changes -------------------------------------------------------------

    def _acquire_channel(self, name: str) -> tuple[Channel, bool]:
        channel = self._channels.get(name)
        is_new = channel is None
        if channel is None:
            channel = self._channels[name] = Channel(name)
        self._ref(channel)
        return channel, is_new

    def _ref(self, channel: Channel) -> None:
        channel.refs += 1
        if channel.linger is not None:
            channel.linger.cancel()
            channel.linger = None

    def join(self, name: str) -> Subscription | None:
        """A reference to ``name`` if it is subscribed and confirmed already, else None.

        No I/O: a waiter registered on it now hears every later message, so an acquire
        that joins before its first attempt needs no second attempt after subscribing.
        """
        channel = self._channels.get(name)
        if channel is None or self.closed or not channel.confirmed.is_set():
            return None
        self._ref(channel)
        return Subscription(self, channel)

    def release(self, channel: Channel) -> None:
        """Drop one reference to ``channel``; unsubscribe a while after none is left."""
        channel.refs -= 1
        assert channel.refs >= 0, channel.name
        if channel.refs == 0 and self._channels.get(channel.name) is channel and not self.closed:
            # Linger: a hot lock is waited on again a moment later, and keeping the
            # channel spares an UNSUBSCRIBE, a SUBSCRIBE and a retry for each new wait.
            channel.linger = asyncio.get_running_loop().call_later(
                self._linger, self._expire, channel
            )

    def _expire(self, channel: Channel) -> None:
        channel.linger = None
        if channel.refs == 0 and self._channels.get(channel.name) is channel:
            del self._channels[channel.name]
            if not self.closed:
                self._enqueue(channel.name, subscribe=False)

    def _enqueue(self, name: str, *, subscribe: bool) -> None:
        # Without a connection there is nothing to do: the reconnect subscribes exactly
        # the channels that have subscribers then.
        wire = self._wire
        if wire is None:
            return
        self._sent.setdefault(name, deque()).append(subscribe)
        if subscribe:
            self._channels[name].sent_on = self._generation
        wire.write(pack(self._subscribe if subscribe else self._unsubscribe, name))

    # The wire's listener: replies and pushes are both messages or confirmations here.

    def on_reply(self, reply: Any) -> None:
        self._keepalive.heard = True
        # One check per message; the kinds of error only when there is one.
        if isinstance(reply, ResponseError):
            if isinstance(reply, MovedError):
                # SSUBSCRIBE to a server that no longer serves the channel's slot.
                slot = reply.slot_id
                self._moved(lambda channel: key_slot(channel.name.encode()) == slot)
                return
            if isinstance(reply, ClusterDownError):
                # SSUBSCRIBE to a server whose slot has no primary just now (a failover,
                # a slot reassigned): no refusal, the connection stays. The reply names no
                # channel, so every one still unconfirmed moves: its waiters attempt
                # again, and subscribe anew once the slot map names a primary.
                self._moved(lambda channel: not channel.confirmed.is_set())
                return
            # An answer, not a broken connection: the server refuses a command.
            self._refused(reply)
            if self._wire is not None:
                self._wire.close(reply)
            return
        if not self._proven:
            # A first reply that is no refusal: the connection works. The next time it
            # drops, reconnect quickly again.
            self._proven = True
            self._backoff = _MIN_BACKOFF
            if self._refusal is not None:
                log.info("aiolock: the server accepts pub/sub commands again")
                self._refusal = None
        self._on_reply(reply)

    on_push = on_reply

    def on_lost(self, wire: Wire, exc: Exception) -> None:
        if wire is not self._wire:
            return
        self._wire = None
        self._keepalive.stop()
        self._barriers.lost()
        for channel in self._channels.values():
            channel.confirmed.clear()
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(exc)

    def _on_reply(self, reply: Any) -> None:
        if isinstance(reply, bytes | str):  # a PING's answer outside RESP2 subscribed mode
            self._barriers.answered(reply)
            return
        kind = text(reply[0])
        if kind == "pong":  # in RESP2 subscribed mode: "pong" and the PING's argument
            self._barriers.answered(reply[1])
        elif kind in {"message", "smessage"}:
            channel = self._channels.get(text(reply[1]))
            if channel is not None:
                data = reply[2] if isinstance(reply[2], bytes) else str(reply[2]).encode()
                self._room.deliver(channel.name, data)
        elif kind in {"subscribe", "ssubscribe", "unsubscribe", "sunsubscribe"}:
            name = text(reply[1])
            sent = self._sent.get(name)
            if sent:
                sent.popleft()
                if not sent:
                    del self._sent[name]
            if kind == "sunsubscribe" and sent is None:
                # Nobody here asked: the server dropped the channel as its slot moved
                # (a failover, a migration).
                self._moved(lambda channel: channel.name == name)
                return
            if kind.endswith("unsubscribe") or sent:
                return
            channel = self._channels.get(name)
            if channel is not None:
                channel.confirmed.set()
                # A (re)confirmed subscription may have missed messages: every waiter
                # re-checks. On a first subscribe nobody waits yet, so this is free.
                self._room.wake_all(channel.name)

    def barrier(self, channel: Channel) -> Barrier:
        """A barrier sent now on the wire carrying ``channel`` (broken if none does yet)."""
        on = self._channels.get(channel.name) is channel and channel.sent_on == self._generation
        return self._barriers.send(self._wire if on else None, channel)

    # -- I/O at the edges ---------------------------------------------------------------

    async def subscribe(self, name: str, limit: float | None) -> Subscription | None:
        """Subscribe to ``name`` (shared with other local waiters) and wait for the server.

        Returns None if ``limit`` (the caller's remaining wait) ran out first. Raises
        redis-py's ``TimeoutError`` if the server did not confirm within
        ``subscribe_timeout``, and `ClientClosedError` once the client is closed.
        """
        if self.closed:
            if self._retired:
                # Its server dropped out of the cluster's layout just now: a subscription
                # that is stale at once sends the caller to where the slot is served.
                gone = Channel(name)
                gone.moved = True
                gone.refs = 1
                return Subscription(self, gone)
            raise ClientClosedError
        channel, is_new = self._acquire_channel(name)
        refusals = self._refusals
        try:
            if self._reader is None:
                self._reader = self._spawn(self._run())
            if is_new:
                self._enqueue(name, subscribe=True)
            bound = self._subscribe_timeout
            by_caller = limit is not None and limit < bound
            confirmed = await wait_event(channel.confirmed, limit if by_caller else bound)
        except BaseException:
            self.release(channel)
            raise
        if self._closed_now() and not channel.moved:
            self.release(channel)
            raise ClientClosedError
        refusal = self._refusal
        if confirmed and not channel.confirmed.is_set() and self._refusals != refusals:
            # Woken by a refusal (_refused), not a confirmation: waiting longer is futile.
            assert refusal is not None
            self.release(channel)
            raise type(refusal)(f"{refusal} (aiolock: subscribing to {name!r})")
        if confirmed or channel.moved:
            # (Moved: a stale subscription, which its caller replaces.)
            return Subscription(self, channel)
        self.release(channel)
        if by_caller:
            return None
        if channel.sent_on == self._generation:
            # Sent on the wire still in use, which has not answered it in time.
            self._distrust(name, bound)
        raise RedisTimeoutError(
            f"aiolock: subscription to {name!r} was not confirmed within {bound:g} s "
            "(subscribe_timeout)"
        )

    async def _run(self) -> None:
        first = True
        loop = asyncio.get_running_loop()
        while not self.closed:
            wire: Wire | None = None
            try:
                self._ended = loop.create_future()
                self._proven = False
                wire = await open_wire(self._make_connection, self, pushes=True)
                if self._closed_now():
                    break
                self._connected(wire, again=not first)
                first = False
                exc = await self._ended
                if not self._closed_now() and not isinstance(exc, ResponseError):
                    log.warning("aiolock: pub/sub connection lost (%s); reconnecting", exc)
                    self._went_down()
            except ResponseError as exc:
                # Refused during the handshake (an ACL without the right to connect).
                if not self.closed:
                    self._refused(exc)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                if not self.closed:
                    # One WARNING per outage: a node down for seconds (a cluster electing
                    # a new primary) would otherwise log one per attempt.
                    report = log.debug if self._outage else log.warning
                    report("aiolock: pub/sub connection failed (%s); reconnecting", exc)
                    self._went_down()
            except Exception:
                # Never let the one reader die: every waiter would then depend on its
                # lease-bounded timeout alone.
                log.exception("aiolock: pub/sub reader failed; reconnecting")
            finally:
                if wire is not None:
                    if not wire.closed:
                        wire.close()  # its on_lost clears what was subscribed
                    await wire.dispose()
            if not self.closed:
                self._on_change()
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, _MAX_BACKOFF)

    def _went_down(self) -> None:
        """The connection was lost, or failed to open: an outage (from its first moment)."""
        self._outage = True
        if self._lost_at is None:
            self._lost_at = monotonic()

    def _connected(self, wire: Wire, *, again: bool) -> None:
        """Use ``wire`` from now on: subscribe every channel with subscribers."""
        self._sent.clear()
        names = list(self._channels)
        self._wire = wire
        self._barriers.connected()
        self._generation += 1
        if again:
            self.reconnects += 1
            # Once per attempt: quiet while the server keeps refusing (_refused).
            log.log(
                logging.DEBUG if self._refusal else logging.INFO,
                "aiolock: pub/sub reconnected; restoring %d channels",
                len(names),
            )
            lost_at = self._lost_at
            if lost_at is not None and self._events is not None:
                self._events.reconnected(wire.peer, monotonic() - lost_at)
        self._lost_at = None
        self._outage = False
        if names:
            for name in names:
                self._sent.setdefault(name, deque()).append(True)
                self._channels[name].sent_on = self._generation
            if self._sharded:
                wire.write(b"".join(pack(self._subscribe, name) for name in names))
            else:
                wire.write(pack(self._subscribe, *names))
        self._keepalive.start(wire)

    def _distrust(self, name: str, bound: float) -> None:
        """Drop the wire on which a SUBSCRIBE went unconfirmed for ``subscribe_timeout``.

        Its replies are paired with what was sent by order alone (``_sent``): one that
        never came (a middlebox ate it, a server froze) would leave every later
        confirmation of the channel read as the answer to the command before it, and
        each later wait fail the same way while the connection lives. A new connection
        starts the pairing afresh, subscribes every channel and wakes every waiter.
        """
        self.reset(RedisTimeoutError(f"subscription to {name!r} not confirmed within {bound:g} s"))

    def _refused(self, exc: ResponseError) -> None:
        """The server refused a reader command: most likely SUBSCRIBE, denied by an ACL.

        Each reconnect asks again (the ACL may be fixed), backing off; the refusal is
        logged once per streak. Whoever waits in subscribe() fails now, rather than after
        subscribe_timeout: a refusal will not turn into a confirmation.
        """
        if self._refusal is None:
            log.warning(
                "aiolock: the server refused a pub/sub command (%s); waiting for a lock "
                "fails until it accepts (retrying every %g s at most)",
                exc,
                _MAX_BACKOFF,
            )
        else:
            log.debug("aiolock: pub/sub command refused again (%s)", exc)
        self._refusal = exc
        self._refusals += 1
        for channel in self._channels.values():
            if not channel.confirmed.is_set():
                # Set then clear at once: the waiters in subscribe() wake, and see the
                # channel unconfirmed and a new refusal; join() never sees it confirmed.
                channel.confirmed.set()
                channel.confirmed.clear()

    def reset(self, exc: Exception) -> None:
        """Drop the connection: the reader connects again and resubscribes (wakes all)."""
        wire = self._wire
        if wire is not None:
            wire.close(exc)

    def _moved(self, which: Callable[[Channel], bool]) -> None:
        """The channels ``which`` picks are served elsewhere now: let go of them.

        Each is forgotten here and marked moved; its waiters wake (they attempt again and,
        still waiting, subscribe anew where the slot is now), and the owner of this
        dispatcher hears of it so that it learns the new layout.
        """
        moved = [channel for channel in self._channels.values() if which(channel)]
        for channel in moved:
            del self._channels[channel.name]
            self._sent.pop(channel.name, None)
            channel.moved = True
            if channel.linger is not None:
                channel.linger.cancel()
                channel.linger = None
            # Wakes whoever waits in subscribe() (it sees the channel unconfirmed, moved).
            channel.confirmed.set()
            channel.confirmed.clear()
            self._room.wake_all(channel.name)
        if moved:
            self._on_change()

    def let_go(self, which: Callable[[str], bool]) -> None:
        """Let go of the channels whose names ``which`` picks, as of dropped ones.

        They are served elsewhere now: the cluster's slot map says so, their server did not.
        """
        if any(which(name) for name in self._channels):
            self._moved(lambda channel: which(channel.name))

    async def retire(self) -> None:
        """Close for good once the server serves no slot: every channel moves elsewhere."""
        self._retired = True
        self._moved(lambda channel: True)
        await self.aclose()

    async def aclose(self) -> None:
        """Release whoever waits in subscribe() and close the connection.

        The client has closed the waiting room first: every waiter is awake already.
        """
        self.closed = True
        for channel in self._channels.values():
            if channel.linger is not None:
                channel.linger.cancel()
            channel.confirmed.set()
        reader = self._reader
        if reader is None:
            return
        reader.cancel()
        # A cancel that lands inside redis-py's connect() can be swallowed there: the
        # reader then sees the closed flag, or the wire's end, and stops.
        wire = self._wire
        if wire is not None:
            wire.close()
        done, _ = await asyncio.wait([reader], timeout=_CLOSE_WAIT)
        if not done:
            log.warning("aiolock: pub/sub reader did not stop within %g s", _CLOSE_WAIT)

    def _closed_now(self) -> bool:
        # A method, so the type checker does not carry an earlier check across an await.
        return self.closed

    # -- introspection for statistics and tests -----------------------------------------

    @property
    def peer(self) -> str | None:
        """Where the open connection goes ("host:port"), None without one."""
        wire = self._wire
        return None if wire is None else wire.peer

    def channels(self) -> dict[str, int]:
        """Map each subscribed channel to its number of local references."""
        return {name: channel.refs for name, channel in self._channels.items()}


def _nothing() -> None:
    pass
