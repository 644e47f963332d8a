"""``python -m benchmarks [--full] [--pin] [--baseline REF] [--no-cluster]
[--no-synchronizers] [--out DIR]``.

By default a quick run (about a minute of measuring on 2 cores): the headline cases only
(uncontended 1 and 32 tasks, one lock at N = 2, 16, 64 and 4 processes x 8 tasks, the
forced handoff) for aiolock's Lock, its sync client, the floor, the token ring, the
Python peers and Redisson (the Java client, where a JDK is present: 1 and 32 threads
uncontended, 16 threads and 4 JVMs x 8 on one lock), one round of 0.3 s each; it ends with
the headline table. (The 4x8 case
starts four processes per implementation: on a loaded machine it takes half the run.)
``--full`` runs every case and lock (read-write, scale, the fair lock's curve, the cluster,
the synchronizers) in four repetitions of 0.6 s: the committed results and the docs'
figures come from ``--full --pin --update-results``.

Runs every case against one server, interleaving the implementations round-robin within
each scenario and repetition (the starting implementation rotates per repetition), prints
the server it uses first, a progress line per measurement and the markdown report at the
end, and writes ``results.json``, ``results.md`` and PNG plots to the output folder: a
fresh ``bench-out/<UTC time>/`` unless ``--out`` names one; ``--update-results`` refreshes
the committed ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiolock
from aiolock.testing import redis_server

from . import _redisson
from ._adapters import ADAPTERS
from ._baseline import install_baseline
from ._cases import Job, Scenario, measure
from ._cluster import cluster_markdown, run_cluster
from ._fair_curve import fair_curve_markdown, plot_fair_curve, run_fair_curve
from ._instrument import environment, server_info
from ._plots import plot
from ._report import headline, markdown, ratios, targets, write
from ._scale import POOLS, waiters_scenario, watchdog_case
from ._scaleout import scale_targets
from ._stats import median_merge
from ._synchronizers import run_synchronizers, synchronizers_markdown

CASES = {
    "uncontended": "1",
    "contended": "2",
    "handoff": "3",
    "rw": "4",
    "watchdog": "5",
    "waiters": "5",
    "fair-curve": "fair-curve",
    "scale-out": "scale-out",
}

SCENARIOS = (
    Scenario("uncontended", "1 task", 1, shared=False),
    Scenario("uncontended", "32 tasks", 32, shared=False),
    Scenario("contended", "N=2", 2),
    Scenario("contended", "N=16", 16),
    Scenario("contended", "N=64", 64),
    Scenario("contended", "4x8", 8, processes=4),
    Scenario("handoff", "N=2", 2, forced=True),
    Scenario("handoff", "N=16", 16, forced=True),
    Scenario("rw", "8R+1W", 9),
)

#: What the quick run (the default) measures: the headline table and the plots' cases.
QUICK_CASES = frozenset({"uncontended", "contended", "handoff"})

#: aiolock's other locks, which the headline does not show: measured in the full run (or
#: when ``--impl`` names them).
FULL_ONLY_IMPLS = frozenset({"aiolock-fair", "aiolock-read", "aiolock-write", "aiolock-rw-mixed"})

RESULTS = Path(__file__).parent / "results"
SCALE_LOCKS = 10_000
SCALE_WAITERS = 10_000
SCALE_WAITER_LOCKS = 1_000


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--full",
        action="store_true",
        help="every case and lock, 4 repetitions of 0.6 s (about 11 min on 2 cores); the "
        "default is the quick headline run (one round of 0.3 s, about 1 min)",
    )
    # The default since the quick run became it; kept so older command lines still work.
    parser.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out",
        type=Path,
        help="output folder (default: a fresh bench-out/<UTC time>/ in the current folder)",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write to benchmarks/results/, the committed results (else a fresh folder)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin the server and every benchmark process to one CPU (stable ratios)",
    )
    parser.add_argument("--pin-cpu", type=int, default=0, help="the CPU of --pin (default 0)")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also measure the aiolock of git ref REF, installed beside (aiolock-baseline)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated cases: uncontended (1), contended (2), handoff (3), rw (4), "
        "watchdog, waiters (5), fair-curve (the fair lock at N = 1-64), scale-out (cluster, "
        "1 vs 3 primaries); numbers work too",
    )
    parser.add_argument(
        "--impl", default="", help=f"comma-separated implementations: {', '.join(ADAPTERS)}"
    )
    parser.add_argument(
        "--no-cluster",
        action="store_true",
        help="skip the cluster part (a local 3-primary cluster: cases 1-2 and scale-out)",
    )
    parser.add_argument(
        "--no-synchronizers",
        action="store_true",
        help="skip the synchronizers part (semaphore, latch, fair read-write lock, RedLock)",
    )
    parser.add_argument(
        "--redisson-warmup",
        type=float,
        default=_redisson.WARMUP_S,
        metavar="S",
        help="each Redisson JVM's warm-up before its first measurement, in seconds (default "
        f"{_redisson.WARMUP_S:g}; {_redisson.REWARM_S:g} s before each later one)",
    )
    parser.add_argument("--duration", type=float, help="seconds per measurement")
    parser.add_argument("--reps", type=int, help="interleaved repetitions per scenario")
    args = parser.parse_args(argv)
    wanted = {c.strip() for c in args.only.split(",") if c.strip()}
    unknown = wanted - set(CASES) - set(CASES.values())
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    if args.full and args.quick:
        parser.error("--full and --quick exclude each other (quick is the default)")
    if args.update_results and not (args.full and args.pin):
        parser.error(
            "--update-results needs --full --pin: the committed results are full pinned runs"
        )
    # The quick run measures the headline cases; --only chooses any case in either mode.
    default = set(CASES) if args.full else QUICK_CASES
    args.cases = {
        c for c, n in CASES.items() if ((c in wanted or n in wanted) if wanted else c in default)
    }
    if not args.full:
        # The cluster and the synchronizers are parts of the full run (--only's cases still
        # run: the cluster part follows them).
        args.no_synchronizers = True
        args.no_cluster = args.no_cluster or not wanted
    impls = {k.strip() for k in args.impl.split(",") if k.strip()}
    if impls - set(ADAPTERS):
        parser.error(f"unknown implementation(s): {', '.join(sorted(impls - set(ADAPTERS)))}")
    wanted_impls = [k for k in ADAPTERS if not impls or k in impls]
    if not args.full and not impls:
        wanted_impls = [k for k in wanted_impls if k not in FULL_ONLY_IMPLS]
    if args.no_cluster:  # the cluster's implementations run in the cluster part only
        wanted_impls = [k for k in wanted_impls if ADAPTERS[k].topology != "cluster"]
    args.impls = [k for k in wanted_impls if k != "aiolock-baseline" or args.baseline]
    if "aiolock-baseline" in impls and not args.baseline:
        parser.error("aiolock-baseline needs --baseline REF")
    if args.out is not None and args.update_results:
        parser.error("--out and --update-results exclude each other")
    if args.update_results:
        args.out = RESULTS
    elif args.out is None:
        args.out = Path("bench-out") / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # Short rounds, many of them: on a noisy machine each repetition of every implementation
    # lands in a different stretch of noise, and the medians and spreads show it.
    args.duration = args.duration or (0.6 if args.full else 0.3)
    args.reps = args.reps or (4 if args.full else 1)
    if args.redisson_warmup < 0:
        parser.error("--redisson-warmup: seconds, 0 or more")
    _redisson.WARMUP_S = args.redisson_warmup  # the JVMs are started from this process
    return args


def _cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs, or None where /proc/stat has no steal column."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    numbers = [int(f) for f in fields[1:]]
    # guest time is counted in user time already.
    return numbers[7], sum(numbers[:8])


def _load() -> float | None:
    """The host's 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def _pin(url: str, cpu: int) -> dict[str, Any]:
    """Pin the server (found by INFO's process_id) and this process to ``cpu``."""
    server_pid = int(server_info(url).get("process_id") or 0)
    if not server_pid:
        raise SystemExit("--pin: the server did not say its process id (INFO server)")
    try:
        os.sched_setaffinity(server_pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # spawned benchmark processes inherit it
    except OSError as exc:
        raise SystemExit(f"--pin: cannot pin to CPU {cpu}: {exc}") from exc
    print(f"pinned: server pid {server_pid} and the benchmark to CPU {cpu}", flush=True)
    return {"cpu": cpu, "server_pid": server_pid}


def _progress(metrics: dict[str, Any], scen: Scenario) -> str:
    if metrics.get("status") != "ok":
        return str(metrics.get("status"))

    def ms(key: str) -> str:
        value = metrics.get(key)
        return "-" if value is None else f"{value:.2f} ms"

    if scen.case == "uncontended":
        text = (
            f"{metrics['pairs_per_s']:,.0f} pairs/s, "
            f"{metrics['client_cpu_us_per_op']:.0f} µs CPU/pair"
        )
    elif scen.case == "rw":
        text = (
            f"{metrics['read_acq_per_s']:,.0f} reads/s, {metrics['write_acq_per_s']:,.0f} writes/s,"
            f" write wait p99 {ms('write_wait_p99_ms')}"
        )
    elif scen.case == "handoff":
        text = f"handoff p50 {ms('handoff_p50_ms')}, p99 {ms('handoff_p99_ms')}"
    else:
        text = (
            f"{metrics['acq_per_s']:,.0f} acq/s, {metrics['owner_changes_per_s']:,.0f} owner "
            f"changes/s, wait p99 {ms('wait_p99_ms')}, {metrics['round_trips_per_op']:.2f} RT/acq"
        )
    for key in ("give_ups", "stragglers", "errors", "exclusion_violations"):
        if metrics.get(key):
            text += f", {key}={metrics[key]}"
    return text


def _check(keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    impls: dict[str, dict[str, Any]] = {}
    for key in keys:
        cls = ADAPTERS[key]
        status = cls.check()
        impls[key] = {"label": cls.label, "mode": cls.mode, "note": cls.note, "status": status}
        if cls.runner == "jvm" and not status:
            impls[key]["note"] = f"{cls.note}; {_redisson.describe()}"
        print(f"{cls.label}: {status or 'available'}", flush=True)
    return impls


def _absent(info: dict[str, Any], key: str) -> bool:
    """Redisson where it cannot run (no JDK, say): no rows at all, the one line of "Peers
    that could not run" says why (a Python peer's "cannot run" shows in its rows)."""
    return bool(info["status"]) and ADAPTERS[key].runner == "jvm"


def applies(cls: type[Any], scen: Scenario) -> bool:
    """Whether implementation ``cls`` runs in scenario ``scen`` on the run's one server."""
    return (
        scen.kind in cls.cases
        and cls.topology == "server"
        and (cls.variants is None or scen.variant in cls.variants)
    )


def _run_cases(
    args: argparse.Namespace, url: str, impls: dict[str, dict[str, Any]], run_id: str
) -> list[dict[str, Any]]:
    """Every scenario x repetition x implementation, round-robin; one row per measurement."""
    runs: list[dict[str, Any]] = []
    for scen in (s for s in SCENARIOS if s.case in args.cases):
        keys = [k for k in impls if applies(ADAPTERS[k], scen) and not _absent(impls[k], k)]
        print(f"== {CASES[scen.case]}. {scen.case} {scen.variant}", flush=True)
        for rep in range(args.reps):
            shift = rep % max(1, len(keys))
            for key in keys[shift:] + keys[:shift]:
                status = impls[key]["status"]
                tag = f"bench:{run_id}:{scen.case}:{scen.variant}:{key}:{rep}".replace(" ", "")
                t0 = time.monotonic()
                cpu0 = _cpu_times()
                metrics: dict[str, Any] = (
                    {"status": status}
                    if status
                    else measure(Job(key, url, tag, scen, args.duration))
                )
                metrics["steal_pct"] = _steal_pct(cpu0, _cpu_times())
                print(
                    f"  rep {rep + 1}/{args.reps} {impls[key]['label']}: "
                    f"{_progress(metrics, scen)} ({time.monotonic() - t0:.1f} s)",
                    flush=True,
                )
                ident = {"case": scen.case, "variant": scen.variant, "impl": key, "rep": rep}
                runs.append({**ident, **metrics})
    return runs


def _run_scale(
    args: argparse.Namespace, url: str, impls: dict[str, dict[str, Any]], run_id: str
) -> dict[str, Any]:
    """Case 5 (aiolock only): watchdog and waiters."""
    out: dict[str, Any] = {}
    blocked = impls["aiolock"]["status"] if "aiolock" in impls else "aiolock not selected"
    if "watchdog" in args.cases:
        print(f"== 5. watchdog: {SCALE_LOCKS:,} locks held for 2 periods", flush=True)
        if blocked:
            out["watchdog"] = {"status": blocked}
        else:
            out["watchdog"] = asyncio.run(watchdog_case(url, f"bench:{run_id}", SCALE_LOCKS))
        print(f"  {out['watchdog']}", flush=True)
    if "waiters" in args.cases:
        print(f"== 5. waiters: {SCALE_WAITERS:,} tasks on {SCALE_WAITER_LOCKS:,} locks", flush=True)
        out["waiters"] = []
        for pool in POOLS:
            if blocked:
                row: dict[str, Any] = {"status": blocked, "client": POOLS[pool]}
            else:
                row = asyncio.run(
                    waiters_scenario(
                        url,
                        f"bench:{run_id}",
                        pool,
                        sizes=(SCALE_WAITERS, SCALE_WAITER_LOCKS),
                        traced_sizes=(SCALE_WAITERS // 10, SCALE_WAITER_LOCKS // 10),
                    )
                )
            print(f"  {row}", flush=True)
            out["waiters"].append(row)
    return out


def _merge(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (case, variant, implementation): medians over the ok repetitions."""
    idents: list[tuple[str, str, str]] = []
    for run in runs:
        ident = (run["case"], run["variant"], run["impl"])
        if ident not in idents:
            idents.append(ident)
    summary = []
    for case, variant, impl in idents:
        reps = [
            {k: v for k, v in r.items() if k not in {"case", "variant", "impl", "rep"}}
            for r in runs
            if (r["case"], r["variant"], r["impl"]) == (case, variant, impl)
        ]
        ok = [r for r in reps if r.get("status") == "ok"]
        merged = median_merge(ok) if ok else reps[0]
        summary.append({"case": case, "variant": variant, "impl": impl, **merged})
    return summary


def _server_part(
    args: argparse.Namespace, url: str, impls: dict[str, dict[str, Any]], run_id: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every case on the one server: the rows of cases 1-4, and the other parts' results."""
    runs = _run_cases(args, url, impls, run_id)
    result: dict[str, Any] = _run_scale(args, url, impls, run_id)
    if not args.no_synchronizers and not args.only:
        result["synchronizers"] = run_synchronizers(
            url=url, rounds=max(3, args.reps), seconds=args.duration, run_id=run_id
        )
    if "fair-curve" in args.cases:
        result["fair_curve"] = run_fair_curve(
            url=url,
            impls=impls,
            reps=args.reps,
            duration=args.duration,
            run_id=run_id,
            progress=_progress,
        )
    return runs, result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite and write the report."""
    args = _parse(argv)
    started = time.monotonic()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    run_id = uuid.uuid4().hex[:8]
    # The server first, so the run's first line names it (REDIS_URL, a container, PATH or
    # the embedded Valkey, in aiolock.testing.redis_server's order).
    with redis_server() as server:
        print(
            f"mode: {'full' if args.full else 'quick (the full run: --full)'}, "
            f"{args.duration} s per measurement, {args.reps} repetition(s)",
            flush=True,
        )
        baseline = None
        if args.baseline:
            folder, commit = install_baseline(args.baseline)
            baseline = {"ref": args.baseline, "commit": commit}
            print(f"baseline: aiolock at {args.baseline} ({commit}) from {folder}", flush=True)
        impls = _check(args.impls)
        cpu0 = _cpu_times()
        load0 = _load()
        srv = {"kind": server.kind, "url": server.url, **server_info(server.url)}
        pinned = _pin(server.url, args.pin_cpu) if args.pin else None
        try:
            runs, result = _server_part(args, server.url, impls, run_id)
        finally:
            _redisson.close()  # Redisson's JVMs, kept for the run, before their server goes
    cluster_headline = bool(args.cases & {"uncontended", "contended"})
    if not args.no_cluster and (cluster_headline or "scale-out" in args.cases):
        result["cluster"] = run_cluster(
            impls=impls,
            reps=args.reps,
            duration=args.duration,
            run_id=run_id,
            progress=_progress,
            headline=cluster_headline,
            scale="scale-out" in args.cases,
        )
    summary = _merge(runs)
    result.update(
        {
            "meta": {
                "mode": "full" if args.full else "quick",
                "duration_s": args.duration,
                "reps": args.reps,
                "pinned": pinned,
                "baseline": baseline,
                "steal_pct": _steal_pct(cpu0, _cpu_times()),
                # The host's 1-minute load average at the start and the end: a quick run on
                # a machine shared with other work measures that work as much as the locks.
                "load_average": [load0, _load()],
                "started": started_at,
                "elapsed_s": time.monotonic() - started,
                "server": srv,
                "environment": environment(),
                "argv": sys.argv[1:] if argv is None else list(argv),
                # An installed wheel (nox -s bench) or the work tree, whose edits during the
                # run would reach the worker processes started later.
                "aiolock_from": str(Path(aiolock.__file__).parent),
            },
            "impls": impls,
            "summary": summary,
            "runs": runs,
        }
    )
    result["ratios"] = ratios(summary, result)
    result["targets"] = targets(runs) + scale_targets(result.get("cluster", {}).get("scale"))
    md = markdown(result)
    if "cluster" in result:
        md += cluster_markdown(result["cluster"], impls)
    if "fair_curve" in result:
        md += fair_curve_markdown(result["fair_curve"])
    if "synchronizers" in result:
        md += synchronizers_markdown(result["synchronizers"])
    print()
    print(md)
    paths = write(args.out, result, md)
    paths += plot(summary, impls, args.out)
    paths += plot_fair_curve(result.get("fair_curve", []), args.out)
    print("written: " + ", ".join(str(p) for p in paths))
    if head := headline(result):
        # Again at the end, where a terminal leaves it (results.md has it at the top).
        print()
        print(head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
