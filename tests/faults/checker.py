"""The fault suite's checker: worker processes contend for locks while a scenario injects
faults; afterwards their logs and the servers prove what held.

What a run proves (:meth:`Result.problems` lists every breach):
- every worker process exited cleanly before the deadline, with no task left waiting;
- no two logged holds of one name overlap unless both are shared (readers), or one of them
  was reported lost to its holder (``LockLostError``): a silent overlap is a violation;
- each exclusively held name's counter, incremented by a non-atomic GET/SET under the
  lock, equals the increments the workers completed (less one per reported overlap);
- no lock key, queue entry or subscription of the run is left on the lock server (on a
  cluster or a Sentinel group: on every primary, and no subscription on any node).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from aiolock.testing import ServerHandle

WORKER = Path(__file__).with_name("worker.py")
EXCLUSIVE_OUTCOMES_REPORTED = frozenset({"lost"})
# Keys that expire on their own by design and are not lock state: tombstones of cancelled
# acquires and the latches of finished unlocks.
# Keys that expire on their own (a fenced lock's token counter outlives its lock by design).
TRANSIENT_MARKERS = ("aiolock_acquire_cancel:", "redisson_unlock_latch:", "redisson_lock_token:")
KIND_GROUPS = {"read": "rw", "write": "rw", "fread": "frw", "fwrite": "frw"}
SHARED = frozenset({"read", "fread"})


@dataclass(frozen=True)
class Load:
    """What the workers do: how many, on which lock kinds, for how long."""

    kinds: tuple[str, ...] = ("lock", "fair", "read", "write", "fenced", "spin", "fread", "fwrite")
    processes: int = 4
    tasks: int = 16
    names_per_kind: int = 2
    duration: float = 8.0
    iterations: int = 2000
    watchdog_timeout: float = 10.0
    cancel: float = 0.0
    exit_holding: int = 0
    starve_every: int = 0
    grace: float = 45.0
    """Seconds after ``duration`` by which every worker must have finished."""
    retry_attempts: int = 3
    retry_interval: float = 0.2


@dataclass(frozen=True)
class LockTopology:
    """Locks on a Redis Cluster or a Sentinel group rather than one server."""

    label: str
    client: dict[str, Any]
    """How a worker builds its client: ``{"cluster": url}`` or
    ``{"sentinels": [[host, port], ...], "master": name}``."""
    primaries: Callable[[], list[str]]
    """URLs of the servers holding the lock state, asked once the workers are done (a
    failover may have moved it)."""
    servers: Callable[[], list[str]]
    """URLs of every data server, where no subscription may be left."""

    def __str__(self) -> str:
        return self.label


@dataclass
class Hold:
    """One logged hold."""

    proc: int
    kind: str
    name: str
    holder: str
    start: float
    end: float
    outcome: str
    called: float
    """When the acquire began: ``start - called`` is how long it waited."""
    token: int | None = None
    """A fenced lock's token for this hold."""


