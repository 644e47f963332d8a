"""Case 5, aiolock only: many locks under the watchdog, and many waiters.

``watchdog``: one client (``watchdog_timeout=3.0``, so one renewal period is 1 s) holds
10,000 locks taken by 32 holder tasks, which stay alive holding them. Over two periods
nothing but renewal touches the server, so the ``evalsha`` delta of INFO commandstats is the
renewal script calls. After the window every key must still exist; the smallest PTTL shows
that renewal, not the initial lease, kept them.

``waiters``: one task holds 1,000 locks; 10,000 tasks (10 per lock) then call ``lock()``.
Memory is the tracemalloc growth from before the waiters are created until all of them are
parked (each lock's ``statistics().tasks_waiting`` adds up and the client stopped sending),
divided by the waiter count, next to the same figure for plain tasks waiting on an
``asyncio.Event``. Drain time runs from the holder's first unlock to the last waiter's unlock.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio

from ._instrument import CommandStats, LogCounter, RoundTrips
from ._stats import percentile

__all__ = ("POOLS", "waiters_case", "waiters_scenario", "watchdog_case")

HOLDERS = 32
SETTLE_CHECKS = 600  # x 50 ms: the bound on waiting for the waiters to park
now = time.monotonic
POOLS = {
    "from_url": "Client.from_url(url) (aiolock's own connections)",
    "blocking": "Client(Redis(BlockingConnectionPool(max_connections=100)))",
}


def _connections(url: str) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        info: Mapping[str, Any] = client.info("stats")
    finally:
        client.close()
    return float(info["total_connections_received"])


async def watchdog_case(
    url: str, tag: str, n_locks: int, periods: int = 2, watchdog: float = 3.0
) -> dict[str, Any]:
    """Renewal cost of ``n_locks`` watchdog-held locks over ``periods`` periods."""
    import aiolock  # noqa: PLC0415

    RoundTrips.install()
    LogCounter.take()
    period = watchdog / 3
    client = aiolock.Client.from_url(url, watchdog_timeout=watchdog)
    names = [f"{tag}:wd:{i}" for i in range(n_locks)]
    all_held = asyncio.Event()
    release = asyncio.Event()
    held = 0

    async def holder(chunk: list[str]) -> None:
        nonlocal held
        locks = [client.lock(n) for n in chunk]
        for lock in locks:
            await lock.lock()
        held += len(locks)
        if held == n_locks:
            all_held.set()
        await release.wait()
        for lock in locks:
            await lock.unlock()

    stats = CommandStats(url)
    out: dict[str, Any] = {"status": "ok", "locks": n_locks, "period_s": period}
    tasks: list[asyncio.Task[None]] = []
    try:
        t0 = now()
        tasks = [asyncio.create_task(holder(names[i::HOLDERS])) for i in range(HOLDERS)]
        async with asyncio.timeout(120):
            await all_held.wait()
        out["acquire_all_s"] = now() - t0
        # From the end of one renewal pass to the end of the pass `periods` later: exactly
        # `periods` passes, whatever the phase of the renewal timer. The first pass seen may
        # have started before every lock was held, so alignment starts at the second.
        ends = await _pass_ends(stats, periods + 2, bound_s=(periods + 4) * period + 5.0)
        (t_a, before, cpu0, rt0), (t_b, after, cpu1, rt1) = ends[1], ends[-1]
        delta = CommandStats.delta(before, after)
        out["renewal_passes"] = periods
        out["observed_period_s"] = (t_b - t_a) / periods
        out["renewal_evalsha_per_period"] = delta.get("evalsha", 0.0) / periods
        out["server_cmds_per_period"] = sum(v for k, v in delta.items() if k != "_cpu") / periods
        out["round_trips_per_period"] = (rt1 - rt0) / periods
        out["client_cpu_ms_per_period"] = 1000 * (cpu1 - cpu0) / periods
        out["server_cpu_ms_per_period"] = 1000 * delta.get("_cpu", 0.0) / periods
        out["server_cmds"] = " ".join(
            f"{k}={v / periods:.0f}" for k, v in delta.items() if k != "_cpu"
        )
        checker = redis.asyncio.Redis.from_url(url)
        try:
            pipe = checker.pipeline(transaction=False)
            for name in names:
                pipe.pttl(name)
            ttls = [int(t) for t in await pipe.execute()]
        finally:
            await checker.aclose()
        out["keys_missing_after"] = sum(t < 0 for t in ttls)
        out["min_pttl_after_ms"] = min(ttls)
        t1 = now()
        release.set()
        async with asyncio.timeout(120):
            await asyncio.gather(*tasks)
        out["release_all_s"] = now() - t1
    except Exception as exc:
        out["status"] = f"error: {type(exc).__name__}: {exc}"
    finally:
        release.set()
        stuck = await _cancel_all(tasks, client)
        if stuck:
            out["tasks_ignoring_cancel_5s"] = stuck
        stats.close()
    taken = LogCounter.take()
    if taken:
        out["aiolock_log"] = LogCounter.summary(taken)
    return out


async def _pass_ends(
    stats: CommandStats, count: int, bound_s: float
) -> list[tuple[float, dict[str, float], float, int]]:
    """Instants (with snapshots) at which a burst of EVALSHA calls ended ``count`` times.

    Samples INFO every 20 ms; a pass has ended when calls rose and then stayed flat for
    100 ms. Only renewal sends EVALSHA while the holders sit on their locks. The CPU time
    and requests of the sampling itself are subtracted from the CPU and send counts given.
    """
    ends: list[tuple[float, dict[str, float], float, int]] = []
    own_cpu, own_sent = 0.0, 0
    snap = stats.snapshot()
    last, last_change, burst = snap.get("evalsha", 0.0), now(), False
    for _ in range(int(bound_s / 0.02)):
        await asyncio.sleep(0.02)
        cpu0, sent0 = time.process_time(), RoundTrips.count
        snap = stats.snapshot()
        own_cpu += time.process_time() - cpu0
        own_sent += RoundTrips.count - sent0
        cpu, sent = time.process_time() - own_cpu, RoundTrips.count - own_sent
        calls = snap.get("evalsha", 0.0)
        if calls != last:
            last, last_change, burst = calls, now(), True
        elif burst and now() - last_change >= 0.1:
            ends.append((last_change, snap, cpu, sent))
            burst = False
            if len(ends) == count:
                return ends
    raise TimeoutError(f"saw {len(ends)} of {count} renewal passes within {bound_s:.0f} s")


async def _cancel_all(tasks: list[asyncio.Task[None]], client: Any) -> int:
    """Cancel, give them 5 s, close the client (which wakes any waiter), collect.

    Returns how many tasks were still running 5 s after ``cancel()``.
    """
    for task in tasks:
        task.cancel()
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=5.0)
    await client.aclose()
    if tasks:
        await asyncio.wait(tasks, timeout=10.0)
    return len(pending)


async def _plain_task_bytes(n: int) -> float:
    """tracemalloc bytes per task parked on an ``asyncio.Event``: the floor for a waiter."""
    event = asyncio.Event()
    start = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.create_task(event.wait()) for _ in range(n)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    used = tracemalloc.get_traced_memory()[0] - start
    event.set()
    await asyncio.gather(*tasks)
    return used / n


def _client(url: str, pool: str) -> tuple[Any, redis.asyncio.Redis | None]:
    """``from_url``: aiolock's own client; ``blocking``: a 100-connection blocking pool."""
    import aiolock  # noqa: PLC0415

    if pool == "from_url":
        return aiolock.Client.from_url(url), None
    conns = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=100)
    own = redis.asyncio.Redis(connection_pool=conns)
    return aiolock.Client(own), own


