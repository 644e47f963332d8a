"""``client.leader(name)``: elections between clients on the plain lock ``name``, terms lost
to force_unlock (the work cancelled, a new term begun), ``run()`` returning and releasing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock

from .faultproxy import FaultProxy
from .helpers import wait_until

LIMIT = 10.0


async def test_one_leader_at_a_time_between_clients(make_client: Any, name: str) -> None:
    """Two clients campaign; the second is elected once the first's term ends, not before."""
    a, b = make_client().leader(name), make_client().leader(name)
    order: list[str] = []
    a_in = asyncio.Event()
    a_go = asyncio.Event()

    async def first() -> None:
        async with a.elected():
            order.append("a in")
            assert a.is_leader
            a_in.set()
            await a_go.wait()
            order.append("a out")
        assert not a.is_leader

    async def second() -> None:
        await a_in.wait()
        async with b.elected():
            order.append("b in")
            assert b.is_leader and not a.is_leader

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await a_in.wait()
    await wait_until(lambda: b.lock.statistics().tasks_waiting == 1, what="b campaigns")
    assert not b.is_leader
    a_go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), LIMIT)
    assert order == ["a in", "a out", "b in"]


async def test_leader_lock_is_the_plain_lock(make_client: Any, raw: Redis, name: str) -> None:
    """Redisson compatibility: the term is a hold of the RLock ``name`` (a hash of holder to
    count); another client's ``lock(name)`` excludes the leader and the other way round."""
    leader_client, other = make_client(), make_client()
    leader = leader_client.leader(name)
    async with leader.elected():
        fields = await raw.hgetall(name)
        assert list(fields.values()) == ["1"]
        assert next(iter(fields)).startswith(leader_client.id + ":")
        assert not await other.lock(name).try_lock(wait=0)
    async with other.lock(name):
        campaign = asyncio.create_task(_elected_once(leader))
        await wait_until(
            lambda: leader.lock.statistics().tasks_waiting == 1, what="the leader waits"
        )
        assert not campaign.done()
    await asyncio.wait_for(campaign, LIMIT)


async def _elected_once(leader: aiolock.Leader) -> None:
    async with leader.elected():
        assert leader.is_leader


async def test_term_lost_to_force_unlock(make_client: Any, name: str) -> None:
    """force_unlock() ends the term: the body is cancelled and ``elected()`` raises
    LockLostError; ``is_leader`` is False from then on."""
    client, admin = make_client(), make_client()
    leader = client.leader(name)
    entered = asyncio.Event()
    cancelled: list[bool] = []

    async def term() -> None:
        async with leader.elected() as hold:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(hold.lost)
                raise

    task = asyncio.create_task(term())
    await entered.wait()
    assert leader.is_leader
    assert await admin.lock(name).force_unlock()
    with pytest.raises(aiolock.LockLostError):
        await asyncio.wait_for(task, LIMIT)
    assert cancelled == [True]
    assert not leader.is_leader


async def test_run_campaigns_again_after_a_loss(make_client: Any, raw: Redis, name: str) -> None:
    """run(): a lost term cancels the work and a new term runs it again; when the work
    returns, run() returns its value with the lock released."""
    client, admin = make_client(), make_client()
    leader = client.leader(name)
    terms: list[str] = []
    started = asyncio.Event()

    async def work() -> str:
        terms.append("start")
        started.set()
        if len(terms) == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                terms.append("cancelled")
                raise
        return "done"

    task = asyncio.create_task(leader.run(work))
    await started.wait()
    assert await admin.lock(name).force_unlock()
    assert await asyncio.wait_for(task, LIMIT) == "done"
    assert terms == ["start", "cancelled", "start"]
    assert not await raw.exists(name)
    assert not leader.is_leader


async def test_run_hands_over_to_the_next_candidate(make_client: Any, name: str) -> None:
    """Candidates of several clients each run once, one after the other, never two at once."""
    running: list[int] = []
    most = 0
    ran: list[int] = []

    def work_of(i: int) -> Any:
        async def work() -> int:
            nonlocal most
            running.append(i)
            most = max(most, len(running))
            await asyncio.sleep(0.01)
            running.remove(i)
            ran.append(i)
            return i

        return work

    leaders = [make_client().leader(name) for _ in range(3)]
    results = await asyncio.wait_for(
        asyncio.gather(*(leader.run(work_of(i)) for i, leader in enumerate(leaders))), LIMIT
    )
    assert results == [0, 1, 2]
    assert sorted(ran) == [0, 1, 2]
    assert most == 1


async def test_run_propagates_work_s_error_after_releasing(
    client: aiolock.Client, raw: Redis, name: str
) -> None:
    """An exception of the work ends run() with it, the lock released; a LockLostError the
    work raises of its own (not its term's) is not taken for a lost term."""
    leader = client.leader(name)

    async def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await leader.run(fails)
    assert not await raw.exists(name)

    async def not_ours() -> None:
        raise aiolock.LockLostError("other", "someone")

    with pytest.raises(aiolock.LockLostError, match="other"):
        await leader.run(not_ours)
    assert not await raw.exists(name)


async def test_run_cancelled_while_campaigning(make_client: Any, raw: Redis, name: str) -> None:
    """run() cancelled while it waits to be elected raises CancelledError and leaves nothing."""
    holder, client = make_client(), make_client()
    leader = client.leader(name)
    async with holder.lock(name):
        task = asyncio.create_task(leader.run(lambda: asyncio.sleep(LIMIT)))
        await wait_until(lambda: leader.lock.statistics().tasks_waiting == 1, what="campaigns")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not await raw.exists(name)


async def test_run_retries_a_campaign_the_server_cannot_answer(
    proxy: FaultProxy, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A campaign that fails for want of the server (partition) is retried, and the work
    runs once the server answers again."""
    client = aiolock.Client.from_url(proxy.url + "?socket_timeout=0.2", retry_attempts=0)
    try:
        leader = client.leader(name)
        proxy.cut()
        task = asyncio.create_task(leader.run(lambda: asyncio.sleep(0, "ran")))
        await wait_until(
            lambda: "campaign for" in caplog.text, limit=LIMIT, what="a campaign failed"
        )
        assert not task.done()
        await proxy.restore()
        assert await asyncio.wait_for(task, LIMIT) == "ran"
        assert not await raw.exists(name)
    finally:
        await client.aclose()


def test_bad_input(client: aiolock.Client) -> None:
    """Bad names and leases fail at once, naming the argument."""
    with pytest.raises(ValueError, match="lease"):
        client.leader("x", lease=0)
    with pytest.raises(TypeError, match="name"):
        client.leader(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        client.leader("")
    with pytest.raises(TypeError, match="work"):
        client.leader("x").run(1)  # type: ignore[arg-type]


def test_repr(client: aiolock.Client) -> None:
    assert repr(client.leader("jobs")) == "<aiolock.Leader 'jobs' (candidate)>"
