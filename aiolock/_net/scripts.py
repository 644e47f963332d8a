"""Lua scripts shipped as package data, and the one place they are run.

Each script is loaded once from ``aiolock/_net/lua/`` and run by EVALSHA on the client's command
connection (``transport.py``); on NOSCRIPT (a fresh or flushed server) its text is loaded
with SCRIPT LOAD through the same connection and the call sent again. Transient connection
errors are retried with the same arguments: every script is written so that a resend is
harmless (acquire by target count, release by unlock latch, rollback by tombstone, renewal
is idempotent).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .acked import acks_of
from .lua_source import read_script
from .resp import pack, pack_script
from .transport import RetiredError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from .topology import Topology
    from .transport import CommandTransport

__all__ = ("Script", "ScriptRunner", "load_script", "refused")

T = TypeVar("T")
log = logging.getLogger("aiolock")

# Error replies by which a server refuses a command before running it: nothing was done, so
# the same command may be sent again. OOM and READONLY come from a script's first write
# only (a script that has written is never stopped by them), so the script changed nothing
# either. A script that fails midway for another reason (ERR, WRONGTYPE) is not a refusal.
_REFUSALS: tuple[type[Exception], ...] = (
    TryAgainError,
    ClusterDownError,
    MasterDownError,
    BusyLoadingError,
    ReadOnlyError,
    OutOfMemoryError,
)
# The refusals of a server state that passes by itself (a slot migration, a cluster or a
# replica catching up, a load from disk; BUSY too): an acquire with a wait rides them out.
# OOM and READONLY (outside Sentinel, whose topology adds it) say the server is full or
# not a primary, which waiting rarely cures: they get the retries of every call only.
_PASSING: tuple[type[Exception], ...] = (
    TryAgainError,
    ClusterDownError,
    MasterDownError,
    BusyLoadingError,
)


# The same by the reply's first word, for a reply redis-py leaves a plain ResponseError:
# BUSY (another client's script or function runs past busy-reply-threshold) has no class
# of its own, and redis-py before 5.1 classes TRYAGAIN, CLUSTERDOWN and MASTERDOWN only in
# its cluster client (so on the public-API fallback wire they arrive unclassed).
# Each of these is of a state that passes by itself, so the one set serves both tests.
_UNCLASSED = frozenset({"BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "LOADING"})


def _code(exc: BaseException) -> str | None:
    """The first word of an error reply redis-py left unclassed (BUSYKEY is not BUSY)."""
    if type(exc) is ResponseError:
        return str(exc).split(" ", 1)[0]
    return None


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is an error reply by which the server refused to run the command."""
    return isinstance(exc, _REFUSALS) or _code(exc) in _UNCLASSED


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, assembled text and SHA-1 (computed here, never by the server)."""

    name: str
    text: str
    sha: str = field(init=False)
    #: The SHA-1 as EVALSHA sends it, and its SCRIPT LOAD packed once.
    sha_bytes: bytes = field(init=False, repr=False)
    load: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.text.encode()).hexdigest()  # noqa: S324
        object.__setattr__(self, "sha", sha)
        object.__setattr__(self, "sha_bytes", sha.encode())
        object.__setattr__(self, "load", pack("SCRIPT", "LOAD", self.text))

    def packed(self, keys: list[str], args: Sequence[str | int | bytes]) -> bytes:
        """``EVALSHA`` of this script with ``keys`` and ``args``, as wire bytes."""
        return pack_script(self.sha_bytes, keys, args)


_cache: dict[str, Script] = {}


def load_script(name: str) -> Script:
    """Return the script ``aiolock/_net/lua/<name>.lua``, read from the installed package once.

    Its text is the file with its ``--@include`` lines replaced by the fragments they name
    (see ``lua_source.py``): one self-contained script, and the SHA-1 is the text's.
    """
    script = _cache.get(name)
    if script is None:
        script = _cache[name] = Script(name, read_script(name))
    return script


class ScriptRunner:
    """Runs the package's scripts on one client's command connections.

    It belongs to one `Client` (never shared at class level), so scripts
    always go to that client's servers: the topology names the connection of each key.
    """

    __slots__ = (
        "_passing",
        "_resend",
        "_retry_attempts",
        "_retry_interval",
        "_route",
        "_topology",
        "_transient",
        "_wait",
        "acks",
    )

    def __init__(
        self,
        topology: Topology,
        *,
        retry_attempts: int,
        retry_interval: float,
        replica_acks: int = 0,
        replica_ack_timeout: float = 1.0,
    ) -> None:
        self._topology = topology
        # WAIT for the replicas, sent behind an acknowledged script (see run_acked).
        self._wait = (
            pack("WAIT", replica_acks, max(1, round(replica_ack_timeout * 1000)))
            if replica_acks
            else None
        )
        #: Whether ``run_acked`` asks for replica acknowledgements (else it is ``run``).
        self.acks = self._wait is not None
        self._route = topology.route
        self._retry_attempts = retry_attempts
        self._retry_interval = retry_interval
        # Every refusal is retried (the command did not run, so the resend is safe).
        self._transient: tuple[type[Exception], ...] = (
            RedisConnectionError,
            RedisTimeoutError,
            *_REFUSALS,
            *topology.transient,
        )
        self._passing: tuple[type[Exception], ...] = (*_PASSING, *topology.transient)
        # What a send may get that a send again (maybe elsewhere) can cure; every error
        # reply, for BUSY has no class (``_retrying`` raises the rest at once).
        self._resend: tuple[type[Exception], ...] = (*self._transient, ResponseError)

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is an error that a later send may not get (retried here)."""
        return isinstance(exc, self._transient) or _code(exc) in _UNCLASSED

    def passing(self, exc: BaseException) -> bool:
        """Whether ``exc`` refused a command for a server state that passes by itself."""
        return isinstance(exc, self._passing) or _code(exc) in _UNCLASSED

    def shard(self, key: str) -> int:
        """Keys of one shard may share a multi-key command (one cluster slot)."""
        return self._topology.shard(key)

    def server(self, key: str) -> CommandTransport | None:
        """The connection ``key``'s commands go to now; None until the layout is known."""
        return self._route(key)

    async def run(self, script: Script, keys: list[str], args: Sequence[str | int | bytes]) -> Any:
        """Run ``script`` with ``keys``/``args``, retrying transient errors and redirects.

        The first send is ``send()``; whatever its reply raises is taken up by ``rerun()``.
        """
        sent = self.send(script, keys, args)
        if sent is None:
            # No known connection with room for it now: sent when there is one.
            command = script.packed(keys, args)
            return await self._retrying(
                lambda to: self._evalsha(to, script, command), keys[0], script.name, None
            )
        try:
            return await sent
        except Exception as exc:
            return await self.rerun(exc, script, keys, args)

    def send(
        self, script: Script, keys: list[str], args: Sequence[str | int | bytes]
    ) -> asyncio.Future[Any] | None:
        """``run()``'s first send, without a coroutine: its reply's future (None: ``run()``).

        Should the future raise, ``rerun(exc, ...)`` does what ``run()`` does after it.
        """
        transport = self._route(keys[0])
        return None if transport is None else transport.send(script.packed(keys, args))

    async def rerun(
        self,
        exc: Exception,
        script: Script,
        keys: list[str],
        args: Sequence[str | int | bytes],
    ) -> Any:
        """``run()`` after a ``send()`` whose reply raised ``exc``: retried as run() would."""
        command = script.packed(keys, args)
        if isinstance(exc, NoScriptError):
            return await self._retrying(
                lambda to: self._evalsha(to, script, command, reload=True),
                keys[0],
                script.name,
                None,
                self._route(keys[0]),
            )
        if isinstance(exc, self._resend):
            return await self._retrying(
                lambda to: self._evalsha(to, script, command), keys[0], script.name, exc
            )
        raise exc

    async def run_acked(
        self, script: Script, keys: list[str], args: Sequence[str | int | bytes]
    ) -> tuple[Any, int | None]:
        """``run()``, then how many replicas acknowledged it (None: none asked for).

        The WAIT goes in the same write, on the server's second connection (``acked.py``):
        it waits for that very write, and holds back no renewal or release.
        """
        wait = self._wait
        if wait is None:
            return await self.run(script, keys, args), None
        command = script.packed(keys, args)

        async def send(to: _Target) -> tuple[Any, int]:
            transport, asking = to
            transport = acks_of(transport)
            batch = [_ASKING, command, wait] if asking else [command, wait]
            replies = await transport.call_many(batch)
            if isinstance(replies[-2], NoScriptError):
                await transport.call(script.load)
                replies = await transport.call_many(batch)
            reply, acked = _connection_errors_raised(replies)[-2:]
            for outcome in (reply, acked):
                if isinstance(outcome, Exception):
                    raise outcome
            return reply, int(acked)

        return await self._retrying(send, keys[0], script.name, None)

    async def _evalsha(
        self, to: _Target, script: Script, command: bytes, *, reload: bool = False
    ) -> Any:
        transport, asking = to
        if reload:
            # The server lost its script cache (restart, SCRIPT FLUSH, failover): load the
            # text once and resend. The SHA is the same, so concurrent callers converge.
            await transport.call(script.load)
        try:
            return await _send(transport, command, asking)
        except NoScriptError:
            await transport.call(script.load)
            return await _send(transport, command, asking)

    async def run_batch(
        self, script: Script, calls: Sequence[tuple[list[str], Sequence[str | int | bytes]]]
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in ``calls``, in one round trip per server.

        Returns one entry per call: its reply, or an exception (its error reply, or the
        connection error that outlasted the retries), for the caller to judge. Transient
        errors resend a server's whole share: only for idempotent scripts.
        """
        commands = [script.packed(keys, args) for keys, args in calls]
        shares: dict[CommandTransport | None, list[int]] = {}
        for index, (keys, _) in enumerate(calls):
            shares.setdefault(self._route(keys[0]), []).append(index)
        replies: list[Any] = [None] * len(calls)

        async def send_share(transport: CommandTransport | None, indexes: list[int]) -> None:
            if transport is None:
                # Not located yet (a cluster before its first map): one by one.
                for index in indexes:
                    replies[index] = await self._caught(script, *calls[index])
                return
            share = [commands[index] for index in indexes]
            try:
                got = await self._retrying(
                    lambda to: self._send_many(to[0], script, share),
                    calls[indexes[0]][0][0],
                    script.name,
                    None,
                    transport,
                    follow=False,
                )
            except (RedisError, OSError) as exc:
                for index in indexes:
                    replies[index] = exc
                return
            for index, reply in zip(indexes, got, strict=True):
                # A slot moved (or moving) since the map was read: that call alone, with
                # run()'s redirects and retries.
                moved = isinstance(reply, _ELSEWHERE)
                replies[index] = await self._caught(script, *calls[index]) if moved else reply

        if len(shares) == 1:
            [(transport, indexes)] = shares.items()
            await send_share(transport, indexes)
        else:
            await asyncio.gather(*(send_share(t, i) for t, i in shares.items()))
        return replies

    async def _caught(
        self, script: Script, keys: list[str], args: Sequence[str | int | bytes]
    ) -> Any:
        try:
            return await self.run(script, keys, args)
        except (RedisError, OSError) as exc:
            return exc

    @staticmethod
    async def _send_many(
        transport: CommandTransport, script: Script, commands: list[bytes]
    ) -> list[Any]:
        replies = _connection_errors_raised(await transport.call_many(commands))
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            # As in run(): the server lost its script cache; load once, resend those.
            await transport.call(script.load)
            again = _connection_errors_raised(
                await transport.call_many([commands[i] for i in missing])
            )
            for index, reply in zip(missing, again, strict=True):
                replies[index] = reply
        return replies

    async def command(self, *args: str | int) -> Any:
        """Run one plain command about the key ``args[1]``, with the same retry policy."""
        command = pack(*args)
        return await self._retrying(
            lambda to: _send(to[0], command, to[1]), str(args[1]), str(args[0]), None
        )

    async def pipeline(self, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands about one key (each ``command[1]``) in one round trip.

        Error replies come back in the list (as exceptions), for the caller to judge.
        """
        packed = [pack(*command) for command in commands]

        async def send(to: _Target) -> list[Any]:
            transport, asking = to
            if asking:
                packed_asking = [part for command in packed for part in (_ASKING, command)]
                replies = await transport.call_many(packed_asking)
                replies = replies[1::2]
            else:
                replies = await transport.call_many(packed)
            return _raised(_connection_errors_raised(replies))

        return await self._retrying(send, commands[0][1], "pipeline", None)

    async def _retrying(
        self,
        call: Callable[[_Target], Awaitable[T]],
        key: str,
        what: str,
        first: Exception | None,
        transport: CommandTransport | None = None,
        *,
        follow: bool = True,
    ) -> T:
        """Send by ``call`` until it is answered: retry transient errors, follow redirects.

        ``first``: the error the first send already got (its transport is ``key``'s).
        ``follow``: MOVED and ASK are followed; else they are raised to the caller.
        """
        attempt = 0
        redirects = 0
        asking = False
        topology = self._topology
        exc = first
        while True:
            if exc is not None:
                if isinstance(exc, RetiredError) or (
                    follow and isinstance(exc, (MovedError, AskError))
                ):
                    # Retired: no fault, the node stopped serving the key's slot while the
                    # call was on its way; sent where the map says now, at once. Bounded
                    # as redirects are: maps read in a failover can disagree a while.
                    redirects += 1
                    if redirects > _MAX_REDIRECTS:
                        raise exc
                    transport, asking = _rerouted(topology, exc)
                    if redirects > _PROMPT_REDIRECTS and not asking:
                        # Bouncing: the nodes disagree on the slot's owner. Resend where
                        # the map says once it was read again (MOVED and all).
                        await topology.settle()
                        transport = None
                    log.debug("%s redirected: %r", what, exc)
                elif self.transient(exc):
                    if transport is not None:
                        topology.failed(transport, exc)
                    attempt += 1
                    if attempt > self._retry_attempts:
                        raise exc
                    log.debug("retrying %s after %r (attempt %d)", what, exc, attempt)
                    await asyncio.sleep(self._retry_interval)
                    transport = None
                    asking = False
                else:
                    raise exc
            try:
                if transport is None:
                    # Inside the try: a map read mid-failover may name no primary for the
                    # slot (ClusterDownError), retried like the server's own CLUSTERDOWN.
                    transport = self._route(key) or await topology.locate(key)
                return await call((transport, asking))
            except self._resend as error:
                exc = error
            else:  # pragma: no cover - returned above
                raise AssertionError


#: Where one send goes: the connection, and whether an ASK redirect sent it there.
_Target = tuple["CommandTransport", bool]
# As redis-py's cluster client: a chain of redirects this long means a map that keeps
# changing, not a slot in migration.
_MAX_REDIRECTS = 16
# A slot's move takes one redirect, a migration's ASK one more; past that the nodes disagree
# (a failover spreading) and each further resend waits for the topology to settle.
_PROMPT_REDIRECTS = 2
_ASKING = pack("ASKING")
# Error replies in a batch that the call alone, sent again, may not get.
_ELSEWHERE = (MovedError, AskError, TryAgainError, ClusterDownError)


def _rerouted(
    topology: Topology, exc: AskError | RetiredError
) -> tuple[CommandTransport | None, bool]:
    """Where a call goes next after ``exc`` (None: by the map), and whether behind ASKING."""
    if isinstance(exc, RetiredError):
        return None, False
    # MovedError is an AskError: only a real ASK sends the one call behind ASKING.
    return topology.redirected(exc), not isinstance(exc, MovedError)


async def _send(transport: CommandTransport, command: bytes, asking: bool) -> Any:  # noqa: FBT001
    """Send one command; after an ASK redirect, behind an ASKING on the same connection."""
    if not asking:
        return await transport.call(command)
    _, reply = await transport.call_many([_ASKING, command])
    if isinstance(reply, Exception):
        raise reply
    return reply


def _raised(replies: list[Any]) -> list[Any]:
    """``replies``, unless one is a redirect: the pipeline then goes where it points."""
    for reply in replies:
        if isinstance(reply, (MovedError, AskError)):
            raise reply
    return replies


def _connection_errors_raised(replies: list[Any]) -> list[Any]:
    """``replies``, unless one is an error about the connection rather than its command.

    Such an error (LOADING, NOAUTH: redis-py's ConnectionError family) is raised, as for a
    single call, so the batch is retried or fails as a whole.
    """
    for reply in replies:
        if isinstance(reply, RedisConnectionError):
            raise reply
    return replies
