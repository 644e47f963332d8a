"""Lua scripts shipped as package data, and the one place they are run and decoded.

Each script is loaded once from ``aiolock/lua/`` and run by EVALSHA; on NOSCRIPT (a fresh or
flushed server) it is loaded with SCRIPT LOAD and run again. Transient connection errors are
retried with the same arguments: every script is written so that a resend is harmless
(acquire by target count, release by unlock latch, rollback by tombstone, renewal is
idempotent).
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

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio import Redis

__all__ = ("Script", "ScriptRunner", "load_script")

T = TypeVar("T")
log = logging.getLogger("aiolock")


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, assembled text and SHA-1 (computed here, never by the server)."""

    name: str
    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())  # noqa: S324


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
    """Runs the package's scripts on one client's command connections.

    It belongs to one :class:`~aiolock.Client` (never shared at class level), so scripts
    always go to that client's server.
    """

    __slots__ = ("_redis", "_retry_attempts", "_retry_interval")

    def __init__(self, redis: Redis, *, retry_attempts: int, retry_interval: float) -> None:
        self._redis = redis
        self._retry_attempts = retry_attempts
        self._retry_interval = retry_interval

    async def run(self, script: Script, keys: list[str], args: list[str | int]) -> Any:
        """Run ``script`` with ``keys``/``args``, retrying transient connection errors."""
        return await self._retrying(lambda: self._evalsha(script, keys, args), script.name)

    async def _evalsha(self, script: Script, keys: list[str], args: list[str | int]) -> Any:
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # The server lost its script cache (restart, SCRIPT FLUSH, failover): load the
            # text once and resend. The SHA is the same, so concurrent callers converge.
            await self._redis.script_load(script.text)
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)

    async def run_batch(
        self, script: Script, calls: list[tuple[list[str], list[str | int]]]
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in ``calls``, all in one round trip.

        One connection checkout for the lot, so a background job (the watchdog) does not
        queue behind a burst of lock calls once per script call. Returns one entry per
        call: its reply, or the error reply as an exception, for the caller to judge.
        Transient connection errors resend the whole batch: only for idempotent scripts.
        """

        async def send(indexes: list[int]) -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for index in indexes:
                    keys, args = calls[index]
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
                return replies

        async def send_all() -> list[Any]:
            replies = await send(list(range(len(calls))))
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                # As in run(): the server lost its script cache; load once, resend those.
                await self._redis.script_load(script.text)
                for index, reply in zip(missing, await send(missing), strict=True):
                    replies[index] = reply
            return replies

        return await self._retrying(send_all, script.name)

    async def command(self, *args: str | int) -> Any:
        """Run one plain command with the same retry policy."""
        return await self._retrying(
            lambda: self._redis.execute_command(*args),  # type: ignore[no-untyped-call]
            str(args[0]),
        )

    async def pipeline(self, *commands: tuple[str, ...]) -> list[Any]:
        """Run plain commands in one round trip, with the same retry policy.

        Error replies come back in the list (as exceptions), for the caller to judge.
        """

        async def send() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
                return replies

        return await self._retrying(send, "pipeline")

    async def _retrying(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        attempt = 0
        while True:
            try:
                return await call()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                attempt += 1
                if attempt > self._retry_attempts:
                    raise
                log.debug("retrying %s after %r (attempt %d)", what, exc, attempt)
                await asyncio.sleep(self._retry_interval)
