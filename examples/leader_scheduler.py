"""A scheduler that runs its jobs on one replica only: the elected leader.

Run several copies with ``REDIS_URL=redis://localhost:6379/0 python -m
examples.leader_scheduler``: one ticks, the others wait. Stop the leader (Ctrl-C) and another
takes over at once (the lock is released on the way out); kill it (or cut it off from Redis)
and another takes over once its lease runs out, and not before: a leader that can no longer
confirm its lease stops its work first (its term is guarded).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import aiolock


async def schedule(
    client: aiolock.Client, name: str, job: Callable[[], Awaitable[None]], *, every: float
) -> None:
    """Run ``job`` every ``every`` seconds while this client leads ``name``; until cancelled.

    A lost term cancels the loop; ``Leader.run`` then campaigns again.
    """
    leader = client.leader(name)

    async def tick_forever() -> None:
        while True:
            await job()
            await asyncio.sleep(every)

    await leader.run(tick_forever)


async def main() -> None:
    """Tick once a second while this process leads ``scheduler:demo``."""
    async with aiolock.Client.from_url(
        os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    ) as client:

        async def job() -> None:
            print(f"tick from {client.id}", flush=True)

        await schedule(client, "scheduler:demo", job, every=1.0)


if __name__ == "__main__":
    asyncio.run(main())
