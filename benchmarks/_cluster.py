"""The cluster part of the run: headline cases on a local 3-primary cluster, and scale-out.

Both need nothing but the server binary the rest of the run uses: the local topologies of
the test tree (``tests/topologies.py``; the benchmark runs from the repository root).

- **Headline cases**: uncontended (1 and 32 tasks) and contended (N=16), for aiolock's
  cluster client and the 2x EVALSHA floor through redis-py's ``RedisCluster``, interleaved
  round-robin per repetition as the single-server cases are. Round trips are counted on
  every primary.
- **Scale-out** (``_scaleout.py``): per-operation client and server CPU and each primary's
  share of the commands, 1 primary against 3 in alternating rounds, and the throughput
  they project for N primaries on N cores.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from redis.crc import key_slot

from tests.topologies import ClusterHandle, redis_cluster  # the test tree's helpers, from the root

from ._adapters import ADAPTERS
from ._cases import Job, Scenario, measure
from ._scaleout import SCALE_NAMES, run_scaleout, scaleout_markdown

__all__ = ("CLUSTER_SCENARIOS", "cluster_markdown", "run_cluster")

CLUSTER_SCENARIOS = (
    Scenario("uncontended", "1 task", 1, shared=False),
    Scenario("uncontended", "32 tasks", 32, shared=False),
    Scenario("contended", "N=16", 16),
)
Progress = Callable[[dict[str, Any], Scenario], str]


def run_cluster(
    *,
    impls: dict[str, dict[str, Any]],
    reps: int,
    duration: float,
    run_id: str,
    progress: Progress,
    headline: bool = True,
    scale: bool = True,
) -> dict[str, Any]:
    """Start the clusters, run the parts asked for; ``{"runs", "scale"}`` (or a status)."""
    keys = [k for k in impls if ADAPTERS[k].topology == "cluster"]
    out: dict[str, Any] = {"runs": [], "scale": None}
    with redis_cluster(primaries=3, replicas=0) as three:
        urls = _primary_urls(three)
        out["cluster"] = {"primaries": len(urls), "url": three.url}
        for scen in CLUSTER_SCENARIOS if headline else ():
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
        wanted = impls.get("aiolock-cluster")
        if scale and wanted is not None and not wanted["status"]:
            with redis_cluster(primaries=1, replicas=0) as one:
                out["scale"] = asyncio.run(
                    run_scaleout(
                        (one.url, _primary_urls(one)),
                        (three.url, urls),
                        rounds=max(5, reps + 1),
                        seconds=max(1.0, 2 * duration),
                        run_id=run_id,
                        on_first=_names_on_first(three, f"bench:{run_id}:scale:on-first"),
                    )
                )
    return out


def _names_on_first(cluster: ClusterHandle, prefix: str) -> list[str]:
    """``SCALE_NAMES`` names whose slots the cluster's first primary serves."""
    slots = cluster.slots()
    first = min(port for _, _, port in slots)
    ranges = [(low, high) for low, high, port in slots if port == first]
    names: list[str] = []
    for index in range(100 * SCALE_NAMES):  # bounded: about a third of them qualify
        name = f"{prefix}:{index}"
        slot = key_slot(name.encode())
        if any(low <= slot <= high for low, high in ranges):
            names.append(name)
            if len(names) == SCALE_NAMES:
                return names
    raise RuntimeError("too few names on the first primary")


def _primary_urls(cluster: ClusterHandle) -> tuple[str, ...]:
    return tuple(f"redis://127.0.0.1:{node.port}/0" for node in cluster.primaries())


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
        lines += scaleout_markdown(scale)
    return "\n".join(lines) + "\n"