@dataclass
class Result:
    """Everything a run measured, and the breaches of what it must prove."""

    scenario: str
    server: str
    load: Load
    faults: Counter[str] = field(default_factory=Counter)
    holds: list[Hold] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    overlaps: list[tuple[Hold, Hold]] = field(default_factory=list)
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)
    transient_left: int = 0
    failures: list[str] = field(default_factory=list)
    took: float = 0.0
    figures: list[str] = field(default_factory=list)
    """The scenario's own figures, appended to its line."""
    windows: list[tuple[float, float]] = field(default_factory=list)
    """Intervals in which an unreported overlap is possible by design (a Sentinel switch,
    before every client has left the old primary): such overlaps are counted apart."""

    @property
    def unreported(self) -> list[tuple[Hold, Hold]]:
        """Overlaps neither of whose holders was told it lost the lock."""
        return [
            (a, b)
            for a, b in self.overlaps
            if a.outcome not in EXCLUSIVE_OUTCOMES_REPORTED
            and b.outcome not in EXCLUSIVE_OUTCOMES_REPORTED
        ]

    @property
    def in_windows(self) -> list[tuple[Hold, Hold]]:
        """Unreported overlaps that begin and end within one of :attr:`windows`."""
        return [
            (a, b)
            for a, b in self.unreported
            if any(
                lo <= max(a.start, b.start) and min(a.end, b.end) <= hi for lo, hi in self.windows
            )
        ]

    @property
    def violations(self) -> list[tuple[Hold, Hold]]:
        """Unreported overlaps outside every window: each one breaks mutual exclusion."""
        tolerated = self.in_windows
        return [pair for pair in self.unreported if pair not in tolerated]

    def total(self, key: str, section: str = "outcomes") -> int:
        """Sum of one figure over the worker summaries."""
        return sum(int(s[section].get(key, 0)) for s in self.summaries)

    @property
    def unfenced(self) -> list[tuple[Hold, Hold]]:
        """Consecutive fenced holds of one name whose tokens did not grow.

        Only holds never reported lost count: they never overlap, so their start order is
        the order the server granted them, and each token must be larger than the last. (A
        hold reported lost may start, as its task sees it, after the next holder's: its
        event loop was starved past its lease. Its smaller token is what fencing is for.)
        """
        by_name: dict[str, list[Hold]] = {}
        for hold in self.holds:
            if hold.token is not None and hold.outcome == "ok":
                by_name.setdefault(hold.name, []).append(hold)
        pairs = []
        for holds in by_name.values():
            holds.sort(key=lambda hold: hold.start)
            pairs += [(a, b) for a, b in itertools.pairwise(holds) if b.token <= a.token]  # type: ignore[operator]
        return pairs

    @property
    def by_kind(self) -> Counter[str]:
        """Holds per lock kind."""
        return Counter(hold.kind for hold in self.holds)

    def problems(self, *, lost_allowed: bool = False) -> list[str]:
        """Every breach; ``lost_allowed``: the scenario loses leases by design."""
        found = list(self.failures)
        for a, b in self.violations[:5]:
            found.append(f"unreported overlap on {a.name}: {a} / {b}")
        if len(self.violations) > 5:
            found.append(f"... {len(self.violations)} unreported overlaps in all")
        for name, (value, expected) in self.counters.items():
            reported = sum(1 for a, _ in self.overlaps if a.name == name)
            if not expected - reported <= value <= expected:
                found.append(f"counter of {name} is {value}, expected {expected}")
        if self.leftovers:
            found.append(f"left on the server: {self.leftovers[:10]}")
        if not lost_allowed:
            # Where a server may lose writes (a restart without persistence, a failover:
            # replication is asynchronous), the token counter may lose its last increments
            # too: regressions are then a figure of the line, not a breach.
            for a, b in self.unfenced[:5]:
                found.append(f"fencing token did not grow on {a.name}: {a} then {b}")
        lost = self.total("lost")
        if lost and not lost_allowed:
            found.append(f"{lost} holds lost their lease in a scenario that must keep them")
        found.extend(
            f"only {self.by_kind[kind]} {kind} holds: the run proves little"
            for kind in self.load.kinds
            if self.by_kind[kind] < 20
        )
        found.extend(
            f"worker {summary['proc']}: tasks still waiting at its end"
            for summary in self.summaries
            if summary["waiting_at_end"]
        )
        return found

    def line(self) -> str:
        """The one summary line printed per scenario."""
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(self.by_kind.items()))
        faults = ", ".join(f"{what} {n:,}" for what, n in sorted(self.faults.items())) or "none"
        errors: Counter[str] = Counter()
        for summary in self.summaries:
            errors.update(summary["errors"])
        shown_errors = ", ".join(f"{what} {n:,}" for what, n in sorted(errors.items())) or "0"
        warnings: Counter[str] = Counter()
        for summary in self.summaries:
            warnings.update(summary["warnings"])
        shown_warnings = ", ".join(f"{what} {n}" for what, n in sorted(warnings.items())) or "0"
        worst: dict[str, float] = {}
        for summary in self.summaries:
            for kind, wait in summary["max_wait"].items():
                worst[kind] = max(worst.get(kind, 0.0), wait)
        shown_worst = ", ".join(f"{kind} {wait:.2f}" for kind, wait in sorted(worst.items()))
        counters_ok = all(v == e for v, e in self.counters.values())
        verdict = "PASS" if not self.problems(lost_allowed=True) else "FAIL"
        windowed = f", in switch windows {len(self.in_windows)}" if self.windows else ""
        regressed = len(self.unfenced)
        figures = "".join(f"; {figure}" for figure in self.figures)
        if regressed:
            figures += f"; fencing tokens out of grant order {regressed}"
        return (
            f"{self.scenario} [{self.server}] {verdict}: "
            f"{self.load.processes}x{self.load.tasks} tasks, {len(self.holds):,} holds ({kinds}); "
            f"faults: {faults}; lost {self.total('lost')}, "
            f"exited holding {self.total('exited-holding')}; errors: {shown_errors}; "
            f"warnings: {shown_warnings}; overlaps {len(self.overlaps)} "
            f"(unreported {len(self.violations)}{windowed}); "
            f"counters {'exact' if counters_ok else 'short'}; "
            f"leftovers {len(self.leftovers)}; worst wait (s) {shown_worst}; "
            f"took {self.took:.1f} s{figures}"
        )


