"""Load drivers: run one implementation on one scenario and return its metrics.

Every worker runs the same bounded loop (at most ``MAX_OPS`` pairs, and none started after
the deadline): acquire, release, record the four instants. With ``forced`` handoff a worker
that has just released waits (on an event, not a timer) until another worker has taken the
lock before it queues again. Workers still waiting at the deadline get a grace period to
finish the pair they started; whatever is still blocked then is cancelled (asyncio) or left
to its daemon thread, and reported as a straggler.

Scenarios with ``processes > 1`` start that many processes with the ``spawn`` method; the
parent takes the server snapshots, starts all of them at one instant on the shared monotonic
clock, and merges their records.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._adapters import ADAPTERS, AsyncAdapter, AsyncWorker, SyncAdapter, SyncWorker, Unavailable
from ._instrument import CommandStats, LogCounter, RoundTrips
from ._redisson import JvmUnavailable, run_jvms
from ._stats import Record, contended_metrics, rw_metrics, uncontended_metrics

__all__ = ("MAX_OPS", "Job", "Scenario", "measure")

MAX_OPS = 1_000_000  # per worker and measurement: the count bound of every load loop
GRACE_S = 5.0  # after the deadline, for acquisitions already waiting
SPAWN_TIMEOUT_S = 60.0
#: Forced handoff: once every other worker is inside acquire(), the holder keeps the lock
#: this long more, so their first attempt has failed and they are parked when it releases.
HOLD_S = 0.002

now = time.monotonic  # CLOCK_MONOTONIC: one clock for all processes of the machine


@dataclass(frozen=True)
class Scenario:
    """One measured configuration."""

    case: str  # uncontended | contended | handoff | rw
    variant: str  # label in the table, e.g. "N=16" or "4x8"
    tasks: int  # workers per process
    processes: int = 1
    shared: bool = True  # all workers on one lock name
    forced: bool = False  # forced handoff

    @property
    def n(self) -> int:
        """Workers in all processes."""
        return self.tasks * self.processes

    @property
    def kind(self) -> str:
        """Which adapters apply (matched against ``Adapter.cases``)."""
        return "multiproc" if self.processes > 1 else self.case


@dataclass(frozen=True)
class Job:
    """One measurement: which implementation, where, under which names, how long."""

    key: str
    url: str
    tag: str
    scen: Scenario
    duration: float
    #: Where the server counters are read (every primary of a cluster); default ``url``.
    stats_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class Signals:
    """How a group syncs with whoever took the server snapshots.

    ``go()`` blocks until the run may start and returns the start instant; ``done()`` is
    called when every worker has finished, before teardown.
    """

    go: Callable[[], float]
    done: Callable[[], None]


@dataclass
class GroupResult:
    """What one process measured."""

    records: list[Record] = field(default_factory=list)
    stuck: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    round_trips: int = 0
    stragglers: int = 0
    errors: list[str] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)
    logs: dict[str, int] = field(default_factory=dict)
    t_start: float = 0.0


# --------------------------------------------------------------------------- asyncio driver


class _AsyncHandoff:
    """Forced handoff state: last owner, workers inside acquire(), one event per change."""

    def __init__(self, workers: int) -> None:
        self.owner = -1
        self.active = workers
        self.queued = 0  # workers inside acquire()
        self.changed = asyncio.Event()

    def _bump(self) -> None:
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def enter(self) -> None:
        self.queued += 1
        self._bump()

    def acquired(self, worker: int) -> None:
        self.queued -= 1
        self.owner = worker
        self._bump()

    def exited(self) -> None:
        self.active -= 1
        self._bump()

    async def wait_queued(self) -> None:
        """Until every other worker is inside acquire() (or has left the run)."""
        while self.queued < self.active - 1:
            await self.changed.wait()

    async def wait_other(self, worker: int) -> None:
        """Until another worker has taken the lock (or no other one is left)."""
        while self.owner == worker and self.active > 1:
            await self.changed.wait()


def _name(tag: str, scen: Scenario, worker: int) -> str:
    return f"{tag}:lock" if scen.shared else f"{tag}:lock:{worker}"


@dataclass
class _AsyncCtl:
    deadline: float
    hand: _AsyncHandoff | None
    res: GroupResult


async def _async_body(worker: AsyncWorker, wid: int, name: str, ctl: _AsyncCtl) -> None:
    deadline, hand, res = ctl.deadline, ctl.hand, ctl.res
    try:
        for _ in range(MAX_OPS):
            if now() >= deadline:
                break
            if hand is not None:
                hand.enter()
            t_wait = now()
            try:
                await worker.acquire(name)
            except asyncio.CancelledError:
                res.stuck.append(t_wait)
                raise
            t_acq = now()
            if hand is not None:
                hand.acquired(wid)
                await hand.wait_queued()
                await asyncio.sleep(HOLD_S)
            t_rel = now()
            await worker.release(name)
            res.records.append(Record(wid, t_wait, t_acq, t_rel, now()))
            if hand is not None:
                await hand.wait_other(wid)
    finally:
        if hand is not None:
            hand.exited()


async def run_group_async(
    adapter: AsyncAdapter, job: Job, offset: int, signals: Signals
) -> GroupResult:
    """Set up, warm up, wait for ``go()`` (which returns the start instant), run, report."""
    scen = job.scen
    res = GroupResult()
    await adapter.setup()
    try:
        workers = [await adapter.worker(offset + i, scen.n) for i in range(scen.tasks)]
        await adapter.ready()
        for w in workers:
            await w.warm()
        res.t_start = signals.go()
        deadline = res.t_start + job.duration
        ctl = _AsyncCtl(deadline, _AsyncHandoff(scen.tasks) if scen.forced else None, res)
        cpu0, rt0 = time.process_time(), RoundTrips.count
        tasks = [
            asyncio.create_task(
                _async_body(w, offset + i, _name(adapter.tag, scen, offset + i), ctl)
            )
            for i, w in enumerate(workers)
        ]
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline + GRACE_S - now()))
        res.stragglers = len(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        res.cpu_s = time.process_time() - cpu0
        res.round_trips = RoundTrips.count - rt0
        signals.done()
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                res.errors.append(_describe(task.exception()))
    finally:
        await adapter.teardown()
    res.extra = dict(adapter.extra)
    return res


# --------------------------------------------------------------------------- thread driver


class _ThreadHandoff:
    """The thread flavour of :class:`_AsyncHandoff` (waits bounded by ``GRACE_S``)."""

    def __init__(self, workers: int) -> None:
        self.owner = -1
        self.active = workers
        self.queued = 0
        self.cond = threading.Condition()

    def enter(self) -> None:
        with self.cond:
            self.queued += 1
            self.cond.notify_all()

    def acquired(self, worker: int) -> None:
        with self.cond:
            self.queued -= 1
            self.owner = worker
            self.cond.notify_all()

    def exited(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def wait_queued(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.queued >= self.active - 1, timeout=GRACE_S)

    def wait_other(self, worker: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.owner != worker or self.active <= 1, timeout=GRACE_S)


@dataclass
class _ThreadCtl:
    hand: _ThreadHandoff | None
    res: GroupResult
    start: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    deadline: float = 0.0  # set before ``start`` is


def _thread_body(worker: SyncWorker, wid: int, name: str, ctl: _ThreadCtl) -> None:
    hand, res, lock = ctl.hand, ctl.res, ctl.lock
    ctl.start.wait()
    try:
        for _ in range(MAX_OPS):
            if now() >= ctl.deadline:
                break
            if hand is not None:
                hand.enter()
            t_wait = now()
            worker.acquire(name)
            t_acq = now()
            if hand is not None:
                hand.acquired(wid)
                hand.wait_queued()
                time.sleep(HOLD_S)
            t_rel = now()
            worker.release(name)
            rec = Record(wid, t_wait, t_acq, t_rel, now())
            with lock:
                res.records.append(rec)
            if hand is not None:
                hand.wait_other(wid)
    except Exception as exc:
        with lock:
            res.errors.append(_describe(exc))
    finally:
        if hand is not None:
            hand.exited()


def run_group_threads(adapter: SyncAdapter, job: Job, offset: int, signals: Signals) -> GroupResult:
    """The thread flavour of :func:`run_group_async`: one daemon thread per worker."""
    scen = job.scen
    res = GroupResult()
    adapter.setup()
    try:
        workers = [adapter.worker(offset + i, scen.n) for i in range(scen.tasks)]
        for w in workers:
            w.warm()
        ctl = _ThreadCtl(_ThreadHandoff(scen.tasks) if scen.forced else None, res)
        threads = [
            threading.Thread(
                target=_thread_body,
                args=(w, offset + i, _name(adapter.tag, scen, offset + i), ctl),
                daemon=True,
            )
            for i, w in enumerate(workers)
        ]
        for t in threads:
            t.start()
        res.t_start = signals.go()
        ctl.deadline = res.t_start + job.duration
        cpu0, rt0 = time.process_time(), RoundTrips.count
        ctl.start.set()
        for t in threads:
            t.join(timeout=max(0.0, ctl.deadline + GRACE_S - now()))
        res.stragglers = sum(t.is_alive() for t in threads)
        res.cpu_s = time.process_time() - cpu0
        res.round_trips = RoundTrips.count - rt0
        signals.done()
    finally:
        if not res.stragglers:
            adapter.teardown()
    res.extra = dict(adapter.extra)
    return res


def _describe(exc: BaseException | None) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {exc}"[:200]


# --------------------------------------------------------------------------- processes


def _run_group(job: Job, offset: int, signals: Signals) -> GroupResult:
    RoundTrips.install()
    LogCounter.take()
    cls = ADAPTERS[job.key]
    try:
        if issubclass(cls, SyncAdapter):
            res = run_group_threads(cls(job.url, job.tag), job, offset, signals)
        else:
            assert issubclass(cls, AsyncAdapter)
            res = asyncio.run(run_group_async(cls(job.url, job.tag), job, offset, signals))
    except NotImplementedError as exc:
        detail = f": {exc}" if str(exc) else ""
        raise Unavailable(f"n/a: not implemented yet (NotImplementedError{detail})") from exc
    res.logs = LogCounter.take()
    return res


@dataclass(frozen=True)
class _Wires:
    """Parent <-> child plumbing (multiprocessing objects, passed at spawn)."""

    msgs: Any  # Queue of (kind, process index, payload)
    go_event: Any
    start_at: Any  # Value("d"): the common start instant
    teardown_ok: Any


def _child(index: int, job: Job, wires: _Wires) -> None:
    """Entry point of one spawned process: runs one group, reports through ``msgs``."""
    msgs = wires.msgs

    def go() -> float:
        msgs.put(("ready", index, None))
        if not wires.go_event.wait(SPAWN_TIMEOUT_S):
            raise TimeoutError("parent never gave the start signal")
        t_start = float(wires.start_at.value)
        time.sleep(max(0.0, t_start - now()))
        return t_start

    def done() -> None:
        msgs.put(("done", index, None))
        wires.teardown_ok.wait(SPAWN_TIMEOUT_S)

    try:
        res = _run_group(job, index * job.scen.tasks, Signals(go, done))
    except Unavailable as exc:
        msgs.put(("unavailable", index, str(exc)))
    except Exception as exc:
        msgs.put(("error", index, f"{_describe(exc)}\n{traceback.format_exc(limit=3)}"))
    else:
        msgs.put(("result", index, res))


def _run_processes(
    job: Job, before: Callable[[], None], after: Callable[[], None]
) -> list[GroupResult]:
    scen = job.scen
    ctx = multiprocessing.get_context("spawn")
    wires = _Wires(ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0), ctx.Event())
    msgs, go_event, start_at, teardown_ok = (
        wires.msgs,
        wires.go_event,
        wires.start_at,
        wires.teardown_ok,
    )
    procs = [
        ctx.Process(target=_child, args=(i, job, wires), daemon=True) for i in range(scen.processes)
    ]
    for p in procs:
        p.start()
    results: dict[int, GroupResult] = {}
    try:
        _await_phase(msgs, "ready", scen.processes, SPAWN_TIMEOUT_S, results)
        before()
        start_at.value = now() + 0.05
        go_event.set()
        _await_phase(msgs, "done", scen.processes, job.duration + GRACE_S + 30.0, results)
        after()
        teardown_ok.set()
        _await_phase(msgs, "result", scen.processes, 30.0, results)
    finally:
        go_event.set()
        teardown_ok.set()
        for p in procs:
            p.join(timeout=10.0)
            if p.is_alive():
                p.terminate()  # our own child, stuck past every bound
                p.join(timeout=5.0)
    return [results[i] for i in sorted(results)]


def _await_phase(
    msgs: Any, phase: str, count: int, timeout: float, results: dict[int, GroupResult]
) -> None:
    seen: set[int] = set()
    end = now() + timeout
    while len(seen) < count:
        try:
            kind, index, payload = msgs.get(timeout=max(0.1, end - now()))
        except queue.Empty:
            raise TimeoutError(f"{count - len(seen)} process(es) never reached {phase!r}") from None
        if kind == "unavailable":
            raise Unavailable(payload)
        if kind == "error":
            raise RuntimeError(f"process {index}: {payload}")
        if kind == phase:
            seen.add(index)
            if kind == "result":
                results[index] = payload


# --------------------------------------------------------------------------- one measurement


def measure(job: Job) -> dict[str, float | int | str | None]:
    """Run one job once; every number of one table row for one repetition."""
    stats = CommandStats(*(job.stats_urls or (job.url,)))
    snaps: dict[str, dict[str, float]] = {}

    def before() -> None:
        snaps["before"] = stats.snapshot()

    def after() -> None:
        snaps["after"] = stats.snapshot()

    def go() -> float:
        before()
        return now()

    try:
        if ADAPTERS[job.key].runner == "jvm":
            groups = [_jvm_group(report) for report in run_jvms(job, before, after)]
        elif job.scen.processes > 1:
            groups = _run_processes(job, before, after)
        else:
            groups = [_run_group(job, 0, Signals(go, after))]
    except (Unavailable, JvmUnavailable) as exc:
        return {"status": str(exc)}
    except Exception as exc:
        return {"status": f"error: {_describe(exc)}"}
    finally:
        stats.close()
    delta = CommandStats.delta(snaps["before"], snaps["after"])
    return _summarise(groups, job.scen, job.duration, delta)


def _jvm_group(report: dict[str, Any]) -> GroupResult:
    """One Redisson JVM's report (benchmarks/_redisson.py) as a process's result."""
    return GroupResult(
        records=[Record(int(r[0]), *map(float, r[1:5])) for r in report["records"]],
        stuck=[float(t) for t in report["stuck"]],
        cpu_s=float(report["cpu_s"]),
        round_trips=int(report["round_trips"]),
        stragglers=int(report["stragglers"]),
        errors=[str(e) for e in report.get("errors", [])],
        t_start=float(report["t_start"]),
    )


def _summarise(
    groups: list[GroupResult], scen: Scenario, duration: float, server: dict[str, float]
) -> dict[str, float | int | str | None]:
    records = [r for g in groups for r in g.records]
    stuck = [t for g in groups for t in g.stuck]
    start = groups[0].t_start
    end = start + duration
    out: dict[str, float | int | str | None] = {"status": "ok"}
    if scen.case == "uncontended":
        out.update(uncontended_metrics(records, start, end))
    elif scen.case == "rw":
        out.update(rw_metrics(records, scen.n - 1, start, end))
    else:
        out.update(contended_metrics(records, range(scen.n), start, end, stuck))
    ops = max(1, len(records))  # every pair, drain included: what the deltas also cover
    server_cpu = server.pop("_cpu", 0.0)
    out["client_cpu_us_per_op"] = 1e6 * sum(g.cpu_s for g in groups) / ops
    out["server_cpu_us_per_op"] = 1e6 * server_cpu / ops
    out["server_cmds_per_op"] = sum(server.values()) / ops
    out["round_trips_per_op"] = sum(g.round_trips for g in groups) / ops
    out["server_cmds"] = " ".join(
        f"{k}={v / ops:.2f}" for k, v in sorted(server.items(), key=lambda kv: -kv[1])[:6]
    )
    out["stragglers"] = sum(g.stragglers for g in groups)
    errors = [e for g in groups for e in g.errors]
    out["errors"] = len(errors)
    if errors:
        out["first_error"] = errors[0]
    logs: dict[str, int] = {}
    for g in groups:
        for msg, n in g.logs.items():
            logs[msg] = logs.get(msg, 0) + n
    if logs:
        out["aiolock_log"] = LogCounter.summary(logs)
    for g in groups:
        for k, v in g.extra.items():
            prev = out.get(k)
            out[k] = (prev if isinstance(prev, int) else 0) + v
    return out
