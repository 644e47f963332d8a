"""Where a RedLock's time goes at 1 task: the composite, or its members.

Three local servers and this process on one core (``--pin-cpu``, as the pinned run), one
task, lock+unlock pairs with an explicit lease (no watchdog), round-robin in short rounds:

- ``one lock``: one aiolock lock on the first server (a member's cost alone);
- ``3 locks in turn``: one lock on each server, taken one after another and released
  one after another by the task (three members' cost, no concurrency, no composite);
- ``3 locks at once``: the same three, taken and released at once for the calling task,
  each call in a task of its own, as the RedLock's members are (three members' cost,
  plus running them at once);
- ``RedLock``: ``aiolock.RedLock`` over the same three (plus the composite's own logic);
- ``aioredlock``: aioredlock's lock over the same three servers, when it is installed;
- ``RedLock (REF)``, with ``--baseline REF``: the RedLock of aiolock at git ref REF,
  installed beside (``_baseline.py``), for an A/B of a change in one run.

Per pair: the client's CPU (``time.process_time``), the servers' CPU (``used_cpu_user +
used_cpu_sys``, summed) and the servers' time running scripts (``INFO commandstats``).
With everything on one core, pairs/s is about 1 ÷ (client + server CPU per pair).

Run from the repository root::

    python -m benchmarks.redlock_parts [--rounds 6] [--seconds 1.0] [--pin-cpu 1]
        [--baseline REF]

After the table: each RedLock's pairs/s ÷ aioredlock's, per round (as the full run takes
its ratio), median (min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiolock
from aiolock._engine.release import release
from aiolock._objects.members import AtOnce, failed, try_member
from aiolock.testing import start_local_server

from ._baseline import NAME, install_baseline
from ._instrument import CommandStats, server_info

LEASE_S = 30.0
WARM_PAIRS = 50
LOOP_BOUND = 1_000_000

Pair = Callable[[], Awaitable[None]]


def _at_once(calls: list[Callable[..., Coroutine[Any, Any, Any]]]) -> Pair:
    """The calls at once for the calling task, each in a task, as a RedLock's members."""

    async def run() -> None:
        caller = asyncio.current_task()
        assert caller is not None
        running = AtOnce(call(task=caller) for call in calls)
        await running.finish()
        for task in running.tasks:
            error = failed(task)
            if error is not None:
                raise error

    return run


async def _aiolock_pairs(urls: list[str], name: str) -> tuple[dict[str, Pair], Pair]:
    clients = [aiolock.Client.from_url(url) for url in urls]
    locks = [client.lock(name, owner=None) for client in clients]
    lock_all = _at_once(
        [functools.partial(try_member, lock, None, LEASE_S, timed=False) for lock in locks]
    )
    unlock_all = _at_once(
        [functools.partial(release, lock._engine, lock._primitive, lock._owner) for lock in locks]
    )

    async def one() -> None:
        await locks[0].lock(lease=LEASE_S)
        await locks[0].unlock()

    async def in_turn() -> None:
        for lock in locks:
            await lock.lock(lease=LEASE_S)
        for lock in locks:
            await lock.unlock()

    async def at_once() -> None:
        await lock_all()
        await unlock_all()

    pairs: dict[str, Pair] = {
        "one lock": one,
        "3 locks in turn": in_turn,
        "3 locks at once": at_once,
        "RedLock": _redlock_pair(aiolock, clients, f"{name}:red"),
    }
    return pairs, _closing(clients)


def _redlock_pair(module: Any, clients: list[Any], name: str) -> Pair:
    """A RedLock lock+unlock pair over ``clients``, of ``module`` (aiolock, or the baseline)."""
    red = module.RedLock(*(client.lock(name) for client in clients))

    async def pair() -> None:
        await red.lock(lease=LEASE_S)
        await red.unlock()

    return pair


def _closing(clients: list[Any]) -> Pair:
    """What closes ``clients``."""

    async def close() -> None:
        for client in clients:
            await client.aclose()

    return close


async def _aioredlock_pair(urls: list[str], name: str) -> tuple[Pair, Pair] | None:
    try:
        module: Any = importlib.import_module("aioredlock")
    except Exception:  # not installed, or broken on this Python: left out
        return None
    manager = module.Aioredlock(urls)

    async def pair() -> None:
        held = None
        for _ in range(LOOP_BOUND):  # it gives up after 3 tries: a user calls again
            with contextlib.suppress(module.LockError):
                held = await manager.lock(name, lock_timeout=LEASE_S)
                break
        if held is None:
            raise RuntimeError("aioredlock never took the lock")
        await manager.unlock(held)

    return pair, manager.destroy


