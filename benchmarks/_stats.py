"""Pure functions that turn raw acquisition records into the numbers in the table.

A record is one lock+unlock by one worker (an asyncio task or a thread), as five floats on
the system-wide monotonic clock (``time.monotonic``, comparable across processes on Linux):

    (worker, t_wait_start, t_acquired, t_release_start, t_released)

Only records whose ``t_acquired`` falls in the measurement window count towards rates;
waits are "censored" at the end of the window, so a worker still waiting when the window
closes shows its wait so far instead of vanishing from the percentiles.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = (
    "Record",
    "contended_metrics",
    "median_merge",
    "percentile",
    "rw_metrics",
    "uncontended_metrics",
)


class Record(NamedTuple):
    """One acquisition: who, and the four instants around it."""

    worker: int
    t_wait: float  # acquire() called
    t_acq: float  # acquire() returned
    t_rel: float  # release() called
    t_done: float  # release() returned


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0..100) of ``values``, ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def uncontended_metrics(
    records: Sequence[Record], start: float, end: float
) -> dict[str, float | int | None]:
    """Pairs per second and pair latency for workers that each use their own lock."""
    in_window = [r for r in records if start <= r.t_acq <= end]
    pair = [r.t_done - r.t_wait for r in in_window]
    return {
        "pairs": len(in_window),
        "pairs_per_s": len(in_window) / (end - start),
        "pair_p50_ms": _ms(percentile(pair, 50)),
        "pair_p99_ms": _ms(percentile(pair, 99)),
    }


def contended_metrics(
    records: Sequence[Record],
    workers: Iterable[int],
    start: float,
    end: float,
    stuck_waits: Sequence[float] = (),
) -> dict[str, float | int | None]:
    """Throughput, owner changes, fairness, waits and handoff latency on ONE lock.

    ``stuck_waits`` are the ``t_wait`` of acquisitions that never returned (cancelled
    after the grace period): they count as waits lasting until the end of the window.
    """
    ordered = sorted(records, key=lambda r: r.t_acq)
    duration = end - start
    acquisitions = 0
    changes = 0
    repeats = 0
    overlaps = 0  # acquire returned before the previous holder even called release
    handoffs: list[float] = []
    previous: Record | None = None
    for rec in ordered:
        if previous is not None and rec.t_acq < previous.t_rel:
            overlaps += 1
        if start <= rec.t_acq <= end:
            acquisitions += 1
            if previous is not None:
                if rec.worker != previous.worker:
                    changes += 1
                    if rec.t_wait < previous.t_rel:  # a waiter, not a latecomer
                        handoffs.append(rec.t_acq - previous.t_rel)
                else:
                    repeats += 1
        previous = rec
    per_worker = Counter(r.worker for r in ordered if start <= r.t_acq <= end)
    counts = [per_worker.get(w, 0) for w in workers]
    waits = [min(r.t_acq, end) - r.t_wait for r in ordered if start <= r.t_wait < end]
    waits.extend(end - t for t in stuck_waits if t < end)
    follow_ups = changes + repeats
    return {
        "acquisitions": acquisitions,
        "acq_per_s": acquisitions / duration,
        "owner_changes_per_s": changes / duration,
        "immediate_reacquire_pct": 100.0 * repeats / follow_ups if follow_ups else None,
        "per_task_min": min(counts) if counts else None,
        "per_task_max": max(counts) if counts else None,
        "wait_p50_ms": _ms(percentile(waits, 50)),
        "wait_p99_ms": _ms(percentile(waits, 99)),
        "wait_max_ms": _ms(max(waits) if waits else None),
        "handoff_p50_ms": _ms(percentile(handoffs, 50)),
        "handoff_p99_ms": _ms(percentile(handoffs, 99)),
        "exclusion_violations": overlaps,
    }


def median_merge(
    runs: Sequence[dict[str, float | int | str | None]],
) -> dict[str, float | int | str | None]:
    """One row from several repetitions: the median of every numeric field.

    Counters that flag problems (give-ups, stragglers, violations) are summed instead, and
    the minimum of ``per_task_min`` is kept, so no repetition's bad news is averaged away.
    """
    summed = {"give_ups", "stragglers", "exclusion_violations", "errors"}
    merged: dict[str, float | int | str | None] = {}
    keys: list[str] = []
    for run in runs:
        keys.extend(k for k in run if k not in keys)
    for key in keys:
        values = [run.get(key) for run in runs]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if not numbers:
            merged[key] = next((v for v in values if v is not None), None)
        elif key in summed:
            merged[key] = sum(numbers)
        elif key == "per_task_min":
            merged[key] = min(numbers)
        elif key == "per_task_max":
            merged[key] = max(numbers)
        else:
            merged[key] = statistics.median(numbers)
    return merged


def rw_metrics(
    records: Sequence[Record], writer: int, start: float, end: float
) -> dict[str, float | int | None]:
    """Readers and the one writer (worker ``writer``) of case 4, and any overlap seen.

    An overlap is a reader that held the lock while the writer did (client-side instants:
    a reader's acquire returned before the writer called release, and the writer's acquire
    returned before that reader called release). A correct read-write lock shows none.
    """
    duration = end - start
    reads = sorted((r for r in records if r.worker != writer), key=lambda r: r.t_acq)
    writes = [r for r in records if r.worker == writer]
    read_starts = [r.t_acq for r in reads]
    longest_read = max((r.t_rel - r.t_acq for r in reads), default=0.0)
    overlaps = 0
    for w in writes:
        lo = bisect.bisect_left(read_starts, w.t_acq - longest_read)
        hi = bisect.bisect_left(read_starts, w.t_rel)
        overlaps += sum(1 for r in reads[lo:hi] if r.t_rel > w.t_acq)

    def waits(recs: Sequence[Record]) -> list[float]:
        return [min(r.t_acq, end) - r.t_wait for r in recs if start <= r.t_wait < end]

    read_waits, write_waits = waits(reads), waits(writes)
    return {
        "read_acq_per_s": sum(start <= r.t_acq <= end for r in reads) / duration,
        "write_acq_per_s": sum(start <= r.t_acq <= end for r in writes) / duration,
        "read_wait_p50_ms": _ms(percentile(read_waits, 50)),
        "read_wait_p99_ms": _ms(percentile(read_waits, 99)),
        "write_wait_p50_ms": _ms(percentile(write_waits, 50)),
        "write_wait_p99_ms": _ms(percentile(write_waits, 99)),
        "write_wait_max_ms": _ms(max(write_waits) if write_waits else None),
        "exclusion_violations": overlaps,
    }
