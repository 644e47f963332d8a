"""Fault scenarios 10-12 (1-8 are in test_scenarios.py): the layout under the locks changes
while the checker runs.

10. Redis Cluster: repeated ``CLUSTER FAILOVER`` of the primaries serving the locks.
11. Redis Cluster: a primary SIGKILLed; its replica takes over after cluster-node-timeout.
12. Sentinel: ``SENTINEL FAILOVER``.

Each runs on a topology of its own (``lock_cluster``, ``lock_sentinel``), started for the
scenario and killed after it. Besides the checker's proofs, each reports per fault how long
the new layout took, when the waiters of the faulted primary's locks that were waiting as
it struck (under Sentinel: as the workers switched) were all served, and how the holds
under way across it ended.

Sentinel has a window by design: the old primary keeps accepting writes after the replica
is promoted, and a client leaves it when it hears ``+switch-master``, not at the promotion.
What the old primary took in between never reaches the new one: a hold taken there and
still held at the switch is reported lost to its holder; a hold released there stays on
the new primary until its holder takes that lock again (the acquire adopts it) or its
lease ends. And a process that has switched and one that has not yet can both hold one
lock without either being told. Such an overlap must lie between the failover command and
the instant the last worker heard the switch (``Result.windows``): it is counted and
printed apart; any other unreported overlap fails the scenario as everywhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from ..topologies import ClusterHandle, Node, SentinelHandle
from .checker import (
    Hold,
    Load,
    LockTopology,
    Result,
    lock_names,
    new_run_id,
    run_checker,
    stopped,
)

pytestmark = pytest.mark.timeout(300)

Report = Callable[[Result], None]
_HOST = "127.0.0.1"
# Bound of the injectors' own waits on the topology, never reached when all goes well.
_ROLE_LIMIT = 30.0


def _listening(sentinel: Node) -> int:
    """Connections subscribed to the sentinel's failover announcements (a sentinel knows no
    PUBSUB NUMSUB): each worker's watch subscribes to three channels on one connection."""
    clients = sentinel.call("CLIENT", "LIST")
    if isinstance(clients, bytes):
        clients = clients.decode()
    return sum(1 for line in str(clients).splitlines() if " sub=3 " in f" {line} ")


def _url(port: int) -> str:
    return f"redis://{_HOST}:{port}"


def on_cluster(cluster: ClusterHandle, url: str | None = None) -> LockTopology:
    """The workers on ``cluster`` (through ``url``, by default its first node); the checks
    on whichever nodes are primaries after the run."""
    url = url or cluster.url
    return LockTopology(
        label=f"cluster of {len(cluster.nodes)} nodes at {url}",
        client={"cluster": url},
        primaries=lambda: [_url(node.port) for node in cluster.primaries()],
        servers=lambda: [_url(node.port) for node in cluster.nodes if node.pid is not None],
    )


def on_sentinel(group: SentinelHandle) -> LockTopology:
    """The workers on ``group`` through its sentinels; the checks on its primary after the run."""
    return LockTopology(
        label=f"Sentinel group {group.master_name!r} of {len(group.nodes)} servers",
        client={"sentinels": group.sentinel_addresses, "master": group.master_name},
        primaries=lambda: [_url(group.primary().port)],
        servers=lambda: [_url(node.port) for node in group.nodes],
    )


@dataclass(frozen=True)
class Fault:
    """One fault: from when it was injected until the new layout was in place."""

    began: float
    settled: float
    names: frozenset[str]
    """The locks the faulted primary served."""
    moved: float | None = None
    """When the clients left the old primary, if not at ``began`` (a Sentinel switch)."""

    def waiters(self, result: Result) -> list[Hold]:
        """Holds of its locks whose acquire was under way when the clients moved."""
        at = self.began if self.moved is None else self.moved
        return [
            hold
            for hold in result.holds
            if hold.name in self.names and hold.called <= at < hold.start
        ]

    def served_within(self, result: Result) -> str:
        """How many waiters :meth:`waiters` finds, and when the last of them was served."""
        at = self.began if self.moved is None else self.moved
        waiters = self.waiters(result)
        return f"{len(waiters)} in {max((hold.start - at for hold in waiters), default=0.0):.2f}"

    def held(self, result: Result) -> list[Hold]:
        """Holds of its locks held at some instant from the fault until the clients had
        moved (the new layout in place, or the Sentinel switch heard)."""
        until = self.settled if self.moved is None else self.moved
        return [
            hold
            for hold in result.holds
            if hold.name in self.names and hold.start < until and hold.end > self.began
        ]


