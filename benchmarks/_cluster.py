"""The cluster part of the run: headline cases on a local 3-primary cluster, and scale-out.

Both need nothing but the server binary the rest of the run uses: the local topologies of
the test tree (``tests/topologies.py``; the benchmark runs from the repository root).

- **Headline cases**: uncontended (1 and 32 tasks) and contended (N=16), for aiolock's
  cluster client and the 2x EVALSHA floor through redis-py's ``RedisCluster``, interleaved
  round-robin per repetition as the single-server cases are. Round trips are counted on
  every primary.
- **Scale-out**: 64 tasks each locking and unlocking names spread over every slot (1,000
  names), against a 1-primary and a 3-primary cluster alternately in short rounds; pairs/s
  per round, medians with their spread, and the ratio 3/1 per pair of rounds. On one
  2-core machine the client, not the servers, is the limit: the ratio says how much the
  client's per-primary connections cost or gain, not what more machines would give.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiolock
from tests.topologies import redis_cluster  # the test tree's helpers, from the root

from ._adapters import ADAPTERS
from ._cases import Job, Scenario, measure

__all__ = ("CLUSTER_SCENARIOS", "cluster_markdown", "run_cluster")

CLUSTER_SCENARIOS = (
    Scenario("uncontended", "1 task", 1, shared=False),
    Scenario("uncontended", "32 tasks", 32, shared=False),
    Scenario("contended", "N=16", 16),
)
SCALE_TASKS = 64
SCALE_NAMES = 1_000

Progress = Callable[[dict[str, Any], Scenario], str]


def run_cluster(
    *,
    impls: dict[str, dict[str, Any]],
    reps: int,
    duration: float,
    run_id: str,
    progress: Progress,
) -> dict[str, Any]:
    """Start the clusters, run both parts; ``{"runs", "scale"}`` (or a status)."""
    keys = [k for k in impls if ADAPTERS[k].topology == "cluster"]
    out: dict[str, Any] = {"runs": [], "scale": None}
    with redis_cluster(primaries=3, replicas=0) as three:
        urls = tuple(f"redis://127.0.0.1:{node.port}/0" for node in three.primaries())
        out["cluster"] = {"primaries": len(urls), "url": three.url}
        for scen in CLUSTER_SCENARIOS:
            print(f"== cluster: {scen.case} {scen.variant}", flush=True)
            applies = [k for k in keys if scen.kind in ADAPTERS[k].cases]
            for rep in range(reps):
                shift = rep % max(1, len(applies))
                for key in applies[shift:] + applies[:shift]:
                    status = impls[key]["status"]
                    tag = f"bench:{run_id}:cluster:{scen.case}:{scen.variant}:{key}:{rep}"
                    job = Job(key, three.url, tag.replace(" ", ""), scen, duration, urls)
                    metrics: dict[str, Any] = {"status": status} if status else measure(job)
                    print(
                        f"  rep {rep + 1}/{reps} {impls[key]['label']}: {progress(metrics, scen)}",
                        flush=True,
                    )
                    ident = {"case": scen.case, "variant": scen.variant, "impl": key, "rep": rep}
                    out["runs"].append({**ident, **metrics})
        if "aiolock" in impls and not impls["aiolock"]["status"]:
            with redis_cluster(primaries=1, replicas=0) as one:
                out["scale"] = asyncio.run(_scale(one.url, three.url, reps, duration))
    return out


async def _scale(one: str, three: str, reps: int, duration: float) -> dict[str, Any]:
    print(f"== cluster scale-out: {SCALE_TASKS} tasks over {SCALE_NAMES:,} names", flush=True)
    rounds = max(3, reps + 1)
    seconds = max(1.0, 2 * duration)
    rates: dict[str, list[float]] = {"1": [], "3": []}
    for index in range(rounds):
        # Alternate which cluster goes first: a drift in the host's noise hits both.
        order = [("1", one), ("3", three)] if index % 2 == 0 else [("3", three), ("1", one)]
        for primaries, url in order:
            rates[primaries].append(await _pairs_per_second(url, seconds))
        print(
            f"  round {index + 1}/{rounds}: 1 primary {rates['1'][-1]:,.0f} pairs/s, "
            f"3 primaries {rates['3'][-1]:,.0f} pairs/s",
            flush=True,
        )
    ratios = [b / a for a, b in zip(rates["1"], rates["3"], strict=True) if a]
    return {
        "tasks": SCALE_TASKS,
        "names": SCALE_NAMES,
        "seconds_per_round": seconds,
        "pairs_per_s": {k: _spread(v) for k, v in rates.items()},
        "ratio_3_over_1": _spread(ratios),
    }


async def _pairs_per_second(url: str, seconds: float) -> float:
    async with aiolock.Client.from_url(url, cluster=True) as client:
        # Warm: the slot map and a connection per primary, outside the measured window.
        await client.lock("scale:warm").lock()
        await client.lock("scale:warm").unlock()
        pairs = 0
        start = time.perf_counter()
        stop = start + seconds

        async def work(index: int) -> None:
            nonlocal pairs
            for _ in range(1_000_000):  # bounded, as every load loop
                if time.perf_counter() >= stop:
                    return
                lock = client.lock(f"scale:{index % SCALE_NAMES}")
                await lock.lock()
                await lock.unlock()
                pairs += 1
                index += SCALE_TASKS

        await asyncio.gather(*(work(index) for index in range(SCALE_TASKS)))
        return pairs / (time.perf_counter() - start)


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cluster_markdown(cluster: dict[str, Any], impls: dict[str, dict[str, Any]]) -> str:
    """The cluster section of the report."""
    lines = ["", "## Redis Cluster (local, 3 primaries, no replicas)", ""]
    runs = cluster.get("runs", [])
    lines += [
        "| case | implementation | pairs or acq/s (median, min-max) | RT/op | wait p99 ms |",
        "|---|---|---|---|---|",
    ]
    for scen in CLUSTER_SCENARIOS:
        for key in dict.fromkeys(r["impl"] for r in runs):
            rows = [
                r
                for r in runs
                if (r["case"], r["variant"], r["impl"]) == (scen.case, scen.variant, key)
                and r.get("status") == "ok"
            ]
            if not rows:
                continue
            rate = "pairs_per_s" if scen.case == "uncontended" else "acq_per_s"
            spread = _spread([float(r[rate]) for r in rows])
            rt = statistics.median(float(r.get("round_trips_per_op") or 0) for r in rows)
            p99s = [float(r["wait_p99_ms"]) for r in rows if r.get("wait_p99_ms") is not None]
            p99 = f"{statistics.median(p99s):.2f}" if p99s else "-"
            lines.append(
                f"| {scen.case} {scen.variant} | {impls[key]['label']} | "
                f"{spread['median']:,.0f} ({spread['min']:,.0f}-{spread['max']:,.0f}) | "
                f"{rt:.2f} | {p99} |"
            )
    scale = cluster.get("scale")
    if scale:
        one, three = scale["pairs_per_s"]["1"], scale["pairs_per_s"]["3"]
        ratio = scale["ratio_3_over_1"]
        lines += [
            "",
            f"Scale-out ({scale['tasks']} tasks over {scale['names']:,} names, "
            f"{scale['seconds_per_round']:g} s rounds, alternating): 1 primary "
            f"{one['median']:,.0f} pairs/s ({one['min']:,.0f}-{one['max']:,.0f}), "
            f"3 primaries {three['median']:,.0f} ({three['min']:,.0f}-{three['max']:,.0f}); "
            f"ratio 3/1 {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}). "
            "Client-bound on one machine.",
        ]
    return "\n".join(lines) + "\n"
