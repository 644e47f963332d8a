"""Fault scenarios 13-14: one node frozen while the others serve (SIGSTOP: a paused VM, a
long fork, a stalled host; connections stay open and nothing is answered).

13. Redis Cluster: one primary frozen for more than three watchdog leases under the
    checker's workers, while a long-lived holder keeps a watchdog lock on every primary
    and a rival client tries those on the primaries that answer. Nothing on the other
    primaries may slow beyond its own bounds: holds on healthy primaries lost: 0, the
    rival takes none of them; the frozen primary's holds are reported lost once it
    answers again (their leases ran out meanwhile), never silently doubled.
14. RedLock over three servers, each of them frozen in turn: ``try_lock(wait=1, lease=5)``
    returns held (a majority answers) within its wait plus one member's share, and
    ``lock()`` (no wait, no lease) within the first round's per-member bound; the frozen
    member's cut-off acquire is undone once it answers.

Each runs on servers of its own, killed after it. No replicas in 13: nothing fails over,
the frozen primary's slots just go unanswered (``cluster-require-full-coverage no``: the
other primaries go on serving theirs, as many deployments run).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import LocalServer, start_local_server

from .. import inside
from ..clusters import names_on_every_primary
from ..freezing import frozen
from ..helpers import quiesce, wait_until
from ..topologies import ClusterHandle, redis_cluster
from .checker import Load, Result, new_run_id, run_checker, stopped
from .test_scenarios_failover import all_names, on_cluster, shards_of

pytestmark = pytest.mark.timeout(120)

Report = Callable[[Result], None]
# The holders' watchdog: a 1.5 s lease renewed every 0.5 s; the freeze lasts three leases.
WATCHDOG = 1.5
FREEZE = 4.5


@pytest.fixture
def lone_primaries() -> Iterator[ClusterHandle]:
    """A fresh cluster of three primaries without replicas, each serving its own slots
    whatever the others' state."""
    with redis_cluster(primaries=3, replicas=0) as cluster:
        for node in cluster.nodes:
            node.call("CONFIG", "SET", "cluster-require-full-coverage", "no")
        yield cluster


async def test_cluster_primary_frozen(
    lone_primaries: ClusterHandle, resource_url: str, tmp_path: Path, report: Report
) -> None:
    """13. One primary frozen for three leases: the other primaries' holds are renewed all
    along (lost: 0), the frozen one's are reported lost once it answers; no waiter hangs."""
    cluster = lone_primaries
    load = Load(duration=8.0, watchdog_timeout=WATCHDOG)
    run_id = new_run_id()
    # The primary serving the most of the workers' locks, and not the seed node (the
    # checks read the slot map from it).
    victim = next(
        node
        for shard in shards_of(cluster, all_names(run_id, load))
        if (node := cluster.node_for_key(min(shard))).port != cluster.nodes[0].port
    )
    # Names of their own: the checker finds nothing of its run left once its workers end.
    names = names_on_every_primary(cluster, new_run_id())
    on_victim = {n for n in names if cluster.node_for_key(n).port == victim.port}
    healthy = [n for n in names if n not in on_victim]
    counts: Counter[str] = Counter()
    measured: dict[str, float] = {}
    holder = aiolock.Client.from_url(cluster.url, cluster=True, watchdog_timeout=WATCHDOG)
    rival = aiolock.Client.from_url(cluster.url, cluster=True)
    locks = {n: holder.lock(n, owner="long") for n in names}

    async def inject(stop: asyncio.Event) -> None:
        for lock in locks.values():
            await lock.lock()
        for n in healthy:  # the rival knows every primary before the freeze
            assert not await rival.lock(n).try_lock()
        if await stopped(stop, 1.0):
            return
        renewal = inside.renewal(holder)
        rounds = renewal.rounds
        taken = 0
        with frozen(victim.pid):
            counts["primary SIGSTOP"] += 1
            began = time.monotonic()
            while time.monotonic() - began < FREEZE:
                for n in healthy:
                    if await rival.lock(n).try_lock():
                        taken += 1
                        await rival.lock(n).unlock()
                await asyncio.sleep(0.25)
            measured["periods"] = renewal.rounds - rounds
            measured["healthy lost"] = taken + sum(
                not locks[n].statistics().held_by_current_task for n in healthy
            )
        thawed = time.monotonic()
        await wait_until(lambda: len(renewal) == len(healthy), limit=20.0, what="frozen lost")
        measured["reported after thaw"] = time.monotonic() - thawed

    try:
        result = await run_checker(
            "13 cluster primary frozen",
            on_cluster(cluster),
            resource_url,
            load,
            tmp_path,
            inject=inject,
            faults=counts,
            run_id=run_id,
        )
        for n in healthy:
            await locks[n].unlock()
        for n in on_victim:
            with pytest.raises(aiolock.LockLostError):
                await locks[n].unlock()
    finally:
        await holder.aclose()
        await rival.aclose()
    result.figures += [
        f"frozen {FREEZE:g} s with a {WATCHDOG:g} s watchdog",
        f"renewal periods meanwhile {measured.get('periods', 0):g}",
        f"holds on healthy primaries lost: {measured.get('healthy lost', -1):g}",
        f"frozen primary's hold reported lost {measured.get('reported after thaw', -1):.2f} s "
        "after it ran again",
    ]
    report(result)
    assert counts["primary SIGSTOP"] == 1
    assert measured["healthy lost"] == 0
    # Ten periods in 4.5 s; fewer on a slow machine, but never stalled by the frozen one.
    assert measured["periods"] >= 4
    assert not result.problems(lost_allowed=True)


