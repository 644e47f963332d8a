"""What ``aiolock list`` costs on a large keyspace: wall time, commands, peak memory.

Two keyspaces on a fresh server (``aiolock.testing.redis_server()``, ``REDIS_URL`` to
choose one), each written raw with pipelines:

* ``apps``: ``--keys`` application strings (``cache:<i>``) and 5 held locks
  (``orders:<i>``): the command must print the 5 rows without a round trip per key;
* ``locks``: ``--keys`` held locks (Redisson's hash layout, one holder each) and as many
  application strings.

For each, ``aiolock list URL`` (the default: 100 rows) and, on ``locks``,
``aiolock list URL --limit N --json`` for every lock, run as the console script (a
subprocess): wall time, the commands the server counted (``INFO commandstats``) and the
subprocess's peak RSS. Run from the repository root::

    python -m benchmarks.cli_list [--keys 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from typing import Any

import redis

from aiolock.testing import redis_server

HOLDER = f"{uuid.uuid4()}:1"
BATCH = 10_000


def commands(r: redis.Redis) -> int:
    """Commands the server has run so far (INFO commandstats)."""
    stats: dict[str, Any] = r.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def fill(r: redis.Redis, *, strings: int, locks: int) -> None:
    r.flushall()
    for start in range(0, max(strings, locks), BATCH):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + BATCH, strings)):
            pipe.set(f"cache:{i}", "x" * 20)
        for i in range(start, min(start + BATCH, locks)):
            pipe.hset(f"orders:{i}", HOLDER, 1)
            pipe.pexpire(f"orders:{i}", 600_000)
        pipe.execute()


def run(r: redis.Redis, url: str, *args: str) -> dict[str, Any]:
    """One ``aiolock list`` run: seconds, commands, peak RSS (MiB), rows printed."""
    before = commands(r)
    start = time.perf_counter()
    rss_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run(
        [sys.executable, "-m", "aiolock", "list", url, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rows = (
        len(json.loads(out)["objects"])
        if "--json" in args
        else sum(1 for line in out.splitlines() if "orders:" in line)
    )
    return {
        "args": " ".join(args) or "(default)",
        "seconds": round(seconds, 2),
        # The INFO of `commands()` itself counts one.
        "commands": commands(r) - before - 1,
        # ru_maxrss is the largest child so far: meaningful when it grew.
        "peak_rss_mib": round(max(rss, rss_before) / 1024, 1),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    with redis_server() as server:
        url = server.url
        r = redis.Redis.from_url(url)
        try:
            fill(r, strings=args.keys, locks=5)
            print(f"apps: {args.keys} application strings + 5 locks")
            print("  ", run(r, url))
            fill(r, strings=args.keys, locks=args.keys)
            print(f"locks: {args.keys} locks + {args.keys} application strings")
            print("  ", run(r, url))
            print(
                "  ",
                run(
                    r, url, "--limit", str(args.keys), "--scan-limit", str(4 * args.keys), "--json"
                ),
            )
        finally:
            r.flushall()
            r.close()


if __name__ == "__main__":
    main()
