"""Guarded holds against a real server process that freezes or restarts (issue 22).

test_guard.py cuts the link with the fault proxy; here the server itself stops answering:
SIGSTOP (a paused VM, a long fork: its connections stay open, nothing is answered, its
leases run on the wall clock) and a restart (with AOF the lock survives it, without it the
lock is gone). The body must stop before the lease could have passed to another client:
cancelled by ``confirmed_until`` (the last answered renewal's send time + lease, less the
drift margin), so earlier than send time + lease, when the server's lease can end at the
earliest. Once the server is back, nothing is left behind: the key is free for a rival,
the client renews nothing and believes nothing held, and it can take the lock again.

Each test owns a private server; a 1 s watchdog keeps each near a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing import LocalServer, start_local_server

from . import inside
from .helpers import wait_until

LIMIT = 10.0
LEASE = 1.0


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with start_local_server(appendonly=True) as handle:
        yield handle


@pytest.fixture
async def raw(server: LocalServer) -> AsyncIterator[Redis]:
    redis = Redis.from_url(server.url, decode_responses=True)
    yield redis
    await redis.aclose()


async def forever() -> None:
    await asyncio.Event().wait()


class Body:
    """A guarded body that records when it was cancelled and what its hold said then."""

    def __init__(self, client: aiolock.Client, name: str) -> None:
        self.lock = client.lock(name)
        self.entered = asyncio.Event()
        self.stopped = 0.0
        self.confirmed_until = 0.0
        self.lost_when_stopped = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        async with self.lock.guarded() as hold:
            self.entered.set()
            try:
                await forever()
            finally:
                self.stopped = loop.time()
                self.confirmed_until = hold.confirmed_until
                self.lost_when_stopped = hold.lost


async def assert_nothing_left(
    client: aiolock.Client, server: LocalServer, raw: Redis, name: str
) -> None:
    """The server back: the lock free for others, the client's belief and renewal empty."""
    await wait_until(lambda: not client.lock(name).statistics().hold_count, limit=LIMIT)
    await wait_until(lambda: len(inside.renewal(client)) == 0, limit=LIMIT, what="renewal stopped")
    rival = aiolock.Client.from_url(server.url, watchdog_timeout=LEASE)
    try:
        async with asyncio.timeout(LIMIT):
            await rival.lock(name).lock()  # free now, or once its lease runs out
        assert await rival.lock(name).hold_count() == 1
        await rival.lock(name).unlock()
    finally:
        await rival.aclose()
    # The holder's client works on: it takes the lock afresh, with a count of one.
    async with asyncio.timeout(LIMIT):
        await client.lock(name).lock()
    assert await client.lock(name).hold_count() == 1
    await client.lock(name).unlock()
    assert await raw.exists(name) == 0


async def test_frozen_server_cancels_the_body_before_its_lease_can_end(
    server: LocalServer, raw: Redis, name: str
) -> None:
    """SIGSTOP: the renewal gets no answer; the body stops at confirmed_until, earlier than
    the server's lease can end (send time + lease), and the block raises LockLostError
    without waiting on the frozen server."""
    client = aiolock.Client.from_url(server.url, watchdog_timeout=LEASE)
    body = Body(client, name)
    loop = asyncio.get_running_loop()
    try:
        task = asyncio.create_task(body.run())
        await body.entered.wait()
        await asyncio.to_thread(server.pause)
        try:
            async with asyncio.timeout(LIMIT):
                with pytest.raises(aiolock.LockLostError) as caught:
                    await task
            raised = loop.time()
        finally:
            server.resume()
        assert isinstance(caught.value.__context__, asyncio.CancelledError)
        assert body.lost_when_stopped
        # Cancelled by confirmed_until, not before. The timer is set for confirmed_until,
        # a drift margin before the lease can end on the server (the last answered send
        # time + lease); how late a loaded loop runs it is a figure, not a test
        # (benchmarks/guard_latency.py: p99 1.4-2.2 ms), so this bound only says "by the
        # timer, not by anything later" (the next renewal would come a third of the lease
        # on).
        assert body.confirmed_until <= body.stopped
        assert body.stopped - body.confirmed_until < LEASE / 4
        assert raised - body.stopped < LEASE / 2, "the block waited on the frozen server"
        await assert_nothing_left(client, server, raw, name)
    finally:
        await client.aclose()


@pytest.mark.parametrize("persisted", [True, False], ids=["aof", "no-persistence"])
async def test_server_restart_cancels_the_body_and_leaves_nothing(
    server: LocalServer, raw: Redis, name: str, persisted: bool
) -> None:
    """A restart: with AOF the lock survives it, so the server stays down past
    confirmed_until and the body stops then (nobody could take the lock meanwhile);
    without persistence the lock is gone when it is back, and the first renewal that
    reaches it finds that and cancels the body. Either way nothing is left afterwards."""
    if not persisted:
        await raw.config_set("appendonly", "no")
    client = aiolock.Client.from_url(server.url, watchdog_timeout=LEASE)
    body = Body(client, name)
    try:
        task = asyncio.create_task(body.run())
        await body.entered.wait()
        await asyncio.to_thread(server.stop)
        if persisted:
            # Down until the body has stopped: the lease it was confirmed for ran out here.
            await asyncio.wait([task], timeout=LIMIT)
            assert task.done(), "the body went on with the server down"
            # By its confirmed_until timer (how late a loaded loop runs it is a figure:
            # benchmarks/guard_latency.py), not by anything later.
            assert body.confirmed_until <= body.stopped < body.confirmed_until + LEASE / 4
        await asyncio.to_thread(server.start)
        await raw.connection_pool.disconnect()  # its connections died with the server
        async with asyncio.timeout(LIMIT):
            with pytest.raises(aiolock.LockLostError):
                await task
        assert body.lost_when_stopped
        assert body.confirmed_until <= body.stopped or not persisted
        await assert_nothing_left(client, server, raw, name)
    finally:
        await client.aclose()
