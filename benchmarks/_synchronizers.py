"""The synchronizers part of the run: semaphore, count-down latch, fair read-write lock and
RedLock, each against what it is compared with, interleaved round-robin in short rounds.

- **Semaphore**: 4 permits, 16 tasks on one client each taking and giving back a permit:
  acquisitions/s, wait p50/p99, scripts run per acquisition.
- **Count-down latch**: 1,000 waiters spread over 4 clients; another client counts the
  latch to zero; the time from that call until each waiter returned (p50, p99, max).
- **Fair read-write lock**: 8 readers with overlapping holds and 1 writer, against the
  (Redisson) read-write lock: the writer's wait p50/p99/max and the readers' rate.
- **RedLock over 3 servers**: aiolock's RedLock, pottery's AIORedlock and aioredlock on the
  same three local servers: lock/unlock pairs/s at 1 task, and acquisitions/s with 8
  tasks on one name.

Every figure is a median over the rounds with its min-max spread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import redis.asyncio

import aiolock
from aiolock.testing import start_local_server

__all__ = ("run_synchronizers", "synchronizers_markdown")

LEASE_S = 30
LATCH_WAITERS = 1_000
LATCH_CLIENTS = 4
LOOP_BOUND = 1_000_000  # every load loop is bounded by count as well as by time


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _scripts_run(url: str) -> int:
    """EVALSHA calls the server has run: one per request a client sends for a call."""
    async with redis.asyncio.Redis.from_url(url) as raw:
        stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


# -- semaphore -----------------------------------------------------------------------------


async def _semaphore_round(url: str, tag: str, seconds: float) -> dict[str, float]:
    async with aiolock.Client.from_url(url) as client:
        sem = client.semaphore(f"{tag}:sem")
        await sem.try_set_permits(4)
        waits: list[float] = []
        before = await _scripts_run(url)
        stop = time.perf_counter() + seconds

        async def work() -> None:
            for _ in range(LOOP_BOUND):
                if time.perf_counter() >= stop:
                    return
                asked = time.perf_counter()
                await sem.acquire()
                waits.append(time.perf_counter() - asked)
                await asyncio.sleep(0)  # a yield inside, as real work would
                await sem.release()

        start = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(16)))
        took = time.perf_counter() - start
        scripts = await _scripts_run(url) - before
    return {
        "acq_per_s": len(waits) / took,
        "wait_p50_ms": _pct(waits, 0.5) * 1000,
        "wait_p99_ms": _pct(waits, 0.99) * 1000,
        # Each acquisition's take(s) and its release: 2 when nobody tries for nothing.
        "scripts_per_acq": scripts / max(1, len(waits)),
    }


# -- count-down latch ----------------------------------------------------------------------


async def _latch_round(url: str, tag: str) -> dict[str, float]:
    clients = [aiolock.Client.from_url(url) for _ in range(LATCH_CLIENTS + 1)]
    try:
        name = f"{tag}:latch"
        opener, waiting = clients[0], clients[1:]
        await opener.count_down_latch(name).try_set_count(1)
        returned: list[float] = []

        async def wait(client: aiolock.Client) -> None:
            assert await client.count_down_latch(name).wait(timeout=60)
            returned.append(time.perf_counter())

        tasks = [
            asyncio.create_task(wait(waiting[i % LATCH_CLIENTS])) for i in range(LATCH_WAITERS)
        ]
        for _ in range(LOOP_BOUND):  # until every waiter is subscribed and parked
            if sum(c.count_down_latch(name).tasks_waiting for c in waiting) >= LATCH_WAITERS:
                break
            await asyncio.sleep(0.01)
        sent = time.perf_counter()
        await opener.count_down_latch(name).count_down()
        async with asyncio.timeout(60):
            await asyncio.gather(*tasks)
    finally:
        for client in clients:
            await client.aclose()
    latencies = [(t - sent) * 1000 for t in returned]
    return {
        "p50_ms": _pct(latencies, 0.5),
        "p99_ms": _pct(latencies, 0.99),
        "max_ms": max(latencies),
    }


# -- fair read-write lock against the read-write lock --------------------------------------


async def _rw_round(url: str, tag: str, factory: str, seconds: float) -> dict[str, float]:
    async with aiolock.Client.from_url(url) as client:
        make = getattr(client, factory)
        name = f"{tag}:{factory}"
        writer_waits: list[float] = []
        reads = 0
        stop = time.perf_counter() + seconds

        async def reader(index: int) -> None:
            nonlocal reads
            lock = make(name).read_lock()
            await asyncio.sleep(index * 0.001)  # staggered: the read holds overlap
            for _ in range(LOOP_BOUND):
                if time.perf_counter() >= stop:
                    return
                async with lock:
                    reads += 1
                    await asyncio.sleep(0.002)

        async def writer() -> None:
            lock = make(name).write_lock()
            for _ in range(LOOP_BOUND):
                if time.perf_counter() >= stop:
                    return
                asked = time.perf_counter()
                async with lock:
                    writer_waits.append(time.perf_counter() - asked)
                    await asyncio.sleep(0.002)
                await asyncio.sleep(0.005)

        start = time.perf_counter()
        await asyncio.gather(writer(), *(reader(i) for i in range(8)))
        took = time.perf_counter() - start
    return {
        "writer_wait_p50_ms": _pct(writer_waits, 0.5) * 1000,
        "writer_wait_p99_ms": _pct(writer_waits, 0.99) * 1000,
        "writer_wait_max_ms": max(writer_waits, default=float("nan")) * 1000,
        "writes": len(writer_waits),
        "reads_per_s": reads / took,
    }


# -- RedLock over three servers ------------------------------------------------------------


RedlockFactory = Callable[[list[str], str], Awaitable[tuple[Any, Callable[[], Awaitable[None]]]]]


async def _aiolock_red(urls: list[str], tag: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    clients = [aiolock.Client.from_url(url) for url in urls]

    def make(name: str) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]:
        red = aiolock.RedLock(*(c.lock(name, owner=None) for c in clients))
        return lambda: red.lock(lease=LEASE_S), red.unlock

    async def close() -> None:
        for client in clients:
            await client.aclose()

    return make, close


async def _pottery_red(urls: list[str], tag: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    cls = importlib.import_module("pottery").AIORedlock
    masters = {redis.asyncio.Redis.from_url(url) for url in urls}

    def make(name: str) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]:
        lock = cls(key=name, masters=masters, auto_release_time=LEASE_S)

        async def acquire() -> None:
            for _ in range(LOOP_BOUND):
                if await lock.acquire():
                    return

        return acquire, lock.release

    async def close() -> None:
        for master in masters:
            await master.aclose()

    return make, close


async def _aioredlock_red(urls: list[str], tag: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    module: Any = importlib.import_module("aioredlock")
    manager = module.Aioredlock(urls)

    def make(name: str) -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]:
        held: list[Any] = []

        async def acquire() -> None:
            for _ in range(LOOP_BOUND):  # it gives up after 3 tries: a user calls again
                with contextlib.suppress(module.LockError):
                    held.append(await manager.lock(name, lock_timeout=LEASE_S))
                    return

        async def release() -> None:
            await manager.unlock(held.pop())

        return acquire, release

    return make, manager.destroy


REDLOCKS: dict[str, tuple[str, RedlockFactory]] = {
    "aiolock": ("aiolock RedLock", _aiolock_red),
    "pottery": ("pottery AIORedlock", _pottery_red),
    "aioredlock": ("aioredlock", _aioredlock_red),
}


async def _red_round(
    urls: list[str], tag: str, key: str, tasks: int, seconds: float
) -> dict[str, float]:
    make, close = await REDLOCKS[key][1](urls, tag)
    try:
        done = 0
        stop = time.perf_counter() + seconds

        async def work(index: int) -> None:
            nonlocal done
            # Each task its own handle (the lock belongs to the task that took it).
            name = f"{tag}:red:{key}:{index if tasks == 1 else 'shared'}"
            acquire, release = make(name)
            for _ in range(LOOP_BOUND):
                if time.perf_counter() >= stop:
                    return
                await acquire()
                done += 1
                await release()

        start = time.perf_counter()
        await asyncio.gather(*(work(i) for i in range(tasks)))
        return {"ops_per_s": done / (time.perf_counter() - start)}
    finally:
        await close()


@contextlib.contextmanager
def _three_servers() -> Iterator[list[str]]:
    servers = [start_local_server() for _ in range(3)]
    try:
        yield [server.url for server in servers]
    finally:
        for server in servers:
            server.close()


def _available(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"cannot run: {type(exc).__name__}: {exc}"
    return None


# -- the part ------------------------------------------------------------------------------


def run_synchronizers(*, url: str, rounds: int, seconds: float, run_id: str) -> dict[str, Any]:
    """Run every comparison; medians and spreads per figure."""
    return asyncio.run(_run(url, rounds, seconds, run_id))


async def _run(url: str, rounds: int, seconds: float, run_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rounds, "seconds_per_round": seconds}
    tag = f"bench:{run_id}:sync"

    print("== synchronizers: semaphore, 4 permits, 16 tasks", flush=True)
    sem = [await _semaphore_round(url, f"{tag}:{r}", seconds) for r in range(rounds)]
    out["semaphore"] = {k: _spread([r[k] for r in sem]) for k in sem[0]}

    print(f"== synchronizers: latch, {LATCH_WAITERS:,} waiters", flush=True)
    latch = [await _latch_round(url, f"{tag}:{r}") for r in range(rounds)]
    out["latch"] = {k: _spread([r[k] for r in latch]) for k in latch[0]}

    print("== synchronizers: 8 readers + 1 writer, fair vs Redisson read-write lock", flush=True)
    rw: dict[str, list[dict[str, float]]] = {"fair_read_write_lock": [], "read_write_lock": []}
    for r in range(rounds):
        order = list(rw) if r % 2 == 0 else list(reversed(rw))
        for factory in order:
            rw[factory].append(await _rw_round(url, f"{tag}:{r}", factory, seconds))
    out["rw"] = {f: {k: _spread([x[k] for x in v]) for k in v[0]} for f, v in rw.items()}

    print("== synchronizers: RedLock over 3 servers", flush=True)
    red: dict[str, Any] = {}
    keys = [k for k in REDLOCKS if k == "aiolock" or _available(k) is None]
    with _three_servers() as urls:
        for tasks in (1, 8):
            per: dict[str, list[float]] = {k: [] for k in keys}
            for r in range(rounds):
                shift = r % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    figures = await _red_round(urls, f"{tag}:{r}:{tasks}", key, tasks, seconds)
                    per[key].append(figures["ops_per_s"])
            red[str(tasks)] = {k: _spread(v) for k, v in per.items()}
            peers = [k for k in keys if k != "aiolock"]
            if peers:
                # Per round, over the best peer of that same round (the bound: >= 1).
                red[f"ratio_best_peer_{tasks}"] = _spread(
                    [
                        per["aiolock"][r] / max(per[k][r] for k in peers)
                        for r in range(rounds)
                        if max(per[k][r] for k in peers) > 0
                    ]
                )
    red["unavailable"] = {k: _available(k) for k in REDLOCKS if k not in keys}
    out["redlock"] = red
    return out


def synchronizers_markdown(result: dict[str, Any]) -> str:
    """The synchronizers section of the report."""

    def fmt(s: dict[str, float], digits: int = 0) -> str:
        return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f}-{s['max']:,.{digits}f})"

    lines = [
        "",
        f"## Synchronizers ({result['rounds']} rounds of {result['seconds_per_round']:g} s; "
        "median (min-max))",
        "",
    ]
    sem = result["semaphore"]
    lines.append(
        f"Semaphore, 4 permits, 16 tasks: {fmt(sem['acq_per_s'])} acquisitions/s, wait p50 "
        f"{fmt(sem['wait_p50_ms'], 2)} ms, p99 {fmt(sem['wait_p99_ms'], 2)} ms, "
        f"{fmt(sem['scripts_per_acq'], 2)} scripts (EVALSHA) per acquisition, its release "
        "included."
    )
    latch = result["latch"]
    lines.append("")
    lines.append(
        f"Count-down latch, {LATCH_WAITERS:,} waiters over {LATCH_CLIENTS} clients, woken by "
        f"one count-down: p50 {fmt(latch['p50_ms'], 1)} ms, p99 {fmt(latch['p99_ms'], 1)} ms, "
        f"max {fmt(latch['max_ms'], 1)} ms."
    )
    lines += [
        "",
        "| 8 readers + 1 writer | writer wait p50 ms | p99 ms | max ms | reads/s |",
        "|---|---|---|---|---|",
    ]
    for factory, label in (
        ("fair_read_write_lock", "aiolock FairReadWriteLock"),
        ("read_write_lock", "aiolock ReadWriteLock (Redisson's rule)"),
    ):
        f = result["rw"][factory]
        lines.append(
            f"| {label} | {fmt(f['writer_wait_p50_ms'], 1)} | {fmt(f['writer_wait_p99_ms'], 1)} "
            f"| {fmt(f['writer_wait_max_ms'], 1)} | {fmt(f['reads_per_s'])} |"
        )
    red = result["redlock"]
    lines += ["", "| RedLock, 3 servers | pairs/s, 1 task | acq/s, 8 tasks, one name |"]
    lines.append("|---|---|---|")
    for key, (label, _) in REDLOCKS.items():
        if key in red["1"]:
            lines.append(f"| {label} | {fmt(red['1'][key])} | {fmt(red['8'][key])} |")
        else:
            lines.append(f"| {label} | {red['unavailable'][key]} | |")
    for tasks, what in (("1", "pairs/s, 1 task"), ("8", "acquisitions/s, 8 tasks")):
        ratio = red.get(f"ratio_best_peer_{tasks}")
        if ratio and ratio.get("median") is not None:
            lines += [
                "",
                f"aiolock RedLock ÷ the best peer of the same round, {what}: "
                f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"
                + (" (bound >= 1)" if tasks == "1" else ""),
            ]
    return "\n".join(lines) + "\n"