def fault_figures(result: Result, faults: list[Fault]) -> list[str]:
    """The figures of ``faults`` for the scenario's line."""
    if not faults:
        return ["no fault injected"]
    settling = [fault.settled - fault.began for fault in faults]
    served = ", ".join(fault.served_within(result) for fault in faults)
    pending = "each fault" if faults[0].moved is None else "the switch"
    held: Counter[str] = Counter()
    for fault in faults:
        held.update(hold.outcome for hold in fault.held(result))
    shown_held = ", ".join(f"{how} {n}" for how, n in sorted(held.items())) or "none"
    return [
        f"new layout after (s) {min(settling):.2f}-{max(settling):.2f}",
        f"waiters pending at {pending}, served within (s): {served}",
        f"holds during a fault: {shown_held}",
    ]


async def role_after(port: int, role: str, since: float) -> float | None:
    """Seconds from ``since`` until the server at ``port`` reports ``role`` (polled), or
    None if it did not within the bound."""
    async with Redis(host=_HOST, port=port, decode_responses=True) as redis:
        while time.monotonic() < since + _ROLE_LIMIT:
            try:
                reply = await redis.execute_command("ROLE")  # type: ignore[no-untyped-call]
            except RedisConnectionError:
                # A sentinel promoting a replica ends with ``CLIENT KILL TYPE normal`` on it,
                # this poller included; the next call opens a new connection.
                reply = None
            if reply is not None and reply[0] == role:
                return time.monotonic() - since
            await asyncio.sleep(0.01)
    return None


def shards_of(cluster: ClusterHandle, names: list[str]) -> list[frozenset[str]]:
    """``names`` grouped by the primary serving them (a failover keeps the groups)."""
    by_port: dict[int, set[str]] = {}
    for name in names:
        by_port.setdefault(cluster.node_for_key(name).port, set()).add(name)
    return sorted((frozenset(group) for group in by_port.values()), key=len, reverse=True)


def all_names(run_id: str, load: Load) -> list[str]:
    return sorted({name for group in lock_names(run_id, load).values() for name in group})