async def waiters_scenario(
    url: str, tag: str, pool: str, *, sizes: tuple[int, int], traced_sizes: tuple[int, int]
) -> dict[str, Any]:
    """The drain run (no tracing) and a smaller tracemalloc run at the same waiters/lock.

    ``sizes`` and ``traced_sizes`` are (waiters, locks) of the two runs.

    tracemalloc slows allocation-heavy code several times over, enough for 10,000 queuing
    waiters to run into ``subscribe_timeout``; so memory is traced on ``mem_waiters`` over
    ``mem_locks`` (same ratio).
    """
    (n_waiters, n_locks), (mem_waiters, mem_locks) = sizes, traced_sizes
    t0 = now()
    out = await waiters_case(url, f"{tag}:drain", n_waiters, n_locks, pool, trace=False)
    out["drain_run_took_s"] = now() - t0
    t0 = now()
    mem = await waiters_case(url, f"{tag}:mem", mem_waiters, mem_locks, pool, trace=True)
    out["traced_run_took_s"] = now() - t0
    out[f"traced_run ({mem_waiters:,} waiters / {mem_locks:,} locks)"] = mem["status"]
    for key in ("bytes_per_waiter", "plain_task_bytes", "aiolock_log"):
        if key in mem:
            out[f"traced_{key}"] = mem[key]
    return out


