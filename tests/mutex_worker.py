"""A worker process for the multi-process tests: run as a script, not imported by pytest.

Usage: python mutex_worker.py URL LOCK_NAME COUNTER_KEY TASKS ROUNDS

Each of TASKS tasks takes the lock ROUNDS times and, holding it, does a non-atomic
read-modify-write of COUNTER_KEY: the final count is exact only under mutual exclusion.
"""

from __future__ import annotations

import asyncio
import sys

from redis.asyncio import Redis

import aiolock


async def main(url: str, name: str, counter: str, tasks: int, rounds: int) -> None:
    """Run the tasks on one client, as one service process would."""
    async with aiolock.Client.from_url(url) as client:
        raw = Redis.from_url(url)

        async def task() -> None:
            for _ in range(rounds):
                async with client.lock(name):
                    value = int(await raw.get(counter) or 0)
                    await raw.set(counter, value + 1)

        await asyncio.gather(*(task() for _ in range(tasks)))
        await raw.aclose()


if __name__ == "__main__":
    url, name, counter, tasks, rounds = sys.argv[1:]
    asyncio.run(main(url, name, counter, int(tasks), int(rounds)))
