"""Fault scenario 17: restarts without persistence, leaders and guarded holders, by default
and with ``restart_grace`` (issue 35), on one server, on a Sentinel group's primary and on
a Redis Cluster primary.

Three candidates run ``leader.run(work)`` on one election and three workers take turns in
``lock.guarded()`` on one lock, each its own client (as separate processes would be). Every
term and every guarded body logs its start and end on one clock, this process's
``time.monotonic()``. The injector restarts the server holding both (one hash tag) without
persistence, over and over (every key lost at once). Over the run:

- **default**: a restart deletes every lock at once, so another client may take one before
  its holder's first round trip after the restart finds out; the holder's client settles
  its holds the moment the connection comes back (a renewal round, and each watch's
  look-up). The overlaps between two holders' work are counted and measured; they must
  stay within ``DEFAULT_WINDOW`` (before that settling, a guarded body ran on for up to a
  renewal period: 8.7 s with the defaults);
- **strict** (``restart_grace`` = the lease): no client acquires on the restarted server
  before it has been up for a lease, by when every hold taken before has ended: **no
  overlap at all**.

In both, work goes on after every restart and nothing is left on the servers at the end.

Where the restarted server sits:

- **server**: one server, stopped (SIGTERM, nothing saved) and started every 2.5 s;
- **sentinel**: a primary, a replica and three sentinels; the primary is SIGKILLed and
  started again on its port with nothing on disk every 2.5 s. Its sentinels' down-after is
  raised to 60 s, so none calls it down: no failover, the clients find it where it was, and
  its replica resyncs from it, empty;
- **cluster**: three primaries and three replicas; the primary of the locks' slot is
  SIGKILLed and started again with its node config (its id and its slots) but no data.
  Every node's cluster-node-timeout is raised to 60 s, so no replica is elected: the node
  rejoins as the primary of its slots, empty, and its replica resyncs from it. A cluster
  primary refuses every command (CLUSTERDOWN) for its first 2 s after a start (the
  server's own rejoin delay): the lease is 3 s here and terms and bodies last six times as
  long (a guarded body 0.3-2.4 s, a term 1.2-6 s), so that holds taken before a restart
  can outlast the refusals, and the primary is restarted every 5 s to leave time for work.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ClusterDownError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
from aiolock.testing import LocalServer

from ..topologies import ClusterHandle, Node, SentinelHandle
from .checker import TRANSIENT_MARKERS
from .test_scenarios_failover import on_cluster, on_sentinel

pytestmark = pytest.mark.timeout(180)

LEASE = 2.0
#: Longer than a restarted cluster primary's refusals (2 s), which would otherwise outlast
#: every hold taken before the restart and leave nothing to race.
CLUSTER_LEASE = 3.0
CANDIDATES = 3
WORKERS = 3
#: The longest overlap allowed by default: the holder's first round trip after the server
#: is back, on a loaded 2-core machine (docs/guarantees.md gives the measured figures).
DEFAULT_WINDOW = 0.5
# Long enough that a restart never looks like a failure to sentinels or cluster nodes.
NO_FAILOVER_MS = 60_000
# What a service catches around a hold while its server restarts: the server gone, or a
# restarted cluster primary refusing commands until it rejoins (raised by a call with a
# wait at its deadline, and by a release).
TRANSIENT = (aiolock.LockError, RedisConnectionError, RedisTimeoutError, ClusterDownError)

Report = Callable[[str], None]


@dataclass
class Span:
    """One term's or guarded body's work."""

    who: str
    start: float
    end: float = 0.0


def overlaps(spans: list[Span]) -> list[float]:
    """How long each pair of spans of different holders ran together."""
    spans = sorted((s for s in spans if s.end), key=lambda s: s.start)
    found = []
    for index, a in enumerate(spans):
        for b in spans[index + 1 :]:
            if b.start >= a.end:
                break
            if a.who != b.who:
                found.append(min(a.end, b.end) - b.start)
    return found


@dataclass
class Target:
    """Where the locks are: how a client is made, how their server restarts, what to check."""

    make: Callable[..., aiolock.Client]
    restart: Callable[[], None]
    """Restart the server of the locks without persistence (blocking: run in a thread)."""
    primaries: Callable[[], list[str]]
    every: float
    duration: float
    lease: float = LEASE
    stretch: float = 1.0
    """Terms and guarded bodies last this many times longer than on one server."""
    kept: Callable[[], bool] = lambda: True
    """After the run: the restarted server is still the locks' primary (no failover)."""
    closing: list[Callable[[], Any]] = field(default_factory=list)


