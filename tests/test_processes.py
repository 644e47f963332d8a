"""Mutual exclusion across OS processes, each with its own client, on a real server."""

from __future__ import annotations

import asyncio
import multiprocessing

from redis.asyncio import Redis

import aiolock

PROCESSES = 4
TASKS = 4
ROUNDS = 25


async def _worker(url: str, name: str, counter: str) -> None:
    async with aiolock.Client.from_url(url) as client:
        raw = Redis.from_url(url)

        async def task() -> None:
            for _ in range(ROUNDS):
                async with client.lock(name):
                    # A non-atomic read-modify-write: exact only under mutual exclusion.
                    value = int(await raw.get(counter) or 0)
                    await raw.set(counter, value + 1)

        await asyncio.gather(*(task() for _ in range(TASKS)))
        await raw.aclose()


def _process(url: str, name: str, counter: str) -> None:
    asyncio.run(_worker(url, name, counter))


async def test_processes_exclude_each_other(redis_url: str, raw: Redis, name: str) -> None:
    """4 processes x 4 tasks incrementing a counter under one lock end with an exact count."""
    counter = f"{name}:counter"
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=_process, args=(redis_url, name, counter)) for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    loop = asyncio.get_running_loop()
    for proc in procs:
        await loop.run_in_executor(None, proc.join, 60)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    assert int(await raw.get(counter) or 0) == PROCESSES * TASKS * ROUNDS
    assert await raw.exists(name) == 0
    await raw.delete(counter)
