"""The count-down latch: Redisson's RCountDownLatch layout and messages, waiters that never
hang (a Java delete() wakes them too), and count-downs made exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, command, script
from .helpers import FAST, cancel_at, quiesce, wait_until

LIMIT = 10.0

# Redisson's countDown and delete, restated from redisson-spec-2.md 4.2 (a Java service).
_REDISSON_COUNT_DOWN = """
local v = redis.call('decr', KEYS[1])
if v <= 0 then redis.call('del', KEYS[1]) end
if v == 0 then redis.call('publish', KEYS[2], '0') end
"""
_REDISSON_DELETE = """
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', KEYS[2], '1')
    return 1
end
return 0
"""


def channel(name: str) -> str:
    return f"redisson_countdownlatch__channel__{{{name}}}"


async def test_layout_and_messages(client: aiolock.Client, raw: Redis, name: str) -> None:
    """The count is a decimal string, deleted at zero; setting publishes 1, reaching zero
    publishes 0 (once: counting down an open latch publishes nothing)."""
    latch = client.count_down_latch(name)
    async with raw.pubsub() as pubsub:
        await pubsub.subscribe(channel(name))
        assert (await pubsub.get_message(timeout=LIMIT))["type"] == "subscribe"
        assert await latch.try_set_count(2)
        assert not await latch.try_set_count(5)
        assert await raw.get(name) == "2"
        await latch.count_down()
        assert await latch.get_count() == 1
        await latch.count_down()
        assert await raw.exists(name) == 0
        await latch.count_down()
        assert await latch.get_count() == 0
        await raw.publish(channel(name), "end")
        seen = []
        while (message := await pubsub.get_message(timeout=LIMIT)) is not None:
            seen.append(message["data"])
            if message["data"] == "end":
                break
    assert seen == ["1", "0", "end"]


async def test_a_zero_count_leaves_the_latch_open(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """try_set_count(0) stores nothing (Redisson stores a 0 that refuses every later count)."""
    latch = client.count_down_latch(name)
    assert await latch.try_set_count(0)
    assert await raw.exists(name) == 0
    assert await latch.wait(timeout=0)
    assert await latch.try_set_count(1)
    await latch.count_down()


async def test_waiters_return_when_the_count_reaches_zero(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Waiters of two clients return True when the last count-down (of a third client, or
    of a Java service) opens the latch; wait on an open latch returns at once."""
    a, b, c = make_client(), make_client(), make_client()
    assert await a.count_down_latch(name).try_set_count(2)
    waiters = [
        asyncio.create_task(client.count_down_latch(name).wait(timeout=LIMIT * 3))
        for client in (a, a, b)
    ]
    await wait_until(
        lambda: (
            inside.waiting_room(a).waiting(name) == 2 and inside.waiting_room(b).waiting(name) == 1
        )
    )
    await c.count_down_latch(name).count_down()
    assert not any(w.done() for w in waiters)
    count_down = raw.register_script(_REDISSON_COUNT_DOWN)
    await count_down(keys=[name, channel(name)])
    async with asyncio.timeout(LIMIT):
        assert await asyncio.gather(*waiters) == [True, True, True]
    assert await c.count_down_latch(name).wait()