def restart_empty(node: Node) -> None:
    """SIGKILL ``node`` and start it on its port with its arguments and no data file (the
    topology's servers share a directory, where a replica's full sync leaves one)."""
    with node.redis() as redis:
        where = redis.config_get("dir")["dir"]
        dump = Path(where) / redis.config_get("dbfilename")["dbfilename"]
    node.kill()
    dump.unlink(missing_ok=True)
    node.start()
    with node.redis() as redis:
        loaded = int(redis.info("persistence").get("rdb_last_load_keys_loaded", 0))
    assert loaded == 0, f"{node} came back with {loaded} keys"


@contextlib.asynccontextmanager
async def target(request: pytest.FixtureRequest, topology: str, key: str) -> AsyncIterator[Target]:
    """The scenario's topology; ``key``: a key of the locks' slot."""
    if topology == "server":
        server: LocalServer = request.getfixturevalue("lock_server")
        yield Target(
            make=lambda **options: aiolock.Client.from_url(server.url, **options),
            restart=server.restart,
            primaries=lambda: [server.url],
            every=2.5,
            duration=16.0,
        )
    elif topology == "sentinel":
        group: SentinelHandle = request.getfixturevalue("lock_sentinel")
        for sentinel in group.sentinels:
            sentinel.call(
                "SENTINEL", "SET", group.master_name, "down-after-milliseconds", NO_FAILOVER_MS
            )
        primary = group.primary()
        closing: list[Callable[[], Any]] = []

        def through_sentinels(**options: Any) -> aiolock.Client:
            via = Sentinel(group.sentinel_addresses, socket_timeout=5)  # type: ignore[no-untyped-call]
            closing.extend(redis.aclose for redis in via.sentinels)
            return aiolock.Client(via.master_for(group.master_name), **options)

        yield Target(
            make=through_sentinels,
            restart=lambda: restart_empty(primary),
            primaries=on_sentinel(group).primaries,
            every=2.5,
            duration=13.0,
            kept=lambda: group.primary().port == primary.port,
            closing=closing,
        )
    else:
        cluster: ClusterHandle = request.getfixturevalue("lock_cluster")
        for node in cluster.nodes:
            node.call("CONFIG", "SET", "cluster-node-timeout", NO_FAILOVER_MS)
        victim = cluster.node_for_key(key)

        def restart() -> None:
            restart_empty(victim)
            victim.call("CONFIG", "SET", "cluster-node-timeout", NO_FAILOVER_MS)

        yield Target(
            make=lambda **options: aiolock.Client.from_url(cluster.url, cluster=True, **options),
            restart=restart,
            primaries=on_cluster(cluster).primaries,
            every=5.0,
            duration=25.0,
            lease=CLUSTER_LEASE,
            stretch=6.0,
            kept=lambda: cluster.node_for_key(key).port == victim.port,
        )


async def leftovers(urls: list[str], suffix: str, lease: float) -> list[str]:
    """Keys of the run still on ``urls`` once the leases of any abandoned hold ran out."""
    deadline = time.monotonic() + lease + 5
    while True:
        found = []
        for url in urls:
            async with Redis.from_url(url, decode_responses=True) as redis:
                found += [
                    key
                    async for key in redis.scan_iter(match=f"*{suffix}*")
                    if not any(marker in key for marker in TRANSIENT_MARKERS)
                ]
        if not found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ["default", "strict"])
