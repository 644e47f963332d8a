"""The fair read-write lock's server work per attempt against its queue length.

    python -m benchmarks.frw_queue_curve [--lengths 1,10,100,1000] [--attempts 50]

Two cases per queue length N, on a fresh local server, counted from ``INFO commandstats``
deltas (load does not change counts; the microseconds are the server's own CPU time for
the scripts, noisy on a loaded machine but not hidden by client-side delays):

- **attempt**: readers hold the lock and N waiters queue for it (a writer, then N - 1
  readers behind it); a new reader tries ``try_lock(wait=0)`` ``--attempts`` times. It is
  refused every time (a writer waits ahead of it): the commands and script microseconds of
  one such attempt. The queued readers' own retries run the same script.
- **drain**: a writer holds the lock and N readers queue behind it; the writer releases.
  Per reader let in: scripts run, commands run inside them, script microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio

import aiolock
from aiolock.testing import start_local_server

__all__ = ("curve",)


async def _stats(raw: redis.asyncio.Redis) -> dict[str, tuple[int, int]]:
    info: Mapping[str, Any] = await raw.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in info.items()
        if isinstance(v, Mapping)
    }


def _delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, int]:
    scripts = after.get("evalsha", (0, 0))[0] - before.get("evalsha", (0, 0))[0]
    usec = after.get("evalsha", (0, 0))[1] - before.get("evalsha", (0, 0))[1]
    inner = sum(
        calls - before.get(name, (0, 0))[0]
        for name, (calls, _) in after.items()
        if name not in {"evalsha", "eval", "info", "script|load", "script", "ping"}
        and not name.startswith(("subscribe", "ssubscribe", "unsubscribe", "client", "hello"))
    )
    return {"scripts": scripts, "commands": inner, "script_usec": usec}


async def _wait_for(predicate: Any, what: str, bound: float = 120.0) -> None:
    stop = time.monotonic() + bound
    while not await predicate():
        if time.monotonic() > stop:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)


async def _attempt_case(url: str, n: int, attempts: int) -> dict[str, float]:
    name = f"curve:attempt:{n}"
    queue = f"aiolock_frw_queue:{{{name}}}"
    async with (
        aiolock.Client.from_url(url) as holders,
        aiolock.Client.from_url(url) as waiters,
        aiolock.Client.from_url(url) as prober,
        redis.asyncio.Redis.from_url(url) as raw,
    ):
        held = holders.fair_read_write_lock(name, owner="holder").read_lock()
        await held.lock()
        release = asyncio.Event()

        async def wait_for(lock: Any) -> None:
            await lock.lock()
            await release.wait()
            await lock.unlock()

        tasks = [asyncio.create_task(wait_for(waiters.fair_read_write_lock(name).write_lock()))]
        await _wait_for(lambda: _queued(raw, queue, 1), "the writer queued")
        tasks += [
            asyncio.create_task(wait_for(waiters.fair_read_write_lock(name).read_lock()))
            for _ in range(n - 1)
        ]
        await _wait_for(lambda: _queued(raw, queue, n), f"{n} waiters queued")
        probe = prober.fair_read_write_lock(name).read_lock()
        before = await _stats(raw)
        for _ in range(attempts):
            if await probe.try_lock(wait=0):
                raise AssertionError("a reader got in ahead of a queued writer")
        after = await _stats(raw)
        release.set()
        await held.unlock()
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    d = _delta(before, after)
    return {k: v / attempts for k, v in d.items()}


async def _queued(raw: redis.asyncio.Redis, queue: str, n: int) -> bool:
    return int(await raw.llen(queue)) >= n


async def _drain_case(url: str, n: int) -> dict[str, float]:
    name = f"curve:drain:{n}"
    queue = f"aiolock_frw_queue:{{{name}}}"
    async with (
        aiolock.Client.from_url(url) as holders,
        aiolock.Client.from_url(url) as waiters,
        redis.asyncio.Redis.from_url(url) as raw,
    ):
        writer = holders.fair_read_write_lock(name, owner="holder").write_lock()
        await writer.lock()
        release = asyncio.Event()
        got = 0

        async def read() -> None:
            nonlocal got
            lock = waiters.fair_read_write_lock(name).read_lock()
            await lock.lock()
            got += 1
            await release.wait()
            await lock.unlock()

        tasks = [asyncio.create_task(read()) for _ in range(n)]
        await _wait_for(lambda: _queued(raw, queue, n), f"{n} readers queued")
        before = await _stats(raw)
        started = time.perf_counter()
        await writer.unlock()

        async def all_in() -> bool:
            return got == n

        await _wait_for(all_in, "every reader let in", bound=600)
        took = time.perf_counter() - started
        after = await _stats(raw)
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    d = _delta(before, after)
    out: dict[str, float] = {k: v / n for k, v in d.items()}
    out["drain_s"] = took
    return out


async def curve(lengths: list[int], attempts: int) -> dict[str, Any]:
    """Both cases for every queue length, each on its own fresh server."""
    result: dict[str, Any] = {}
    for n in lengths:
        server = start_local_server()
        try:
            result[str(n)] = {
                "attempt": await _attempt_case(server.url, n, attempts),
                "drain": await _drain_case(server.url, n),
            }
        finally:
            server.close()
        print(n, json.dumps(result[str(n)]), flush=True)
    return result


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "| queue length | attempt: commands | attempt: script µs | drain: scripts/reader "
        "| drain: commands/reader | drain: script µs/reader | drain: s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in result.items():
        a, d = r["attempt"], r["drain"]
        lines.append(
            f"| {int(n):,} | {a['commands']:.1f} | {a['script_usec']:.0f} | {d['scripts']:.2f} "
            f"| {d['commands']:.1f} | {d['script_usec']:.0f} | {d['drain_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1,10,100,1000")
    parser.add_argument("--attempts", type=int, default=50)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    print(_markdown(asyncio.run(curve(lengths, args.attempts))))


if __name__ == "__main__":
    main()
