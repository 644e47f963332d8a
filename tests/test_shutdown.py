"""aclose(): the holds of ended tasks are released at once, so another process takes over
without waiting out the lease; holds of tasks still running are left to expire, with a
WARNING naming the task; and aclose() stays bounded with the server unreachable."""

from __future__ import annotations

import asyncio
import logging

import pytest

import aiolock

from .conftest import ClientFactory
from .faultproxy import FaultProxy
from .helpers import FAST, wait_until
from .sweep import Kind, handle, rival_handle

# Safety net of the bounded checks (the releases take milliseconds).
LIMIT = 5.0


@pytest.mark.parametrize("kind", list(Kind), ids=[kind.value for kind in Kind])
async def test_aclose_releases_the_holds_of_ended_tasks(
    kind: Kind, make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_client(), make_client()
    lock = handle(a, kind, name, None)

    async def take_and_end() -> None:
        await lock.lock()
        await lock.lock()  # reentrant: both holds go

    with caplog.at_level(logging.WARNING, "aiolock"):
        await asyncio.create_task(take_and_end())
        await wait_until(
            lambda: any("ended while" in r.getMessage() for r in caplog.records),
            what="the task's end is noticed",
        )
    rival = rival_handle(b, kind, name)
    assert not await rival.try_lock(wait=0)
    async with asyncio.timeout(LIMIT):
        await a.aclose()
    # At once: the lease (30 s) is not waited out.
    assert await rival.try_lock(wait=0)
    await rival.unlock()


async def test_aclose_leaves_running_tasks_holds_with_a_warning(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make_client(), make_client()
    held, done = asyncio.Event(), asyncio.Event()

    async def hold_on() -> None:
        await a.lock(name).lock()
        held.set()
        await done.wait()

    task = asyncio.create_task(hold_on(), name="still-working")
    await held.wait()
    with caplog.at_level(logging.WARNING, "aiolock"):
        await a.aclose()
    warnings = [r.getMessage() for r in caplog.records if "client closed while" in r.getMessage()]
    assert len(warnings) == 1
    assert "still-working" in warnings[0]
    assert name in warnings[0]
    assert await b.lock(name).is_locked()
    done.set()
    await task
    assert await b.lock(name).force_unlock()


async def test_owner_holds_are_left_as_before(make_client: ClientFactory, name: str) -> None:
    """An owner= hold belongs to no task: aclose() cannot know it is abandoned."""
    a, b = make_client(), make_client()
    await asyncio.create_task(a.lock(name, owner="job").lock())
    await a.aclose()
    assert await b.lock(name).is_locked()
    assert await b.lock(name).force_unlock()


async def test_aclose_is_bounded_with_the_server_unreachable(
    proxy: FaultProxy, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=0)
    await asyncio.create_task(client.lock(name).lock())
    proxy.cut()
    try:
        with caplog.at_level(logging.WARNING, "aiolock"):
            async with asyncio.timeout(LIMIT):
                await client.aclose()
        assert any("could not release" in r.getMessage() for r in caplog.records)
    finally:
        await proxy.restore()


async def test_aclose_cancels_guarded_bodies_and_releases_their_holds(
    make_client: ClientFactory, name: str
) -> None:
    """aclose() first cancels every guarded body: its block raises LockLostError, and its
    hold is released before the connections close, so another process takes over at once."""
    a, b = make_client(), make_client()
    inside = asyncio.Event()

    async def work() -> None:
        async with a.lock(name).guarded():
            inside.set()
            await asyncio.Event().wait()  # works until told to stop

    task = asyncio.create_task(work())
    await inside.wait()
    async with asyncio.timeout(LIMIT):
        await a.aclose()
    with pytest.raises(aiolock.LockLostError, match="closing"):
        await task
    # At once: the lease (30 s) is not waited out.
    assert await b.lock(name).try_lock(wait=0)
    await b.lock(name).unlock()
