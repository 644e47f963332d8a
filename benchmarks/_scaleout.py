"""Cluster scale-out: what spreading locks over primaries costs per operation, and what that
projects for N primaries on N cores.

No throughput ratio measured on one 2-core machine can say what a cluster serves: the
primaries and their client share the same two cores. What can be measured here, and does not
depend on how many cores there are, is the work per operation and where it lands:

- **share**: over 1,000 lock names, each primary's share of the server commands (``INFO
  commandstats`` call deltas read on each primary separately). Each lock's keys hash to one
  slot, so an even spread of slots is an even spread of work.
- **client CPU per pair**: the client process's user + system CPU (``getrusage``, as
  ``time.process_time()``) over the window, divided by lock+unlock pairs; 1 primary
  against 3, in the same round.
- **server CPU per pair**: ``used_cpu_user + used_cpu_sys`` deltas summed over the
  primaries, divided by pairs, and of it the time spent running scripts (``INFO
  commandstats``). A primary's idle work (its cron, the cluster bus) is measured once per
  cluster over an idle second and reported beside it.

Within a round every configuration keeps its client open and they take turns in slices of
0.2 s (the first rotating), so the host's drifting speed falls on all of them alike; each
figure is a median over the rounds with its min-max, and the ratios are taken per round.
Pinned (``--pin``), the primaries move to a core of their own for this part (``_placed``).

Why per-pair CPU can differ: the client writes whatever its tasks sent during one event loop
tick in one write per connection, and the server reads and answers a batch at a time. The
same 64 tasks spread over 3 primaries make batches a third the size, so more writes, reads
and wake-ups per pair on both sides. To show that cost apart from the cluster's routing, each
round also runs the 3-primary cluster with 3 x 64 tasks (the same batch per primary as 1
primary with 64) and, to tell the batch size from the task count, the 1-primary cluster with
3 x 64 tasks too; it reports the client's user and system CPU apart and the server's reads
per pair (``total_reads_processed``: one per batch read from a client). Every ratio is to
1 primary with 64 tasks, per round.

The projection (``projection``) is a model, not a measurement: see benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis

import aiolock

from ._instrument import CommandStats, RoundTrips, counters, script_us, server_info

__all__ = ("SCALE_NAMES", "SCALE_TASKS", "projection", "run_scaleout", "scale_targets")

SCALE_TASKS = 64
ONE_SERVING = "3on1"
#: The configurations of a round: (primaries, tasks).
CONFIGS = {
    "1": (1, SCALE_TASKS),
    "3": (3, SCALE_TASKS),
    "1x3": (1, 3 * SCALE_TASKS),
    "3x3": (3, 3 * SCALE_TASKS),
    # 3 primaries, every name on the first: the others idle. Its server work per pair
    # against 1 primary's tells the cluster's own cost from three busy primaries sharing
    # one core (the same batches as 1 primary with 64 tasks, on the same core).
    ONE_SERVING: (3, SCALE_TASKS),
}
#: Ratios taken per round, (configuration, over configuration), in the table's order: each
#: configuration after the first, over the one it differs from in one respect.
RATIOS = (("3", "1"), ("1x3", "1"), ("3x3", "1x3"), (ONE_SERVING, "1"))
SCALE_NAMES = 1_000
SHARE_BOUND_PCT = 10.0  # each primary within 10 % of its even share
CLIENT_CPU_BOUND = 1.1  # client CPU per pair, 3 primaries / 1
IDLE_S = 1.0
#: How long one configuration runs before the next takes its turn (seconds).
SLICE_S = 0.2
#: Primaries of the projection table.
PROJECT_N = (1, 3, 6, 12, 24)

Cluster = tuple[str, tuple[str, ...]]  # (seed url, every primary's url)


async def run_scaleout(
    one: Cluster,
    three: Cluster,
    *,
    rounds: int,
    seconds: float,
    run_id: str,
    on_first: Sequence[str],
) -> dict[str, Any]:
    """Alternate rounds on the 1- and 3-primary clusters; the figures with their spreads.

    ``on_first``: ``SCALE_NAMES`` names the 3-primary cluster's first primary serves.
    """
    RoundTrips.install()
    print(
        f"== cluster scale-out: {SCALE_TASKS} tasks over {SCALE_NAMES:,} names, "
        f"{rounds} rounds of {seconds:g} s",
        flush=True,
    )
    clusters = {"1": one, "3": three}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in CONFIGS}
    keys = list(CONFIGS)
    with _placed([url for _, urls in clusters.values() for url in urls]) as placement:
        idle = {k: _idle_cpu_per_s(urls) for k, (_, urls) in clusters.items()}
        for index in range(rounds):
            tag = f"bench:{run_id}:scale:{index}"
            for key, row in (await _round(clusters, tag, seconds, index, on_first)).items():
                rows[key].append(row)
            print(
                f"  round {index + 1}/{rounds}: "
                + "; ".join(_brief(key, rows[key][-1]) for key in keys),
                flush=True,
            )
    return {**_summary(rows, idle, seconds), "placement": placement}


@contextlib.contextmanager
def _placed(urls: Sequence[str]) -> Iterator[dict[str, int] | None]:
    """The primaries on a core of their own while the client is pinned to one (``--pin``).

    Pinned, every process of the run shares one core, and the client's CPU per pair then
    also counts refilling its caches after the primaries ran: three primaries switch in
    more often than one, which would show as client work that grows with the primaries.
    In production the primaries are other machines. So the client keeps its core and the
    primaries of both clusters move to another one for this part (and back after it);
    yields ``{"client_cpu", "server_cpu"}``, or None when the run is not pinned (or has one
    core), and then nothing moves.
    """
    mine = os.sched_getaffinity(0)
    others = sorted(set(range(os.cpu_count() or 1)) - mine)
    if len(mine) != 1 or not others:
        yield None
        return
    pids = [int(server_info(url)["process_id"]) for url in urls]
    before: dict[int, set[int]] = {}
    try:
        for pid in pids:
            before[pid] = os.sched_getaffinity(pid)
            os.sched_setaffinity(pid, {others[0]})
    except OSError as exc:  # not ours to move (another user's server): measured as it is
        print(f"  scale-out: the primaries stay where they are: {exc}", flush=True)
        placed = None
    else:
        placed = {"client_cpu": next(iter(mine)), "server_cpu": others[0]}
    try:
        yield placed
    finally:
        for pid, cpus in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, cpus)


def _brief(key: str, row: Mapping[str, Any]) -> str:
    return (
        f"{_label(key)} {row['pairs_per_s']:,.0f} pairs/s, client "
        f"{row['client_cpu_us']:.1f} µs/pair, server {row['server_cpu_us']:.1f} µs/pair, "
        f"shares " + "/".join(f"{100 * s:.1f}" for s in row["shares"]) + " %"
    )


def _idle_cpu_per_s(urls: Sequence[str]) -> float:
    """Server CPU seconds per second that the primaries spend with no client traffic."""
    stats = CommandStats(*urls)
    try:
        before, t0 = stats.snapshot()["_cpu"], time.perf_counter()
        time.sleep(IDLE_S)  # measuring idle work: the window is the point
        after, t1 = stats.snapshot()["_cpu"], time.perf_counter()
    finally:
        stats.close()
    return (after - before) / (t1 - t0)


def _cpu() -> tuple[float, float]:
    """The client process's (user, system) CPU seconds (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


