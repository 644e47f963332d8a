"""One connection of aiolock's own, opened by redis-py and then read and written directly.

redis-py opens it from the user's settings (the connection class and keyword arguments of
their pool: TLS, password or credential provider, db, RESP2/RESP3, client name, Sentinel
discovery), so aiolock honours every setting redis-py does. Once the handshake is done the
connection is taken over:

- **direct** (the normal way): the socket's protocol object is replaced by one that feeds
  every chunk to a hiredis parser and hands each reply on at once, in the event loop's own
  callback, with no task, no timeout scope and no read call per reply. This relies on one
  private attribute of redis-py's connection (``_writer``, present from 5.0 to 8.x, the
  range the package accepts); where it is missing, or the transport cannot change its
  protocol, the fallback is used.
- **fallback** (public API only): a reader task loops on ``read_response`` and a writer
  task sends with ``send_packed_command``. Slower, same behaviour. ``AIOLOCK_WIRE=redis-py``
  selects it, so the test suite can run on it too.

A wire never retries or times out by itself: whoever owns it (``transport.py``,
``pubsub.py``) decides when silence means a dead connection and closes it.

**Fork**: a forked child inherits every open wire, whose socket is also the parent's. In
the child each wire is *inherited* from then on (see ``_inherit``): it writes nothing,
closes nothing and lets redis-py close nothing, at garbage collection and interpreter exit
included, so that the child can never write on, shut or unregister the parent's
connection. Its owner refuses calls on it (the engine's ``Affinity`` refuses them earlier
still).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import os
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError

from .resp import REPLY_ERRORS, ErrorReply, error_reply, from_redis_py

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

__all__ = ("Wire", "WireListener", "abandon_loop", "open_wire")

log = logging.getLogger("aiolock")

# RESP3 pushes (hiredis >= 3.2, the package's lower bound, gives them a type of their own).
_PUSH = hiredis.PushNotification
_MORE = object()  # what the hiredis parser returns while a reply is incomplete


class WireListener(Protocol):
    """Who a wire hands its replies and its end to."""

    def on_reply(self, reply: Any) -> None:
        """One reply, in order; an error reply comes as the exception redis-py would raise."""

    def on_push(self, reply: Any) -> None:
        """A RESP3 push (a pub/sub message) the parser could tell from a reply."""

    def on_lost(self, wire: Wire, exc: Exception) -> None:
        """The connection ended; called once, and never before ``open_wire`` returned."""


class Wire:
    """An open connection: ``write`` bytes, replies go to the listener, ``close`` ends it."""

    def __init__(self, conn: AbstractConnection, listener: WireListener) -> None:
        self._conn = conn
        self._listener = listener
        self.closed = False
        #: Opened by the process this one was forked from: never to be touched here.
        self.inherited = False
        #: Where it goes, for messages.
        self.peer = _describe(conn)
        #: The event loop its transport belongs to.
        self.loop = asyncio.get_running_loop()
        _open_wires.add(self)

    def _inherit(self) -> None:
        """In a forked child: stop touching the socket, which is the parent's too.

        Whatever closes the asyncio transport in the child (our close, redis-py's
        ``disconnect()`` or ``__del__``, asyncio's ``StreamWriter.__del__`` once the child
        drops the writer) would unregister the socket from the epoll instance the child
        shares with the parent, which then never hears from that connection again (or,
        over TLS, write a close_notify on it). So the wire is closed (nothing is written,
        its owner sees it unusable), its transports are marked closing without closing
        them (asyncio's private flags: nothing public does that), and redis-py's connection
        forgets its streams. The child's copy of the socket is closed by the transport's
        garbage collection or the child's exit, which leaves the parent's open. The
        listener is not told: its futures belong to the parent's loop.
        """
        self.inherited = True
        self.closed = True
        self._let_go()

    def _let_go(self) -> list[Any]:
        """Mark the transports closed without closing them; redis-py forgets its streams.

        Returns the transports (a TLS one and its socket's), for ``_abandon`` to close
        their sockets itself.
        """
        conn: Any = self._conn
        writer = getattr(conn, "_writer", None)
        transport = getattr(writer, "transport", None)
        below = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
        transports = [each for each in (transport, below) if each is not None]
        for each in transports:
            if hasattr(each, "_closing"):  # a socket transport
                each._closing = True
            if hasattr(each, "_closed"):  # a TLS transport over one
                each._closed = True
        conn._reader = conn._writer = None
        return transports

    def _abandon(self) -> None:
        """Its event loop is closed: close the socket without the loop.

        Nothing can run on a closed loop (``asyncio.Transport.close()`` would schedule its
        callback there and fail), and the transport, garbage once its loop is gone, would
        warn ``unclosed transport``. So its socket is closed here and the transports
        marked closed (asyncio's private fields, as in ``_inherit``); redis-py's
        connection forgets its streams. The listener is not told: its futures belong to
        the dead loop too.
        """
        self.closed = True
        for each in self._let_go():
            sock = getattr(each, "_sock", None)
            if sock is not None:
                sock.close()
                each._sock = None

    @property
    def direct(self) -> bool:
        """Whether replies are parsed straight off the socket (else redis-py's reads)."""
        return False

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the socket; never blocks."""
        raise NotImplementedError

    def close(self, exc: Exception | None = None) -> None:
        """End the connection now; the listener hears ``on_lost`` (once) with ``exc``."""
        raise NotImplementedError

    async def dispose(self) -> None:
        """Let redis-py forget the connection (after ``close``); never raises."""
        if self.inherited:
            return
        with contextlib.suppress(Exception):
            await self._conn.disconnect(nowait=True)

    def _lost(self, exc: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        self._listener.on_lost(self, exc)


class _DirectWire(Wire, asyncio.Protocol):
    """Replies parsed by hiredis in ``data_received``; writes straight to the transport."""

    def __init__(
        self,
        conn: AbstractConnection,
        listener: WireListener,
        transport: asyncio.Transport,
        previous: asyncio.BaseProtocol,
    ) -> None:
        Wire.__init__(self, conn, listener)
        self._transport = transport
        # redis-py's stream protocol: it still hears the end, so redis-py's own bookkeeping
        # (its disconnect(), its warnings) stays true.
        self._previous = previous
        self._parser = hiredis.Reader(notEnoughData=_MORE, replyError=ErrorReply)
        transport.set_protocol(self)
        if not transport.is_reading():
            transport.resume_reading()

    @property
    def direct(self) -> bool:
        return True

    def write(self, data: bytes) -> None:
        if not self.closed:
            self._transport.write(data)

    def close(self, exc: Exception | None = None) -> None:
        if self.inherited:
            return
        # abort(): nothing more is read or written, and connection_lost follows.
        self._transport.abort()
        self._lost(exc or RedisConnectionError(f"aiolock: connection to {self.peer} closed"))

    # -- asyncio.Protocol ---------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        listener = self._listener
        try:
            while not self.closed:
                reply = parser.gets()
                if reply is _MORE:
                    return
                if reply.__class__ is ErrorReply:
                    listener.on_reply(error_reply(str(reply)))
                elif reply.__class__ is _PUSH:
                    listener.on_push(reply)
                else:
                    listener.on_reply(reply)
        except hiredis.ProtocolError as exc:
            self.close(RedisConnectionError(f"aiolock: protocol error from {self.peer}: {exc}"))
        except Exception as exc:
            # A bug in a listener: end this connection (its callers get an error and the
            # owner reconnects) rather than leave the stream half-read.
            log.exception("aiolock: handling a reply from %s failed", self.peer)
            self.close(RedisConnectionError(f"aiolock: reply handling failed: {exc!r}"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._previous.connection_lost(exc)
        self._lost(RedisConnectionError(f"aiolock: connection to {self.peer} lost: {exc or 'EOF'}"))


class _RedisPyWire(Wire):
    """The fallback: redis-py's public send and read, each in a task of the wire's own."""

    def __init__(self, conn: AbstractConnection, listener: WireListener, *, pushes: bool) -> None:
        super().__init__(conn, listener)
        self._pushes = pushes
        self._out: list[bytes] = []
        self._writer: asyncio.Task[None] | None = None
        self._reader = _own_task(self._read())

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self._out.append(data)
        if self._writer is None:
            self._writer = _own_task(self._write())

    async def _write(self) -> None:
        try:
            while self._out and not self.closed:
                data = b"".join(self._out)
                self._out.clear()
                await self._conn.send_packed_command(data, check_health=False)
        except Exception as exc:
            self.close(RedisConnectionError(f"aiolock: writing to {self.peer} failed: {exc}"))
        finally:
            self._writer = None

    async def _read(self) -> None:
        while not self.closed:
            try:
                # math.inf: no timeout of redis-py's; the owner bounds the silence.
                reply = await self._conn.read_response(
                    timeout=math.inf, disconnect_on_error=False, push_request=self._pushes
                )
            except REPLY_ERRORS as exc:
                reply = from_redis_py(exc)
            except Exception as exc:
                self.close(RedisConnectionError(f"aiolock: reading from {self.peer} failed: {exc}"))
                return
            if not self.closed:
                self._listener.on_reply(reply)

    def close(self, exc: Exception | None = None) -> None:
        if self.inherited:
            return
        for task in (self._reader, self._writer):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._lost(exc or RedisConnectionError(f"aiolock: connection to {self.peer} closed"))

    async def dispose(self) -> None:
        if self.inherited:
            return  # its tasks are the parent's loop's
        # The tasks end before redis-py closes the socket under them.
        tasks = [t for t in (self._reader, self._writer) if t is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await super().dispose()


def _own_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """A task of the wire's own, in an empty context, not the context of its opener or writer.

    The wire outlives whichever call opened it or wrote first, and its reader never ends
    by itself: in that call's context it would pass for the call's work. A sync call's
    undo is every task started in its context once it is cancelled (``sync/_portal.py``):
    a reader opened then (a pub/sub connection still connecting as Ctrl-C came) held the
    interruption for the undo's whole bound and the process's exit for as long again.
    """
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


# Every wire not yet garbage: a forked child marks each inherited.
_open_wires: weakref.WeakSet[Wire] = weakref.WeakSet()


def _inherit_all() -> None:
    for wire in list(_open_wires):
        wire._inherit()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_inherit_all)


def abandon_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close the sockets of every wire of ``loop``, a closed event loop (see ``_abandon``)."""
    for wire in list(_open_wires):
        if wire.loop is loop and not wire.inherited:
            wire._abandon()


def _wanted() -> str:
    return os.environ.get("AIOLOCK_WIRE", "direct")


async def open_wire(
    make_connection: Callable[[], AbstractConnection],
    listener: WireListener,
    *,
    pushes: bool = False,
) -> Wire:
    """Connect a new redis-py connection (its handshake included) and take it over.

    ``pushes``: the connection will carry pub/sub messages (the fallback then asks redis-py
    to return RESP3 pushes as replies). Raises what ``connect()`` raises.
    """
    conn = make_connection()
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except BaseException:
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        raise
    writer = getattr(conn, "_writer", None)
    transport = getattr(writer, "transport", None)
    if (
        _wanted() != "redis-py"
        and isinstance(transport, asyncio.Transport)
        and hasattr(transport, "set_protocol")
    ):
        return _DirectWire(conn, listener, transport, transport.get_protocol())
    return _RedisPyWire(conn, listener, pushes=pushes)


def _describe(conn: AbstractConnection) -> str:
    host = getattr(conn, "host", None)
    port = getattr(conn, "port", None)
    if host is not None:
        return f"{host}:{port}"
    return str(getattr(conn, "path", "") or type(conn).__name__)
