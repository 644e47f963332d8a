"""RedLock and MultiLock over servers far apart: acquire and unlock latency against one member's.

Five servers, each behind a fault proxy (``tests/faultproxy.py``) that holds every command
``--delay`` seconds (default 4 ms one way: a round trip 4 ms longer, as 2 ms each way
would make it). One task, one at a time: ``--n`` acquisitions (default 50) of one member
alone, of a RedLock over the five and of a MultiLock over the five, each released before
the next; the acquire and the unlock calls are timed. With ``--baseline REF`` the aiolock
of git ref REF (installed beside as ``aiolock_baseline``, see ``_baseline.py``) is measured
in the same run, interleaved with this one.

Run from the repository root::

    python -m benchmarks.redlock_latency [--n 50] [--delay 0.004] [--baseline main]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import statistics
import time
from types import ModuleType
from typing import Any

import aiolock
from aiolock.testing import LocalServer, start_local_server
from tests.faultproxy import FaultProxy

from ._baseline import NAME, install_baseline

SERVERS = 5


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _time(acquire: Any, release: Any) -> tuple[float, float]:
    started = time.perf_counter()
    await acquire()
    took = time.perf_counter() - started
    started = time.perf_counter()
    await release()
    return took, time.perf_counter() - started


async def measure(
    lib: ModuleType, urls: list[str], n: int, tag: str
) -> dict[str, list[tuple[float, float]]]:
    """(acquire, unlock) latencies (s) of one member, a RedLock and a MultiLock, interleaved."""
    clients = [lib.Client.from_url(url) for url in urls]
    try:
        name = f"bench:redlock:{tag}"
        one = clients[0].lock(f"{name}:one")
        red = lib.RedLock(*(c.lock(name) for c in clients))
        multi = lib.MultiLock(*(c.lock(f"{name}:{i}") for i, c in enumerate(clients)))
        cases = {"one member": one, "RedLock x5": red, "MultiLock x5": multi}
        times: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
        for lock in cases.values():  # warm: connections, scripts loaded
            await _time(lock.lock, lock.unlock)
        for _ in range(n):
            for case, lock in cases.items():
                times[case].append(await _time(lock.lock, lock.unlock))
        return times
    finally:
        for client in clients:
            await client.aclose()


async def run(n: int, delay: float, baseline: str | None) -> None:
    libs: list[tuple[str, ModuleType]] = [("aiolock", aiolock)]
    if baseline is not None:
        _, commit = install_baseline(baseline)
        libs.append((f"aiolock {baseline} ({commit})", importlib.import_module(NAME)))
    servers: list[LocalServer] = [start_local_server() for _ in range(SERVERS)]
    try:
        async with contextlib.AsyncExitStack() as stack:
            proxies = [
                await stack.enter_async_context(FaultProxy.from_url(server.url))
                for server in servers
            ]
            for proxy in proxies:
                proxy.delay(delay)
            urls = [proxy.url for proxy in proxies]
            print(
                f"{SERVERS} servers, each behind a proxy adding {delay * 1000:g} ms per command "
                f"(one way); n={n} per case, one task (loaded-machine figures)"
            )
            results: dict[str, dict[str, list[tuple[float, float]]]] = {
                label: {} for label, _ in libs
            }
            # Interleaved in rounds, so that load changes affect both alike.
            rounds = 5
            for r in range(rounds):
                for label, lib in libs:
                    got = await measure(lib, urls, max(1, n // rounds), f"{r}:{label}")
                    for case, values in got.items():
                        results[label].setdefault(case, []).extend(values)
            for label, cases in results.items():
                print(f"\n{label}")
                for which, call in ((0, "acquire"), (1, "unlock")):
                    base = statistics.median(v[which] for v in cases["one member"])
                    for case, values in cases.items():
                        ms = [v[which] * 1000 for v in values]
                        p50 = statistics.median(ms)
                        print(
                            f"  {call:<7} {case:<13} p50={p50:7.2f} ms  "
                            f"p90={_p(ms, 0.9):7.2f} ms  = {p50 / (base * 1000):.2f}x one "
                            "member's p50"
                        )
    finally:
        for server in servers:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.004)
    parser.add_argument("--baseline", default=None, help="also measure aiolock at this git ref")
    args = parser.parse_args()
    asyncio.run(run(args.n, args.delay, args.baseline))


if __name__ == "__main__":
    main()
