"""Lua scripts shipped as package data, and the one place they are run.

Each script is loaded once from ``aiolock/lua/`` and run by EVALSHA on the client's command
connection (``_transport.py``); on NOSCRIPT (a fresh or flushed server) its text is loaded
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

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._lua import read_script
from ._resp import pack, pack_script

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._transport import CommandTransport

__all__ = ("Script", "ScriptRunner", "load_script")

T = TypeVar("T")
log = logging.getLogger("aiolock")


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

    def packed(self, keys: list[str], args: list[str | int]) -> bytes:
        """``EVALSHA`` of this script with ``keys`` and ``args``, as wire bytes."""
        return pack_script(self.sha_bytes, keys, args)


_cache: dict[str, Script] = {}


def load_script(name: str) -> Script:
    """Return the script ``aiolock/lua/<name>.lua``, read from the installed package once.

    Its text is the file with its ``--@include`` lines replaced by the fragments they name
    (see :mod:`aiolock._lua`): one self-contained script, and the SHA-1 is the text's.
    """
    script = _cache.get(name)
    if script is None:
        script = _cache[name] = Script(name, read_script(name))
    return script


class ScriptRunner:
    """Runs the package's scripts on one client's command connection.

    It belongs to one :class:`~aiolock.Client` (never shared at class level), so scripts
    always go to that client's server.
    """

    __slots__ = ("_retry_attempts", "_retry_interval", "_transport")

    def __init__(
        self, transport: CommandTransport, *, retry_attempts: int, retry_interval: float
    ) -> None:
        self._transport = transport
        self._retry_attempts = retry_attempts
        self._retry_interval = retry_interval

    async def run(self, script: Script, keys: list[str], args: list[str | int]) -> Any:
        """Run ``script`` with ``keys``/``args``, retrying transient connection errors."""
        command = script.packed(keys, args)
        try:
            return await self._transport.call(command)
        except NoScriptError:
            pass
        except (RedisConnectionError, RedisTimeoutError) as exc:
            if not self._retry_attempts:
                raise
            log.debug("retrying %s after %r (attempt 1)", script.name, exc)
            await asyncio.sleep(self._retry_interval)
            return await self._retrying(
                lambda: self._evalsha(script, command), script.name, attempt=1
            )
        return await self._retrying(lambda: self._reload(script, command), script.name)

    async def _evalsha(self, script: Script, command: bytes) -> Any:
        try:
            return await self._transport.call(command)
        except NoScriptError:
            return await self._reload(script, command)

    async def _reload(self, script: Script, command: bytes) -> Any:
        # The server lost its script cache (restart, SCRIPT FLUSH, failover): load the text
        # once and resend. The SHA is the same, so concurrent callers converge.
        await self._transport.call(script.load)
        return await self._transport.call(command)

    async def run_batch(
        self, script: Script, calls: list[tuple[list[str], list[str | int]]]
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in ``calls``, all in one round trip.

        Returns one entry per call: its reply, or the error reply as an exception, for the
        caller to judge. Transient connection errors resend the whole batch: only for
        idempotent scripts.
        """
        commands = [script.packed(keys, args) for keys, args in calls]

        async def send_all() -> list[Any]:
            replies = _connection_errors_raised(await self._transport.call_many(commands))
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                # As in run(): the server lost its script cache; load once, resend those.
                await self._transport.call(script.load)
                again = _connection_errors_raised(
                    await self._transport.call_many([commands[i] for i in missing])
                )
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return replies

        return await self._retrying(send_all, script.name)

    async def command(self, *args: str | int) -> Any:
        """Run one plain command with the same retry policy."""
        command = pack(*args)
        return await self._retrying(lambda: self._transport.call(command), str(args[0]))

    async def pipeline(self, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands in one round trip, with the same retry policy.

        Error replies come back in the list (as exceptions), for the caller to judge.
        """
        packed = [pack(*command) for command in commands]

        async def send() -> list[Any]:
            return _connection_errors_raised(await self._transport.call_many(packed))

        return await self._retrying(send, "pipeline")

    async def _retrying(self, call: Callable[[], Awaitable[T]], what: str, attempt: int = 0) -> T:
        while True:
            try:
                return await call()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                attempt += 1
                if attempt > self._retry_attempts:
                    raise
                log.debug("retrying %s after %r (attempt %d)", what, exc, attempt)
                await asyncio.sleep(self._retry_interval)


def _connection_errors_raised(replies: list[Any]) -> list[Any]:
    """``replies``, unless one is an error about the connection rather than its command.

    Such an error (LOADING, NOAUTH: redis-py's ConnectionError family) is raised, as for a
    single call, so the batch is retried or fails as a whole.
    """
    for reply in replies:
        if isinstance(reply, RedisConnectionError):
            raise reply
    return replies
