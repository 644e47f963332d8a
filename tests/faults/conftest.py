"""Fixtures of the fault suite: private server processes it may kill, and its summary lines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aiolock.testing import LocalServer, start_local_server

from ..topologies import ClusterHandle, SentinelHandle, redis_cluster, redis_sentinel
from .checker import Result

_lines: list[str] = []


@pytest.fixture(scope="session")
def resource_url() -> Iterator[str]:
    """The server holding the counters the locks protect: never faulted."""
    server = start_local_server()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def lock_server() -> Iterator[LocalServer]:
    """A fresh lock server per scenario, without persistence: the scenario may kill it."""
    server = start_local_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def aof_lock_server() -> Iterator[LocalServer]:
    """A fresh lock server whose data survives a restart (AOF, fsync always)."""
    server = start_local_server(appendonly=True)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def lock_cluster() -> Iterator[ClusterHandle]:
    """A fresh 3+3 cluster per scenario (2 s to start): the scenario fails over or kills
    its nodes, which a shared one would carry into the next."""
    with redis_cluster() as cluster:
        yield cluster


@pytest.fixture
def lock_sentinel() -> Iterator[SentinelHandle]:
    """A fresh primary + replica + 3 sentinels per scenario; every process is killed after."""
    with redis_sentinel() as group:
        yield group


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[Result | str], None]:
    """Keep a scenario's summary line (a checker's result, or a line of its own) for the
    end of the run, and print it at once.

    Under xdist the worker hands the line to the controller, which prints the summary.
    """
    workeroutput = getattr(request.config, "workeroutput", None)

    def keep(result: Result | str) -> None:
        line = result if isinstance(result, str) else result.line()
        _lines.append(line)
        if workeroutput is not None:
            workeroutput["aiolock_fault_lines"] = list(_lines)
        print(line)

    return keep


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    _lines.extend(getattr(node, "workeroutput", {}).get("aiolock_fault_lines", ()))


def _number(line: str) -> int:
    first = line.split(maxsplit=1)[0]
    return int(first) if first.isdigit() else 0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per scenario, whatever the verbosity."""
    if _lines:
        terminalreporter.section("fault scenarios")
        # In scenario order (each line starts with its number), whichever worker ran it.
        for line in sorted(_lines, key=_number):
            terminalreporter.write_line(line)
