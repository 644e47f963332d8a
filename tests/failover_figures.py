"""Failover figures on local topologies (not a test).

    python -m tests.failover_figures failover|kill|sentinel

One client holds 8 locks (one name's slot), another parks 4 waiters on each; after the
fault the holder unlocks all 8; printed: seconds from the fault to the last waiter served,
and how many unlocks raised LockLostError, per run. The scale-out ratio (1 to 3 primaries)
is the benchmark's (``python -m benchmarks``, its cluster part).
"""

# A measuring script, not library code: each closure runs within its loop iteration, and the
# waits poll counters that have no event to await.
# ruff: noqa: B023, ASYNC110

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from redis.asyncio.sentinel import Sentinel

import aiolock

from . import inside
from .topologies import redis_cluster, redis_sentinel

# Resends that span an election (2 s node timeout, then the vote).
RIDE_OUT = {"retry_attempts": 60, "retry_interval": 0.1}


async def scenario(
    holder: aiolock.Client, waiting: aiolock.Client, fault: Callable[[], Awaitable[None]]
) -> tuple[float, int]:
    names = [f"fig:{index}" for index in range(8)]
    locks = [holder.lock(name, owner="h") for name in names]
    for lock in locks:
        await lock.lock()
    served: list[float] = []

    async def wait_for(name: str) -> None:
        async with waiting.lock(name).acquired(wait=60):
            served.append(time.perf_counter())

    tasks = [asyncio.create_task(wait_for(name)) for name in names for _ in range(4)]
    while sum(waiting.lock(name).statistics().tasks_waiting for name in names) < len(tasks):
        await asyncio.sleep(0.01)
    start = time.perf_counter()
    await fault()
    lost = 0

    async def unlock(lock: aiolock.Lock) -> None:
        nonlocal lost
        try:
            await lock.unlock()
        except aiolock.LockLostError:
            lost += 1

    await asyncio.gather(*(unlock(lock) for lock in locks))
    await asyncio.gather(*tasks)
    return round(max(served) - start, 3), lost


async def cluster_runs(*, kill: bool) -> list[tuple[float, int]]:
    results = []
    for _ in range(3):
        with redis_cluster() as cluster:
            holder = aiolock.Client.from_url(cluster.url, cluster=True, **RIDE_OUT)  # type: ignore[arg-type]
            waiting = aiolock.Client.from_url(cluster.url, cluster=True, **RIDE_OUT)  # type: ignore[arg-type]
            victim = cluster.node_for_key("fig:0")

            async def fault() -> None:
                if kill:
                    victim.kill()
                else:
                    await asyncio.to_thread(cluster.failover, victim)

            results.append(await scenario(holder, waiting, fault))
            await holder.aclose()
            await waiting.aclose()
    return results


async def sentinel_runs() -> list[tuple[float, int]]:
    results = []
    with redis_sentinel() as group:
        for _ in range(3):
            await asyncio.to_thread(group.wait_settled)
            sentinel = Sentinel(group.sentinel_addresses)  # type: ignore[no-untyped-call]
            redis = [sentinel.master_for(group.master_name) for _ in range(2)]
            holder, waiting = (aiolock.Client(r, **RIDE_OUT) for r in redis)  # type: ignore[arg-type]

            async def fault() -> None:
                # The fault ends once both clients heard the switch (printed).
                before = inside.sentinel(holder).switches, inside.sentinel(waiting).switches
                start = time.perf_counter()
                await asyncio.to_thread(group.failover)
                while (
                    inside.sentinel(holder).switches,
                    inside.sentinel(waiting).switches,
                ) <= before:
                    await asyncio.sleep(0.005)
                print("both clients switched after", round(time.perf_counter() - start, 3), "s")

            results.append(await scenario(holder, waiting, fault))
            await holder.aclose()
            await waiting.aclose()
            for client in [*redis, *sentinel.sentinels]:
                await client.aclose()
    return results


async def main(which: str) -> None:
    runs = {
        "failover": lambda: cluster_runs(kill=False),
        "kill": lambda: cluster_runs(kill=True),
        "sentinel": sentinel_runs,
    }[which]
    print(which, "(seconds to serve all, unlocks lost):", await runs())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