class _Window:
    """What one configuration did over its slices of a round: summed, then per pair."""

    def __init__(self, urls: Sequence[str]) -> None:
        # One connection per primary: shares need them apart.
        self.infos = [redis.Redis.from_url(url, decode_responses=True) for url in urls]
        self.pairs = 0
        self.seconds = 0.0
        self.client = [0.0, 0.0]  # user, system
        self.round_trips = 0
        self.server_cpu = 0.0
        self.script_time = 0.0  # µs
        self.reads = 0.0
        self.cmds = [0.0] * len(urls)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each primary's counters: one INFO each, so each adds one read of its own."""
        return [info.info("stats", "cpu", "commandstats") for info in self.infos]

    def add(self, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
        """Add the servers' side of a slice, from its snapshots."""
        for index, (b, a) in enumerate(zip(before, after, strict=True)):
            delta = CommandStats.delta(counters(b), counters(a))
            self.server_cpu += delta.pop("_cpu", 0.0)
            self.cmds[index] += sum(delta.values())
            self.script_time += script_us(a) - script_us(b)
            # The second INFO's own read is counted in its reply; the first's is not.
            self.reads += float(a["total_reads_processed"]) - float(b["total_reads_processed"]) - 1

    def row(self) -> dict[str, Any]:
        ops = max(1, self.pairs)
        total = sum(self.cmds) or 1.0
        return {
            "pairs": self.pairs,
            "pairs_per_s": self.pairs / self.seconds,
            "client_cpu_us": 1e6 * sum(self.client) / ops,
            "client_user_us": 1e6 * self.client[0] / ops,
            "client_sys_us": 1e6 * self.client[1] / ops,
            "server_reads": self.reads / ops,
            "server_cpu_us": 1e6 * self.server_cpu / ops,
            "server_script_us": self.script_time / ops,
            "server_cmds": total / ops,
            "round_trips": self.round_trips / ops,
            "shares": [c / total for c in self.cmds],
            "window_s": self.seconds,
        }

    def close(self) -> None:
        for info in self.infos:
            info.close()


async def _round(
    clusters: Mapping[str, Cluster],
    tag: str,
    seconds: float,
    index: int,
    on_first: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """One round: each configuration for ``seconds``, in slices of ``SLICE_S`` taking turns.

    Each configuration keeps its client open over the round, so the slices take turns
    within fractions of a second: a drift in the host's speed (the largest noise here)
    falls on all of them alike, where whole windows one after another took it apart.
    """
    keys = list(CONFIGS)
    windows: dict[str, _Window] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, Any] = {}
        names: dict[str, list[str]] = {}
        for key in keys:
            primaries, tasks = CONFIGS[key]
            seed, urls = clusters[str(primaries)]
            windows[key] = _Window(urls)
            stack.callback(windows[key].close)
            clients[key] = await stack.enter_async_context(
                aiolock.Client.from_url(seed, cluster=True)
            )
            names[key] = (
                list(on_first)
                if key == ONE_SERVING
                else [f"{tag}:{key}:{i}" for i in range(SCALE_NAMES)]
            )
            # Warm, outside the slices: the slot map, a connection per primary, every
            # name's slot cached and its scripts loaded.
            await _drive(clients[key], names[key], time.perf_counter() + 60.0, tasks, passes=1)
        cursors = dict.fromkeys(keys, 0)
        for turn in range(max(1, round(seconds / SLICE_S))):
            shift = (index + turn) % len(keys)
            for key in keys[shift:] + keys[:shift]:
                window, tasks = windows[key], CONFIGS[key][1]
                before = window.snapshot()
                cpu0, rt0, t0 = _cpu(), RoundTrips.count, time.perf_counter()
                pairs = await _drive(
                    clients[key], names[key], t0 + SLICE_S, tasks, None, start=cursors[key]
                )
                t1, rt1, cpu1 = time.perf_counter(), RoundTrips.count, _cpu()
                window.add(before, window.snapshot())
                cursors[key] = (cursors[key] + pairs) % SCALE_NAMES
                window.pairs += pairs
                window.seconds += t1 - t0
                window.round_trips += rt1 - rt0
                window.client[0] += cpu1[0] - cpu0[0]
                window.client[1] += cpu1[1] - cpu0[1]
    return {key: window.row() for key, window in windows.items()}


async def _drive(
    client: Any,
    names: Sequence[str],
    stop: float,
    tasks: int,
    passes: int | None,
    *,
    start: int = 0,
) -> int:
    """``tasks`` tasks lock and unlock ``names`` in turn; pairs done.

    Task ``i`` takes names ``start + i``, ``start + i + tasks``, ... so concurrent tasks
    hold different names (uncontended) and, from slice to slice, every name is used
    equally. ``passes=1`` goes over the names once (the warm-up); else until ``stop``.
    """
    done = 0
    limit = len(names) if passes == 1 else 1_000_000  # bounded, as every load loop

    async def work(index: int) -> None:
        nonlocal done
        for _ in range(limit):
            if index >= limit or time.perf_counter() >= stop:
                return
            lock = client.lock(names[index % len(names)])
            await lock.lock()
            await lock.unlock()
            done += 1
            index += tasks

    await asyncio.gather(*(work(start + index) for index in range(tasks)))
    return done


_METRICS = (
    ("pairs_per_s", "pairs_per_s"),
    ("client_cpu_us_per_pair", "client_cpu_us"),
    ("client_user_us_per_pair", "client_user_us"),
    ("client_sys_us_per_pair", "client_sys_us"),
    ("server_cpu_us_per_pair", "server_cpu_us"),
    ("server_script_us_per_pair", "server_script_us"),
    ("server_reads_per_pair", "server_reads"),
    ("server_cmds_per_pair", "server_cmds"),
    ("round_trips_per_pair", "round_trips"),
)


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        # A ratio over a metric that was 0 in every round (system CPU under the clock's
        # tick, say): nothing to report, rather than no report.
        return {"median": math.nan, "min": math.nan, "max": math.nan}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _summary(
    rows: Mapping[str, list[dict[str, Any]]], idle: Mapping[str, float], seconds: float
) -> dict[str, Any]:
    def per_round_ratio(metric: str, mine: str, base: str) -> list[float]:
        pairs = zip(rows[base], rows[mine], strict=True)
        return [b[metric] / a[metric] for a, b in pairs if a[metric]]

    out: dict[str, Any] = {
        "tasks": SCALE_TASKS,
        "names": SCALE_NAMES,
        "rounds": len(rows["1"]),
        "seconds_per_round": seconds,
        "idle_server_cpu_ms_per_s": {k: 1000 * v for k, v in idle.items()},
    }
    for key, metric in _METRICS:
        out[key] = {k: _spread([r[metric] for r in v]) for k, v in rows.items()}
        for mine, base in RATIOS:
            out[f"{key}_ratio_{mine}_over_{base}"] = _spread(per_round_ratio(metric, mine, base))
    # Each primary's share of the 3-primary cluster's commands, and per round the largest
    # deviation of any primary from an even share, relative to that share.
    threes = rows["3"]
    primaries = len(threes[0]["shares"])
    even = 1.0 / primaries
    out["shares_pct"] = [_spread([100 * r["shares"][i] for r in threes]) for i in range(primaries)]
    out["share_deviation_pct"] = _spread(
        [100 * max(abs(s - even) for s in r["shares"]) / even for r in threes]
    )
    out["rows"] = dict(rows)
    out["projection"] = projection(out)
    return out


def projection(scale: Mapping[str, Any]) -> list[dict[str, float]]:
    """Throughput projected for N primaries, each on a core of its own (a model).

    From the 3-primary medians: one primary serves ``1 / server CPU per pair`` pairs/s on
    one core (a primary runs commands on one thread), N of them N times that, as the names
    spread evenly (measured: ``share``); the clients need ``throughput x client CPU per
    pair`` cores to drive it. Idle work is left out of the per-pair cost (it does not grow
    with load), which the measured per-pair server CPU includes only as its share over the
    window.
    """
    server_us = scale["server_cpu_us_per_pair"]["3"]["median"]
    client_us = scale["client_cpu_us_per_pair"]["3"]["median"]
    out = []
    for n in PROJECT_N:
        rate = n * 1e6 / server_us
        out.append({"primaries": n, "pairs_per_s": rate, "client_cores": rate * client_us / 1e6})
    return out


def scale_targets(scale: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's scale-out rows for the report's targets table (median over the rounds)."""
    if not scale:
        return []
    rounds = scale["rounds"]

    def row(name: str, bound: str, spread: Mapping[str, float], met: bool | None) -> dict[str, Any]:
        return {"target": name, "bound": bound, **spread, "reps": rounds, "met": met}

    dev = scale["share_deviation_pct"]
    client = scale["client_cpu_us_per_pair_ratio_3_over_1"]
    server = scale["server_cpu_us_per_pair"]
    return [
        row(
            f"cluster, 3 primaries, {scale['names']:,} names: largest deviation of a "
            "primary's command share from 1/3, % of 1/3",
            f"<= {SHARE_BOUND_PCT:g}",
            dev,
            dev["median"] <= SHARE_BOUND_PCT,
        ),
        row(
            "cluster: client CPU per pair, 3 primaries ÷ 1",
            f"<= {CLIENT_CPU_BOUND:g}",
            client,
            client["median"] <= CLIENT_CPU_BOUND,
        ),
        row(
            f"cluster: client CPU per pair, 3 primaries ÷ 1, both with {3 * scale['tasks']} tasks",
            "(reported)",
            scale["client_cpu_us_per_pair_ratio_3x3_over_1x3"],
            None,
        ),
        row("cluster: server CPU µs per pair, 1 primary", "(reported)", server["1"], None),
        row("cluster: server CPU µs per pair, 3 primaries", "(reported)", server["3"], None),
        row(
            "cluster: server CPU per pair, 3 primaries ÷ 1",
            "(reported)",
            scale["server_cpu_us_per_pair_ratio_3_over_1"],
            None,
        ),
        row(
            "cluster: server time running scripts per pair, 3 primaries ÷ 1",
            "(reported)",
            scale["server_script_us_per_pair_ratio_3_over_1"],
            None,
        ),
        row(
            "cluster: server CPU per pair, 3 primaries with every name on one ÷ 1",
            "(reported)",
            scale[f"server_cpu_us_per_pair_ratio_{ONE_SERVING}_over_1"],
            None,
        ),
        row(
            "cluster: server time running scripts per pair, 3 primaries with every name on one ÷ 1",
            "(reported)",
            scale[f"server_script_us_per_pair_ratio_{ONE_SERVING}_over_1"],
            None,
        ),
    ]


def _label(config: str) -> str:
    primaries, tasks = CONFIGS[config]
    serving = " (1 serving)" if config == ONE_SERVING else ""
    return f"{primaries}p/{tasks}t{serving}"


def _placement(scale: Mapping[str, Any]) -> str:
    placed = scale.get("placement")
    if not placed:
        return "The client and the primaries shared the run's cores (not pinned)."
    return (
        f"The client alone on CPU {placed['client_cpu']}, the primaries of both clusters "
        f"on CPU {placed['server_cpu']}."
    )


def scaleout_markdown(scale: Mapping[str, Any]) -> list[str]:
    """The scale-out section: per-operation figures, shares, and the projection."""

    def cell(spread: Mapping[str, float], digits: int = 0) -> str:
        fmt = f",.{digits}f"
        return f"{spread['median']:{fmt}} ({spread['min']:{fmt}}-{spread['max']:{fmt}})"

    lines = [
        "",
        f"### Scale-out: lock+unlock pairs over {scale['names']:,} names, "
        f"{scale['rounds']} alternating rounds of {scale['seconds_per_round']:g} s",
        "",
        "Per lock+unlock pair, median (min-max) over the rounds; each ratio is taken per "
        "round, over the column it differs from in one respect. " + _placement(scale),
        "",
        "| per pair | "
        + _label("1")
        + " | "
        + " | ".join(f"{_label(mine)} | ÷ {_label(base)}" for mine, base in RATIOS)
        + " |",
        "|---|" + "---|" * (1 + 2 * len(RATIOS)),
    ]
    for key, label, digits in (
        ("client_cpu_us_per_pair", "client CPU µs", 1),
        ("client_user_us_per_pair", "of which user", 1),
        ("client_sys_us_per_pair", "of which system", 1),
        ("server_cpu_us_per_pair", "server CPU µs (all primaries)", 1),
        ("server_script_us_per_pair", "of which running scripts", 1),
        ("server_reads_per_pair", "server reads (batches)", 3),
        ("server_cmds_per_pair", "server commands", 2),
        ("round_trips_per_pair", "round trips", 2),
        ("pairs_per_s", "pairs/s (2 shared cores: not a capacity)", 0),
    ):
        cells = [cell(scale[key]["1"], digits)]
        for mine, base in RATIOS:
            cells += [
                cell(scale[key][mine], digits),
                cell(scale[f"{key}_ratio_{mine}_over_{base}"], 2),
            ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    idle = scale["idle_server_cpu_ms_per_s"]
    shares = ", ".join(cell(s, 1) for s in scale["shares_pct"])
    lines += [
        "",
        f"Command share per primary (3 primaries), %: {shares}; largest deviation from "
        f"1/3: {cell(scale['share_deviation_pct'], 1)} % of 1/3. Idle server CPU: "
        f"{idle['1']:.1f} ms/s (1 primary), {idle['3']:.1f} ms/s (3 primaries).",
        "",
        "Projection (a model, not a measurement): N primaries each on its own core serve "
        "N ÷ (server CPU per pair) pairs/s; the clients need that rate x client CPU per "
        "pair cores. From the 3-primary medians above:",
        "",
        "| primaries (= server cores) | projected pairs/s | client cores to drive it |",
        "|---|---|---|",
    ]
    lines += [
        f"| {p['primaries']:.0f} | {p['pairs_per_s']:,.0f} | {p['client_cores']:.1f} |"
        for p in scale["projection"]
    ]
    return lines
