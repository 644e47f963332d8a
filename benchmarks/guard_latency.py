"""The guard's cancel latency: from a guarded hold's loss to its body's cancellation.

Two ways a guarded hold is lost, ``--n`` times each (default 100), one at a time:

* **found gone**: another client ``force_unlock()``s the lock; the unlock message on the
  lock's channel (every guarded hold watches it since 6b2a2f1) or the holder's renewal (a
  round run here on demand, ``renew_once()``, as the watchdog would), whichever comes
  first, finds it gone and tells the guard. Measured from that moment (the guard's
  ``Guarding.lose``, timed by a wrapper) to the body's ``CancelledError``.
* **not confirmed**: ``guarded(lease=0.05)``, never renewed: the guard's timer fires at
  ``confirmed_until``. Measured from ``confirmed_until`` to the body's ``CancelledError``.

Run from the repository root (the server as for the other benchmarks:
``aiolock.testing.redis_server()``, ``REDIS_URL`` to choose one)::

    python -m benchmarks.guard_latency [--n 100]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
from collections.abc import Callable

import aiolock
from aiolock._engine import guard as _guard
from aiolock.testing import redis_server


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(what: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{what:<14} n={len(ms)}  p50={statistics.median(ms):.3f} ms  "
        f"p99={_percentile(ms, 0.99):.3f} ms  max={max(ms):.3f} ms"
    )


async def _body(
    guarded: _guard.Guarded, entered: asyncio.Event, out: list[tuple[_guard.Hold, float]]
) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with guarded as hold:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                out.append((hold, loop.time()))
                raise
    except aiolock.LockLostError:
        pass


async def found_gone(url: str, n: int) -> list[float]:
    """Lost by force_unlock() elsewhere, found by a renewal round."""
    loop = asyncio.get_running_loop()
    told: dict[_guard.Guarding, float] = {}
    original: Callable[[_guard.Guarding, str], None] = _guard.Guarding.lose

    def timed(hold: _guard.Guarding, why: str) -> None:
        told.setdefault(hold, loop.time())
        original(hold, why)

    _guard.Guarding.lose = timed  # type: ignore[method-assign,assignment]
    holder = aiolock.Client.from_url(url, watchdog_timeout=30)
    other = aiolock.Client.from_url(url)
    latencies: list[float] = []
    try:
        for i in range(n):
            name = f"bench:guard:gone:{i}"
            entered, out = asyncio.Event(), list[tuple[_guard.Hold, float]]()
            task = asyncio.create_task(_body(holder.lock(name).guarded(), entered, out))
            await entered.wait()
            await other.lock(name).force_unlock()
            await holder._services.renewal.renew_once()
            await task
            hold, stopped = out[0]
            latencies.append(stopped - told[_guard.guarding_of(hold)])
    finally:
        _guard.Guarding.lose = original  # type: ignore[method-assign,assignment]
        await holder.aclose()
        await other.aclose()
    return latencies


async def not_confirmed(url: str, n: int) -> list[float]:
    """Lost at confirmed_until: an explicit lease that ran out."""
    client = aiolock.Client.from_url(url)
    latencies: list[float] = []
    try:
        for i in range(n):
            entered, out = asyncio.Event(), list[tuple[_guard.Hold, float]]()
            guarded = client.lock(f"bench:guard:lease:{i}").guarded(lease=0.05)
            await _body(guarded, entered, out)
            hold, stopped = out[0]
            latencies.append(stopped - hold.confirmed_until)
            # Let the lease end on the server before the next round (its release, sent in
            # the background, may find it already gone).
            await asyncio.sleep(0.06)
    finally:
        await client.aclose()
    return latencies


async def main(n: int) -> None:
    # Each loss is logged at WARNING: 200 lines that say nothing here.
    logging.getLogger("aiolock").setLevel(logging.ERROR)
    with redis_server() as server:
        gone = await found_gone(server.url, n)
        late = await not_confirmed(server.url, n)
    print(_summary("found gone", gone))
    print(_summary("not confirmed", late))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="losses of each kind")
    asyncio.run(main(parser.parse_args().n))
