"""Mutual exclusion across OS processes, each with its own client, on a real server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from redis.asyncio import Redis

PROCESSES = 4
TASKS = 4
ROUNDS = 25
WORKER = Path(__file__).with_name("mutex_worker.py")


async def test_processes_exclude_each_other(redis_url: str, raw: Redis, name: str) -> None:
    """4 processes x 4 tasks incrementing a counter under one lock end with an exact count."""
    counter = f"{name}:counter"
    args = [str(WORKER), redis_url, name, counter, str(TASKS), str(ROUNDS)]
    procs = [await asyncio.create_subprocess_exec(sys.executable, *args) for _ in range(PROCESSES)]
    try:
        async with asyncio.timeout(60):
            codes = [await proc.wait() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert codes == [0] * PROCESSES
    assert int(await raw.get(counter) or 0) == PROCESSES * TASKS * ROUNDS
    assert await raw.exists(name) == 0
    await raw.delete(counter)
