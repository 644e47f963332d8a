"""aiolock.integrations.fastapi on a real FastAPI app and a real server.

Requests go through httpx's ASGI transport with the app's lifespan run; the disconnect test
drives the app as an ASGI server does (a receive channel that says ``http.disconnect``),
since httpx's transport runs the app inside the request and has no way to disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from pydantic import BaseModel

import aiolock
from aiolock.integrations.fastapi import get_client, hold, lifespan

from .conftest import CLOSED_PORT_URL, ClientFactory
from .helpers import wait_until


class Payment(BaseModel):
    amount: int


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, and an HTTP client for it."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http


def app_client(app: FastAPI) -> aiolock.Client:
    client = app.state.aiolock_client
    assert isinstance(client, aiolock.Client)
    return client


def closed(client: aiolock.Client) -> bool:
    return client.closed


def orders_app(url: str, name: str, **hold_options: Any) -> tuple[FastAPI, list[int]]:
    """An app whose POST /orders/{order_id}/pay holds ``{name}:{order_id}``; which ran."""
    ran: list[int] = []
    app = FastAPI(lifespan=lifespan(url, retry_attempts=0))

    @app.post(
        "/orders/{order_id}/pay",
        dependencies=[Depends(hold(name + ":{order_id}", **hold_options))],
    )
    async def pay(
        order_id: int, payment: Payment, client: Annotated[aiolock.Client, Depends(get_client)]
    ) -> dict[str, Any]:
        ran.append(order_id)
        lock = client.lock(f"{name}:{order_id}")
        return {
            "amount": payment.amount,
            "held_by_handler": await lock.is_held_by_current_task(),
        }

    return app, ran


async def test_hold_holds_the_lock_while_the_handler_runs(redis_url: str, name: str) -> None:
    app, ran = orders_app(redis_url, name, wait=2)
    async with serving(app) as http:
        response = await http.post("/orders/7/pay", json={"amount": 5})
        assert response.status_code == 200, response.text
        # The body still reached the handler; the request's task held the lock.
        assert response.json() == {"amount": 5, "held_by_handler": True}
        assert ran == [7]
        assert not await app_client(app).lock(f"{name}:7").is_locked()


async def test_wait_ran_out_is_423_with_retry_after(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    app, ran = orders_app(redis_url, name, wait=0.05, retry_after=3)
    other = make_client()
    async with serving(app) as http, other.lock(f"{name}:7"):
        response = await http.post("/orders/7/pay", json={"amount": 5})
    assert response.status_code == 423
    assert response.headers["Retry-After"] == "3"
    assert name in response.json()["detail"]
    assert ran == []


async def test_retry_after_defaults_to_one_second(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    app, _ = orders_app(redis_url, name, wait=0, kind="fair_lock")
    other = make_client()
    async with serving(app) as http, other.fair_lock(f"{name}:1"):
        response = await http.post("/orders/1/pay", json={"amount": 5})
    assert (response.status_code, response.headers["Retry-After"]) == (423, "1")


async def test_redis_unreachable_is_503(name: str) -> None:
    app, ran = orders_app(CLOSED_PORT_URL, name, wait=2)
    async with serving(app) as http:
        response = await http.post("/orders/7/pay", json={"amount": 5})
    assert response.status_code == 503
    assert ran == []


async def test_a_disconnected_client_stops_waiting_and_never_runs_the_handler(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    app, ran = orders_app(redis_url, name, wait=None)
    other = make_client()
    body = b'{"amount": 5}'
    disconnect = asyncio.Event()
    received: list[str] = []
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        if not received:
            received.append("body")
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/orders/7/pay",
        "raw_path": b"/orders/7/pay",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
        "server": ("test", 80),
        "client": ("127.0.0.1", 40000),
    }
    async with app.router.lifespan_context(app), other.lock(f"{name}:7"):
        waiting = app_client(app).lock(f"{name}:7")
        request = asyncio.create_task(app(scope, receive, send))
        await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="request waits")
        disconnect.set()
        async with asyncio.timeout(5):
            await request
        assert waiting.statistics().tasks_waiting == 0
    # Released by `other` only now: a request still waiting would have taken it and run.
    assert ran == []
    assert sent[0]["status"] == 499


async def test_a_lost_hold_cancels_the_handler_and_is_503(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    started = asyncio.Event()
    finished: list[str] = []
    app = FastAPI(lifespan=lifespan(redis_url, watchdog_timeout=0.6))

    @app.post("/jobs/{job}", dependencies=[Depends(hold(name + ":{job}", wait=2))])
    async def job(job: str) -> str:
        started.set()
        await asyncio.Event().wait()  # until the loss cancels it
        finished.append(job)  # pragma: no cover - never reached
        return job  # pragma: no cover

    async with serving(app) as http:
        request = asyncio.create_task(http.post("/jobs/a"))
        async with asyncio.timeout(5):
            await started.wait()
        assert await make_client().lock(f"{name}:a").force_unlock()
        async with asyncio.timeout(5):
            response = await request
    assert response.status_code == 503
    assert "was lost" in response.json()["detail"]
    assert finished == []


async def test_a_request_cancelled_while_it_waits_raises_cancelled_and_leaves_nothing(
    redis_url: str, name: str, make_client: ClientFactory
) -> None:
    # A server cancelling the request task (uvicorn at shutdown, a timeout middleware):
    # the CancelledError is not turned into an answer, and the wait leaves nothing behind.
    app, ran = orders_app(redis_url, name, wait=None)
    other = make_client()
    async with serving(app) as http, other.lock(f"{name}:7"):
        waiting = app_client(app).lock(f"{name}:7")
        request = asyncio.create_task(http.post("/orders/7/pay", json={"amount": 5}))
        await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="request waits")
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert waiting.statistics().tasks_waiting == 0
    assert ran == []


async def test_lifespan_closes_the_client_and_runs_the_apps_own(redis_url: str) -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def own(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        client = app.state.aiolock_client
        events.append(f"start, client closed: {client.closed}")
        yield {"greeting": "hi"}
        events.append(f"stop, client closed: {client.closed}")

    app = FastAPI(lifespan=lifespan(redis_url, app_lifespan=own))
    async with app.router.lifespan_context(app) as state:
        assert state is not None
        client = state["aiolock_client"]
        assert state["greeting"] == "hi"
        assert isinstance(client, aiolock.Client)
        assert not closed(client)
    assert closed(client)
    assert events == ["start, client closed: False", "stop, client closed: False"]


async def test_get_client_outside_the_lifespan_says_how_to_set_it_up() -> None:
    app = FastAPI()

    @app.get("/")
    async def root(client: Annotated[aiolock.Client, Depends(get_client)]) -> str:
        return client.id  # pragma: no cover - never reached

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        with pytest.raises(RuntimeError, match=r"lifespan=aiolock\.integrations\.fastapi"):
            await http.get("/")


def test_hold_checks_its_arguments_when_made() -> None:
    with pytest.raises(ValueError, match="template must be a non-empty str"):
        hold("")
    with pytest.raises(ValueError, match="positional field"):
        hold("orders:{}")
    with pytest.raises(ValueError, match="kind must be one of"):
        hold("orders:{id}", kind="mutex")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait must be >= 0"):
        hold("orders:{id}", wait=-1)
    with pytest.raises(ValueError, match="retry_after must be >= 0"):
        hold("orders:{id}", retry_after=-1)


async def test_a_template_naming_no_path_parameter_fails_the_request(
    redis_url: str, name: str
) -> None:
    app = FastAPI(lifespan=lifespan(redis_url))

    @app.get("/items/{item_id}", dependencies=[Depends(hold(name + ":{order_id}"))])
    async def item(item_id: int) -> int:
        return item_id  # pragma: no cover - never reached

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            with pytest.raises(LookupError, match="no path parameter 'order_id'"):
                await http.get("/items/3")


def test_importing_aiolock_imports_no_framework() -> None:
    # What redis-py imports by itself (recent releases import opentelemetry where it is
    # installed) is not aiolock's doing.
    code = (
        "import sys; import redis.asyncio; "
        "base = {m.partition('.')[0] for m in sys.modules}; "
        "import aiolock, aiolock.integrations; "
        "new = {m.partition('.')[0] for m in sys.modules} - base; "
        "frameworks = {'fastapi', 'starlette', 'aiohttp', 'anyio', 'opentelemetry'}; "
        "print(sorted(frameworks & new), 'fastapi' in base, 'aiohttp' in base)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[] False False", out.stdout