Injector = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


async def stopped(stop: asyncio.Event, within: float) -> bool:
    """Wait up to ``within`` s for the workers to end; True once they have."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await stop.wait()
    return stop.is_set()


def new_run_id() -> str:
    """The token in every name of one run."""
    return uuid.uuid4().hex[:10]


def lock_names(run_id: str, load: Load) -> dict[str, list[str]]:
    """The lock names of each kind in run ``run_id`` (read and write locks share theirs)."""
    groups = {KIND_GROUPS.get(kind, kind) for kind in load.kinds}
    group_names = {
        group: [f"fault:{run_id}:{group}:{i}" for i in range(load.names_per_kind)]
        for group in groups
    }
    return {kind: group_names[KIND_GROUPS.get(kind, kind)] for kind in load.kinds}


async def run_checker(
    scenario: str,
    lock_server: ServerHandle | LockTopology,
    resource_url: str,
    load: Load,
    workdir: Path,
    *,
    inject: Injector | None = None,
    faults: Counter[str] | None = None,
    run_id: str | None = None,
) -> Result:
    """Run the workers with ``inject`` running beside them until they finish; check.

    ``run_id``: given where the injector must know the lock names (:func:`lock_names`).
    """
    run_id = run_id or new_run_id()
    result = Result(scenario, str(lock_server), load, faults if faults is not None else Counter())
    names = lock_names(run_id, load)
    if isinstance(lock_server, LockTopology):
        client: dict[str, Any] = lock_server.client
        primaries, servers = lock_server.primaries, lock_server.servers
    else:
        url = lock_server.url
        client = {"url": url}

        def primaries() -> list[str]:
            return [url]

        servers = primaries
    started = time.monotonic()
    procs = []
    for proc in range(load.processes):
        spec = {
            "client": client,
            "resource_url": resource_url,
            "proc": proc,
            "seed": int(run_id, 16) % 100_000,
            "tasks": load.tasks,
            "kinds": list(load.kinds),
            "names": names,
            "duration": load.duration,
            "iterations": load.iterations,
            "watchdog_timeout": load.watchdog_timeout,
            "retry_attempts": load.retry_attempts,
            "retry_interval": load.retry_interval,
            "cancel": load.cancel,
            "exit_holding": load.exit_holding,
            "starve_every": load.starve_every if proc == 0 else 0,
            "log": str(workdir / f"{run_id}-{proc}.jsonl"),
        }
        spec_path = workdir / f"{run_id}-{proc}.json"
        spec_path.write_text(json.dumps(spec))
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable, str(WORKER), str(spec_path), stdout=asyncio.subprocess.PIPE
            )
        )
    stop = asyncio.Event()
    injector = asyncio.create_task(inject(stop)) if inject is not None else None
    try:
        outputs = await _collect(procs, load.duration + load.grace, result)
    finally:
        stop.set()
        if injector is not None:
            await injector
    result.took = time.monotonic() - started
    for proc, output in enumerate(outputs):
        if output is not None:
            result.summaries.append(json.loads(output.splitlines()[-1]))
        log = workdir / f"{run_id}-{proc}.jsonl"
        if log.exists():
            for line in log.read_text().splitlines():
                d = json.loads(line)
                result.holds.append(
                    Hold(d["p"], d["k"], d["n"], d["h"], d["s"], d["e"], d["o"], d["c"], d.get("t"))
                )
    result.overlaps = find_overlaps(result.holds)
    await _check_servers(
        result,
        await asyncio.to_thread(primaries),
        await asyncio.to_thread(servers),
        resource_url,
        run_id=run_id,
        names=names,
        load=load,
    )
    return result


async def _collect(
    procs: list[asyncio.subprocess.Process], deadline: float, result: Result
) -> list[bytes | None]:
    """Each worker's stdout, or None (and a failure) for one that failed or overran."""
    outputs: list[bytes | None] = []
    try:
        async with asyncio.timeout(deadline):
            for proc in procs:
                stdout, _ = await proc.communicate()
                if proc.returncode != 0:
                    result.failures.append(f"a worker exited with {proc.returncode}")
                    outputs.append(None)
                else:
                    outputs.append(stdout)
    except TimeoutError:
        result.failures.append(f"workers still running {deadline:.0f} s after the start")
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    outputs += [None] * (len(procs) - len(outputs))
    return outputs


