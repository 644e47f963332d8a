"""What the sync API's thread hand-off costs at 1 thread, in CPU and in thread sleeps.

Three measurements in turns (``--rounds`` of ``--pairs``, interleaved so that drift of the
machine hits them alike), medians shown:

* ``async``: one task doing ``lock()`` + ``unlock()`` pairs on the async client: the floor;
* ``sync``: one thread doing the same pairs on ``aiolock.sync`` (each call handed to the
  loop thread and back);
* ``empty``: one thread handing an empty coroutine to the loop thread and back (the
  hand-off alone, per call, no server).

For each: wall and process CPU per pair (per call for ``empty``), and the context switches
(voluntary and all) of the process's threads per pair, read from ``/proc`` (Linux only):
counts that load changes little. The async client's loop mostly finds the reply there when
it polls (no voluntary switch); a sync call sleeps three times (the caller until the
outcome, the loop thread until the reply and until the next call). Run pinned for figures
to compare
(``taskset -c 0 python -m benchmarks.sync_handoff``; the server started here inherits the
pinning), from the repository root::

    python -m benchmarks.sync_handoff [--pairs 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable

import aiolock
import aiolock.sync
from aiolock.sync._portal import portal
from aiolock.testing import redis_server


def _switches() -> tuple[int, int]:
    """The process's threads' voluntary and involuntary context switches so far."""
    voluntary = involuntary = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
    return voluntary, involuntary


def _measure(run: Callable[[int], None], n: int) -> tuple[float, float, float, float]:
    """Wall µs, CPU µs, voluntary and all switches per unit of ``run(n)``."""
    s0, w0, c0 = _switches(), time.perf_counter(), time.process_time()
    run(n)
    w1, c1, s1 = time.perf_counter(), time.process_time(), _switches()
    voluntary = s1[0] - s0[0]
    return 1e6 * (w1 - w0) / n, 1e6 * (c1 - c0) / n, voluntary / n, (voluntary + s1[1] - s0[1]) / n


async def _empty() -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with redis_server() as server:
        client = aiolock.sync.Client.from_url(server.url)
        sync_lock = client.lock("bench:handoff:sync")
        loop_thread = portal()  # the loop the sync client uses (attached once more)
        async_client = aiolock.Client.from_url(server.url)
        async_lock = async_client.lock("bench:handoff:async")

        async def async_pairs(n: int) -> None:
            for _ in range(n):
                await async_lock.lock()
                await async_lock.unlock()

        def sync_pairs(n: int) -> None:
            for _ in range(n):
                sync_lock.lock()
                sync_lock.unlock()

        def empty_calls(n: int) -> None:
            for _ in range(n):
                loop_thread.run(_empty())

        # The async client runs in a loop of this thread: its own, so that the loop thread
        # of the sync client sleeps meanwhile, as it would without a sync caller.
        runner = asyncio.Runner()
        modes: dict[str, Callable[[int], None]] = {
            "async": lambda n: runner.run(async_pairs(n)),
            "sync": sync_pairs,
            "empty": empty_calls,
        }
        rows: dict[str, list[tuple[float, float, float, float]]] = {mode: [] for mode in modes}
        for run in modes.values():
            run(200)  # connections, scripts loaded, caches warm
        for _ in range(args.rounds):
            for mode, run in modes.items():
                rows[mode].append(_measure(run, args.pairs))
        runner.run(async_client.aclose())
        runner.close()
        loop_thread.detach()
        client.close()
    print(f"{args.rounds} rounds of {args.pairs}; medians (empty: per call, no server)")
    print("mode   | wall µs/pair | CPU µs/pair | switches/pair: voluntary | all")
    for mode, measured in rows.items():
        wall, cpu, vol, every = (statistics.median(m[i] for m in measured) for i in range(4))
        print(f"{mode:6} | {wall:12.1f} | {cpu:11.1f} | {vol:24.2f} | {every:.2f}")


if __name__ == "__main__":
    main()
