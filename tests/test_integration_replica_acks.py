"""A request's lock refused for want of replica acknowledgements is a 503, never a 500.

A client with ``replica_acks=1`` on a server with no replica gets ``ReplicaAckError`` from
every acquisition (the hold is given back at once): the request's handler never ran, as
when Redis is unreachable, so the integrations answer 503, in FastAPI's ``hold()`` and in
aiohttp's ``@locked`` alike.
"""

from __future__ import annotations

from typing import Any

import httpx
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from fastapi import Depends, FastAPI

from aiolock.integrations import aiohttp as aiohttp_integration
from aiolock.integrations import fastapi as fastapi_integration

from .conftest import ClientFactory

# No replica answers: WAIT 1 gives up after this long (seconds) and the acquisition fails.
_ACKS: dict[str, Any] = {"replica_acks": 1, "replica_ack_timeout": 0.05, "retry_attempts": 0}


async def test_fastapi_hold_answers_503(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    ran: list[str] = []
    app = FastAPI(lifespan=fastapi_integration.lifespan(redis_url, **_ACKS))

    @app.post("/pay", dependencies=[Depends(fastapi_integration.hold(name, wait=1))])
    async def pay() -> dict[str, str]:
        ran.append("pay")
        return {"paid": "yes"}

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            response = await http.post("/pay")
    assert response.status_code == 503, response.text
    assert "replicas acknowledged" in response.json()["detail"]
    assert ran == []
    # The hold was given back: anyone takes the lock at once.
    other = make_client().lock(name)
    assert await other.try_lock(wait=0)
    await other.unlock()


async def test_aiohttp_locked_answers_503(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    ran: list[str] = []
    app = web.Application()
    aiohttp_integration.setup(app, redis_url, **_ACKS)

    @aiohttp_integration.locked(name, wait=1)
    async def pay(request: web.Request) -> web.Response:
        ran.append("pay")
        return web.json_response({"paid": "yes"})

    app.router.add_post("/pay", pay)
    async with TestClient(TestServer(app)) as http:
        response = await http.post("/pay")
        assert response.status == 503, await response.text()
        assert "replicas acknowledged" in (await response.json())["detail"]
    assert ran == []
    other = make_client().lock(name)
    assert await other.try_lock(wait=0)
    await other.unlock()
