"""aiolock.integrations.aiohttp on a real aiohttp server and a real Redis server.

aiohttp's TestServer cancels handlers when their client disconnects; ``web.run_app`` does
not by default: the disconnect test runs on both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import aiolock
from aiolock.integrations.aiohttp import client_key, locked, setup

from .conftest import CLOSED_PORT_URL, ClientFactory
from .helpers import wait_until


def orders_app(
    url: str, name: str, *, wait: float | None, **options: object
) -> tuple[web.Application, list[str]]:
    """An app whose POST /orders/{order_id}/pay holds ``{name}:{order_id}``; which ran."""
    ran: list[str] = []
    app = web.Application()
    setup(app, url, retry_attempts=0)

    @locked(name + ":{order_id}", wait=wait, **options)  # type: ignore[arg-type]
    async def pay(request: web.Request) -> web.Response:
        order_id = request.match_info["order_id"]
        ran.append(order_id)
        lock = request.app[client_key].lock(f"{name}:{order_id}")
        return web.json_response({"held_by_handler": await lock.is_held_by_current_task()})

    app.router.add_post("/orders/{order_id}/pay", pay)
    return app, ran


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(app)) as http:
        yield http


async def test_locked_holds_the_lock_while_the_handler_runs(redis_url: str, name: str) -> None:
    app, ran = orders_app(redis_url, name, wait=2)
    async with serving(app) as http:
        response = await http.post("/orders/7/pay")
        assert response.status == 200
        assert await response.json() == {"held_by_handler": True}
        assert ran == ["7"]
        assert not await app[client_key].lock(f"{name}:7").is_locked()


async def test_wait_ran_out_is_423_with_retry_after(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    app, ran = orders_app(redis_url, name, wait=0.05, kind="write_lock")
    other = make_client()
    async with serving(app) as http, other.read_write_lock(f"{name}:7").read_lock():
        response = await http.post("/orders/7/pay")
        assert response.status == 423
        assert response.headers["Retry-After"] == "1"
        assert name in (await response.json())["detail"]
    assert ran == []


async def test_redis_unreachable_is_503(name: str) -> None:
    app, ran = orders_app(CLOSED_PORT_URL, name, wait=2)
    async with serving(app) as http:
        response = await http.post("/orders/7/pay")
        assert response.status == 503
    assert ran == []


@contextlib.asynccontextmanager
async def running(app: web.Application, *, handler_cancellation: bool) -> AsyncIterator[int]:
    """The app on a real server, as ``web.run_app`` serves it; its port."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        (address,) = runner.addresses
        yield address[1]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("handler_cancellation", [True, False])
async def test_a_disconnected_client_stops_waiting_and_never_runs_the_handler(
    redis_url: str, name: str, make_client: ClientFactory, handler_cancellation: bool
) -> None:
    app, ran = orders_app(redis_url, name, wait=None)
    other = make_client()
    async with (
        running(app, handler_cancellation=handler_cancellation) as port,
        other.lock(f"{name}:7"),
    ):
        waiting = app[client_key].lock(f"{name}:7")
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /orders/7/pay HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n")
        await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="request waits")
        writer.close()
        await writer.wait_closed()
        await wait_until(lambda: waiting.statistics().tasks_waiting == 0, what="wait stopped")
    # Released by `other` only now: a request still waiting would have taken it and run.
    assert ran == []


async def test_a_lost_hold_cancels_the_handler_and_is_503(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    started = asyncio.Event()
    finished: list[str] = []
    app = web.Application()
    setup(app, redis_url, watchdog_timeout=0.6)

    @locked(name + ":{job}", wait=2)
    async def job(request: web.Request) -> web.Response:
        started.set()
        await asyncio.Event().wait()  # until the loss cancels it
        finished.append("job")  # pragma: no cover - never reached
        return web.Response()  # pragma: no cover

    app.router.add_post("/jobs/{job}", job)
    async with serving(app) as http:
        request = asyncio.create_task(http.post("/jobs/a"))
        async with asyncio.timeout(5):
            await started.wait()
        assert await make_client().lock(f"{name}:a").force_unlock()
        async with asyncio.timeout(5):
            response = await request
        assert response.status == 503
        assert "was lost" in (await response.json())["detail"]
    assert finished == []


async def test_setup_closes_the_client_at_cleanup(redis_url: str) -> None:
    app = web.Application()
    setup(app, redis_url)
    async with serving(app):
        client = app[client_key]
        assert isinstance(client, aiolock.Client)
        assert not client.closed
    assert client.closed


async def test_locked_without_setup_says_how(name: str) -> None:
    app = web.Application()

    @locked(name + ":{id}")
    async def item(request: web.Request) -> web.Response:
        return web.Response()  # pragma: no cover - never reached

    app.router.add_get("/items/{id}", item)
    async with serving(app) as http:
        response = await http.get("/items/1")
        assert response.status == 500
