"""The HTTP integrations through real server processes, Redis or the lock taken away at each
phase of a request (issue 37).

tests/http_apps.py serves a payment endpoint from a subprocess: FastAPI under uvicorn, and
aiohttp under its ``AppRunner`` (as ``web.run_app`` serves it, handlers not cancelled on
disconnect). Its Redis connection goes through a fault proxy in this process, so "Redis
unreachable" is a partition (``cut()``), or the release's commands never answered.
For every phase the status is the documented one:

=========================  ===========================  ======
phase                      what happens                 status
=========================  ===========================  ======
waiting                    the wait runs out            423
waiting                    the holder force-unlocked    200
waiting                    Redis unreachable            503 (the handler never ran)
in the handler             the lock force-unlocked      503 (the handler cancelled)
in the handler             Redis unreachable            503 (cancelled at confirmed_until)
after the handler's work   the lock's key gone          200 (its own response)
at the release             Redis unreachable            200 (its own response)
=========================  ===========================  ======

and the server's log has no traceback and no ERROR: each release problem is one WARNING line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from .conftest import ClientFactory
from .faultproxy import FaultProxy, script
from .helpers import wait_until

APPS = Path(__file__).with_name("http_apps.py")
LIMIT = 20.0
#: In the integrations' warning of a completed request's release problem.
COMPLETED = "the request's handler completed"


class Server:
    """A tests/http_apps.py process: its port, its stdout lines, its stderr file."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.port = 0

    async def line(self) -> str:
        """The next line the server prints (``port N``, ``entered N``)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(LIMIT):
            raw = await self.proc.stdout.readline()
        assert raw, f"the server ended: {self.log.read_text()}"
        return raw.decode().strip()

    async def stop(self) -> int:
        """Stop it as its supervisor would (SIGTERM): its exit status."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(LIMIT):
                return await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise


@contextlib.asynccontextmanager
async def serving(framework: str, url: str, name: str, tmp: Path) -> AsyncIterator[Server]:
    log = tmp / f"{framework}.log"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(APPS),
            framework,
            url,
            name,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    server = Server(proc, log)
    try:
        first = await server.line()
        assert first.startswith("port "), first
        server.port = int(first.split()[1])
        yield server
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def subscribed(raw: Redis, channel: str) -> bool:
    """Whether someone waits on ``channel`` (a request waiting for the lock)."""
    counts = await raw.pubsub_numsub(channel)
    return bool(counts and counts[0][1])


@pytest.mark.parametrize("framework", ["fastapi", "aiohttp"])
async def test_each_phase_of_a_request_answers_the_documented_status(  # noqa: PLR0917 - fixtures
    framework: str,
    name: str,
    proxy: FaultProxy,
    make_client: ClientFactory,
    raw: Redis,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url = proxy.url + "?socket_timeout=0.5"
    rival = make_client()
    statuses: dict[str, int] = {}
    async with (
        serving(framework, url, name, tmp_path) as server,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=LIMIT) as http,
    ):

        async def post(path: str) -> int:
            async with asyncio.timeout(LIMIT):
                response = await http.post(path)
            if response.status_code == 200:
                assert response.json() == {"paid": path.split("/")[2].split("?", maxsplit=1)[0]}
            return response.status_code

        statuses["untouched"] = await post("/pay/a")

        # Waiting: the wait runs out.
        async with rival.lock(f"{name}:q"):
            statuses["waiting, wait ran out"] = await post("/quick/q")

        # Waiting: the holder is force-unlocked; the request takes the lock and runs.
        await rival.lock(f"{name}:w").lock()
        waiting = asyncio.create_task(post("/pay/w"))
        await wait_until(
            lambda: subscribed(raw, f"redisson_lock__channel:{{{name}:w}}"),
            limit=LIMIT,
            what="the request waits",
        )
        assert await rival.lock(f"{name}:w").force_unlock()
        statuses["waiting, holder forced"] = await waiting

        # Waiting: Redis unreachable.
        async with proxy.partition():
            statuses["waiting, Redis unreachable"] = await post("/pay/u")

        # In the handler: the lock force-unlocked.
        parked = asyncio.create_task(post("/pay/h1?then=park"))
        assert await server.line() == "entered h1"
        assert await rival.lock(f"{name}:h1").force_unlock()
        statuses["in the handler, lock forced"] = await parked

        # In the handler: Redis unreachable.
        parked = asyncio.create_task(post("/pay/h2?then=park"))
        assert await server.line() == "entered h2"
        async with proxy.partition():
            statuses["in the handler, Redis unreachable"] = await parked

        # After the handler's work: the lock lost without a word (found by the release).
        statuses["after the work, lock gone"] = await post("/pay/f?then=gone")

        # At the release: Redis unreachable (no answer to the release, nor to its resends).
        with proxy.delay(LIMIT, script("lock_release")):
            statuses["at the release, Redis unreachable"] = await post("/pay/r")
            # FastAPI releases after the response has been sent: its warning comes after.
            await wait_until(
                lambda: server.log.read_text().count(COMPLETED) == 2,
                limit=LIMIT,
                what="the release's warning",
            )

        # uvicorn re-raises the signal once it has shut down (the app's lifespan ended).
        assert await server.stop() in (0, -signal.SIGTERM)
    log = server.log.read_text()
    print(f"{framework} statuses: {statuses}")
    print(f"{framework} status counts: {dict(collections.Counter(statuses.values()))}")
    request.node.user_properties.append(("statuses", statuses))
    assert statuses == {
        "untouched": 200,
        "waiting, wait ran out": 423,
        "waiting, holder forced": 200,
        "waiting, Redis unreachable": 503,
        "in the handler, lock forced": 503,
        "in the handler, Redis unreachable": 503,
        "after the work, lock gone": 200,
        "at the release, Redis unreachable": 200,
    }
    assert "Traceback" not in log, log
    assert "ERROR" not in log, log
    completed = [line for line in log.splitlines() if COMPLETED in line]
    assert len(completed) == 2, log
    assert all(line.startswith("WARNING ") for line in completed), log
    for key in ("a", "q", "w", "u", "h1", "h2", "f", "r"):
        await wait_until(partial(_absent, raw, f"{name}:{key}"), limit=LIMIT, what=key)


async def _absent(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 0
