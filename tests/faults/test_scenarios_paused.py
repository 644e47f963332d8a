"""Fault scenarios 15-16: one component paused at a time (SIGSTOP), every call with a wait.

15. Sentinel (a primary, 2 replicas, 3 sentinels): each sentinel, then each replica with
    and without ``replica_acks=1``, paused in turn. Nothing fails over (the primary is
    never paused; down-after is 1 s but a replica or a sentinel down starts no failover).
16. Redis Cluster (3 primaries + 3 replicas, ``cluster-require-full-coverage no``): each
    whole shard (its primary and its replica: nothing can be elected, its slots go
    unanswered), then one primary alone (its replica is elected meanwhile).

While a component is paused, every call kind runs once with a ``wait``, on a lock whose
server is the paused one where there is one: ``try_lock(wait=0)`` on a free lock (an
existing client, then a new one: its first connection), ``try_lock(wait=1)`` and
``acquired(wait=1)`` on a lock another client holds. Each must return within its wait
plus the stated cut-off (0.5 s, ``aiolock._engine.acquire.CUT_OFF``), with 1 s of slack
for a loaded machine; the line reports each call's longest time against its wait. A
keeper holds a watchdog lock (1.5 s lease) on every primary throughout: those on servers
that were not paused are never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
from redis.asyncio.sentinel import Sentinel

import aiolock
from aiolock._engine.acquire import CUT_OFF

from ..clusters import names_on_every_primary
from ..freezing import frozen
from ..topologies import ClusterHandle, Node, SentinelHandle, redis_cluster, redis_sentinel
from .checker import new_run_id

pytestmark = pytest.mark.timeout(240)

WATCHDOG = 1.5
# Slack on top of wait + CUT_OFF for a loaded 2-core machine (the figures are printed).
SLACK = 1.0

Make = Callable[..., aiolock.Client]
Longest = dict[str, float]


async def _calls(make: Make, client: aiolock.Client, name: str, longest: Longest) -> None:
    """Every call kind with a wait on ``name`` (held by a rival) and a free lock beside it.

    Each call's time is checked against its wait and kept (the longest) in ``longest``.
    ``make`` makes the new client (closed by the caller, once every server answers).
    """
    fresh = make()
    free = client.lock(f"{name}:free:{time.monotonic_ns()}")

    async def try_free(handle: aiolock.Lock) -> None:
        with contextlib.suppress(aiolock.ReplicaAckError):
            if await handle.try_lock(wait=0):
                await handle.unlock()

    async def acquired(handle: aiolock.Lock) -> None:
        with contextlib.suppress(aiolock.LockTimeoutError):
            async with handle.acquired(wait=1):
                pass

    async def try_held(handle: aiolock.Lock) -> None:
        assert not await handle.try_lock(wait=1)

    calls: list[tuple[str, float, Callable[[], Awaitable[Any]]]] = [
        ("try_lock(wait=0)", 0.0, lambda: try_free(free)),
        (
            "new client try_lock(wait=0)",
            0.0,
            lambda: try_free(fresh.lock(f"{name}:new:{time.monotonic_ns()}")),
        ),
        ("try_lock(wait=1) held", 1.0, lambda: try_held(client.lock(name))),
        ("acquired(wait=1) held", 1.0, lambda: acquired(client.lock(name))),
    ]
    for what, wait, call in calls:
        began = time.monotonic()
        async with asyncio.timeout(wait + 20):
            await call()
        took = time.monotonic() - began
        longest[what] = max(longest.get(what, 0.0), took)
        assert took < wait + CUT_OFF + SLACK, f"{what} took {took:.2f} s"


@pytest.fixture
def sentinel_group() -> Iterator[SentinelHandle]:
    with redis_sentinel(replicas=2) as group:
        yield group


async def test_sentinel_component_paused(sentinel_group: SentinelHandle) -> None:
    """15. Each sentinel, then each replica (replica_acks 0 and 1), paused in turn."""
    group = sentinel_group
    sentinels: list[Sentinel] = []
    clients: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        via = Sentinel(group.sentinel_addresses, socket_timeout=5)  # type: ignore[no-untyped-call]
        sentinels.append(via)
        client = aiolock.Client(via.master_for(group.master_name), **options)
        clients.append(client)
        return client

    run = new_run_id()
    longest: dict[str, Longest] = {}
    started = time.monotonic()
    try:
        primary = group.primary()
        replicas = [node for node in group.nodes if node.port != primary.port]
        cases: list[tuple[str, Node, int]] = [
            (f"sentinel {i}", node, 0) for i, node in enumerate(group.sentinels)
        ]
        cases += [(f"replica {i}", node, 0) for i, node in enumerate(replicas)]
        cases += [(f"replica {i} (replica_acks=1)", node, 1) for i, node in enumerate(replicas)]
        for label, node, acks in cases:
            options: dict[str, Any] = {"watchdog_timeout": WATCHDOG}
            if acks:
                options |= {"replica_acks": 1, "replica_ack_timeout": 0.5}
            client = make(**options)
            keeper = make(watchdog_timeout=WATCHDOG)
            rival = make()
            name = f"paused:{run}:{len(longest)}"
            kept = keeper.lock(f"{name}:kept")
            await kept.lock()
            await rival.lock(name, owner="rival").lock()
            assert await client.lock(f"{name}:warm").try_lock(wait=0)  # connected first
            await client.lock(f"{name}:warm").unlock()
            with frozen(node.pid):
                await _calls(partial(make, **options), client, name, longest.setdefault(label, {}))
            # The primary never paused: the keeper's hold was renewed throughout.
            assert await kept.is_held_by_current_task(), f"{label}: a healthy hold was lost"
            await kept.unlock()
            await rival.lock(name, owner="rival").unlock()
    finally:
        for client in clients:
            await client.aclose()
        for via in sentinels:
            for redis in via.sentinels:
                await redis.aclose()
    print(
        f"15 Sentinel component paused PASS in {time.monotonic() - started:.1f} s: {_line(longest)}"
    )


@pytest.fixture
def shards() -> Iterator[ClusterHandle]:
    with redis_cluster(primaries=3, replicas=1) as cluster:
        for node in cluster.nodes:
            node.call("CONFIG", "SET", "cluster-require-full-coverage", "no")
        yield cluster


async def test_cluster_component_paused(shards: ClusterHandle) -> None:
    """16. Each whole shard (primary and replica), then one primary alone, paused."""
    cluster = shards
    clients: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        client = aiolock.Client.from_url(cluster.url, cluster=True, **options)
        clients.append(client)
        return client

    run = new_run_id()
    longest: dict[str, Longest] = {}
    started = time.monotonic()
    try:
        # Each shard in turn, then one primary alone; its primary read from the layout of
        # the moment (a pause can end in a failover).
        groups = [[p, *cluster.replicas_of(p)] for p in cluster.primaries()]
        cases = [(f"shard {i}", group, True) for i, group in enumerate(groups)]
        for label, group, whole in [*cases, ("primary alone", groups[0], False)]:
            cluster.wait_stable()
            ports = {node.port for node in cluster.primaries()}
            primary = next(node for node in group if node.port in ports)
            paused = [primary, *(node for node in group if whole and node is not primary)]
            client, keeper, rival = make(), make(watchdog_timeout=WATCHDOG), make()
            uid = f"{run}:{len(longest)}"
            kept = {n: keeper.lock(n) for n in names_on_every_primary(cluster, uid)}
            for lock in kept.values():
                await lock.lock()
            # The calls' locks in the slot of the keeper's lock on the paused primary.
            name = next(
                f"{{{n}}}:x" for n in kept if cluster.node_for_key(n).port == paused[0].port
            )
            await rival.lock(name, owner="rival").lock()
            assert await client.lock(f"{name}:warm").try_lock(wait=0)
            await client.lock(f"{name}:warm").unlock()
            healthy = [n for n in kept if cluster.node_for_key(n).port != paused[0].port]
            with contextlib.ExitStack() as stack:
                for node in paused:
                    stack.enter_context(frozen(node.pid))
                await _calls(make, client, name, longest.setdefault(label, {}))
            for n in healthy:
                assert await kept[n].is_held_by_current_task(), f"{label}: {n} was lost"
            for lock in kept.values():
                with contextlib.suppress(aiolock.LockLostError):
                    await lock.unlock()
            with contextlib.suppress(aiolock.LockError):
                await rival.lock(name, owner="rival").unlock()
    finally:
        for client in clients:
            await client.aclose()
    print(
        f"16 Cluster component paused PASS in {time.monotonic() - started:.1f} s: {_line(longest)}"
    )


def _line(longest: dict[str, Longest]) -> str:
    return "; ".join(
        f"{label}: " + ", ".join(f"{what} {took:.2f} s" for what, took in calls.items())
        for label, calls in longest.items()
    )
