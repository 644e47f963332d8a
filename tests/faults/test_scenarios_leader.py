"""Leader election under faults: connection kills, forced unlocks and a server restart.

Three candidates, each its own client (as three processes would be), run
``leader.run(work)`` over and over on one election; the work of a term runs until it steps
down (a drawn 0.2-1.5 s) or is cancelled. Every term's start and end are logged on this
machine's clock (``time.monotonic()``, as the guard's deadlines are the loop's clock). Over
the run the injector kills every command connection (CLIENT KILL TYPE normal) and every
pub/sub connection, forces the lock away (``force_unlock()`` from a fourth client) and
restarts the server once (AOF, fsync always: the lock and its expiry survive).

What the run proves:
- two terms never overlap, forced unlocks included: force_unlock deletes the lock and wakes
  the next candidate with the message that also ends the term under way (heard after its
  watch's barrier, it ends the term in its own callback), and the next term begins only
  once its own barrier is back, a round trip after its acquire. The overlaps that follow a
  forced unlock are still counted apart (they must be 0 too);
- after every lost term a new term begins within the lease + 1 s (the server's downtime
  excluded: nobody can be elected while it is down);
- every candidate ends (no campaign hangs) and nothing is left on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

import aiolock
from aiolock.testing import LocalServer

pytestmark = pytest.mark.timeout(180)

LEASE = 2.0
DURATION = 25.0
CANDIDATES = 3


@dataclass
class Term:
    """One logged term."""

    candidate: int
    start: float
    end: float = 0.0
    outcome: str = "running"
    """``returned`` (stepped down), ``lost`` (cancelled: the hold was lost), or ``lost at
    release`` (the work returned before the loss was noticed; run() raised LockLostError)."""
    forced: float | None = None
    """When the lock was forced away from this term, if it was."""


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


async def test_leader_under_faults(aof_lock_server: LocalServer) -> None:
    """Connection kills, forced unlocks and a restart: one term at a time, and a new term
    within lease + 1 s of every loss."""
    server = aof_lock_server
    name = f"leader:{random.getrandbits(40):x}"
    terms: list[Term] = []
    current: dict[int, Term] = {}
    faults: Counter[str] = Counter()
    outages: list[tuple[float, float]] = []
    stop = asyncio.Event()
    rng = random.Random(22)

    async def candidate(i: int, client: aiolock.Client) -> None:
        leader = client.leader(name)

        async def work() -> None:
            term = Term(i, time.monotonic())
            terms.append(term)
            current[i] = term
            try:
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                term.outcome = "returned"
            except asyncio.CancelledError:
                term.outcome = "cancelled"
                raise
            finally:
                term.end = time.monotonic()
                del current[i]

        while not stop.is_set():
            try:
                await leader.run(work)
            except aiolock.LockLostError:
                # The work returned before the guard learnt of the loss (a forced unlock
                # between two renewals): the release found it, and run() says so.
                mine = [t for t in terms if t.candidate == i]
                mine[-1].outcome = "lost at release"
            except (aiolock.LockError, RedisConnectionError, RedisTimeoutError) as exc:
                # A release that failed after the work returned (the server went away).
                faults[f"run() raised {type(exc).__name__}"] += 1
        assert not leader.is_leader

    async def step(redis: Redis, forcer: aiolock.Client, tick: int) -> None:
        faults["command connections killed"] += await redis.client_kill_filter(
            _type="normal", skipme=True
        )
        if tick % 4 == 0:
            faults["pub/sub connections killed"] += await redis.client_kill_filter(_type="pubsub")
        if tick % 14 == 7:
            now = time.monotonic()
            for term in current.values():
                term.forced = now
            if await forcer.lock(name).force_unlock():
                faults["forced unlocks"] += 1

    async def inject() -> None:
        async with admin(server) as redis:
            forcer = aiolock.Client.from_url(server.url)
            try:
                started = time.monotonic()
                restarted = False
                tick = 0
                while time.monotonic() - started < DURATION:
                    await asyncio.sleep(0.25)
                    tick += 1
                    try:
                        await step(redis, forcer, tick)
                    except RedisConnectionError:
                        faults["injections failed (connection)"] += 1
                    if not restarted and time.monotonic() - started > DURATION / 2:
                        restarted = True
                        down = time.monotonic()
                        await asyncio.to_thread(server.stop)
                        await asyncio.sleep(1.0)  # the outage itself is the fault
                        await asyncio.to_thread(server.start)
                        outages.append((down, time.monotonic()))
                        faults["restarts (AOF)"] += 1
            finally:
                stop.set()
                await forcer.aclose()

    clients = [
        aiolock.Client.from_url(server.url, watchdog_timeout=LEASE) for _ in range(CANDIDATES)
    ]
    began = time.monotonic()
    try:
        async with asyncio.timeout(DURATION + 60):
            await asyncio.gather(inject(), *(candidate(i, c) for i, c in enumerate(clients)))
    finally:
        for client in clients:
            await client.aclose()
    took = time.monotonic() - began

    for term in terms:
        if term.outcome == "cancelled":
            term.outcome = "lost"  # only the guard cancels a term's work here
    terms.sort(key=lambda t: t.start)
    overlaps: list[tuple[Term, Term, float]] = []
    for a_index, a in enumerate(terms):
        for b in terms[a_index + 1 :]:
            if b.start >= a.end:
                break
            overlaps.append((a, b, min(a.end, b.end) - b.start))
    forced = [(a, b, d) for a, b, d in overlaps if a.forced is not None and a.forced <= b.start]

    def downtime(lo: float, hi: float) -> float:
        return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in outages)

    gaps = []
    for term in terms:
        if not term.outcome.startswith("lost"):
            continue
        later = [t.start for t in terms if t.start >= term.end]
        if later:
            gaps.append(min(later) - term.end - downtime(term.end, min(later)))
    handover = [b.start - a.end for a, b in itertools.pairwise(terms) if a.outcome == "returned"]
    outcomes = Counter(t.outcome for t in terms)
    line = (
        f"leader under faults: {took:.1f} s, {len(terms)} terms {dict(outcomes)}, "
        f"{', '.join(f'{v} {k}' for k, v in sorted(faults.items()))}; "
        f"overlaps: {len(overlaps)} ({len(forced)} after a force_unlock, longest "
        f"{max((d for *_, d in overlaps), default=0.0) * 1000:.2f} ms); "
        f"new term after a loss within {max(gaps, default=0.0):.2f} s (bound {LEASE + 1:g} s), "
        f"after a step-down within {max(handover, default=0.0):.2f} s"
    )
    print(line)
    assert not overlaps, [(a, b) for a, b, _ in overlaps[:3]]
    assert max(gaps, default=0.0) <= LEASE + 1.0, gaps
    assert faults["restarts (AOF)"] == 1
    assert faults["forced unlocks"] >= 3
    assert faults["command connections killed"] >= 20
    assert outcomes["returned"] >= 10
    assert outcomes["lost"] + outcomes["lost at release"] >= 3
    async with admin(server) as redis:
        assert not await redis.exists(name)
