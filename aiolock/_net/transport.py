"""The command connection: one auto-pipelined connection per server, shared by every call.

Why not redis-py's pool: a profile of one lock/unlock pair put most of the client's CPU in
redis-py's per-command machinery (a pool checkout, a ``wait_for`` task per send and a
timeout scope per read, retry and callback layers). Here a call packs its command, appends
a future to the queue of replies expected and writes; replies resolve the futures in order.

- **Batching**: a command sent while nothing is in flight is written at once; commands
  sent while others are in flight are gathered and written together at the end of the
  event loop's tick, so 32 concurrent calls cost one write, not 32. So are the commands
  of callers that replies just woke together, whichever connection they go to (``_Pass``):
  the first of them would otherwise find its connection idle and leave alone.
- **One deadline per connection**: while anything is in flight, a reply must come within
  ``deadline`` seconds of the previous one (or of the send, from idle); else the connection
  is declared dead. No timer per command, no ``asyncio.wait_for`` anywhere.
- **Failure**: a dropped or dead connection fails every queued and in-flight call with
  redis-py's ``ConnectionError``/``TimeoutError``, which the script runner resends (every
  script is idempotent); the next call reconnects.
- **Cancellation**: a cancelled caller's future is cancelled; its reply, when it comes, is
  read and dropped, so the stream never goes out of step and the connection stays up.
- **Backpressure**: at most ``limit`` commands are queued or in flight; a call beyond waits
  its turn (first come, first served).
- **Fork**: in a forked child the inherited connection is never written (``wire.py``); a
  call raises ``RuntimeError`` instead.
- An error reply fails only its own caller. Nothing blocking (BLPOP, WAIT without a bound)
  is ever sent here: it would hold up every call behind it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._exceptions import ClientClosedError
from .wire import Wire, open_wire

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from .._emitter import Emitter

__all__ = ("CommandTransport", "RetiredError")


class RetiredError(RedisConnectionError):
    """The server was dropped from the client's layout (a cluster node no longer a primary).

    A ``ConnectionError``, so whatever resends on a lost connection resends on this too; the
    script runner sends such a call where the slot is served now, at once and without
    spending a retry: no fault happened.
    """


class _Batch:
    """The replies of one ``call_many``, collected in order into one future."""

    __slots__ = ("future", "left", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], size: int) -> None:
        self.future = future
        self.replies: list[Any] = []
        self.left = size

    def put(self, reply: Any) -> None:
        self.replies.append(reply)
        self.left -= 1
        if not self.left and not self.future.done():
            self.future.set_result(self.replies)

    def done(self) -> bool:
        return self.future.done()

    def set_exception(self, exc: BaseException) -> None:
        self.future.set_exception(exc)


_Sink = asyncio.Future[Any] | _Batch


class _Pass:
    """The commands an event loop's transports gather in one pass of it, written at its end.

    Shared by every transport of the loop. A command sent while its connection is idle is
    written at once (one caller alone waits no longer), unless replies just woke several
    callers: each of them may send its next command in the coming pass, to this server or
    (a cluster) another, and the first would find its connection idle. Then the pass's
    commands are gathered and written together, one write per connection, by a flush
    queued in that pass (so it runs after all of them): half the writes, and batches the
    servers read whole.
    """

    __slots__ = ("defer", "deferred_at", "due", "flushes", "queued")

    def __init__(self) -> None:
        # Replies woke several callers: commands wait for a flush queued after them.
        self.defer = False
        # Flushes queued when the last such replies came (a flush queued later clears it).
        self.deferred_at = 0
        # A flush is queued and has not run.
        self.due = False
        self.flushes = 0
        # Transports with commands waiting for the flush.
        self.queued: list[CommandTransport] = []

    def woke(self) -> None:
        """Replies just woke several callers: gather what they send in the coming pass."""
        self.defer = True
        self.deferred_at = self.flushes

    def queue(self, transport: CommandTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.queued.append(transport)
        if not self.due:
            self.due = True
            self.flushes += 1
            loop.call_soon(self.flush)

    def flush(self) -> None:
        self.due = False
        if self.flushes > self.deferred_at:
            # Queued after the callers were woken: it runs after what they sent.
            self.defer = False
        queued, self.queued = self.queued, []
        for transport in queued:
            transport._flush()


_passes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pass] = weakref.WeakKeyDictionary()


def _pass_of(loop: asyncio.AbstractEventLoop) -> _Pass:
    writes = _passes.get(loop)
    if writes is None:
        # The pass holds no reference to its loop: the loop's entry goes with it.
        writes = _Pass()
        # A loop that cannot be weakly referenced: each transport has a pass of its own.
        with contextlib.suppress(TypeError):
            _passes[loop] = writes
    return writes


class CommandTransport:
    """An auto-pipelined connection to one server; it (re)connects on demand."""

    def __init__(
        self,
        make_connection: Callable[[], AbstractConnection],
        *,
        deadline: float,
        limit: int = 4096,
        on_open: Callable[[], None] | None = None,
        events: Emitter | None = None,
    ) -> None:
        self._make_connection = make_connection
        # Told of each connection made again after one was lost (a ``Reconnected`` event).
        self._events = events
        # When (time.monotonic()) the last connection was lost; None: none lost since.
        self._lost_at: float | None = None
        #: Where the last connection went ("host:port"), kept after it is lost (for logs).
        self.last_peer: str | None = None
        # Told of every connection opened (the Sentinel watch starts with the first).
        self._on_open = on_open
        self._deadline = deadline
        self._limit = limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wire: Wire | None = None
        # A wire that ended and still needs redis-py to forget it (done by the next open).
        self._ended: list[Wire] = []
        self._opening: asyncio.Task[Wire] | None = None
        # One entry per command written or about to be: who gets its reply.
        self._sinks: collections.deque[_Sink] = collections.deque()
        # Commands of this tick not written yet (written together by _flush).
        self._out: list[bytes] = []
        # The loop's pass that writes them (shared by the loop's transports; see _Pass).
        self._pass: _Pass | None = None
        # Callers woken by the replies since nothing was last in flight (see on_reply).
        self._woken = 0
        # Calls waiting for room (backpressure): how many commands each brings.
        self._room: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._reserved = 0
        self._timer: asyncio.TimerHandle | None = None
        # The loop's clock (``loop.time``, bound once the loop is known), read once per reply.
        self._clock: Callable[[], float] = monotonic
        self._heard = 0.0
        self.closed = False
        self._retired: str | None = None
        #: Connections opened so far (the first one included).
        self.connects = 0

    # -- calls ----------------------------------------------------------------------------

    async def call(self, command: bytes) -> Any:
        """Send one packed command; return its reply or raise its error reply."""
        future = self.send(command)
        if future is None:
            wire = await self._ready(1)
            future = self._loop.create_future()  # type: ignore[union-attr]
            self._put(wire, command, future)
        return await future

    def send(self, command: bytes) -> asyncio.Future[Any] | None:
        """``call()`` without its coroutine: its reply's future, if it can go out now.

        None if not (no connection, or no room): then ``await call()``. The future raises
        an error reply.
        """
        wire = self._at_once(1)
        if wire is None:
            return None
        future: asyncio.Future[Any] = self._loop.create_future()  # type: ignore[union-attr]
        self._put(wire, command, future)
        return future

    async def call_many(self, commands: list[bytes]) -> list[Any]:
        """Send packed commands in one write; return their replies in order.

        Error replies come back in the list (as exceptions), for the caller to judge.
        """
        if not commands:
            return []
        size = len(commands)
        wire = self._at_once(size)
        if wire is None:
            wire = await self._ready(size)
        future: asyncio.Future[list[Any]] = self._loop.create_future()  # type: ignore[union-attr]
        self._put(wire, b"".join(commands), _Batch(future, size), size)
        return await future

    def _at_once(self, size: int) -> Wire | None:
        """The connection, if ``size`` more commands may go on it now; else ``_ready()``."""
        wire = self._wire
        # A closed wire here is one inherited from the parent process (see _ready).
        if wire is None or wire.closed or self._room or len(self._sinks) + size > self._limit:
            return None
        return wire

    def _put(self, wire: Wire, data: bytes, sink: _Sink, size: int = 1) -> None:
        sinks = self._sinks
        writes: _Pass = self._pass  # type: ignore[assignment]  # set with the loop
        # Idle, and nobody else about to send: write at once.
        idle = not sinks and not writes.defer and not writes.due
        sinks.extend([sink] * size)
        if idle:
            # Nothing in flight: write now, nobody's reply is held up by waiting a tick.
            wire.write(data)
            self._heard = self._clock()
            if self._timer is None:
                self._arm(self._heard + self._deadline)
            return
        out = self._out
        out.append(data)
        if len(out) == 1:
            writes.queue(self, self._loop)  # type: ignore[arg-type]

    def _flush(self) -> None:
        out = self._out
        if out and self._wire is not None:
            self._wire.write(out[0] if len(out) == 1 else b"".join(out))
            if self._timer is None:
                self._heard = self._clock()
                self._arm(self._heard + self._deadline)
        out.clear()

    # -- replies (called by the wire, in the loop's callback) ------------------------------

    def on_reply(self, reply: Any) -> None:
        sinks = self._sinks
        if not sinks:
            # A reply nobody asked for: the stream is out of step; start again.
            if self._wire is not None:
                self._wire.close(RedisConnectionError("aiolock: unexpected reply from server"))
            return
        sink = sinks.popleft()
        if sink.__class__ is _Batch:
            sink.put(reply)
        elif not sink.done():
            if isinstance(reply, Exception):  # an error reply: its own caller raises it
                sink.set_exception(reply)
            else:
                sink.set_result(reply)  # type: ignore[union-attr]
            self._woken += 1
        self._heard = self._clock()
        if not sinks:
            if self._woken > 1:
                # Every reply is in and several callers were woken: what they send next
                # is gathered, not written command by command (see _Pass). One woken
                # caller writes at once.
                self._pass.woke()  # type: ignore[union-attr]
            self._woken = 0
        if self._room:
            self._give_room()

    def on_push(self, reply: Any) -> None:
        """A RESP3 push: nothing aiolock asked for on this connection; ignored."""

    def on_lost(self, wire: Wire, exc: Exception) -> None:
        if wire is not self._wire:
            return
        self._wire = None
        self._ended.append(wire)
        if self._lost_at is None and not self.closed:
            self._lost_at = monotonic()
            if self._events is not None:
                self._events.connection_lost()  # its holds are settled once it answers
        self._fail_all(exc)

    def _fail_all(self, exc: Exception) -> None:
        sinks, self._sinks = self._sinks, collections.deque()
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sink in sinks:
            if not sink.done():  # a batch appears once per command: failed once
                sink.set_exception(exc)
        # Who waits for room reconnects and resends: wake them all.
        self._reserved = 0
        room, self._room = self._room, collections.deque()
        for _, turn in room:
            if not turn.done():
                turn.set_result(None)

    # -- the deadline ---------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        self._timer = self._loop.call_at(when, self._check)  # type: ignore[union-attr]

    def _check(self) -> None:
        self._timer = None
        if not self._sinks or self._wire is None:
            return
        due = self._heard + self._deadline
        if self._clock() < due:
            self._arm(due)
            return
        self._wire.close(
            RedisTimeoutError(
                f"aiolock: no reply from {self._wire.peer} within {self._deadline:g} s; "
                "the connection is considered dead"
            )
        )

    # -- connecting and room ---------------------------------------------------------------

    async def _ready(self, size: int) -> Wire:
        """Wait for a connection and for room for ``size`` commands; return the wire."""
        while True:
            if self.closed:
                raise self._closed_error()
            wire = self._wire
            if wire is not None and wire.inherited:
                # A forked child: the connection is the parent's (a lost wire is dropped
                # at once, so a closed one here can only be inherited).
                raise RuntimeError(
                    f"aiolock: the connection to {wire.peer} belongs to the process this one "
                    "was forked from; create a new client after the fork"
                )
            if wire is None:
                wire = await self._open()
                # The connect ended a tick ago: since then the transport may have been
                # closed or retired, or the new connection lost. A command put on such a
                # wire would wait for a reply that never comes.
                if self.closed:
                    raise self._closed_error()
                if wire is not self._wire:
                    raise RedisConnectionError(f"aiolock: connection to {wire.peer} lost")
            queued = len(self._sinks) + self._reserved
            if not self._room and (not queued or queued + size <= self._limit):
                return wire
            turn: asyncio.Future[None] = self._loop.create_future()  # type: ignore[union-attr]
            entry = (size, turn)
            self._room.append(entry)
            try:
                await turn
            except BaseException:
                if turn.done() and not turn.cancelled():
                    # Given room it will not use: hand it on.
                    self._reserved -= size
                    self._give_room()
                else:
                    with contextlib.suppress(ValueError):
                        self._room.remove(entry)
                raise
            # Room was reserved for this call by _give_room (or the connection was lost and
            # every reservation dropped): take it and go.
            self._reserved = max(0, self._reserved - size)
            if self._wire is not None:
                return self._wire

    def _give_room(self) -> None:
        room = self._room
        while room:
            size, turn = room[0]
            queued = len(self._sinks) + self._reserved
            if queued and queued + size > self._limit:
                return
            room.popleft()
            if not turn.done():
                self._reserved += size
                turn.set_result(None)

    async def _open(self) -> Wire:
        task = self._opening
        if task is None:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
                self._pass = _pass_of(self._loop)
                self._clock = self._loop.time
            task = self._opening = self._loop.create_task(self._connect())
            task.add_done_callback(self._opened)
        # A caller's cancel must not cancel the connect every caller shares.
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                # The connect was stopped by aclose(), not this caller: that is no cancel
                # of its own to raise.
                raise self._closed_error() from None
            raise

    async def _connect(self) -> Wire:
        while self._ended:
            await self._ended.pop().dispose()
        wire = await open_wire(self._make_connection, self)
        if self.closed:
            wire.close()
            await wire.dispose()
            raise self._closed_error()
        self._wire = wire
        self.connects += 1
        self.last_peer = wire.peer
        lost_at, self._lost_at = self._lost_at, None
        if lost_at is not None and self._events is not None:
            self._events.reconnected(wire.peer, monotonic() - lost_at)
        if self._on_open is not None:
            self._on_open()
        return wire

    def _opened(self, task: asyncio.Task[Wire]) -> None:
        self._opening = None
        if not task.cancelled():
            task.exception()  # retrieved: every caller has it from the shield

    def reset(self, exc: Exception) -> None:
        """Drop the connection now: queued and in-flight calls fail with ``exc``.

        For a server that stopped being the primary (a Sentinel switch, a cluster node
        demoted): their callers resend, and the next call connects to the current one.
        """
        wire = self._wire
        if wire is not None:
            wire.close(exc)

    async def aclose(self, why: str | None = None) -> None:
        """Fail whatever is still queued, close the connection and forget it.

        ``why``: the server was dropped from the client's layout (a cluster node no longer
        a primary): calls then fail with a ``RetiredError`` saying so, which the script
        runner resends elsewhere, rather than with ``ClientClosedError``.
        """
        self._retired = why
        self.closed = True
        opening = self._opening
        if opening is not None:
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
        wire = self._wire
        if wire is not None:
            wire.close(self._closed_error())
        self._fail_all(self._closed_error())
        while self._ended:
            await self._ended.pop().dispose()

    def _closed_error(self) -> Exception:
        if self._retired is not None:
            return RetiredError(self._retired)
        return ClientClosedError()

    @property
    def peer(self) -> str | None:
        """Where the open connection goes ("host:port"), None without one."""
        wire = self._wire
        return None if wire is None else wire.peer

    @property
    def in_flight(self) -> int:
        """Commands sent or queued whose replies have not come yet."""
        return len(self._sinks)
