"""Fault scenarios 1-8, each with the checker's workers running (scenario 9, bad input and
misuse, is tests/test_misuse.py and tests/test_validation.py, also run by ``nox -s faults``).

Every scenario is bounded: the workers run ``Load.duration`` seconds and must all have
finished ``Load.grace`` seconds later; injectors stop when the workers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import aiolock
from aiolock.testing import LocalServer

from .. import inside
from ..helpers import wait_until
from .checker import Load, Result, run_checker, stopped

pytestmark = pytest.mark.timeout(300)

Report = Callable[[Result], None]


@contextlib.asynccontextmanager
async def admin(server: LocalServer) -> AsyncIterator[Redis]:
    """A plain connection for injecting faults, retrying across a restart."""
    redis = Redis.from_url(
        server.url, decode_responses=True, retry=Retry(ExponentialBackoff(cap=0.2), 50)
    )
    try:
        yield redis
    finally:
        await redis.aclose()


async def test_pubsub_connections_killed(
    lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """1. Killing the shared pub/sub connection over and over loses no waiter and no hold."""
    faults: Counter[str] = Counter()

    async def inject(stop: asyncio.Event) -> None:
        async with admin(lock_server) as redis:
            while not await stopped(stop, 0.3):
                faults["pub/sub connections killed"] += await redis.client_kill_filter(
                    _type="pubsub"
                )

    result = await run_checker(
        "1 pub/sub killed",
        lock_server,
        resource_url,
        Load(),
        tmp_path,
        inject=inject,
        faults=faults,
    )
    report(result)
    assert not result.problems()
    assert faults["pub/sub connections killed"] >= 10


async def test_command_connections_killed(
    lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """2. Killing every command connection, often with a script's reply pending, never makes
    an acquire count twice or an unlock release twice, and leaves nothing held."""
    faults: Counter[str] = Counter()

    async def inject(stop: asyncio.Event) -> None:
        async with admin(lock_server) as redis:
            while not await stopped(stop, 0.15):
                faults["command connections killed"] += await redis.client_kill_filter(
                    _type="normal", skipme=True
                )

    result = await run_checker(
        "2 commands killed",
        lock_server,
        resource_url,
        Load(),
        tmp_path,
        inject=inject,
        faults=faults,
    )
    report(result)
    assert not result.problems()
    assert faults["command connections killed"] >= 50


async def test_server_paused(
    lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """3. A server frozen for 2 s (CLIENT PAUSE, then SIGSTOP) only delays the workers."""
    faults: Counter[str] = Counter()

    async def inject(stop: asyncio.Event) -> None:
        async with admin(lock_server) as redis:
            if await stopped(stop, 1.0):
                return
            await redis.client_pause(2000, all=True)
            faults["CLIENT PAUSE 2000 ALL"] += 1
            if await stopped(stop, 3.0):
                return
            lock_server.pause()
            faults["SIGSTOP for 2 s"] += 1
            try:
                await stopped(stop, 2.0)
            finally:
                lock_server.resume()

    result = await run_checker(
        "3 server paused",
        lock_server,
        resource_url,
        Load(duration=9.0),
        tmp_path,
        inject=inject,
        faults=faults,
    )
    report(result)
    assert not result.problems()
    assert faults["SIGSTOP for 2 s"] == 1
    waits = [wait for s in result.summaries for wait in s["max_wait"].values()]
    assert max(waits) >= 1.5  # the pauses were felt


async def _probe_restart(
    server: LocalServer, down: float, faults: Counter[str], *, crash: bool = False
) -> tuple[aiolock.Client, aiolock.Lock, aiolock.Lock, float]:
    """Hold a watchdog lock and a 1 s lease lock, then stop the server for ``down`` s.

    ``crash``: SIGKILL, so the server dies at once (SIGTERM lets it serve on briefly while
    it shuts down). Returns the probe client, its two locks and the instant of the stop.
    """
    probe = aiolock.Client.from_url(server.url, watchdog_timeout=10)
    kept = probe.lock("probe:watchdog", owner="probe")
    short = probe.lock("probe:short", owner="probe")
    await kept.lock()
    await short.lock(lease=1.0)
    stopped_at = time.monotonic()
    if crash:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
    await asyncio.to_thread(server.stop)
    faults["crashes (SIGKILL)" if crash else "restarts (SIGTERM)"] += 1
    # The outage itself is the fault: its length is the scenario's, not a wait to settle.
    await asyncio.sleep(down)
    await asyncio.to_thread(server.start)
    return probe, kept, short, stopped_at


async def test_server_restarted_with_aof(
    aof_lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """4. A restart with AOF: waiters recover, holds whose lease outlived the outage are
    still held (unlock works), the ones that did not report LockLostError."""
    faults: Counter[str] = Counter()
    probes: list[tuple[bool, str]] = []

    async def inject(stop: asyncio.Event) -> None:
        for _ in range(2):
            if await stopped(stop, 1.5):
                return
            probe, kept, short, _ = await _probe_restart(aof_lock_server, 1.5, faults)
            try:
                probes.append((await kept.is_held_by_current_task(), "watchdog hold kept"))
                await kept.unlock()
                with pytest.raises(aiolock.LockLostError):
                    await short.unlock()
                probes.append((True, "1 s lease reported lost"))
            finally:
                await probe.aclose()

    result = await run_checker(
        "4 restart with AOF",
        aof_lock_server,
        resource_url,
        Load(duration=9.0),
        tmp_path,
        inject=inject,
        faults=faults,
    )
    report(result)
    assert not result.problems()
    assert faults["restarts (SIGTERM)"] == 2
    assert probes == [(True, "watchdog hold kept"), (True, "1 s lease reported lost")] * 2


async def test_server_restarted_without_persistence(
    lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """5. A restart that loses every key: each holder learns it (LockLostError at unlock),
    waiters carry on, nobody hangs; overlaps happen only with holds reported lost."""
    faults: Counter[str] = Counter()
    crashes: list[float] = []
    probes: list[str] = []

    async def inject(stop: asyncio.Event) -> None:
        for _ in range(2):
            if await stopped(stop, 2.0):
                return
            probe, kept, short, crashed_at = await _probe_restart(
                lock_server, 0.5, faults, crash=True
            )
            crashes.append(crashed_at)
            try:
                for lock in (kept, short):
                    with pytest.raises(aiolock.LockLostError):
                        await lock.unlock()
                    probes.append("lost")
            finally:
                await probe.aclose()

    result = await run_checker(
        "5 restart, no persistence",
        lock_server,
        resource_url,
        Load(duration=9.0),
        tmp_path,
        inject=inject,
        faults=faults,
    )
    report(result)
    assert not result.problems(lost_allowed=True)
    assert probes == ["lost"] * 4
    # The crashes wiped workers' holds and their holders were told: the scenario proved
    # something. (Critical sections last about a millisecond, so a logged hold spanning a
    # crash by more than the margin below is too rare a sight to require one per run.)
    told = result.total("lost") + result.total("unlock-error")
    assert told, "no worker was told of a hold the crashes wiped: the scenario proved nothing"
    # A hold taken before a crash and released after it (5 ms margin for the SIGKILL to
    # land) was wiped by it: its holder must have been told, never a successful unlock.
    wiped = [
        hold
        for hold in result.holds
        if any(hold.start < at and hold.end > at + 0.005 for at in crashes)
    ]
    assert {hold.outcome for hold in wiped} <= {"lost", "unlock-error"}


async def test_cancellation_storm(
    lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """6. A fifth of all rounds cancelled at a random point (acquire in flight, waiting,
    critical section, release), plus tasks that end holding a lock: nothing is orphaned
    beyond its lease, and each ended holder is reported."""
    load = Load(cancel=0.2, exit_holding=2, watchdog_timeout=2.0)
    result = await run_checker("6 cancellation storm", lock_server, resource_url, load, tmp_path)
    report(result)
    assert not result.problems()
    cancelled = sum(s["errors"].get("cancelled (by the worker)", 0) for s in result.summaries)
    # A fifth of the rounds get a deadline of 0-15 ms; some finish before it.
    assert cancelled >= 0.05 * sum(s["rounds"] for s in result.summaries)
    exited = sum(s["exits_holding"] for s in result.summaries)
    assert exited == load.processes * load.exit_holding
    reported = sum(s["warnings"].get("task ended holding", 0) for s in result.summaries)
    assert reported == exited


async def test_starved_event_loop(
    lock_server: LocalServer, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """7. A holder whose event loop blocks past its lease loses the lock by design; the
    library must say so (LockLostError at unlock, a WARNING), never pretend."""
    load = Load(watchdog_timeout=1.0, starve_every=4, duration=9.0)
    result = await run_checker("7 starved loop", lock_server, resource_url, load, tmp_path)
    report(result)
    assert not result.problems(lost_allowed=True)
    starved = [h for h in result.holds if h.proc == 0 and h.end - h.start >= 1.5]
    assert starved, "no hold was starved: the scenario proved nothing"
    assert {hold.outcome for hold in starved} == {"lost"}
    assert sum(s["warnings"].get("lease lost", 0) for s in result.summaries) >= len(starved)


async def test_ten_thousand_locks_held(
    lock_server: LocalServer,
    resource_url: str,
    tmp_path: Path,
    report: Report,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """8. One client holding 10,000 locks under the watchdog renews them all, in batches of
    at most 100 per script call, within a CPU budget, while the checker runs beside it."""
    count, period = 10_000, 1.0
    faults: Counter[str] = Counter()
    measured: dict[str, float] = {}
    client = aiolock.Client.from_url(lock_server.url, watchdog_timeout=3 * period)
    locks = [client.lock(f"many:{i}", owner="bulk") for i in range(count)]

    async def inject(stop: asyncio.Event) -> None:
        for start in range(0, count, 500):
            await asyncio.gather(*(lock.lock() for lock in locks[start : start + 500]))
        faults["locks held by one client"] = count
        renewal = inside.renewal(client)
        calls, rounds = renewal.calls, renewal.rounds
        cpu, began = time.process_time(), time.monotonic()
        await stopped(stop, 4 * period)
        # At least two whole rounds with every lock tracked, even where taking the 10,000
        # locks used up most of the checker's run (a slow or busy machine).
        await wait_until(lambda: renewal.rounds >= rounds + 2, limit=4 * period, what="2 rounds")
        measured["periods"] = (time.monotonic() - began) / period
        measured["calls"] = renewal.calls - calls
        measured["rounds"] = renewal.rounds - rounds
        measured["cpu"] = time.process_time() - cpu
        measured["round calls"] = renewal.last_round_calls

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        try:
            result = await run_checker(
                "8 10,000 locks held",
                lock_server,
                resource_url,
                Load(duration=9.0),
                tmp_path,
                inject=inject,
                faults=faults,
            )
            async with Redis.from_url(lock_server.url) as raw:
                pipe = raw.pipeline(transaction=False)
                for lock in locks:
                    pipe.pttl(lock.name)
                ttls = await pipe.execute()
            for start in range(0, count, 500):
                await asyncio.gather(*(lock.unlock() for lock in locks[start : start + 500]))
            async with Redis.from_url(lock_server.url) as raw:
                left = [key async for key in raw.scan_iter(match="many:*", count=1000)]
        finally:
            await client.aclose()
    faults["renewal rounds"] = int(measured["rounds"])
    faults["renewal calls per round"] = int(measured["round calls"])
    faults["client CPU ms per period"] = round(1000 * measured["cpu"] / measured["periods"])
    report(result)
    assert not result.problems()
    assert all(ttl > 0 for ttl in ttls), "a held lock expired or lost its lease"
    assert not left, f"{len(left)} of the 10,000 locks were left after their unlock"
    assert not [r for r in caplog.records if "lost" in r.getMessage()]
    # One round per period (none failed: no WARNING), each in batches of 100.
    assert measured["round calls"] == count / 100
    periods = measured["periods"]
    assert math.floor(periods) - 1 <= measured["rounds"] <= math.ceil(periods)
    # Budget: renewing 10,000 locks costs under a third of a core (the checker's own
    # bookkeeping in this process is included).
    assert measured["cpu"] / measured["periods"] < 0.33
