"""The fair read-write lock: arrival order across clients, readers at the head together, no
writer starved, dead holders and dead waiters dropped, and waiters that leave the queue.

The lock methods of both views are in the conformance suite.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._net.scripts import load_script

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy
from .helpers import cancel_at, quiesce, wait_until

LIMIT = 10.0


def keys(name: str) -> dict[str, str]:
    return {
        "state": f"aiolock_frw:{{{name}}}",
        "leases": f"aiolock_frw_leases:{{{name}}}",
        "queue": f"aiolock_frw_queue:{{{name}}}",
        "deadlines": f"aiolock_frw_deadlines:{{{name}}}",
        "admitted": f"aiolock_frw_admitted:{{{name}}}",
    }


async def queued(raw: Redis, name: str) -> list[str]:
    return [str(entry) for entry in await raw.lrange(keys(name)["queue"], 0, -1)]


async def test_layout(client: aiolock.Client, raw: Redis, name: str) -> None:
    """Holds are r:/w: fields with a lease each (server clock); a waiter is queued under the
    same string; nothing is left once everything is released."""
    frw = client.fair_read_write_lock(name, owner="a")
    await frw.write_lock().lock()
    await frw.read_lock().lock()
    k = keys(name)
    holder = f"{client.id}:owner:a"
    assert await raw.hgetall(k["state"]) == {
        "mode": "write",
        f"w:{holder}": "1",
        f"r:{holder}": "1",
    }
    assert sorted(await raw.zrange(k["leases"], 0, -1)) == [f"r:{holder}", f"w:{holder}"]
    other = client.fair_read_write_lock(name, owner="b").read_lock()
    waiter = asyncio.create_task(other.lock())
    await wait_until(lambda: other.statistics().tasks_waiting == 1)
    assert await queued(raw, name) == [f"r:{client.id}:owner:b"]
    await frw.write_lock().unlock()
    async with asyncio.timeout(LIMIT):
        await waiter  # the write hold went: read mode, the queued reader comes in
    assert await raw.hget(k["state"], "mode") == "read"
    await frw.read_lock().unlock()
    await other.unlock()
    assert await raw.exists(*k.values()) == 0


async def test_a_writer_is_not_starved_by_readers(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Readers hold; a writer queues; readers arriving after it wait for it, even with
    try_lock(0) (Redisson's read-write lock lets them in ahead of the writer)."""
    a, b, c = make_client(), make_client(), make_client()
    reader = a.fair_read_write_lock(name, owner="r1").read_lock()
    await reader.lock()
    writer = b.fair_read_write_lock(name, owner="w").write_lock()
    writing = asyncio.create_task(writer.try_lock(wait=LIMIT))
    await wait_until(lambda: writer.statistics().tasks_waiting == 1)
    late = c.fair_read_write_lock(name, owner="r2").read_lock()
    assert not await late.try_lock()
    late_reading = asyncio.create_task(late.try_lock(wait=LIMIT))
    await wait_until(lambda: late.statistics().tasks_waiting == 1)
    assert await queued(raw, name) == [f"w:{b.id}:owner:w", f"r:{c.id}:owner:r2"]
    await reader.unlock()
    async with asyncio.timeout(LIMIT):
        assert await writing
    assert not late_reading.done()
    await writer.unlock()
    async with asyncio.timeout(LIMIT):
        assert await late_reading
    await late.unlock()