async def test_cluster_failovers(
    lock_cluster: ClusterHandle, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """10. ``CLUSTER FAILOVER`` of the locks' primaries, one after another, about once a
    second: a planned switch loses no hold, breaks no exclusion and strands no waiter,
    with the client's default retries."""
    load = Load()
    run_id = new_run_id()
    shards = shards_of(lock_cluster, all_names(run_id, load))
    counts: Counter[str] = Counter()
    faults: list[Fault] = []

    async def inject(stop: asyncio.Event) -> None:
        for turn in itertools.count():
            if await stopped(stop, 1.0):
                return
            shard = shards[turn % len(shards)]
            node = await asyncio.to_thread(lock_cluster.node_for_key, min(shard))
            began = time.monotonic()
            # Returns once every node agrees on the new primary and its replica streams.
            await asyncio.to_thread(lock_cluster.failover, node)
            faults.append(Fault(began, time.monotonic(), shard))
            counts["CLUSTER FAILOVER"] += 1

    result = await run_checker(
        "10 cluster failovers",
        on_cluster(lock_cluster),
        resource_url,
        load,
        tmp_path,
        inject=inject,
        faults=counts,
        run_id=run_id,
    )
    result.figures += [f"{len(shards)} primaries serve the locks", *fault_figures(result, faults)]
    report(result)
    assert not result.problems()
    assert counts["CLUSTER FAILOVER"] >= 4
    assert {fault.names for fault in faults} == set(shards), "a primary was never failed over"


async def test_cluster_primary_killed(
    lock_cluster: ClusterHandle, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """11. The primary serving most of the locks is SIGKILLed; its replica is elected after
    the 2 s node timeout. Clients whose retries span that (40 x 0.2 s) see no error; a hold
    the replica had not received is reported lost, never silently doubled; no waiter hangs.
    """
    load = Load(duration=10.0, retry_attempts=40, retry_interval=0.2)
    run_id = new_run_id()
    shard = shards_of(lock_cluster, all_names(run_id, load))[0]
    victim = lock_cluster.node_for_key(min(shard))
    # The workers reach the cluster through another primary: a client whose one startup
    # node is dead before its first command never learns the slot map (redis-py's cluster
    # client knows no other node yet). On a loaded machine a worker can start after the
    # kill: whole processes then failed every call (128 or 32 errors, in CI too).
    survivor = next(node for node in lock_cluster.primaries() if node.port != victim.port)
    counts: Counter[str] = Counter()
    faults: list[Fault] = []

    async def inject(stop: asyncio.Event) -> None:
        if await stopped(stop, 2.0):
            return
        began = time.monotonic()
        await asyncio.to_thread(victim.kill)
        counts["primary SIGKILL"] += 1
        await asyncio.to_thread(
            lock_cluster.wait_stable,
            lambda: lock_cluster.node_for_key(min(shard)).port != victim.port,
        )
        faults.append(Fault(began, time.monotonic(), shard))

    result = await run_checker(
        "11 cluster primary killed",
        on_cluster(lock_cluster, _url(survivor.port)),
        resource_url,
        load,
        tmp_path,
        inject=inject,
        faults=counts,
        run_id=run_id,
    )
    result.figures += [f"{len(shard)} of the locks on it", *fault_figures(result, faults)]
    report(result)
    assert not result.problems(lost_allowed=True)
    assert counts["primary SIGKILL"] == 1
    assert len(faults) == 1
    errors = [summary["errors"] for summary in result.summaries if summary["errors"]]
    assert not errors, f"errors reached workers whose retries span the takeover: {errors}"


async def test_sentinel_failover(
    lock_sentinel: SentinelHandle, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """12. ``SENTINEL FAILOVER`` under the load: every worker moves to the new primary when
    the leading sentinel announces the promotion, before the switch (before: at the
    switch, a second later, and the holds taken on the old primary meanwhile were lost); a
    hold the new primary does not have is reported lost; no waiter hangs; an unreported
    overlap is tolerated only inside the window from the failover command to the last
    worker's move, and counted there."""
    load = Load()
    counts: Counter[str] = Counter()
    faults: list[Fault] = []
    names = frozenset(all_names(run_id := new_run_id(), load))
    roles: dict[str, float | None] = {}

    async def inject(stop: asyncio.Event) -> None:
        if await stopped(stop, 2.0):
            return
        # Every worker listens to the sentinel that will lead (on a loaded machine a worker
        # may still be starting at 2 s; one that is not listening follows at the switch).
        leader = lock_sentinel.sentinels[0]
        while _listening(leader) < load.processes:
            if await stopped(stop, 0.05):
                return
        old = await asyncio.to_thread(lock_sentinel.primary)
        replica = next(node for node in lock_sentinel.nodes if node.port != old.port)
        began = time.monotonic()
        promotion = asyncio.create_task(role_after(replica.port, "master", began))
        # Returns once every sentinel names the new primary and it reports itself one.
        await asyncio.to_thread(lock_sentinel.failover)
        faults.append(Fault(began, time.monotonic(), names))
        counts["SENTINEL FAILOVER"] += 1
        roles["replica promoted"] = await promotion
        # Until then the old primary takes every write sent to it.
        roles["old primary demoted"] = await role_after(old.port, "slave", began)

    result = await run_checker(
        "12 sentinel failover",
        on_sentinel(lock_sentinel),
        resource_url,
        load,
        tmp_path,
        inject=inject,
        faults=counts,
        run_id=run_id,
    )
    heard = [at for summary in result.summaries for at in summary["switched_at"]]
    promoted = roles.get("replica promoted")
    if faults and heard:
        fault = faults[0] = dataclasses.replace(faults[0], moved=max(heard))
        # From the command, not the promotion seen by polling (later than the real one).
        result.windows.append((fault.began, max(heard)))
        since = [at - fault.began for at in heard]
        spread = 1000 * (max(since) - min(since))
        before = sum(1 for at in since if promoted is not None and at < promoted)
        result.figures.append(
            f"workers moved after (s) {min(since):.2f}-{max(since):.2f} "
            f"(spread {spread:.0f} ms), {before} of {len(since)} before the promotion was seen"
        )
    result.figures += [
        f"{what} after (s) {'never' if at is None else f'{at:.2f}'}" for what, at in roles.items()
    ]
    result.figures += fault_figures(result, faults)
    report(result)
    assert not result.problems(lost_allowed=True)
    assert counts["SENTINEL FAILOVER"] == 1
    assert [len(summary["switched_at"]) for summary in result.summaries] == [1] * load.processes
    # Each moved at the announcement of the promotion, not at the switch.
    assert [summary["switched_early"] for summary in result.summaries] == [[True]] * load.processes
