"""A fault-injecting TCP proxy between redis-py clients and the real test server.

Tests that need the network to misbehave (a lost reply, a partition, a slow link, a killed
connection) put this proxy between a client and the server instead of mocking redis-py: the
client runs its real socket code and the server really executes, or never receives, each
command, so a test observes what production would.

The proxy knows just enough RESP to be exact. The client->server stream is split into
commands (redis-py sends arrays of bulk strings), the server->client stream into replies
(framed here, decoded by hiredis), and the n-th reply of a connection answers its n-th
command. RESP3 push messages answer nothing and pass through. A connection that sends
SUBSCRIBE (or any pub/sub or MONITOR command) is a pub/sub connection: its replies no longer
pair with commands, so from then on they are forwarded as they come, but for the messages a
``drop_messages()`` rule takes.

Usage::

    async with FaultProxy.from_url(redis_url) as proxy:
        client = aiolock.Client.from_url(proxy.url + "?socket_timeout=0.3")
        drop = proxy.drop_reply(script("lock_release"))
        ...                                   # the release runs, its reply never arrives
        await drop.executed.wait()

redis-py resends a command that timed out or lost its connection (3 times by default): a
plain ``Redis`` that should show the fault itself needs ``retry=Retry(NoBackoff(), 0)``.

``refuse(match, "TRYAGAIN")`` answers matching commands with an error reply in the
server's place (the server never sees them), as a server refusing a command unrun does:
BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, LOADING, READONLY, OOM (see :data:`REFUSALS`).

Every fault is a handle with ``remove()`` (also a context manager); ``cut()`` is undone by
``restore()``. On exit the proxy closes every connection and ends all of its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import urllib.parse
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Literal, Self

import hiredis

from aiolock._net.scripts import load_script

__all__ = [
    "REFUSALS",
    "Blackhole",
    "Delay",
    "Drop",
    "DropMessage",
    "FaultProxy",
    "Match",
    "ProtocolError",
    "Refuse",
    "Rule",
    "Stats",
    "command",
    "parse_command",
    "reply_end",
    "script",
]

Words = Sequence[bytes]
"""A command as the server sees it: its name and arguments, as bytes."""

Match = Callable[[Words], bool]
"""Chooses commands: called with the words of each command the proxy reads."""

MatchLike = Match | str | None
"""A :data:`Match`, a command name (any case), or ``None`` for every command."""

RestoreMode = Literal["reset", "resume"]

LISTEN_HOST: Final = "127.0.0.1"
_CHUNK: Final = 65536
# Commands after which the server's replies stop pairing one-to-one with commands.
_UNPAIRED: Final = frozenset(
    {
        b"SUBSCRIBE",
        b"PSUBSCRIBE",
        b"SSUBSCRIBE",
        b"UNSUBSCRIBE",
        b"PUNSUBSCRIBE",
        b"SUNSUBSCRIBE",
        b"MONITOR",
    }
)
#: The error replies by which a server refuses a command before running it, as each server
#: words them: ``refuse(match, code)`` answers with these.
REFUSALS: Final = {
    "BUSY": (
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."
    ),
    "TRYAGAIN": "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN": "CLUSTERDOWN The cluster is down",
    "MASTERDOWN": (
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."
    ),
    "LOADING": "LOADING Redis is loading the dataset in memory",
    "READONLY": "READONLY You can't write against a read only replica.",
    "OOM": "OOM command not allowed when used memory > 'maxmemory'.",
}
# hiredis returns False for "incomplete", but RESP3 `#f` is False too: use a sentinel.
_INCOMPLETE: Final = object()


class ProtocolError(Exception):
    """A stream that is not RESP: the proxy could no longer pair replies with commands."""


# --- matchers ------------------------------------------------------------------------------


def command(name: str, *args: str | bytes) -> Match:
    """Match commands called ``name`` (any case) whose first arguments are ``args``."""
    want = name.upper().encode()
    prefix = [a.encode() if isinstance(a, str) else a for a in args]

    def match(words: Words) -> bool:
        return (
            len(words) > len(prefix)
            and words[0].upper() == want
            and list(words[1 : 1 + len(prefix)]) == prefix
        )

    return match


def script(name: str) -> Match:
    """Match runs of the package script ``name``: EVALSHA of its SHA, or EVAL of its text.

    EVAL is matched too because a client falls back to it (or to SCRIPT LOAD + EVALSHA)
    when the server does not know the SHA.
    """
    loaded = load_script(name)
    sha, text = loaded.sha.encode(), loaded.text.encode()

    def match(words: Words) -> bool:
        if len(words) < 2:
            return False
        verb = words[0].upper()
        if verb in (b"EVALSHA", b"EVALSHA_RO"):
            return words[1].lower() == sha
        return verb in (b"EVAL", b"EVAL_RO") and words[1] == text

    return match


def _every(words: Words) -> bool:
    return True


def _as_match(match: MatchLike) -> Match:
    if match is None:
        return _every
    if isinstance(match, str):
        return command(match)
    return match


# --- RESP framing ----------------------------------------------------------------------------


def _int(line: bytes) -> int:
    try:
        return int(line)
    except ValueError:
        raise ProtocolError(f"bad length {line!r}") from None


def parse_command(buf: bytes, pos: int = 0) -> tuple[list[bytes], int] | None:
    """Parse the command starting at ``buf[pos]``: its words and where it ends.

    ``None`` if the command is not complete yet. Inline commands (words separated by
    spaces, as typed into telnet) are accepted too, though redis-py never sends them.
    """
    size = len(buf)
    if pos >= size:
        return None
    if buf[pos] != ord("*"):
        return _parse_inline(buf, pos)
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    count = _int(buf[pos + 1 : eol])
    pos = eol + 2
    words: list[bytes] = []
    for _ in range(count):
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        if buf[pos] != ord("$"):
            raise ProtocolError(f"command word is not a bulk string: {buf[pos : eol + 2]!r}")
        start = eol + 2
        end = start + _int(buf[pos + 1 : eol])
        if end + 2 > size:
            return None
        words.append(buf[start:end])
        pos = end + 2
    return words, pos


def _parse_inline(buf: bytes, pos: int) -> tuple[list[bytes], int] | None:
    eol = buf.find(b"\n", pos)
    if eol < 0:
        return None
    return buf[pos:eol].split(), eol + 1


_LINE: Final = frozenset(b"+-:_,#(")  # one line: simple string, error, integer, null, ...
_BULK: Final = frozenset(b"$=!")  # a length line, then that many bytes and CRLF
_ARRAY: Final = frozenset(b"*~>")  # a count, then that many replies (array, set, push)
_PAIRS: Final = frozenset(b"%|")  # a count, then that many key/value pairs (map, attribute)


def reply_end(buf: bytes, pos: int = 0) -> int | None:
    """Where the reply (RESP2 or RESP3) starting at ``buf[pos]`` ends; ``None`` if incomplete.

    Only the frame is found here (hiredis decodes it): the proxy must know the exact bytes
    of each reply to forward or swallow it, which hiredis's reader does not tell.
    """
    size = len(buf)
    remaining = 1
    while remaining:
        if pos >= size:
            return None
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        kind = buf[pos]
        remaining -= 1
        if kind in _LINE:
            pos = eol + 2
        elif kind in _BULK:
            length = _int(buf[pos + 1 : eol])
            pos = eol + 2 + (length + 2 if length >= 0 else 0)
        elif kind in _ARRAY:
            remaining += max(_int(buf[pos + 1 : eol]), 0)
            pos = eol + 2
        elif kind in _PAIRS:
            # An attribute (|) is followed by the reply it annotates: one more to read.
            remaining += 2 * _int(buf[pos + 1 : eol]) + (kind == ord("|"))
            pos = eol + 2
        else:
            raise ProtocolError(f"unknown reply type {buf[pos : pos + 1]!r}")
    return pos if pos <= size else None


# --- faults ----------------------------------------------------------------------------------


class Rule:
    """Watches the commands that ``match``; the base of every per-command fault.

    Its events tell a test where the (first) matching command got to, so that it can wait
    instead of sleeping: ``received`` (read from the client), ``forwarded`` (written to the
    server), ``executed`` (the server's reply reached the proxy; never set on a pub/sub
    connection, whose replies are not paired).
    """

    def __init__(self, proxy: FaultProxy, match: Match) -> None:
        self._proxy = proxy
        self.match = match
        self.count = 0
        """Commands matched so far."""
        self.words: list[bytes] | None = None
        """The last command matched."""
        self.reply: object = None
        """The last reply, as hiredis decodes it (an error reply is a ``hiredis.ReplyError``)."""
        self.received = asyncio.Event()
        self.forwarded = asyncio.Event()
        self.executed = asyncio.Event()

    @property
    def active(self) -> bool:
        return self in self._proxy._rules

    def remove(self) -> None:
        """Stop matching (commands already matched keep their fate)."""
        with contextlib.suppress(ValueError):
            self._proxy._rules.remove(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def _matched(self, words: list[bytes]) -> None:
        self.count += 1
        self.words = words
        self.received.set()

    def _replied(self, reply: object) -> None:
        self.reply = reply
        self.executed.set()


class Drop(Rule):
    """Swallows the reply of the next matching command; the command still runs.

    One-shot: it stops matching once it has taken a command. A NOSCRIPT reply (an EVALSHA
    the server could not run) is not taken: it is passed on and the drop re-armed, so that
    the drop takes the run that happens. What the connection does
    after the swallowed reply is ``then``: ``"hold"`` keeps it open but dead in both
    directions, as after a lost packet (the client waits until its socket_timeout);
    ``"close"`` closes it (the client sees the connection closed at once).
    """

    def __init__(self, proxy: FaultProxy, match: Match, then: Literal["hold", "close"]) -> None:
        super().__init__(proxy, match)
        self.then = then


class Refuse(Rule):
    """Answers matching commands with an error reply; they never reach the server.

    ``times``: how many commands it answers before it stops matching (None: until
    ``remove()``); those after it are forwarded. Only commands of paired connections are
    refused (a pub/sub connection's replies cannot be placed). The reply takes the place of
    the server's in the connection's order: the replies of the commands sent before it come
    first. ``executed`` is never set: ``answered`` is, at the first refusal.
    """

    def __init__(self, proxy: FaultProxy, match: Match, error: str, times: int | None) -> None:
        super().__init__(proxy, match)
        self.error = error
        self.times = times
        self.frame = b"-" + error.encode() + b"\r\n"
        self.answered = asyncio.Event()


class Delay(Rule):
    """Holds each matching command ``seconds`` before forwarding it.

    Commands behind a held one on the same connection wait too, as on one TCP stream.
    ``remove()`` lets the held commands go at once.
    """

    def __init__(self, proxy: FaultProxy, match: Match, seconds: float) -> None:
        super().__init__(proxy, match)
        self.seconds = seconds
        self._released = asyncio.Event()

    def remove(self) -> None:
        super().remove()
        self._released.set()

    async def _hold(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.seconds):
                await self._released.wait()


#: What a pub/sub connection gets when something is published to a channel it listens to.
_PUBLISHED: Final = ("message", "smessage", "pmessage")


class DropMessage(Rule):
    """Drops what the server sends a pub/sub connection that ``match`` picks, ``times`` times
    (``None``: until removed), then stops matching.

    ``match`` is called with the words of each message a pub/sub connection receives (a
    RESP2 array or a RESP3 push): its kind (``b"message"``, ``b"smessage"``, ``b"pmessage"``,
    ``b"subscribe"``, ...) then its items, so ``[b"message", channel, payload]``. ``count``
    and ``words`` tell the messages dropped; ``dropped`` is set at the first (``received``
    too: the events of a command, ``forwarded`` and ``executed``, are never set). The rule
    lives in a list of its own: commands never reach it.
    """

    def __init__(self, proxy: FaultProxy, match: Match, times: int | None) -> None:
        super().__init__(proxy, match)
        self.times = times
        self.dropped = asyncio.Event()

    @property
    def active(self) -> bool:
        return self in self._proxy._message_drops

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            self._proxy._message_drops.remove(self)

    def _drops(self, words: list[bytes]) -> bool:
        if not self.match(words):
            return False
        self._matched(words)
        self.dropped.set()
        if self.times is not None and self.count >= self.times:
            self.remove()
        return True


def _message_match(channel: str | Callable[[bytes], bool], kinds: Iterable[str]) -> Match:
    """Match messages of ``kinds`` on a channel: a glob pattern (``fnmatch``) or a predicate."""
    wanted = frozenset(kind.lower().encode() for kind in kinds)
    picks = (
        (lambda name: fnmatch.fnmatchcase(name, channel.encode()))
        if isinstance(channel, str)
        else channel
    )

    def match(words: Words) -> bool:
        if len(words) < 2 or words[0].lower() not in wanted:
            return False
        # A pattern subscription's message names the pattern, then the channel.
        at = 2 if words[0].lower() == b"pmessage" else 1
        return len(words) > at and picks(words[at])

    return match


class Blackhole:
    """Discards everything the server sends on pub/sub connections while active."""

    def __init__(self, proxy: FaultProxy) -> None:
        self._proxy = proxy
        self.swallowed = asyncio.Event()
        """Set once some pub/sub bytes were discarded."""
        self.bytes_swallowed = 0

    def remove(self) -> None:
        """Deliver pub/sub traffic again (what was discarded stays lost)."""
        with contextlib.suppress(ValueError):
            self._proxy._blackholes.remove(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


@dataclass
class Stats:
    """Counters over the proxy's whole life."""

    commands: Counter[str] = field(default_factory=Counter)
    """Commands read from clients, by upper-case name (``"EVALSHA"``, ``"CLIENT"``)."""
    replies_dropped: int = 0
    pushes: int = 0
    """RESP3 push messages passed on outside pub/sub (client-side caching invalidations)."""
    connections_accepted: int = 0


# --- one proxied connection ------------------------------------------------------------------


@dataclass
class _Pending:
    """A command forwarded on a paired connection whose reply has not come back yet."""

    rules: list[Rule]
    drop: Drop | None
    #: The reply the proxy gives in the server's place (the command was not forwarded).
    local: bytes | None = None


class _Link:
    """One client connection and its upstream connection, pumped by two tasks."""

    def __init__(
        self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.client_r = reader
        self.client_w = writer
        self.up_r: asyncio.StreamReader | None = None
        self.up_w: asyncio.StreamWriter | None = None
        self.up_ready = asyncio.Event()
        # None in the queue marks the first pub/sub command: replies past it are unpaired.
        self.pending: deque[_Pending | None] = deque()
        self.pubsub = False  # client side: a pub/sub command was sent
        self.raw = False  # server side: replies are forwarded untouched
        self.dead = False  # nothing passes any more, either way
        self.aborted = False  # close without flushing (a kill, a reset)
        self.killed = False  # abort() ran: its task is cancelled once, not per call
        self.decoder = hiredis.Reader(notEnoughData=_INCOMPLETE)
        self.raw_buf = b""  # the start of an unpaired reply not complete yet
        self.task: asyncio.Task[None] | None = None

    def abort(self) -> None:
        """Close at once, discarding whatever is held, as a reset connection would."""
        self.dead = self.aborted = True
        for writer in (self.client_w, self.up_w):
            if writer is not None:
                writer.transport.abort()
        if self.task is not None and not self.killed:
            # Once: a second cancel would interrupt the task's own clean-up.
            self.task.cancel()
        self.killed = True

    async def run(self) -> None:
        c2s = asyncio.create_task(self._client_to_server())
        s2c: asyncio.Task[None] | None = None
        try:
            # A connection accepted during a cut reaches the server only once restored.
            await self.proxy._flowing.wait()
            try:
                self.up_r, self.up_w = await asyncio.open_connection(
                    self.proxy.upstream_host, self.proxy.upstream_port
                )
            except OSError:
                self.aborted = True  # server unreachable: the client sees a closed connection
                return
            if self.dead:
                return
            self.up_ready.set()
            s2c = asyncio.create_task(self._server_to_client())
            await asyncio.wait({c2s, s2c}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.proxy._links.discard(self)
            pumps = [t for t in (c2s, s2c) if t is not None]
            for task in pumps:
                task.cancel()
            for result in await asyncio.gather(*pumps, return_exceptions=True):
                if isinstance(result, Exception):
                    self.proxy.errors.append(result)
            for writer in (self.up_w, self.client_w):
                if writer is not None:
                    await _close(writer, abort=self.aborted)

    async def _open(self) -> bool:
        """Wait until bytes may pass (no cut, upstream connected); False if they never will."""
        flowing = self.proxy._flowing
        while not (flowing.is_set() and self.up_ready.is_set()):
            await flowing.wait()
            await self.up_ready.wait()
        return not self.aborted

    async def _send_up(self, data: bytes, rules: list[Rule]) -> None:
        if data and await self._open() and not self.dead:
            assert self.up_w is not None
            self.up_w.write(data)
            await self.up_w.drain()
            for rule in rules:
                rule.forwarded.set()

    async def _send_down(self, data: bytes) -> None:
        if data and await self._open():
            self.client_w.write(data)
            await self.client_w.drain()

    def _on_command(self, words: list[bytes]) -> tuple[list[Rule], list[Delay], bool]:
        """Count one command, let the rules claim it, and queue it for its reply.

        The last item: whether the proxy answered it itself (it is not forwarded).
        """
        if not words:
            return [], [], False  # an empty inline line: the server ignores it, no reply
        proxy = self.proxy
        name = words[0].upper()
        proxy.stats.commands[name.decode("ascii", "replace")] += 1
        if name in _UNPAIRED and not self.pubsub:
            self.pubsub = True
            self.pending.append(None)
        rules: list[Rule] = []
        delays: list[Delay] = []
        drop: Drop | None = None
        # A refused command is never forwarded: no drop takes it (drops stay armed).
        refuse = None if self.pubsub else self._refusal(words)
        for rule in list(proxy._rules):
            if isinstance(rule, Refuse):
                if rule is not refuse:
                    continue
                if rule.times is not None and rule.count + 1 >= rule.times:
                    rule.remove()
            elif isinstance(rule, Drop):
                # Unpaired replies cannot be told apart, so a drop there would drop the wrong
                # bytes: drops only take commands of paired connections.
                if drop is not None or refuse is not None or self.pubsub or not rule.match(words):
                    continue
                drop = rule
                rule.remove()
            elif not rule.match(words):
                continue
            elif isinstance(rule, Delay):
                delays.append(rule)
            rule._matched(words)
            rules.append(rule)
        if refuse is not None:
            # Answered here, in its turn among the replies: no drop or delay applies.
            self.pending.append(_Pending(rules, None, refuse.frame))
            refuse.answered.set()
            self._answer_local()
            return rules, [], True
        if not self.pubsub:
            self.pending.append(_Pending(rules, drop))
        return rules, delays, False

    def _refusal(self, words: list[bytes]) -> Refuse | None:
        """The first refusing rule that matches ``words``, if any."""
        for rule in self.proxy._rules:
            if isinstance(rule, Refuse) and rule.match(words):
                return rule
        return None

    def _answer_local(self) -> None:
        """Give the client the proxy's own replies due now (none ahead waits for the server).

        Written at once, in the same step as the pairing that made them due, so that they
        keep their place among the server's replies. During a cut they wait for the next
        server reply, as the server's own replies do.
        """
        if not self.dead and self.proxy._flowing.is_set() and (out := self._local_due()):
            self.client_w.write(out)

    async def _client_to_server(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            buf = b""
            while chunk := await self.client_r.read(_CHUNK):
                if self.dead:
                    continue  # keep reading, so the client's close is noticed
                buf += chunk
                pos = 0
                batch = bytearray()
                batch_rules: list[Rule] = []
                while (parsed := parse_command(buf, pos)) is not None:
                    words, end = parsed
                    rules, delays, answered = self._on_command(words)
                    if answered:
                        # Not forwarded: what came before it is, with its rules.
                        await self._send_up(bytes(batch), batch_rules)
                        batch.clear()
                        batch_rules = []
                        pos = end
                        continue
                    if delays:
                        # What came before the held command is not held with it.
                        await self._send_up(bytes(batch), batch_rules)
                        batch.clear()
                        batch_rules = []
                        for delay in delays:
                            await delay._hold()
                    batch += buf[pos:end]
                    batch_rules += rules
                    pos = end
                buf = buf[pos:]
                await self._send_up(bytes(batch), batch_rules)

    async def _server_to_client(self) -> None:
        assert self.up_r is not None
        with contextlib.suppress(ConnectionError, OSError):
            buf = b""
            while chunk := await self.up_r.read(_CHUNK):
                if self.dead:
                    continue
                if self.raw:
                    await self._send_raw(chunk)
                    continue
                buf += chunk
                out, pos, drop, unpaired = self._pair_replies(buf)
                buf = buf[pos:]
                await self._send_down(out)  # the replies before a dropped one still arrive
                if drop is not None:
                    if drop.then == "close":
                        return
                    continue
                if unpaired:
                    await self._send_raw(buf)
                    buf = b""

    def _pair_replies(self, buf: bytes) -> tuple[bytes, int, Drop | None, bool]:
        """Split ``buf`` into replies and settle each.

        Returns what to forward, how many bytes were used, the drop that took a reply (the
        connection is then dead), and whether the rest of ``buf`` is unpaired (pub/sub).
        """
        out = bytearray()
        pos = 0
        while not self.dead:
            if self.pending and self.pending[0] is None:
                self.pending.popleft()
                self.raw = True
                break
            end = reply_end(buf, pos)
            if end is None:
                break
            frame = buf[pos:end]
            pos = end
            reply = self._decode(frame)
            if isinstance(reply, hiredis.PushNotification):
                self.proxy.stats.pushes += 1
                out += frame  # answers no command
                continue
            entry = self.pending.popleft() if self.pending else None
            if entry is None:
                out += frame  # a reply the proxy cannot pair (CLIENT REPLY ON): pass it on
                continue
            drop = entry.drop
            if drop is not None and _not_run(reply):
                # The script was not run, so this is not the reply to lose: pass it on and
                # wait for the client's EVAL or second EVALSHA.
                self.proxy._rules.insert(0, drop)
                drop = None
            for rule in entry.rules:
                if rule is not entry.drop or drop is not None:
                    rule._replied(reply)
            if drop is None:
                out += frame
                out += self._local_due()
                continue
            self.proxy.stats.replies_dropped += 1
            self.dead = True  # whatever follows the lost reply is lost with it
            return bytes(out), pos, drop, False
        return bytes(out), pos, None, self.raw

    def _local_due(self) -> bytes:
        """The proxy's own replies next in line after a server reply (taken off the queue)."""
        out = bytearray()
        while self.pending and (entry := self.pending[0]) is not None and entry.local:
            self.pending.popleft()
            out += entry.local
        return bytes(out)

    def _decode(self, frame: bytes) -> object:
        self.decoder.feed(frame)
        try:
            reply: object = self.decoder.gets()
        except hiredis.ProtocolError:
            # A type hiredis does not know (the blob error `!`) in a frame already checked
            # by reply_end: pass it on undecoded, with a fresh reader for what follows.
            self.decoder = hiredis.Reader(notEnoughData=_INCOMPLETE)
            return frame
        # An attribute comes as its own value before the reply it annotates.
        while (more := self.decoder.gets()) is not _INCOMPLETE:
            reply = more
        if reply is _INCOMPLETE:
            raise ProtocolError(f"hiredis found no complete reply in {frame[:80]!r}")
        return reply

    async def _send_raw(self, data: bytes) -> None:
        # Whole replies only, so that a message can be told and dropped (a client cannot
        # read part of one sooner anyway).
        buf = self.raw_buf + data
        out = bytearray()
        pos = 0
        while (end := reply_end(buf, pos)) is not None:
            if not self._message_dropped(buf[pos:end]):
                out += buf[pos:end]
            pos = end
        self.raw_buf = buf[pos:]
        data = bytes(out)
        if not data:
            return
        holes = self.proxy._blackholes
        if not holes:
            await self._send_down(data)
            return
        for hole in holes:
            hole.bytes_swallowed += len(data)
            hole.swallowed.set()

    def _message_dropped(self, frame: bytes) -> bool:
        """Whether a :class:`DropMessage` takes this pub/sub message."""
        drops = self.proxy._message_drops
        if not drops:
            return False
        reply = self._decode(frame)
        if not isinstance(reply, list):  # a PONG, MONITOR's lines
            return False
        words = [w if isinstance(w, bytes) else str(w).encode() for w in reply]
        return any(drop._drops(words) for drop in list(drops))


def _not_run(reply: object) -> bool:
    """Whether ``reply`` says the command was refused unrun because its script is unknown."""
    return isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT")


async def _close(writer: asyncio.StreamWriter, *, abort: bool) -> None:
    if abort:
        writer.transport.abort()
    else:
        writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
    except asyncio.CancelledError:
        writer.transport.abort()
        raise


# --- the proxy -------------------------------------------------------------------------------


class FaultProxy:
    """A TCP proxy on 127.0.0.1 (a free port) to ``upstream_host:upstream_port``.

    Use it as ``async with``: it listens on entry, and on exit closes every connection and
    waits for all of its tasks. Errors inside the proxy (a stream that is not RESP) are
    collected in :attr:`errors` and raised on exit, so they fail the test.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._db = db
        self._username = username
        self._password = password
        self.stats = Stats()
        self.errors: list[BaseException] = []
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._rules: list[Rule] = []
        self._blackholes: list[Blackhole] = []
        self._message_drops: list[DropMessage] = []
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cut_links: set[_Link] = set()

    @classmethod
    def from_url(cls, url: str) -> FaultProxy:
        """A proxy to the server of a ``redis://`` URL; :attr:`url` keeps its db and user."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "redis" or not parts.hostname:
            # TLS would hide the RESP stream; a unix socket needs no TCP proxy.
            raise ValueError(f"only redis:// URLs can be proxied, not {url!r}")
        path = parts.path.strip("/")
        return cls(
            parts.hostname,
            parts.port or 6379,
            db=int(path) if path else 0,
            username=urllib.parse.unquote(parts.username) if parts.username else None,
            password=urllib.parse.unquote(parts.password) if parts.password else None,
        )

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not listening: use `async with FaultProxy(...)`")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/<db>``, with the upstream URL's credentials."""
        auth = ""
        if self._username or self._password:
            user = urllib.parse.quote(self._username or "", safe="")
            auth = f"{user}:{urllib.parse.quote(self._password or '', safe='')}@"
        return f"redis://{auth}{LISTEN_HOST}:{self.port}/{self._db}"

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._links)

    @property
    def is_cut(self) -> bool:
        return not self._flowing.is_set()

    async def __aenter__(self) -> Self:
        assert ipaddress.ip_address(LISTEN_HOST).is_loopback
        self._server = await asyncio.start_server(self._accept, LISTEN_HOST, 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
        self._rules.clear()
        for link in set(self._links):
            link.abort()
        # Every link task, including those already ending on their own.
        await self._gather(set(self._tasks))
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self.errors and exc_type is None:
            raise self.errors[0]

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, reader, writer)
        if self._server is None or not self._server.is_serving():
            link.abort()
            writer.close()
            return
        self.stats.connections_accepted += 1
        self._links.add(link)
        if self.is_cut:
            self._cut_links.add(link)
        link.task = asyncio.create_task(link.run(), name=f"faultproxy link {self.port}")
        self._tasks.add(link.task)
        link.task.add_done_callback(self._tasks.discard)

    async def _abort(self, links: set[_Link]) -> None:
        for link in links:
            link.abort()
        await self._gather({link.task for link in links if link.task is not None})

    async def _gather(self, tasks: set[asyncio.Task[None]]) -> None:
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):
                self.errors.append(result)

    # --- faults ----------------------------------------------------------------------------

    def watch(self, match: MatchLike = None) -> Rule:
        """Observe matching commands (events and a count), changing nothing."""
        rule = Rule(self, _as_match(match))
        self._rules.append(rule)
        return rule

    def drop_reply(self, match: MatchLike, *, then: Literal["hold", "close"] = "hold") -> Drop:
        """Let the next matching command run on the server, and swallow its reply.

        ``match`` is a predicate on the command's words, a command name, or
        ``script("lock_release")`` for a run of that package script. See :class:`Drop`.
        """
        if then not in ("hold", "close"):
            raise ValueError(f"then must be 'hold' or 'close', not {then!r}")
        drop = Drop(self, _as_match(match), then)
        self._rules.append(drop)
        return drop

    def refuse(self, match: MatchLike, error: str, *, times: int | None = None) -> Refuse:
        """Answer matching commands with the error reply ``error``, never forwarding them.

        ``error``: a key of :data:`REFUSALS` (``"TRYAGAIN"``) or a whole error line
        (``"ERR ..."``). ``times``: refuse that many, then forward (None: every one until
        ``remove()``). See :class:`Refuse`.
        """
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1 or None, not {times!r}")
        text = REFUSALS.get(error, error)
        if not text or "\r" in text or "\n" in text:
            raise ValueError(f"error must be one line of text, not {error!r}")
        rule = Refuse(self, _as_match(match), text, times)
        self._rules.append(rule)
        return rule

    def delay(self, seconds: float, match: MatchLike = None) -> Delay:
        """Hold matching commands (every command by default) ``seconds`` before forwarding."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, not {seconds!r}")
        delay = Delay(self, _as_match(match), seconds)
        self._rules.append(delay)
        return delay

    def blackhole_pubsub(self) -> Blackhole:
        """Discard what the server sends on pub/sub connections, until ``remove()``."""
        hole = Blackhole(self)
        self._blackholes.append(hole)
        return hole

    def drop_messages(
        self,
        channel: str | Callable[[bytes], bool],
        *,
        times: int | None = 1,
        kinds: Iterable[str] = _PUBLISHED,
    ) -> DropMessage:
        """Drop what pub/sub connections receive on ``channel``, ``times`` times (``None``:
        until ``remove()``).

        ``channel`` is a glob pattern (``"lock__channel:{name}*"``) or a predicate on the
        channel's name (bytes). ``kinds`` are the kinds of message taken: what is published
        by default; ``("subscribe",)`` loses the server's confirmations instead. See
        :class:`DropMessage`.
        """
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1 or None, not {times!r}")
        drop = DropMessage(self, _message_match(channel, kinds), times)
        self._message_drops.append(drop)
        return drop

    def cut(self) -> None:
        """Partition: nothing passes on any connection, either way, until :meth:`restore`.

        Bytes are held, not discarded. New connections are accepted but get nothing.
        """
        if not self.is_cut:
            self._flowing.clear()
            self._cut_links = set(self._links)

    async def restore(self, mode: RestoreMode = "reset") -> None:
        """End the partition.

        ``"reset"`` closes every connection that existed during the cut, discarding what
        it held (as connections that timed out on both ends). ``"resume"`` delivers what
        was held, late, as TCP would after a short outage.
        """
        if mode not in ("reset", "resume"):
            raise ValueError(f"mode must be 'reset' or 'resume', not {mode!r}")
        if not self.is_cut:
            return
        victims, self._cut_links = self._cut_links, set()
        if mode == "reset":
            # Aborted before the gate opens, so that none of their held bytes slip through.
            for link in victims:
                link.abort()
        self._flowing.set()
        if mode == "reset":
            await self._abort(victims)

    @contextlib.asynccontextmanager
    async def partition(self, mode: RestoreMode = "reset") -> AsyncIterator[None]:
        """``cut()`` for the body of the ``async with``, then ``restore(mode)``."""
        self.cut()
        try:
            yield
        finally:
            await self.restore(mode)

    async def kill_connections(self) -> int:
        """Close every current connection (clients see the connection closed); how many."""
        links = set(self._links)
        await self._abort(links)
        return len(links)