async def test_readers_at_the_head_come_in_together(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Writer holds; queued: reader, reader, writer, reader (three clients). The release
    lets the first two readers in together; the second writer comes next; the last
    reader, behind it, last."""
    clients = [make_client() for _ in range(3)]

    def side(i: int, owner: str, write: bool) -> Any:
        frw = clients[i % 3].fair_read_write_lock(name, owner=owner)
        return frw.write_lock() if write else frw.read_lock()

    first = side(0, "w1", True)
    await first.lock()
    order: list[str] = []
    queue = [("r1", False), ("r2", False), ("w2", True), ("r3", False)]
    inside = asyncio.Event()
    let_go = {owner: asyncio.Event() for owner, _ in queue}

    async def wait(i: int, owner: str, write: bool) -> None:
        handle = side(i + 1, owner, write)
        async with handle.acquired(wait=LIMIT * 3):
            order.append(owner)
            inside.set()
            await let_go[owner].wait()

    tasks = []
    for i, (owner, write) in enumerate(queue):
        tasks.append(asyncio.create_task(wait(i, owner, write)))
        await wait_until(partial(_queued_now, raw, name, i + 1))
    await first.unlock()
    await wait_until(lambda: len(order) == 2)
    assert sorted(order) == ["r1", "r2"]
    let_go["r1"].set()
    let_go["r2"].set()
    await wait_until(lambda: len(order) == 3)
    assert order[2] == "w2"
    let_go["w2"].set()
    await wait_until(lambda: len(order) == 4)
    assert order[3] == "r3"
    let_go["r3"].set()
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(*tasks)
    assert await raw.exists(*keys(name).values()) == 0


async def _queued_now(raw: Redis, name: str, count: int) -> bool:
    return len(await queued(raw, name)) == count


async def test_dead_holders_and_waiters_are_dropped(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A hold whose lease ended and a waiter whose entry was not refreshed in time (their
    clients gone) stand in nobody's way: the next attempt purges them."""
    k = keys(name)
    seconds, _ = await raw.time()
    past = seconds * 1000 - 1000
    await raw.hset(k["state"], mapping={"mode": "write", "w:ghost": "1"})
    await raw.zadd(k["leases"], {"w:ghost": past})
    await raw.rpush(k["queue"], "w:ghost2")
    await raw.zadd(k["deadlines"], {"w:ghost2": past})
    writer = client.fair_read_write_lock(name).write_lock()
    assert await writer.try_lock()
    assert await queued(raw, name) == []
    await writer.unlock()
    assert await raw.exists(*k.values()) == 0


def _script_keys(name: str, call: str) -> list[str]:
    """The KEYS of frw_acquire and frw_rollback, with the tombstone of call ``call``."""
    k = keys(name)
    channel = f"aiolock_frw__channel:{{{name}}}"
    tombstone = f"aiolock_acquire_cancel:{{{name}}}:{call}"
    return [k["state"], k["leases"], k["queue"], k["deadlines"], channel, tombstone, k["admitted"]]


def _first_hold(field: str) -> list[str | int]:
    """frw_acquire's ARGV for a waiting first hold of ``field`` (lease 30 s, entry 5 s)."""
    return [30_000, field, 1, "1", 5_000, "PUBLISH", 2_000]


async def test_rollback_before_late_acquire_voids_it(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A rollback that reaches the server before its acquire (a first hold, the lock free):
    the acquire takes nothing and queues nothing, on either side."""
    run = inside.runner(client).run
    for side in ("r", "w"):
        field = f"{side}:{client.id}:late"
        frw = _script_keys(name, f"late-{side}")
        rolled = await run(load_script("frw_rollback"), frw, [field, 1, 30_000, "PUBLISH", 5_000])
        assert rolled == 0
        assert await run(load_script("frw_acquire"), frw, _first_hold(field)) == [-1, 0]
        assert await raw.exists(*keys(name).values()) == 0
        await raw.delete(frw[-1])


async def test_a_free_lock_goes_to_the_queued_writer_first(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Nobody holds the lock but a writer is queued (between a release and its next try): a
    newcomer's first hold, reader or writer, is not granted; it queues behind."""
    k = keys(name)
    seconds, _ = await raw.time()
    await raw.rpush(k["queue"], "w:head")
    await raw.zadd(k["deadlines"], {"w:head": seconds * 1000 + 60_000})
    run = inside.runner(client).run
    for side in ("r", "w"):
        field = f"{side}:{client.id}:new"
        reply = await run(load_script("frw_acquire"), _script_keys(name, side), _first_hold(field))
        assert reply[0] == 0
        assert await raw.exists(k["state"], k["leases"]) == 0
    assert await queued(raw, name) == ["w:head", f"r:{client.id}:new", f"w:{client.id}:new"]
    await raw.delete(*k.values())


async def test_upgrade_is_refused(client: aiolock.Client, raw: Redis, name: str) -> None:
    """A holder of read locks asking for the write lock: LockUpgradeError, nothing changed."""
    frw = client.fair_read_write_lock(name)
    await frw.read_lock().lock()
    with pytest.raises(aiolock.LockUpgradeError):
        await frw.write_lock().lock()
    assert await queued(raw, name) == []
    await frw.read_lock().unlock()


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "redisson"])
async def test_a_lost_write_hold_beside_read_holds_makes_the_next_write_an_upgrade(
    fair: bool, make_client: ClientFactory, name: str
) -> None:
    """Found by the model: a writer whose write hold was deleted (force_unlock) without its
    knowing, then took a read hold, asked for the write lock again. Once the server told
    it the write hold was gone, that was an upgrade, yet it queued behind its own read
    hold until its wait ran out. Now it is refused as soon as the loss is found."""
    mine, other = make_client(), make_client()

    def rw(client: aiolock.Client, owner: str | None = None) -> Any:
        make = client.fair_read_write_lock if fair else client.read_write_lock
        return make(name, owner=owner)

    holder = rw(mine, "o")
    await holder.write_lock().lock()
    assert await rw(mine).write_lock().force_unlock()
    reader = rw(other).read_lock()
    await reader.lock()
    assert await holder.read_lock().try_lock(wait=0)
    for attempt in (partial(holder.write_lock().try_lock, wait=LIMIT), holder.write_lock().lock):
        async with asyncio.timeout(LIMIT / 2):
            with pytest.raises(aiolock.LockUpgradeError):
                await attempt()
    await holder.read_lock().unlock()
    with pytest.raises(aiolock.LockLostError):
        await holder.write_lock().unlock()
    await reader.unlock()


