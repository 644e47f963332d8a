"""The cost of the event stream: lock/unlock pairs with no listener and with one.

Three clients on one server, each doing lock()+unlock() pairs on its own lock, one task:

* ``none``: no listener, the slow-lock log off (``slow_wait=None, slow_hold=None``);
* ``default``: no listener, the slow-lock log on (the defaults: 5 s, 60 s);
* ``listener``: the defaults and one no-op listener.

The modes run in turns (``--rounds`` of ``--pairs`` pairs each, interleaved so that drift of
the machine hits them alike); each round's time per pair is kept and the medians compared.
Each pair makes two events (``Acquired``, ``Released``). Then the emitter alone, without a
server (``timeit``), for the CPU cost of one event more precisely than round trips allow.

Run from the repository root (the server as for the other benchmarks:
``aiolock.testing.redis_server()``, ``REDIS_URL`` to choose one)::

    python -m benchmarks.events_cost [--pairs 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import timeit
from time import perf_counter

import aiolock
from aiolock._emitter import Emitter
from aiolock.events import Event
from aiolock.testing import redis_server

MODES = ("none", "default", "listener")


def _noop(event: Event) -> None:
    pass


async def _pairs(lock: aiolock.Lock, n: int) -> float:
    """Seconds per lock()+unlock() pair over ``n`` pairs."""
    start = perf_counter()
    for _ in range(n):
        await lock.lock()
        await lock.unlock()
    return (perf_counter() - start) / n


async def measure(url: str, pairs: int, rounds: int) -> dict[str, list[float]]:
    clients = {
        "none": aiolock.Client.from_url(url, slow_wait=None, slow_hold=None),
        "default": aiolock.Client.from_url(url),
        "listener": aiolock.Client.from_url(url),
    }
    clients["listener"].add_listener(_noop)
    per_pair: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        locks = {mode: client.lock(f"bench:events:{mode}") for mode, client in clients.items()}
        for lock in locks.values():
            await _pairs(lock, 200)  # warm up: connections, scripts loaded
        for i in range(rounds):
            # Rotate the order too: no mode always runs first in a round.
            order = MODES[i % 3 :] + MODES[: i % 3]
            for mode in order:
                per_pair[mode].append(await _pairs(locks[mode], pairs))
    finally:
        for client in clients.values():
            await client.aclose()
    return per_pair


def emitter_alone(number: int = 200_000) -> dict[str, float]:
    """Seconds per hook call (an Acquired), no server: the pure CPU cost of one event."""
    results = {}
    for mode in MODES:
        emitter = Emitter() if mode == "none" else Emitter(slow_wait=5.0, slow_hold=60.0)
        if mode == "listener":
            emitter.add(_noop)

        def hook(emitter: Emitter = emitter) -> None:
            emitter.acquired("lock", "bench", "holder:1", 0.001, reentrant=False)

        results[mode] = min(timeit.repeat(hook, number=number, repeat=5)) / number
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with redis_server() as server:
        per_pair = asyncio.run(measure(server.url, args.pairs, args.rounds))
    base = statistics.median(per_pair["none"])
    print(f"lock+unlock pairs, 1 task, {args.rounds} rounds x {args.pairs} pairs, medians:")
    for mode in MODES:
        median = statistics.median(per_pair[mode])
        spread = statistics.pstdev(per_pair[mode]) * 1e6
        print(
            f"  {mode:<9} {median * 1e6:8.2f} us/pair  (sd {spread:.2f} us)  "
            f"{(median - base) * 1e6:+.2f} us/pair = {(median - base) * 1e6 / 2:+.2f} us/event"
        )
    alone = emitter_alone()
    print("the emitter alone (one Acquired hook call, no server, best of 5):")
    for mode in MODES:
        print(f"  {mode:<9} {alone[mode] * 1e9:8.1f} ns/event")


if __name__ == "__main__":
    main()