async def _measure(pair: Pair, stats: CommandStats, seconds: float) -> dict[str, float]:
    for _ in range(WARM_PAIRS):
        await pair()
    before, scripts0 = stats.snapshot()["_cpu"], stats.script_us()
    cpu0, t0 = time.process_time(), time.perf_counter()
    stop = t0 + seconds
    done = 0
    for _ in range(LOOP_BOUND):
        if time.perf_counter() >= stop:
            break
        await pair()
        done += 1
    t1, cpu1 = time.perf_counter(), time.process_time()
    after, scripts1 = stats.snapshot()["_cpu"], stats.script_us()
    return {
        "pairs_per_s": done / (t1 - t0),
        "client_us": 1e6 * (cpu1 - cpu0) / done,
        "server_us": 1e6 * (after - before) / done,
        "script_us": (scripts1 - scripts0) / done,
    }


async def run(
    urls: list[str], rounds: int, seconds: float, baseline: str | None = None
) -> dict[str, list[dict[str, float]]]:
    """Each case once per round, the order rotating; its figures per round.

    ``baseline``: the git ref of the ``aiolock_baseline`` installed, for its RedLock.
    """
    stats = CommandStats(*urls)
    rows: dict[str, list[dict[str, float]]] = {}
    try:
        for index in range(rounds):
            pairs, close = await _aiolock_pairs(urls, f"bench:redparts:{index}")
            cases: dict[str, Pair] = dict(pairs)
            closers = [close]
            if baseline is not None:
                module = importlib.import_module(NAME)
                base_clients = [module.Client.from_url(url) for url in urls]
                base = f"bench:redparts:{index}:base"
                cases[f"RedLock ({baseline})"] = _redlock_pair(module, base_clients, base)
                closers.append(_closing(base_clients))
            peer = await _aioredlock_pair(urls, f"bench:redparts:{index}:aioredlock")
            if peer is not None:
                cases["aioredlock"], peer_close = peer
                closers.append(peer_close)
            try:
                keys = list(cases)
                shift = index % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    rows.setdefault(key, []).append(await _measure(cases[key], stats, seconds))
            finally:
                for closer in closers:
                    await closer()
    finally:
        stats.close()
    return rows


def _cell(values: list[float], digits: int = 1) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def main() -> None:
    """Start three servers, pin, measure, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--pin-cpu", type=int, default=None, help="one CPU for all (default: none)")
    parser.add_argument("--baseline", default=None, help="also the RedLock of aiolock at this ref")
    args = parser.parse_args()
    baseline = None
    if args.baseline is not None:
        _, baseline = install_baseline(args.baseline)
    servers = [start_local_server() for _ in range(3)]
    try:
        urls = [server.url for server in servers]
        if args.pin_cpu is not None:
            for url in urls:
                os.sched_setaffinity(int(server_info(url)["process_id"]), {args.pin_cpu})
            os.sched_setaffinity(0, {args.pin_cpu})
        rows = asyncio.run(run(urls, args.rounds, args.seconds, baseline))
    finally:
        for server in servers:
            server.close()
    print(f"\n{args.rounds} rounds of {args.seconds:g} s; per pair, median (min-max)\n")
    print("| case | pairs/s | client CPU µs | server CPU µs | of which scripts µs |")
    print("|---|---|---|---|---|")
    for key, values in rows.items():
        cells = [
            _cell([v["pairs_per_s"] for v in values], 0),
            _cell([v["client_us"] for v in values]),
            _cell([v["server_us"] for v in values]),
            _cell([v["script_us"] for v in values]),
        ]
        print(f"| {key} | " + " | ".join(cells) + " |")
    peer = rows.get("aioredlock")
    if peer is not None:
        print()
        for key, values in rows.items():
            if key.startswith("RedLock"):
                pairs = zip(values, peer, strict=True)
                ratios = [mine["pairs_per_s"] / its["pairs_per_s"] for mine, its in pairs]
                print(f"{key} ÷ aioredlock, pairs/s per round: {_cell(ratios, 2)}")


if __name__ == "__main__":
    main()