async def waiters_case(
    url: str, tag: str, n_waiters: int, n_locks: int, pool: str, *, trace: bool
) -> dict[str, Any]:
    """Memory per parked waiter and the time to drain ``n_waiters`` over ``n_locks``."""
    RoundTrips.install()
    LogCounter.take()
    client, own = _client(url, pool)
    names = [f"{tag}:wt:{pool}:{i}" for i in range(n_locks)]
    out: dict[str, Any] = {"status": "ok", "client": POOLS[pool], "waiters": n_waiters}
    out["locks"] = n_locks
    held = asyncio.Event()
    release = asyncio.Event()
    waits: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    holder_task: asyncio.Task[None] | None = None

    async def holder() -> None:
        locks = [client.lock(n) for n in names]
        for lock in locks:
            await lock.lock()
        held.set()
        await release.wait()
        for lock in locks:
            await lock.unlock()

    async def waiter(name: str) -> None:
        lock = client.lock(name)
        t_wait = now()
        await lock.lock()
        waits.append(now() - t_wait)
        await lock.unlock()

    conns0 = _connections(url)
    try:
        holder_task = asyncio.create_task(holder())
        async with asyncio.timeout(120):
            await held.wait()
        if trace:
            tracemalloc.start()
        try:
            if trace:
                out["plain_task_bytes"] = await _plain_task_bytes(n_waiters)
            mem0 = tracemalloc.get_traced_memory()[0]
            t0 = now()
            tasks = [asyncio.create_task(waiter(names[i % n_locks])) for i in range(n_waiters)]
            out["park_all_s"] = await _settle(client, names, n_waiters, tasks) - t0
            if trace:
                out["bytes_per_waiter"] = (tracemalloc.get_traced_memory()[0] - mem0) / n_waiters
        finally:
            if trace:
                tracemalloc.stop()
        out["connections_opened"] = _connections(url) - conns0
        t1 = now()
        release.set()
        async with asyncio.timeout(300):
            await asyncio.gather(*tasks)
        out["drain_s"] = now() - t1
        out["drain_per_s"] = n_waiters / out["drain_s"]
        out["wait_p50_ms"] = 1000 * (percentile(waits, 50) or 0.0)
        out["wait_max_ms"] = 1000 * max(waits)
    except Exception as exc:
        out["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
        out["connections_opened"] = _connections(url) - conns0
    finally:
        release.set()
        stuck = await _cancel_all([*tasks, *([holder_task] if holder_task else [])], client)
        if stuck:
            out["tasks_ignoring_cancel_5s"] = stuck
        if own is not None:
            await own.aclose()
    taken = LogCounter.take()
    if taken:
        out["aiolock_log"] = LogCounter.summary(taken)
    return out


async def _settle(
    client: Any, names: list[str], n_waiters: int, tasks: list[asyncio.Task[None]]
) -> float:
    """Wait (bounded) until every waiter is parked: counted by aiolock, client quiet.

    Returns the instant the client was last seen sending (the end of parking, +-50 ms).
    Fails at once if a waiter has failed (it would never park).
    """
    handles = [client.lock(n) for n in names]
    has_stats = hasattr(handles[0], "statistics")
    last, quiet, last_change = -1, 0, now()
    for _ in range(SETTLE_CHECKS):
        await asyncio.sleep(0.05)
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
        if failed:
            exc = failed[0].exception()
            raise RuntimeError(
                f"{len(failed):,} of {n_waiters:,} waiters failed while queuing, "
                f"first: {type(exc).__name__}: {exc}"
            )
        sent = RoundTrips.count
        if sent == last:
            quiet += 1
        else:
            quiet, last, last_change = 0, sent, now()
        parked = (
            sum(h.statistics().tasks_waiting for h in handles) >= n_waiters if has_stats else True
        )
        if parked and quiet >= 3:
            return last_change
    raise TimeoutError("waiters did not park within the bound")