@pytest.mark.parametrize("topology", ["server", "sentinel", "cluster"])
async def test_restarts_without_persistence(
    request: pytest.FixtureRequest, report: Report, topology: str, mode: str
) -> None:
    """17. Restarts without persistence: overlaps within the window by default, none with
    ``restart_grace``; work after every restart; nothing left."""
    suffix = f"{random.getrandbits(40):x}"
    # One hash tag: on a cluster both live on the primary that is restarted.
    election, name = f"{{restart:{suffix}}}:leader", f"{{restart:{suffix}}}:lock"
    terms: list[Span] = []
    bodies: list[Span] = []
    errors: list[str] = []
    # How long each acquire that raised a refusal took: it is resent until the wait is over.
    refused: list[float] = []
    stop = asyncio.Event()
    rng = random.Random(35)

    async def candidate(i: int, client: aiolock.Client, stretch: float) -> None:
        leader = client.leader(election)

        async def work() -> None:
            span = Span(f"leader{i}", time.monotonic())
            terms.append(span)
            try:
                await asyncio.sleep(rng.uniform(0.2, 1.0) * stretch)
            finally:
                span.end = time.monotonic()

        while not stop.is_set():
            try:
                await leader.run(work)
            except TRANSIENT as exc:
                errors.append(type(exc).__name__)

    async def worker(i: int, client: aiolock.Client, wait: float, stretch: float) -> None:
        lock = client.lock(name)
        while not stop.is_set():
            called = time.monotonic()
            span: Span | None = None
            try:
                async with lock.guarded(wait=wait):
                    span = Span(f"worker{i}", time.monotonic())
                    bodies.append(span)
                    try:
                        await asyncio.sleep(rng.uniform(0.05, 0.4) * stretch)
                    finally:
                        span.end = time.monotonic()
            except TRANSIENT as exc:
                errors.append(type(exc).__name__)
                if span is None and isinstance(exc, ClusterDownError):
                    refused.append(time.monotonic() - called)
                await asyncio.sleep(0.05)

    restarts = 0

    async with target(request, topology, name) as where:

        async def inject() -> None:
            nonlocal restarts
            try:
                started = time.monotonic()
                while time.monotonic() - started < where.duration:
                    await asyncio.sleep(where.every)
                    await asyncio.to_thread(where.restart)  # without persistence: all lost
                    restarts += 1
            finally:
                stop.set()

        options: dict[str, Any] = {"watchdog_timeout": where.lease}
        if mode == "strict":
            options["restart_grace"] = where.lease
        clients = [where.make(**options) for _ in range(CANDIDATES + WORKERS)]
        try:
            # A task group: an unexpected error cancels the others before the clients close.
            async with asyncio.timeout(where.duration + 60), asyncio.TaskGroup() as group:
                group.create_task(inject())
                for i, each in enumerate(clients[:CANDIDATES]):
                    group.create_task(candidate(i, each, where.stretch))
                for i, each in enumerate(clients[CANDIDATES:]):
                    group.create_task(worker(i, each, 3 * where.lease, where.stretch))
        finally:
            for each in clients:
                await each.aclose()
            for close in where.closing:
                await close()
        kept = await asyncio.to_thread(where.kept)
        left = await leftovers(await asyncio.to_thread(where.primaries), suffix, where.lease)

    leader_overlaps, body_overlaps = overlaps(terms), overlaps(bodies)
    every = leader_overlaps + body_overlaps
    report(
        f"17 restarts without persistence [{topology}, {mode}]: {restarts} restarts, "
        f"{len(terms)} terms, {len(bodies)} guarded bodies; overlaps: "
        f"{len(leader_overlaps)} of terms, {len(body_overlaps)} of bodies, longest "
        f"{max(every, default=0.0) * 1000:.1f} ms; errors {dict(Counter(errors))}; "
        f"leftovers {len(left)}"
    )
    assert restarts >= 5
    assert kept, "the restarted server is no longer the locks' primary: a failover happened"
    # Work went on between the restarts.
    assert len(terms) >= restarts
    assert len(bodies) >= restarts
    assert not left, left
    assert all(took >= 3 * where.lease for took in refused), f"refused before the wait: {refused}"
    if mode == "strict":
        assert not every, every
    else:
        assert max(every, default=0.0) <= DEFAULT_WINDOW, every


async def test_cluster_restart_with_a_long_watchdog(
    lock_cluster: ClusterHandle, report: Report
) -> None:
    """17b. A guarded body on a cluster primary restarted without persistence, with a 60 s
    watchdog: it must end within the window of another client's acquire. (The renewal
    refused by the restarted primary's first seconds was retried only a quarter period
    later, 5 s here: the body ran 2.9 s beside the next holder.)"""
    cluster = lock_cluster
    for node in cluster.nodes:
        node.call("CONFIG", "SET", "cluster-node-timeout", NO_FAILOVER_MS)
    name = f"{{restart:{random.getrandbits(40):x}}}:long"
    victim = cluster.node_for_key(name)
    holder = aiolock.Client.from_url(cluster.url, cluster=True, watchdog_timeout=60)
    rival = aiolock.Client.from_url(cluster.url, cluster=True, watchdog_timeout=60)
    entered = asyncio.Event()
    ended = 0.0

    async def hold() -> None:
        nonlocal ended
        with contextlib.suppress(aiolock.LockLostError):
            async with holder.lock(name).guarded():
                entered.set()
                try:
                    await asyncio.sleep(60)
                finally:
                    ended = time.monotonic()

    try:
        async with asyncio.timeout(60):
            task = asyncio.create_task(hold())
            await entered.wait()
            await asyncio.to_thread(restart_empty, victim)
            lock = rival.lock(name)
            assert await lock.try_lock(wait=30)
            acquired = time.monotonic()
            await task
            await lock.unlock()
    finally:
        await holder.aclose()
        await rival.aclose()
    report(f"17b cluster restart, 60 s watchdog: the body ran {ended - acquired:.2f} s on")
    assert ended - acquired <= DEFAULT_WINDOW
