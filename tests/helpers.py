"""Test helpers: waiting on conditions with a deadline, and gating a chosen command."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from aiolock._scripts import load_script


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], *, limit: float = 10.0, what: str = ""
) -> None:
    """Wait until ``predicate()`` is true; fail the test if ``limit`` seconds pass first.

    For state owned by Redis or by other tasks, where no event can be awaited directly.
    """
    deadline = time.monotonic() + limit
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {limit} s: {what or predicate}")
        await asyncio.sleep(0.005)


class Gate:
    """Holds the reply of one chosen script call: sent to the server, reply pending.

    Armed ``before_send``, it holds the call before it is sent instead (``sent`` is then
    set when the call is ready to go). Armed ``swallow_cancel``, a cancel that lands while
    the reply is held is swallowed and the reply returned all the same, as Python 3.11's
    ``asyncio.wait_for`` (which redis-py wraps around every socket write) can do.
    """

    def __init__(self) -> None:
        self.target: bytes | None = None
        self.before_send = False
        self.swallow_cancel = False
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    def arm(self, script: str, *, before_send: bool = False, swallow_cancel: bool = False) -> None:
        """Gate the next EVALSHA of the package script ``script``."""
        self.target = load_script(script).sha.encode()
        self.before_send = before_send
        self.swallow_cancel = swallow_cancel
        self.sent = asyncio.Event()
        self.release = asyncio.Event()


class _GatedConnection(Connection):
    gate: Gate
    _gated = False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        gate = self.gate
        data = b"".join(command) if isinstance(command, list) else command
        if gate.target is not None and isinstance(data, bytes) and gate.target in data:
            gate.target = None
            if gate.before_send:
                gate.sent.set()
                await gate.release.wait()
                await super().send_packed_command(command, check_health)
                return
            self._gated = True
        await super().send_packed_command(command, check_health)
        if self._gated:
            gate.sent.set()

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if self._gated:
            self._gated = False
            try:
                await self.gate.release.wait()
            except asyncio.CancelledError:
                if not self.gate.swallow_cancel:
                    await self.disconnect(nowait=True)
                    raise
                # What 3.11's wait_for does when the cancel and the result meet: it
                # returns the result and the task carries on with cancelling() > 0.
                await self.gate.release.wait()
            except BaseException:
                # Exactly what redis-py does when a pending read is interrupted: the
                # reply can no longer be matched to its command, so drop the connection.
                await self.disconnect(nowait=True)
                raise
        return await super().read_response(*args, **kwargs)


def gated_redis(url: str) -> tuple[Redis, Gate]:
    """A redis client whose connections pause the reply of a gated command."""
    gate = Gate()
    connection_class = type("GatedConnection", (_GatedConnection,), {"gate": gate})
    redis = Redis.from_url(url, connection_class=connection_class)
    return redis, gate


def _settling(client: Any) -> set[Any]:
    """The client's background completions still running (rollbacks, releases, leaves).

    The long-lived background tasks (renewal, pub/sub reader, latch sweeper) do not count.
    """
    lasting = {client._renewal._task, client._dispatcher._reader, client._latches._task}
    return {task for task in client._background.tasks if task not in lasting}


async def quiesce(client: Any, *, limit: float = 30.0) -> None:
    """Wait until every background completion of ``client`` has finished.

    A cancelled or cut-off call finishes its work (undo an acquire, complete a release,
    leave a fair queue) in the background; checks of Redis state against the client's
    belief are made once that work is done.
    """
    await wait_until(lambda: not _settling(client), limit=limit, what="background work settled")