@pytest.fixture
def red_servers() -> Iterator[list[LocalServer]]:
    """Three independent servers for a RedLock, one of which the scenario freezes."""
    started = [start_local_server() for _ in range(3)]
    try:
        yield started
    finally:
        for server in started:
            server.resume()
            server.close()


async def test_redlock_member_frozen(red_servers: list[LocalServer], report: Report) -> None:
    """14. Each server of a RedLock frozen in turn: try_lock(wait=1, lease=5) holds the
    other two within 1 s and a member's share; lock() within the first round's 1.5 s per
    member; once the frozen server answers, nothing of the cut-off acquire is left there.
    Meanwhile is_held_by_current_task() answers held at once (from the other two; a
    query waits 1.5 s at most), and an unlock() of a RedLock held on the frozen server
    too returns within that bound, the frozen member's release landing once it answers."""
    clients = [aiolock.Client.from_url(server.url) for server in red_servers]
    raws = [Redis.from_url(server.url) for server in red_servers]
    name = f"frozen:{new_run_id()}"
    red = aiolock.RedLock(*(client.lock(name) for client in clients))
    took: dict[str, list[float]] = {
        "try_lock(wait=1, lease=5)": [],
        "lock()": [],
        "is_held_by_current_task()": [],
        "unlock() held on the frozen one": [],
    }
    started = time.monotonic()
    try:
        for index, server in enumerate(red_servers):
            # Connected first: the freeze catches live connections.
            assert await red.try_lock(wait=1, lease=5)
            await red.unlock()
            server.pause()
            try:
                for what, call in (
                    ("try_lock(wait=1, lease=5)", lambda: red.try_lock(wait=1, lease=5)),
                    ("lock()", red.lock),
                ):
                    began = time.monotonic()
                    async with asyncio.timeout(10):
                        assert await call() in (True, None)
                    took[what].append(time.monotonic() - began)
                    # The servers asked, the frozen one too: the other two answer held.
                    began = time.monotonic()
                    async with asyncio.timeout(10):
                        assert await red.is_held_by_current_task()
                    took["is_held_by_current_task()"].append(time.monotonic() - began)
                    await red.unlock()
            finally:
                server.resume()
            await quiesce(clients[index])
            assert not await raws[index].exists(name), "a cut-off acquire was left behind"
            # Held on all three, then one frozen: unlock() returns within its bound, and
            # the frozen member's release lands once the server answers again.
            assert await red.try_lock(wait=1, lease=5)
            server.pause()
            try:
                began = time.monotonic()
                async with asyncio.timeout(10):
                    await red.unlock()
                    assert not await red.is_held_by_current_task()
                took["unlock() held on the frozen one"].append(time.monotonic() - began)
            finally:
                server.resume()
            await quiesce(clients[index])
            assert not await raws[index].exists(name), "the frozen member's release was lost"
    finally:
        for client in clients:
            await client.aclose()
        for raw in raws:
            await raw.aclose()
    line = "; ".join(
        f"{what} returned in (s) {', '.join(f'{t:.2f}' for t in times)}"
        for what, times in took.items()
    )
    print(f"14 RedLock member frozen PASS in {time.monotonic() - started:.1f} s: {line}")
    # wait=1: each member's share of it, at most 1 s; lock(): 1.5 s for the frozen one.
    assert max(took["try_lock(wait=1, lease=5)"]) < 1 + 1.0
    assert max(took["lock()"]) < 1.5 + 1.0
    # A majority answers held at once: the frozen one is not waited for its 1.5 s.
    assert max(took["is_held_by_current_task()"]) < 1.5
    # The frozen member's unlock is cut off after 1.5 s; is_held answers at once.
    assert max(took["unlock() held on the frozen one"]) < 1.5 + 1.0