async def test_a_waiter_that_gives_up_or_is_cancelled_leaves_the_queue(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A queued writer cancelled at every loop iteration of its wait, or whose wait runs
    out: its entry is gone, and the reader behind it is not held up."""
    a, b = make_client(), make_client()
    holder = a.fair_read_write_lock(name, owner="h").read_lock()
    await holder.lock()
    writer = b.fair_read_write_lock(name, owner="w").write_lock()
    assert not await writer.try_lock(wait=0.05)
    await quiesce(b)
    assert await queued(raw, name) == []
    for k in range(60):
        task = asyncio.create_task(writer.try_lock(wait=LIMIT))
        cancel_at(task, k)
        with pytest.raises(asyncio.CancelledError):
            await task
        await quiesce(b)
        assert await queued(raw, name) == [], f"k={k}"
        assert writer.statistics().hold_count == 0
        assert not await raw.hexists(keys(name)["state"], f"w:{b.id}:owner:w")
    reader = b.fair_read_write_lock(name, owner="r").read_lock()
    assert await reader.try_lock()
    await reader.unlock()
    await holder.unlock()


async def test_a_dead_waiter_is_dropped_within_watchdog_timeout(
    proxy: FaultProxy, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """A queued writer whose client is cut off (it can neither try again nor leave) stops
    holding up the reader behind it within watchdog_timeout: its entry's deadline is less
    than that after it was last seen, and the reader's next try, due before then, drops it."""
    holder = make_client(watchdog_timeout=1).fair_read_write_lock(name).read_lock()
    await holder.lock()
    dead = aiolock.Client.from_url(proxy.url, watchdog_timeout=1)
    writer = dead.fair_read_write_lock(name).write_lock()
    task = asyncio.create_task(writer.lock())
    entry = f"w:{dead.id}:"

    async def dead_queued() -> bool:
        return any(e.startswith(entry) for e in await queued(raw, name))

    await wait_until(dead_queued)
    proxy.cut()
    try:
        seconds, micros = await raw.time()
        cut_ms = seconds * 1000 + micros // 1000
        entries = await raw.zrange(keys(name)["deadlines"], 0, -1, withscores=True)
        assert len(entries) == 1
        field, deadline = str(entries[0][0]), float(entries[0][1])
        assert field.startswith(entry)
        assert deadline - cut_ms <= 1000  # watchdog_timeout
        reader = make_client(watchdog_timeout=1).fair_read_write_lock(name).read_lock()
        async with asyncio.timeout(LIMIT):
            await reader.lock()  # not hung: the dead writer was dropped
        assert not await dead_queued()
        assert await raw.zscore(keys(name)["deadlines"], field) is None
        await reader.unlock()
    finally:
        await proxy.restore()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await dead.aclose()
    await holder.unlock()
