"""Fixtures: a real server for the session, clients, unique names and a leak check."""

from __future__ import annotations

import contextlib
import traceback
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

import aiolock
from aiolock.testing import ServerHandle, redis_server


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        action="store_true",
        help="also collect the fault-injection suite in tests/faults (nox -s faults)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The fault suite takes minutes and owns its servers: only `nox -s faults` runs it.
    if collection_path.name == "faults" and not config.getoption("--faults"):
        return True
    return None


# Tombstones of cancelled acquires outlive the test by design (they expire on their own
# after a few seconds); they are not lock state.
_TRANSIENT_PREFIXES = ("aiolock_acquire_cancel:",)


# Every asyncio connection redis-py makes in this process, with where it was made: a test
# that ends with one still open leaked it (its client's aclose() missed it), which would
# otherwise surface only as a ResourceWarning in whichever later test the GC runs in.
_connections: weakref.WeakKeyDictionary[AbstractConnection, traceback.StackSummary] = (
    weakref.WeakKeyDictionary()
)
_connection_init = AbstractConnection.__init__


def _tracked_init(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
    _connection_init(self, *args, **kwargs)
    _connections[self] = traceback.extract_stack(limit=25)


AbstractConnection.__init__ = _tracked_init  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _no_open_connections() -> Iterator[None]:
    """No test leaves a redis connection open once its fixtures are torn down."""
    yield
    open_now = [(conn, stack) for conn, stack in list(_connections.items()) if conn.is_connected]
    for conn, _ in open_now:
        # Reported once: close the socket so later tests do not see it again.
        writer = conn._writer
        if writer is not None:
            writer.transport.abort()
        conn._reader = conn._writer = None
    if open_now:
        where = "".join(traceback.format_list(open_now[0][1]))
        pytest.fail(
            f"{len(open_now)} redis connection(s) left open; the first was made at:\n{where}"
        )


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """One real server for the whole run (REDIS_URL, Docker, PATH or embedded Valkey)."""
    with redis_server(announce=False) as handle:
        # Past output capture (active while fixtures set up), so every CI log says which
        # server the run was against.
        plugins = request.config.pluginmanager
        reporter = plugins.get_plugin("terminalreporter")
        capture = plugins.get_plugin("capturemanager")
        if reporter is not None:
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                reporter.write_line(f"aiolock tests: using {handle}")
        yield handle


@pytest.fixture(scope="session")
def redis_url(server: ServerHandle) -> str:
    return server.url


@pytest.fixture
def uid() -> str:
    """A fresh token that every name of one test contains."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def name(uid: str) -> str:
    """A lock name unique to this test."""
    return f"test:{uid}"


@pytest.fixture
async def raw(redis_url: str, uid: str) -> AsyncIterator[Redis]:
    """A plain redis client for assertions; at the end, nothing of this test may remain."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    yield redis
    try:
        leftover = [
            key
            async for key in redis.scan_iter(match=f"*{uid}*")
            if not key.startswith(_TRANSIENT_PREFIXES)
        ]
        channels = await redis.pubsub_channels(f"*{uid}*")
        assert not leftover, f"keys left behind: {leftover}"
        assert not channels, f"subscriptions left behind: {channels}"
    finally:
        await redis.aclose()


ClientFactory = Callable[..., aiolock.Client]


@pytest.fixture
async def make_client(redis_url: str, raw: Redis) -> AsyncIterator[ClientFactory]:
    """Build clients (each stands for one process); all are closed before the leak check."""
    clients: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        client = aiolock.Client.from_url(redis_url, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
async def client(make_client: ClientFactory) -> aiolock.Client:
    """A client with the default options."""
    return make_client()
