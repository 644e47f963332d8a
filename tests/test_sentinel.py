"""Sentinel: the client works through ``master_for`` and follows a failover, pub/sub included.

On a real local group (``aiolock.testing.redis_sentinel``): a primary, a replica and three
sentinels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError

import aiolock

from . import inside
from .faultproxy import FaultProxy
from .freezing import frozen
from .helpers import forced_term_ends_on_its_message, wait_until
from .test_cli import aiolock_cli
from .topologies import SentinelHandle, redis_sentinel

# Safety net only: every wait ends on an event or on Redis state.
LIMIT = 20.0


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelHandle]:
    with redis_sentinel() as handle:
        yield handle


@pytest.fixture
async def sentinel(group: SentinelHandle) -> AsyncIterator[Sentinel]:
    sentinel = Sentinel(group.sentinel_addresses, socket_timeout=5)  # type: ignore[no-untyped-call]
    yield sentinel
    for redis in sentinel.sentinels:
        await redis.aclose()


@pytest.fixture
async def make_client(group: SentinelHandle, sentinel: Sentinel, uid: str) -> AsyncIterator[Any]:
    """Clients over ``master_for``; all closed, then nothing of the test may remain."""
    made: list[tuple[aiolock.Client, Redis]] = []

    def make(*, via: Sentinel = sentinel, **options: Any) -> aiolock.Client:
        redis = via.master_for(group.master_name)
        client = aiolock.Client(redis, **options)
        made.append((client, redis))
        return client

    yield make
    for client, redis in made:
        await client.aclose()
        await redis.aclose()
    primary = sentinel.master_for(group.master_name, decode_responses=True)
    try:
        left = [
            key
            async for key in primary.scan_iter(match=f"*{uid}*")
            if not key.startswith("aiolock_acquire_cancel:")
        ]
        assert not left, f"keys left behind: {left}"
    finally:
        await primary.aclose()


async def test_locks_and_waiters_through_sentinel(make_client: Any, name: str) -> None:
    holder, waiting = make_client(), make_client()
    lock = holder.lock(name, owner="h")
    await lock.lock()
    task = asyncio.create_task(_hold_once(waiting.lock(name)))
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
    await lock.unlock()
    async with asyncio.timeout(LIMIT):
        await task


async def _hold_once(handle: aiolock.Lock) -> None:
    async with handle.acquired(wait=LIMIT):
        pass


@contextlib.asynccontextmanager
async def _sentinels_without_events(
    group: SentinelHandle, user: str
) -> AsyncIterator[tuple[Sentinel, Sentinel, FaultProxy]]:
    """Two ways a client never hears ``+switch-master``: a Sentinel whose one sentinel sits
    behind a fault proxy (whose pub/sub deliveries the test swallows), and one whose user
    may not subscribe to any channel (an ACL, as Redis 7's default for new users)."""
    for node in group.sentinels:
        node.call("ACL", "SETUSER", user, "on", ">pw", "+@all", "resetchannels")
    host, port = group.sentinel_addresses[0]
    refused = Sentinel(  # type: ignore[no-untyped-call]
        group.sentinel_addresses,
        socket_timeout=5,
        sentinel_kwargs={"username": user, "password": "pw"},
    )
    try:
        async with FaultProxy(host, port) as proxy:
            proxied = Sentinel([(host, proxy.port)], socket_timeout=5)  # type: ignore[no-untyped-call]
            try:
                yield proxied, refused, proxy
            finally:
                for redis in proxied.sentinels:
                    await redis.aclose()
    finally:
        for redis in refused.sentinels:
            await redis.aclose()
        for node in group.sentinels:
            node.call("ACL", "DELUSER", user)


async def test_forced_leader_term_ends_on_its_message(make_client: Any, name: str) -> None:
    """Through Sentinel too, a forced term ends on its message (its barrier came back)."""
    await forced_term_ends_on_its_message(make_client(), make_client(), name, LIMIT)


async def test_failover_moves_commands_and_pubsub_to_the_new_primary(
    group: SentinelHandle,
    sentinel: Sentinel,
    make_client: Any,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SENTINEL FAILOVER under a held lock and parked waiters: the client hears the switch,
    renews on the new primary, and its waiters (subscribed there anew) are served.

    Events that never arrive: a client whose sentinel delivers nothing on its pub/sub
    connection (a fault proxy swallows it), and one whose sentinels refuse the subscription
    (an ACL), follow the switch all the same, commands and pub/sub, by asking the sentinels;
    their parked waiters are served; the refusal is logged naming the sentinel."""
    caplog.set_level(logging.INFO, logger="aiolock")
    # A lease long enough to outlast the switch: the old primary's renewals stop reaching
    # the replica once it is promoted, and the client moves when the sentinels announce it.
    holder, waiting = make_client(watchdog_timeout=4), make_client()
    lock = holder.lock(name, owner="h")
    await lock.lock()
    served: list[int | str] = []

    async def wait_for(client: aiolock.Client, index: int | str) -> None:
        async with client.lock(name).acquired(wait=LIMIT):
            served.append(index)

    tasks = [asyncio.create_task(wait_for(waiting, index)) for index in range(3)]
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 3)
    await wait_until(inside.sentinel(holder).listening.is_set, what="watching")
    await wait_until(inside.sentinel(waiting).listening.is_set, what="watching")
    async with _sentinels_without_events(group, f"aiolock-{name}") as (proxied, refused, proxy):
        deaf, denied = make_client(via=proxied), make_client(via=refused)
        tasks += [asyncio.create_task(wait_for(deaf, "deaf"))]
        tasks += [asyncio.create_task(wait_for(denied, "denied"))]
        await wait_until(
            lambda: (
                deaf.lock(name).statistics().tasks_waiting
                == denied.lock(name).statistics().tasks_waiting
                == 1
            )
        )
        await wait_until(inside.sentinel(deaf).listening.is_set, what="watching")
        await wait_until(
            lambda: any("refused the +switch-master" in r.getMessage() for r in caplog.records),
            what="the refusal logged",
        )
        refusal = next(r for r in caplog.records if "refused the +switch" in r.getMessage())
        assert refusal.levelno == logging.WARNING
        assert any(f":{node.port} " in refusal.getMessage() for node in group.sentinels)
        assert not inside.sentinel(denied).listening.is_set()
        hole = proxy.blackhole_pubsub()
        new = await asyncio.to_thread(group.failover)
        # Bounded, not hung: a poll each second, each sentinel bounded by 0.5 s (before
        # polling they stayed on the old primary until it was demoted, ~10 s, or for good).
        switched = time.monotonic()
        await wait_until(
            lambda: all(
                inside.connected_to(client) == [f"127.0.0.1:{new.port}"] * 2
                for client in (deaf, denied)
            ),
            limit=5.0,
            what="both connections of the clients that missed the event on the new primary",
        )
        assert time.monotonic() - switched < 5.0
        assert inside.sentinel(deaf).switches == inside.sentinel(deaf).polled_switches == 1
        assert inside.sentinel(denied).switches == inside.sentinel(denied).polled_switches == 1
        hole.remove()
        await wait_until(
            lambda: inside.sentinel(holder).switches == inside.sentinel(waiting).switches == 1,
            limit=LIMIT,
            what="both clients heard the switch",
        )
        # Both moved when the promotion was announced (the switch then moved nothing).
        assert inside.sentinel(holder).early_switches == 1
        assert inside.sentinel(waiting).early_switches == 1
        rounds = inside.renewal(holder).rounds
        await wait_until(
            lambda: inside.renewal(holder).rounds >= rounds + 2, limit=LIMIT, what="renewals"
        )
        async with Redis(host="127.0.0.1", port=new.port, decode_responses=True) as primary:
            assert await primary.hget(name, f"{holder.id}:owner:h") == "1"
            assert await primary.pttl(name) > 0
        await lock.unlock()
        async with asyncio.timeout(LIMIT):
            await asyncio.gather(*tasks)
        await deaf.aclose()
    assert sorted(served, key=str) == [0, 1, 2, "deaf", "denied"]
    wire = inside.wire_of(inside.transport(holder))
    assert wire is not None
    assert wire.peer.endswith(f":{new.port}")


@pytest.mark.parametrize("abort", ["announced", "missed"])
async def test_a_promotion_never_carried_out_hands_the_connections_back(
    group: SentinelHandle, make_client: Any, name: str, abort: str
) -> None:
    """A promotion announced (``+failover-state-send-slaveof-noone``) moves the client to
    the replica at once, before the switch; if it is given up instead, whether the abort is
    heard (``-failover-abort-slave-timeout``) or missed (no sentinel reports a failover
    under way, two polls in a row), the client goes back to the primary the sentinels
    name, and its calls work there again.

    The announcement is handed to the watch as a sentinel's message would be (a real
    sentinel only gives a promotion up when the replica stops answering mid-failover)."""
    client = make_client()
    lock = client.lock(name)
    assert not await lock.is_locked()  # connects (a read: nothing to sweep afterwards)
    await wait_until(inside.sentinel(client).listening.is_set, what="watching")
    primary = group.primary()
    replica = next(node for node in group.nodes if node.port != primary.port)
    # After an earlier test's failover the old primary takes writes until it is demoted.
    await wait_until(lambda: replica.call("ROLE")[0] == "slave", limit=LIMIT, what="a replica")
    watch = inside.sentinel(client)
    watch.heard(
        "+failover-state-send-slaveof-noone",
        f"slave 127.0.0.1:{replica.port} 127.0.0.1 {replica.port} @ {group.master_name} "
        f"127.0.0.1 {primary.port}",
    )
    assert watch.early_switches == 1
    # Every (re)connect goes to the replica now, though the sentinels name the primary.
    assert await watch.locate() == ("127.0.0.1", replica.port)
    if abort == "announced":
        watch.heard(
            "-failover-abort-slave-timeout",
            f"master {group.master_name} 127.0.0.1 {primary.port}",
        )
    # Refused (READONLY) while it still goes to the replica; then taken on the primary.
    async with asyncio.timeout(LIMIT):
        while True:
            try:
                async with lock.acquired(wait=LIMIT):
                    pass
                break
            except (ReadOnlyError, RedisConnectionError):
                continue
    assert await watch.locate() == ("127.0.0.1", primary.port)
    # A connect under way when the promotion was given up may still have gone to the
    # replica: the next poll moves it.
    await wait_until(
        lambda: set(inside.connected_to(client)) == {f"127.0.0.1:{primary.port}"},
        limit=LIMIT,
        what="every connection on the primary",
    )
    assert not await lock.is_locked()


async def test_cli_through_sentinel_exits_promptly(
    group: SentinelHandle, make_client: Any, name: str
) -> None:
    """``aiolock inspect`` and ``force-unlock --yes`` with ``--sentinel``: each answers and
    exits at once (force-unlock once hung in the aclose() of its client's sentinel watch).

    In this module, to use its running group (a group of its own costs seconds to start).
    """
    holder, waiting = make_client(), make_client()
    await holder.lock(name, owner="h").lock()
    task = asyncio.create_task(_hold_once(waiting.lock(name)))
    await wait_until(lambda: waiting.lock(name).statistics().tasks_waiting == 1)
    url = "redis://" + ",".join(f"{host}:{port}" for host, port in group.sentinel_addresses)
    via = ("--sentinel", group.master_name, "--json")

    started = time.monotonic()
    run = await aiolock_cli("inspect", url, name, *via)
    assert run.code == 0, run
    assert run.json()["kind"] == "lock"
    run = await aiolock_cli("force-unlock", url, name, "--yes", *via)
    took = time.monotonic() - started
    assert run.code == 0, run
    assert run.json() == {"name": name, "kind": "lock", "unlocked": True}
    # Two subprocesses of ~0.5 s each: bounded, not hung (aiolock_cli fails at 20 s each).
    assert took < 10, f"inspect + force-unlock took {took:.1f} s"
    # The waiter, woken by the force-unlock's message, takes the lock and lets it go.
    async with asyncio.timeout(LIMIT):
        await task


async def test_a_paused_sentinel_costs_the_calls_nothing(
    group: SentinelHandle, make_client: Any, name: str
) -> None:
    """The first listed sentinel paused (a stalled host), the primary healthy: a new
    client's first call, an existing client's reconnect and a first wait (its pub/sub
    connection opened then) all go through the other sentinels at once. Before, every
    connection asked the paused sentinel first and waited on it: try_lock(wait=0) took
    about a minute, lock() failed with TimeoutError after 7.5 s."""
    holder = make_client()
    old = make_client()
    # ``old`` is connected before the pause; its connections are dropped during it.
    assert await old.lock(f"{name}:warm").try_lock(wait=0)
    await old.lock(f"{name}:warm").unlock()
    held = holder.lock(name, owner="h")
    await held.lock()
    with frozen(group.sentinels[0].pid):
        async with asyncio.timeout(LIMIT):
            fresh = make_client()
            assert not await fresh.lock(name).try_lock(wait=0)
            inside.transport(old).reset(ConnectionError("test: dropped"))
            assert not await old.lock(name).try_lock(wait=0)
            waiter = asyncio.create_task(_hold_once_unbounded(fresh.lock(name)))
            await wait_until(lambda: fresh.lock(name).statistics().tasks_waiting == 1)
            await held.unlock()
            await waiter


async def _hold_once_unbounded(handle: aiolock.Lock) -> None:
    await handle.lock()
    await handle.unlock()