def find_overlaps(holds: list[Hold]) -> list[tuple[Hold, Hold]]:
    """Pairs of holds of one name whose intervals overlap, unless both are shared."""
    found: list[tuple[Hold, Hold]] = []
    by_name: dict[str, list[Hold]] = {}
    for hold in holds:
        by_name.setdefault(hold.name, []).append(hold)
    for group in by_name.values():
        group.sort(key=lambda hold: hold.start)
        active: list[Hold] = []
        for hold in group:
            active = [other for other in active if other.end > hold.start]
            found.extend(
                (other, hold)
                for other in active
                if not (other.kind in SHARED and hold.kind in SHARED)
            )
            active.append(hold)
    return found


async def _check_servers(
    result: Result,
    lock_urls: Sequence[str],
    server_urls: Sequence[str],
    resource_url: str,
    *,
    run_id: str,
    names: dict[str, list[str]],
    load: Load,
) -> None:
    resource = Redis.from_url(resource_url, decode_responses=True)
    try:
        increments: Counter[str] = Counter()
        for summary in result.summaries:
            increments.update(summary["increments"])
        exclusive = {name for kind, group in names.items() if kind not in SHARED for name in group}
        for name in sorted(exclusive):
            value = int(await resource.get(f"counter:{name}") or 0)
            result.counters[name] = (value, increments[name])
    finally:
        await resource.aclose()
    if result.failures:
        return  # a killed worker leaves state the checks below would only echo
    locks = [Redis.from_url(url, decode_responses=True) for url in lock_urls]
    try:
        # Holds of tasks that exited holding, and of holders that lost them, run out with
        # their lease; anything still there after that is a leak.
        deadline = time.monotonic() + load.watchdog_timeout + 5
        while True:
            keys = [
                key
                for lock in locks
                async for key in lock.scan_iter(match=f"*{run_id}*", count=1000)
            ]
            lasting = [k for k in keys if not any(m in k for m in TRANSIENT_MARKERS)]
            if not lasting or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        result.leftovers = lasting
        result.transient_left = len(keys) - len(lasting)
    finally:
        for lock in locks:
            await lock.aclose()
    for url in server_urls:
        async with Redis.from_url(url, decode_responses=True) as server:
            channels = await server.pubsub_channels(f"*{run_id}*")
            counts = await server.pubsub_numsub(*channels) if channels else []
            result.leftovers += [f"subscription {c!r} on {url}" for c, n in counts if int(n)]
            shard = await server.pubsub_shardchannels(f"*{run_id}*")
            result.leftovers += [f"shard subscription {c!r} on {url}" for c in shard]
