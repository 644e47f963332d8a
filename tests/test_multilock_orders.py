"""Composite orders: MultiLocks and RedLocks over members that share a name across servers
and ``key_prefix`` clients, listed in any order by many tasks, never deadlock.

Members are waited for in an order every process agrees on; "as given" is not one. Two
tasks that list the same name on two servers in opposite orders would otherwise each take
one member and wait for the other's for good (``lock()``) or fail with both locks free
(``try_lock(wait=...)``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator

import pytest

import aiolock
from aiolock.testing import LocalServer, start_local_server

from . import inside

# Each scenario ends in well under a second when nothing deadlocks; a deadlock never ends.
LIMIT = 20.0


@pytest.fixture(scope="module")
def servers() -> Iterator[list[LocalServer]]:
    """Three independent servers."""
    started = [start_local_server() for _ in range(3)]
    try:
        yield started
    finally:
        for server in started:
            server.close()


@pytest.fixture
async def clients(servers: list[LocalServer]) -> AsyncIterator[list[aiolock.Client]]:
    """A client per server, then two more on the first server with their own key_prefix."""
    made = [aiolock.Client.from_url(server.url) for server in servers]
    made += [aiolock.Client.from_url(servers[0].url, key_prefix=prefix) for prefix in ("a:", "b:")]
    yield made
    for client in made:
        await client.aclose()


async def test_the_order_ignores_how_the_members_are_listed(servers: list[LocalServer]) -> None:
    """Same-name members (other servers, other prefixes, "localhost" for 127.0.0.1) are
    put in one order whatever order they are given in."""
    url = servers[0].url
    local = url.replace("127.0.0.1", "localhost")
    made = [
        aiolock.Client.from_url(url),
        aiolock.Client.from_url(servers[1].url),
        aiolock.Client.from_url(url, key_prefix="p:"),
        aiolock.Client.from_url(local, key_prefix="q:"),
    ]
    twin = aiolock.Client.from_url(local)
    for kind in (aiolock.MultiLock, aiolock.RedLock):
        locks = [client.lock("x") for client in made]
        first = [
            (inside.key_of(m), inside.engine(m).settings.server)
            for m in inside.members_of(kind(*locks))
        ]
        for order in ([3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]):
            listed = kind(*(locks[i] for i in order))
            assert [
                (inside.key_of(m), inside.engine(m).settings.server)
                for m in inside.members_of(listed)
            ] == first
    # One process naming the first server "localhost", another "127.0.0.1": one order.
    assert (
        inside.engine(made[0].lock("x")).settings.server
        == inside.engine(twin.lock("x")).settings.server
    )
    for client in (*made, twin):
        await client.aclose()


@pytest.mark.parametrize("wait", [None, LIMIT])
async def test_opposite_orders_of_same_named_members_never_deadlock(
    clients: list[aiolock.Client], uid: str, wait: float | None
) -> None:
    """The review's case: a third party holds the name on two servers; two tasks wait on
    MultiLocks listing them in opposite orders; once both are free, both get through."""
    name = f"x:{uid}"
    one, two = clients[0], clients[1]
    blockers = [client.lock(name, owner="blocker") for client in (one, two)]
    for blocker in blockers:
        await blocker.lock()
    got: list[bool] = []

    async def take(first: aiolock.Client, second: aiolock.Client) -> None:
        multi = aiolock.MultiLock(first.lock(name), second.lock(name))
        if wait is None:
            await multi.lock()
            got.append(True)
        else:
            got.append(await multi.try_lock(wait=wait))
        await asyncio.sleep(0)
        if got[-1]:
            await multi.unlock()

    async with asyncio.timeout(LIMIT * 2), asyncio.TaskGroup() as tg:
        tg.create_task(take(one, two))
        tg.create_task(take(two, one))
        # Both parked (each waits for a member), then both members freed at once.
        for _ in range(20):
            await asyncio.sleep(0)
        for blocker in blockers:
            await blocker.unlock()
    assert got == [True, True]


@pytest.mark.parametrize("kind", [aiolock.MultiLock, aiolock.RedLock])
async def test_random_orders_from_many_tasks_never_deadlock(
    clients: list[aiolock.Client], uid: str, kind: type[aiolock.MultiLock | aiolock.RedLock]
) -> None:
    """Property: many tasks take composites over the same-named members (3 servers, 2
    prefixes), each listing them in its own random order each time, with lock() (no wait
    bounds it): every task gets through, and no two hold at once (a MultiLock: all
    members; a RedLock: a majority of the 3 servers' members)."""
    name = f"x:{uid}"
    rng = random.Random(uid)
    members = clients if kind is aiolock.MultiLock else clients[:3]
    inside = most = done = 0
    rounds, tasks = 6, 8

    async def worker(seed: int) -> None:
        nonlocal inside, most, done
        mine = random.Random(seed)
        for _ in range(rounds):
            listed = [client.lock(name) for client in members]
            mine.shuffle(listed)
            async with kind(*listed):
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(mine.uniform(0, 0.002))
                inside -= 1
                done += 1

    async with asyncio.timeout(LIMIT * 3), asyncio.TaskGroup() as tg:
        for _ in range(tasks):
            tg.create_task(worker(rng.randrange(1 << 30)))
    assert (done, most) == (rounds * tasks, 1)