async def test_a_java_delete_wakes_the_waiters(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Redisson's delete() publishes 1, which its own waiters ignore: here they look again,
    find the latch open, and return True."""
    latch = client.count_down_latch(name)
    assert await latch.try_set_count(3)
    waiter = asyncio.create_task(latch.wait(timeout=LIMIT * 3))
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)
    delete = raw.register_script(_REDISSON_DELETE)
    assert await delete(keys=[name, channel(name)]) == 1
    async with asyncio.timeout(LIMIT):
        assert await waiter


async def test_a_wait_runs_out(client: aiolock.Client, name: str) -> None:
    """wait(timeout) answers False when the count is still above zero at the end."""
    latch = client.count_down_latch(name)
    assert await latch.try_set_count(1)
    assert not await latch.wait(timeout=0)
    assert not await latch.wait(timeout=0.05)
    assert inside.waiting_room(client).waiting(name) == 0
    await latch.count_down()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda latch: latch.try_set_count(-1), ValueError, "count must be >= 0, got -1"),
        (lambda latch: latch.try_set_count(1.5), TypeError, "count must be an int, not float"),
        (lambda latch: latch.try_set_count(False), TypeError, "count must be an int, not bool"),
        (lambda latch: latch.wait(timeout=-1), ValueError, "timeout must be >= 0"),
    ],
)
async def test_bad_input_is_refused_before_any_io(
    offline: aiolock.Client, call: Callable[[Any], Awaitable[object]], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        await call(offline.count_down_latch("l"))


async def test_resent_count_down_counts_once(proxy: FaultProxy, raw: Redis, name: str) -> None:
    """A count-down and a try_set whose replies were lost are resent, and count once."""
    client = aiolock.Client.from_url(proxy.url + FAST, retry_attempts=2, retry_interval=0.05)
    try:
        latch = client.count_down_latch(name)
        drop = proxy.drop_reply(script("latch_try_set"))
        assert await latch.try_set_count(3)
        assert drop.executed.is_set()
        drop = proxy.drop_reply(script("latch_count_down"))
        await latch.count_down()
        assert drop.executed.is_set()
        assert await raw.get(name) == "2"
    finally:
        await client.aclose()
    await raw.delete(name)


async def test_cancellation_sweep(client: aiolock.Client, raw: Redis, name: str) -> None:
    """count_down() cancelled at every loop iteration counts down exactly once; wait()
    cancelled at every iteration, while another task opens the latch, raises
    CancelledError or returns True, and leaves no waiter counted."""
    latch = client.count_down_latch(name)
    cases = 0
    for k in range(400):
        await raw.set(name, 5)
        task = asyncio.create_task(latch.count_down())
        cancel_at(task, k)
        cancelled = False
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        await quiesce(client)
        assert await raw.get(name) == "4", f"k={k}"
        cases += 1
        if not cancelled:
            break
    await raw.delete(name)
    for k in range(400):
        assert await latch.try_set_count(1)

        async def opened() -> bool:
            opener = asyncio.create_task(client.count_down_latch(name).count_down())
            try:
                return await latch.wait(timeout=LIMIT)
            finally:
                await opener

        waiting = asyncio.create_task(opened())
        cancel_at(waiting, k)
        cancelled = False
        try:
            assert await waiting
        except asyncio.CancelledError:
            cancelled = True
        await quiesce(client)
        assert inside.waiting_room(client).waiting(name) == 0, f"k={k}"
        assert await raw.exists(name) == 0
        cases += 1
        if not cancelled:
            break
    assert cases >= 4


async def test_wait_sees_a_zero_even_if_the_latch_is_set_again_at_once(
    proxy: FaultProxy, raw: Redis, name: str
) -> None:
    """The "0" message means the count reached zero: a waiter that receives it returns True,
    even if the latch was set again before it could read the count (issue 21, s04).

    Deterministic: the waiter's look at the count after it registered is held in the proxy
    while another client counts down to 0 and sets the count again; the held GET then
    answers 5."""
    client = aiolock.Client.from_url(proxy.url)
    try:
        latch = client.count_down_latch(name)
        await raw.set(name, 1)
        first = proxy.delay(0, command("GET", name))
        waiter = asyncio.create_task(latch.wait(timeout=3))
        async with asyncio.timeout(LIMIT):
            await first.executed.wait()
        first.remove()
        held = proxy.delay(LIMIT, command("GET", name))
        async with asyncio.timeout(LIMIT):
            await held.received.wait()
        # Registered, subscribed, and reading the count: the latch opens and is set again.
        await raw.eval(_REDISSON_COUNT_DOWN, 2, name, channel(name))
        await raw.set(name, 5)
        await raw.publish(channel(name), "1")
        held.remove()
        async with asyncio.timeout(LIMIT):
            assert await waiter is True
        assert await latch.get_count() == 5
    finally:
        await client.aclose()
        await raw.delete(name)
