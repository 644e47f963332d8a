"""The HTTP integrations' answer when something goes wrong after the handler ran (issue 37).

The rule, the same for aiohttp's ``@locked`` and FastAPI's ``hold()``: a handler that
completed gets its own response; a release that fails (Redis unreachable) or finds the lock
lost is logged once at WARNING, one line and no traceback, and the loss is in the client's
events; 503 only when the handler was cancelled or never ran. Each case runs on both
frameworks, in process: aiohttp's TestServer and httpx's ASGITransport (the FastAPI
recipe's test setup, under which a raise after the response is a ``RuntimeError`` in the
test). tests/test_integration_servers.py drives the same phases through real server
processes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from fastapi import Depends, FastAPI, HTTPException
from redis.asyncio import Redis

from aiolock.events import Event, Lost, Released
from aiolock.integrations import aiohttp as aiohttp_integration
from aiolock.integrations import fastapi as fastapi_integration

from .conftest import ClientFactory
from .faultproxy import FaultProxy, script

Framework = Literal["aiohttp", "fastapi"]
FRAMEWORKS: tuple[Framework, ...] = ("aiohttp", "fastapi")

#: What the handler does once it holds the lock (its work then done): the lock's name.
Work = Callable[[str], Awaitable[None]]

Post = Callable[[str], Awaitable[tuple[int, Any]]]


@contextlib.asynccontextmanager
async def serving(
    framework: Framework, url: str, name: str, work: Work, events: list[Event]
) -> AsyncIterator[tuple[Post, list[str]]]:
    """An app whose POST /pay/{n} holds ``{name}:{n}``, runs ``work``, answers ``{"paid": n}``.

    Yields a way to post (status, JSON body) and the list of payments made. The app's
    client's events go to ``events``.
    """
    paid: list[str] = []
    if framework == "aiohttp":
        app = web.Application()
        aiohttp_integration.setup(app, url, retry_attempts=0)

        @aiohttp_integration.locked(name + ":{n}", wait=2)
        async def pay(request: web.Request) -> web.Response:
            n = request.match_info["n"]
            await work(f"{name}:{n}")
            paid.append(n)
            return web.json_response({"paid": n})

        app.router.add_post("/pay/{n}", pay)

        async def listen(app: web.Application) -> AsyncIterator[None]:
            app[aiohttp_integration.client_key].add_listener(events.append)
            yield

        app.cleanup_ctx.append(listen)
        async with TestClient(TestServer(app)) as http:

            async def post_aiohttp(path: str) -> tuple[int, Any]:
                response = await http.post(path)
                return response.status, await response.json()

            yield post_aiohttp, paid
        return

    fast = FastAPI(lifespan=fastapi_integration.lifespan(url, retry_attempts=0))

    @fast.post("/pay/{n}", dependencies=[Depends(fastapi_integration.hold(name + ":{n}", wait=2))])
    async def pay_fastapi(n: str) -> dict[str, str]:
        await work(f"{name}:{n}")
        paid.append(n)
        return {"paid": n}

    async with fast.router.lifespan_context(fast):
        fast.state.aiolock_client.add_listener(events.append)
        transport = httpx.ASGITransport(app=fast)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as asgi:

            async def post_fastapi(path: str) -> tuple[int, Any]:
                response = await asgi.post(path)
                return response.status_code, response.json()

            yield post_fastapi, paid


def release_problems(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The integrations' log records of a completed request's release problem."""
    return [r for r in caplog.records if "the request's handler completed" in r.getMessage()]


def assert_logged_once_plainly(caplog: pytest.LogCaptureFixture, name: str) -> None:
    """One WARNING line about the release, no traceback anywhere, nothing at ERROR."""
    (record,) = release_problems(caplog)
    assert record.levelno == logging.WARNING
    assert name in record.getMessage()
    assert "\n" not in record.getMessage()
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_lock_lost_after_the_work_was_done_still_answers_the_handlers_response(
    framework: Framework,
    redis_url: str,
    name: str,
    raw: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lock is gone without a word while the handler finishes (its lease ran out, a
    failover lost it: no message tells the holder), found only by the release: the payment
    was made, so the client gets 200 and its body (a 503 would make a retrying client pay
    twice). A loss the client hears of while the handler runs cancels it instead (503,
    tests/test_integration_servers.py)."""

    async def forced_meanwhile(lock: str) -> None:
        assert await raw.delete(lock) == 1

    events: list[Event] = []
    caplog.set_level(logging.WARNING, logger="aiolock")
    async with serving(framework, redis_url, name, forced_meanwhile, events) as (post, paid):
        status, body = await post("/pay/9")
    assert (status, body) == (200, {"paid": "9"})
    assert paid == ["9"]
    assert_logged_once_plainly(caplog, f"{name}:9")
    # The hold's end is in the events: a loss, not a release.
    assert [type(e) for e in events if isinstance(e, Lost | Released)] == [Lost]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_release_that_cannot_reach_redis_still_answers_the_handlers_response(
    framework: Framework,
    name: str,
    proxy: FaultProxy,
    make_client: ClientFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis goes away exactly at the release (its connection closes under the release's
    script): 200 and the handler's body, one WARNING line, not a 500 or a traceback."""
    url = proxy.url + "?socket_timeout=2"
    proxy.drop_reply(script("lock_release"), then="close")

    async def done(lock: str) -> None:
        pass

    events: list[Event] = []
    caplog.set_level(logging.WARNING, logger="aiolock")
    async with serving(framework, url, name, done, events) as (post, paid):
        status, body = await post("/pay/3")
    assert (status, body) == (200, {"paid": "3"})
    assert paid == ["3"]
    assert_logged_once_plainly(caplog, f"{name}:3")
    # The release cut off is finished in the background (by the app's close at the
    # latest): the hold ends in exactly one end event.
    ends = [type(e) for e in events if isinstance(e, Lost | Released)]
    assert ends in ([Released], [Lost]), events
    # The release ran on the server (only its reply was lost): nobody holds the lock.
    assert not await make_client().lock(f"{name}:3").is_locked()


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_handler_that_raises_keeps_its_own_error_when_the_lock_was_lost(
    framework: Framework,
    redis_url: str,
    name: str,
    raw: Redis,
) -> None:
    """A handler's own HTTP error is its response even when the lock was lost meanwhile."""

    async def refuse(lock: str) -> None:
        assert await raw.delete(lock) == 1
        if framework == "aiohttp":
            raise web.HTTPConflict(
                text='{"detail": "already paid"}', content_type="application/json"
            )
        raise HTTPException(409, "already paid")

    async with serving(framework, redis_url, name, refuse, []) as (post, paid):
        status, body = await post("/pay/4")
    assert (status, body) == (409, {"detail": "already paid"})
    assert paid == []
