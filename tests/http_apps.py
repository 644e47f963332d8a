"""A payment endpoint on a real HTTP server process, for tests/test_integration_servers.py.

``python tests/http_apps.py (fastapi|aiohttp) REDIS_URL NAME`` serves, on a port of its own
(printed as ``port N`` on stdout), FastAPI under uvicorn or aiohttp under its
``AppRunner`` (as ``web.run_app`` serves it), with the app's aiolock client for
``REDIS_URL`` (``watchdog_timeout=1``, redis-py's retries as by default):

- ``POST /pay/{n}?then=...`` holds ``{NAME}:{n}`` (``wait=5``), then, by ``then``:
  ``done`` answers at once; ``gone`` deletes its own lock's key first (the lock lost,
  silently, after the work was done); ``park`` prints ``entered N`` on stdout
  and waits until it is cancelled (the test then takes the lock or the server away).
  It answers ``{"paid": n}``.
- ``POST /quick/{n}`` the same with ``wait=0.2``.

Run as a script (not ``-m``): the installed aiolock is imported, as the suite's is.
Logs go to stderr, which the test reads for tracebacks and the release warning.
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations.

import asyncio
import logging
import signal
import socket
import sys
from typing import Annotated

import uvicorn
from aiohttp import web
from fastapi import Depends, FastAPI, Query
from redis.asyncio import Redis

from aiolock.integrations import aiohttp as aiohttp_integration
from aiolock.integrations import fastapi as fastapi_integration

WATCHDOG = 1.0


async def then(kind: str, url: str, lock: str, n: str) -> None:
    """What the handler does while it holds ``lock``."""
    if kind == "gone":
        # The lock's key gone without a word (its lease ran out, a failover lost it): no
        # message tells the holder, its release finds it.
        raw = Redis.from_url(url)
        try:
            await raw.delete(lock)
        finally:
            await raw.aclose()
    elif kind == "park":
        print(f"entered {n}", flush=True)
        await asyncio.Event().wait()


def fastapi_app(url: str, name: str) -> FastAPI:
    hold = fastapi_integration.hold
    app = FastAPI(lifespan=fastapi_integration.lifespan(url, watchdog_timeout=WATCHDOG))

    @app.post("/pay/{n}", dependencies=[Depends(hold(name + ":{n}", wait=5))])
    async def pay(n: str, then_: Annotated[str, Query(alias="then")] = "done") -> dict[str, str]:
        await then(then_, url, f"{name}:{n}", n)
        return {"paid": n}

    @app.post("/quick/{n}", dependencies=[Depends(hold(name + ":{n}", wait=0.2))])
    async def quick(n: str) -> dict[str, str]:
        return {"paid": n}

    return app


def aiohttp_app(url: str, name: str) -> web.Application:
    locked = aiohttp_integration.locked
    app = web.Application()
    aiohttp_integration.setup(app, url, watchdog_timeout=WATCHDOG)

    @locked(name + ":{n}", wait=5)
    async def pay(request: web.Request) -> web.Response:
        n = request.match_info["n"]
        await then(request.query.get("then", "done"), url, f"{name}:{n}", n)
        return web.json_response({"paid": n})

    @locked(name + ":{n}", wait=0.2)
    async def quick(request: web.Request) -> web.Response:
        return web.json_response({"paid": request.match_info["n"]})

    app.router.add_post("/pay/{n}", pay)
    app.router.add_post("/quick/{n}", quick)
    return app


async def serve_fastapi(url: str, name: str, sock: socket.socket) -> None:
    config = uvicorn.Config(fastapi_app(url, name), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


async def serve_aiohttp(url: str, name: str, sock: socket.socket) -> None:
    runner = web.AppRunner(aiohttp_app(url, name))
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    framework, url, name = sys.argv[1:4]
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s"
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is told: a request sent before the server runs waits in
    # the backlog instead of being refused.
    sock.listen(128)
    print(f"port {sock.getsockname()[1]}", flush=True)
    serve = serve_fastapi if framework == "fastapi" else serve_aiohttp
    asyncio.run(serve(url, name, sock))


if __name__ == "__main__":
    main()
