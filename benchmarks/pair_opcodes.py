"""Python work per plain lock()+unlock() pair, counted: opcodes executed, per function.

A count that load does not change (CPU time on a shared machine varies by +-30 %): compare
two trees by running this under each (``PYTHONPATH=<tree>``), e.g. against the base commit
checked out with ``git worktree add /tmp/base 9854a47``::

    PYTHONPATH=/tmp/base python -m benchmarks.pair_opcodes URL base.json
    python -m benchmarks.pair_opcodes URL now.json

Prints the total per pair (the event loop's and background tasks' share apart).
"""

from __future__ import annotations

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


async def main(url: str, out: str | None) -> None:
    client = aiolock.Client.from_url(url)
    lock = client.lock("bench:pair-opcodes")
    for _ in range(WARMUP):
        await lock.lock()
        await lock.unlock()
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
    for _ in range(PAIRS):
        await lock.lock()
        await lock.unlock()
    sys.settrace(None)
    await client.aclose()
    per_pair = {name: n / PAIRS for name, n in counts.items()}
    own = sum(n for name, n in per_pair.items() if not name.startswith(LOOP))
    print(f"opcodes per pair: {sum(per_pair.values()):.0f} ({own:.0f} outside the event loop)")
    if out is not None:
        text = json.dumps(per_pair, indent=0, sort_keys=True)
        await asyncio.to_thread(Path(out).write_text, text)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
