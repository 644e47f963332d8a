"""The examples in examples/ run against the test server, as their users would run them.

Each example's keys get the test's uid through ``key_prefix`` (the examples use plain
names such as ``orders:7``), so the leak check covers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from redis import Redis as SyncRedis
from redis.asyncio import Redis

import aiolock
import aiolock.sync

from .conftest import ClientFactory
from .helpers import wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str) -> ModuleType:
    """Import ``examples/{name}.py`` (the examples are not installed with the package)."""
    qualified = f"examples.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module


@contextlib.asynccontextmanager
async def asgi(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http


async def test_fastapi_service(
    redis_url: str, uid: str, raw: Redis, make_client: ClientFactory
) -> None:
    app = example("fastapi_service").create_app(redis_url, key_prefix=f"{uid}:")
    async with asgi(app) as http:
        first = await http.post("/orders/7/pay", json={"amount": 5})
        second = await http.post("/orders/7/pay", json={"amount": 6})
        assert (first.status_code, second.status_code) == (200, 200)
        assert second.json()["fencing_token"] > first.json()["fencing_token"]
        assert (await http.get("/orders/7")).json()["payments"] == 2
        # Another replica is paying the same order: this request waits for it, then pays.
        other = make_client(key_prefix=f"{uid}:")
        paying = other.fenced_lock("orders:7")
        await paying.lock()
        request = asyncio.create_task(http.post("/orders/7/pay", json={"amount": 7}))
        waiting = app.state.aiolock_client.fenced_lock("orders:7")
        await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="request waits")
        await paying.unlock()
        async with asyncio.timeout(5):
            third = await request
        assert third.status_code == 200
        assert third.json()["fencing_token"] > second.json()["fencing_token"] + 1
    assert [amount for _, amount in app.state.ledger[7]] == [5, 6, 7]
    # The fencing token counter outlives the lock by design; nothing else is left.
    await raw.delete(f"{uid}:redisson_lock_token:{{orders:7}}")


async def test_aiohttp_service(redis_url: str, uid: str, make_client: ClientFactory) -> None:
    service = example("aiohttp_service")
    app = service.create_app(redis_url, key_prefix=f"{uid}:")
    async with TestClient(TestServer(app)) as http:
        response = await http.post("/reports/daily")
        assert response.status == 200
        assert (await response.json())["builds"] == 1
        # Another replica is building it: this request waits for it, then builds.
        other = make_client(key_prefix=f"{uid}:")
        building = other.lock("reports:daily")
        await building.lock()
        request = asyncio.create_task(http.post("/reports/daily"))
        waiting = app[service.client_key].lock("reports:daily")
        await wait_until(lambda: waiting.statistics().tasks_waiting == 1, what="request waits")
        await building.unlock()
        async with asyncio.timeout(5):
            response = await request
        assert response.status == 200
        assert (await response.json())["builds"] == 2


async def test_leader_scheduler_runs_on_one_client_and_fails_over(
    redis_url: str, uid: str, make_client: ClientFactory
) -> None:
    schedule = example("leader_scheduler").schedule
    ticks: list[str] = []
    clients = [make_client(key_prefix=f"{uid}:") for _ in range(2)]

    def job_of(client: aiolock.Client) -> Any:
        async def job() -> None:
            ticks.append(client.id)

        return job

    runs = {
        client.id: asyncio.create_task(schedule(client, "scheduler", job_of(client), every=0.01))
        for client in clients
    }
    try:
        await wait_until(lambda: len(ticks) >= 5, what="five ticks")
        first = ticks[0]
        assert set(ticks) == {first}, "two leaders ticked"
        # The leader stops (a deploy): the other takes over without waiting out a lease.
        runs[first].cancel()
        await asyncio.gather(runs[first], return_exceptions=True)
        count = len(ticks)
        await wait_until(lambda: len(ticks) >= count + 3, limit=5, what="the other ticks")
        assert set(ticks[count:]) == set(runs) - {first}
    finally:
        for run in runs.values():
            run.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)


README = EXAMPLES.parent / "README.md"


def readme_part(name: str) -> str:
    """The lines of ``examples/{name}.py`` between its ``--8<--`` markers (the README's)."""
    text = (EXAMPLES / f"{name}.py").read_text()
    start = text.index("# --8<-- [start:readme]\n") + len("# --8<-- [start:readme]\n")
    return text[start : text.index("# --8<-- [end:readme]")].strip() + "\n"


@pytest.mark.parametrize("name", ["fastapi_quickstart", "aiohttp_quickstart"])
def test_the_readme_quotes_its_examples_verbatim(name: str) -> None:
    """The README's framework snippets are these files' (run and type-checked below)."""
    assert f"```python\n{readme_part(name)}```" in README.read_text()


def quickstart(name: str, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> ModuleType:
    """Import ``examples/{name}.py`` afresh, its client pointed at the test server."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.delitem(sys.modules, f"examples.{name}", raising=False)
    return example(name)


async def test_fastapi_quickstart(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = quickstart("fastapi_quickstart", monkeypatch, redis_url).app
    async with asgi(app) as http:
        response = await http.post("/orders/7/pay")
        assert (response.status_code, response.json()) == (200, {"paid": 7})


async def test_aiohttp_quickstart(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = quickstart("aiohttp_quickstart", monkeypatch, redis_url).app
    async with TestClient(TestServer(app)) as http:
        response = await http.post("/reports/daily")
        assert (response.status, await response.json()) == (200, {"built": "daily"})


# --------------------------------------------------------------------------- aiolock.sync


@pytest.fixture
def sync_client(redis_url: str, uid: str) -> Iterator[aiolock.sync.Client]:
    """A sync client whose keys carry the test's uid; nothing of it may remain."""
    with aiolock.sync.Client.from_url(redis_url, key_prefix=f"{uid}:") as client:
        yield client
    with SyncRedis.from_url(redis_url) as redis:
        # A fenced lock's token counter outlives the lock by design.
        redis.delete(*redis.keys(f"redisson_lock_token:*{uid}*") or ["-"])
        assert redis.keys(f"*{uid}*") == []


def test_sync_flask_pay_one_at_a_time(sync_client: aiolock.sync.Client, uid: str) -> None:
    """Request threads paying one order take turns, each with a newer fencing token."""
    flask_example = example("sync_flask")
    ledger = flask_example.Ledger()
    answers: list[dict[str, int]] = []
    threads = [
        threading.Thread(
            target=lambda a=amount: answers.append(flask_example.pay(sync_client, ledger, 7, a))
        )
        for amount in (5, 6, 7)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(a["payments"] for a in answers) == [1, 2, 3]
    tokens = [token for token, _ in ledger.payments[7]]
    assert tokens == sorted(set(tokens))  # every write under a newer token than the last
    assert sorted(amount for _, amount in ledger.payments[7]) == [5, 6, 7]


def test_sync_celery_builds_once(sync_client: aiolock.sync.Client, redis_url: str) -> None:
    """A second run of the task while the first builds skips; after it, it builds."""
    celery_example = example("sync_celery")
    store: dict[str, list[str]] = {}
    skipped: list[bool] = []

    def second_run(section: int) -> None:
        if section == 1:  # mid-build: another worker (thread) runs the same task now
            other = threading.Thread(
                target=lambda: skipped.append(
                    not celery_example.build_report(sync_client, "d1", {})
                )
            )
            other.start()
            other.join(10)

    assert celery_example.build_report(sync_client, "d1", store, on_section=second_run)
    assert skipped == [True]
    assert store == {"d1": ["d1 section 0", "d1 section 1", "d1 section 2"]}
    assert celery_example.build_report(sync_client, "d1", store)  # free again
