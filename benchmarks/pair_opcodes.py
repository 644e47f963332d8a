"""Python work per plain lock()+unlock() pair, counted: opcodes executed, per function.

A count that load does not change (CPU time on a shared machine varies by +-30 %): compare
two trees by running this under each (``PYTHONPATH=<tree>``), e.g. against the base commit
checked out with ``git worktree add /tmp/base 9854a47``::

    PYTHONPATH=/tmp/base python -m benchmarks.pair_opcodes URL base.json
    python -m benchmarks.pair_opcodes URL now.json
    python -m benchmarks.pair_opcodes URL now32.json --tasks 32

Prints the total per pair (the event loop's and background tasks' share apart) and, from
a second, untraced run, the event loop's passes, callbacks run (``call_soon`` handles) and
selector events per pair. With ``--tasks N`` (default 1), N tasks each lock and unlock a
name of their own at once, as the benchmark's 32-task case does: the replies of many
tasks then arrive in one read and their commands leave in one write, so the loop's share
per pair falls. Tracing slows the client, which changes how calls batch: the opcode
count per function is what to compare; the loop figures come from the untraced run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import aiolock

PAIRS = 300
WARMUP = 300
# The event loop's own code and the background tasks (their share varies run to run).
LOOP = ("base_events", "selectors", "selector_events", "events.py", "futures", "tasks", "_latches")


async def _pairs(locks: list[Any], pairs: int) -> None:
    async def work(lock: Any) -> None:
        for _ in range(pairs):
            await lock.lock()
            await lock.unlock()

    await asyncio.gather(*(work(lock) for lock in locks))


def _loop_counter(loop: asyncio.AbstractEventLoop) -> tuple[collections.Counter[str], Any]:
    """Count the loop's passes, the callbacks each runs and the selector's events.

    Wraps the private ``_run_once`` and ``_selector.select`` of asyncio's own loops (this
    is a measuring tool, not library code); returns the counts and an undo.
    """
    stats: collections.Counter[str] = collections.Counter()
    base: Any = loop
    run_once, selector = base._run_once, base._selector
    select = selector.select

    def counted_run_once() -> None:
        stats["loop passes"] += 1
        stats["callbacks run"] += len(base._ready)
        run_once()

    def counted_select(timeout: float | None = None) -> Any:
        events = select(timeout)
        stats["selector events"] += len(events)
        return events

    base._run_once, selector.select = counted_run_once, counted_select

    def undo() -> None:
        base._run_once, selector.select = run_once, select

    return stats, undo


async def main(url: str, out: str | None, tasks: int) -> None:
    client = aiolock.Client.from_url(url)
    locks = [client.lock(f"bench:pair-opcodes:{i}") for i in range(tasks)]
    await _pairs(locks, WARMUP)
    counts: collections.Counter[str] = collections.Counter()

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1
        return local

    def tracer(frame: FrameType, _event: str, _arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    sys.settrace(tracer)
    await _pairs(locks, PAIRS)
    sys.settrace(None)
    stats, undo = _loop_counter(asyncio.get_running_loop())
    await _pairs(locks, PAIRS)
    undo()
    await client.aclose()
    pairs = PAIRS * tasks
    per_pair = {name: n / pairs for name, n in counts.items()}
    own = sum(n for name, n in per_pair.items() if not name.startswith(LOOP))
    print(
        f"{tasks} task(s): opcodes per pair: {sum(per_pair.values()):.0f} "
        f"({own:.0f} outside the event loop)"
    )
    print("untraced, per pair: " + ", ".join(f"{k} {v / pairs:.3f}" for k, v in stats.items()))
    if out is not None:
        text = json.dumps(per_pair, indent=0, sort_keys=True)
        await asyncio.to_thread(Path(out).write_text, text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url")
    parser.add_argument("out", nargs="?", help="write the per-function counts here (JSON)")
    parser.add_argument("--tasks", type=int, default=1, help="concurrent tasks (default 1)")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.out, args.tasks))
