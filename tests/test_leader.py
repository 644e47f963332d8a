"""``client.leader(name)``: elections between clients on the plain lock ``name``, terms lost
to force_unlock (the work cancelled, a new term begun), ``run()`` returning and releasing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
import aiolock.sync

from . import inside
from .conftest import ClientFactory
from .faultproxy import FaultProxy, command
from .helpers import forced_term_ends_on_its_message, wait_until

LIMIT = 10.0
#: A watchdog lease whose renewal (every third of it) finds a forced unlock within 0.3 s.
FAST_WATCHDOG = 0.9


async def test_one_leader_at_a_time_between_clients(make_client: ClientFactory, name: str) -> None:
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
            assert b.is_leader
            assert not a.is_leader

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await a_in.wait()
    await wait_until(lambda: b.lock.statistics().tasks_waiting == 1, what="b campaigns")
    assert not b.is_leader
    a_go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), LIMIT)
    assert order == ["a in", "a out", "b in"]


async def test_leader_lock_is_the_plain_lock(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Redisson compatibility: the term is a hold of the RLock ``name`` (a hash of holder to
    count); another client's ``lock(name)`` excludes the leader and the other way round."""
    leader_client, other = make_client(), make_client()
    leader = leader_client.leader(name)
    async with leader.elected():
        fields = await raw.hgetall(name)
        assert list(fields.values()) == ["1"]
        assert str(next(iter(fields))).startswith(leader_client.id + ":")
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


async def test_term_lost_to_force_unlock(make_client: ClientFactory, name: str) -> None:
    """force_unlock() ends the term at once, not at the next renewal (10 s away with the
    default 30 s watchdog): the body is cancelled and ``elected()`` raises LockLostError;
    ``is_leader`` is False from then on."""
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
        await asyncio.wait_for(task, 3)
    assert cancelled == [True]
    assert not leader.is_leader


def _barrier_back(leader: aiolock.Leader) -> bool:
    """Whether the watch of the leader's term has its barrier back (engine internals)."""
    lock = leader.lock
    waiters = inside.engine(lock).services.waiting.waiters(inside.primitive_of(lock).channel(""))
    return any(w.barrier is not None and w.barrier.passed for w in waiters)


async def test_forced_term_ends_before_the_next_begins(
    make_client: ClientFactory, name: str
) -> None:
    """force_unlock() of a term under way: its work ends before the next leader's begins, on
    this machine's clock, every time. The unlock message that wakes the next candidate
    ends the term itself, in its own callback (no renewal runs to find the loss), and the
    next term begins only once its own barrier is back, a round trip later."""
    a, b, admin = make_client(), make_client(), make_client()
    a_leader, b_leader = a.leader(name), b.leader(name)
    for _ in range(20):
        a_span: list[float] = []
        b_start: list[float] = []
        a_in = asyncio.Event()
        a_task = asyncio.create_task(_spanned(a_leader, a_span, a_in))
        await a_in.wait()
        b_task = asyncio.create_task(_spanned(b_leader, b_start, None))
        await wait_until(
            lambda: b_leader.lock.statistics().tasks_waiting == 1 and _barrier_back(a_leader),
            what="b campaigns, a's term has its barrier back",
        )
        rounds = inside.renewal(a).rounds
        assert await admin.lock(name).force_unlock()
        with pytest.raises(aiolock.LockLostError):
            await asyncio.wait_for(a_task, LIMIT)
        await asyncio.wait_for(b_task, LIMIT)
        assert a_span[1] < b_start[0], f"a's work ran {b_start[0] - a_span[1]:.6f} s into b's"
        assert inside.renewal(a).rounds == rounds


@pytest.mark.parametrize(
    "options",
    [{}, {"protocol": 3}, {"protocol": 3, "decode_responses": True}],
    ids=["resp2", "resp3", "resp3-decoded"],
)
async def test_forced_term_ends_on_its_message_in_any_reply_mode(
    redis_url: str, make_client: ClientFactory, name: str, options: dict[str, Any]
) -> None:
    """The barrier's answer is told apart in RESP2 subscribed mode and in RESP3."""
    redis = Redis.from_url(redis_url, **options)
    client = aiolock.Client(redis)
    try:
        await forced_term_ends_on_its_message(client, make_client(), name)
    finally:
        await client.aclose()
        await redis.aclose()


async def _spanned(leader: aiolock.Leader, span: list[float], stay: asyncio.Event | None) -> None:
    """One term whose work logs its start and end; with ``stay``, set it and run until
    cancelled."""
    async with leader.elected():
        span.append(time.monotonic())
        if stay is None:
            return
        stay.set()
        try:
            await asyncio.Event().wait()
        finally:
            span.append(time.monotonic())


async def test_unlock_message_before_the_barrier_does_not_end_the_term(
    proxy: FaultProxy, raw: Redis, name: str
) -> None:
    """An unlock message heard after the term's acquire but before its barrier (a PING on
    the pub/sub connection, held back here) may be stale, a release published before the
    acquire and delivered late: the watch looks the hold up (HEXISTS), finds it, and the
    term goes on. Its body starts once the barrier is back; from then on the same message
    ends the term at once (no look-up), and its hold, still on the server here, is released
    by the usual exit."""
    client = aiolock.Client.from_url(proxy.url)
    checks = proxy.watch(command("HEXISTS"))
    leader = client.leader(name)
    channel = inside.primitive_of(leader.lock).channel("")
    entered = asyncio.Event()

    async def term() -> None:
        async with leader.elected():
            entered.set()
            await asyncio.Event().wait()

    try:
        barrier = proxy.delay(LIMIT * 2, command("PING"))
        task = asyncio.create_task(term())
        await asyncio.wait_for(barrier.received.wait(), LIMIT)
        await wait_until(checks.executed.is_set, what="the watch's first look-up")
        assert await raw.publish(channel, "0") == 1
        await wait_until(lambda: checks.count == 2, what="the look-up the message asked for")
        assert not entered.is_set()  # the term waits for its barrier
        assert not task.done()

        barrier.remove()
        await asyncio.wait_for(entered.wait(), LIMIT)
        assert [leader.is_leader] == [True]
        assert await raw.publish(channel, "0") == 1
        with pytest.raises(aiolock.LockLostError, match="deleted while it held it"):
            await asyncio.wait_for(task, LIMIT)
        assert checks.count == 2
        assert not leader.is_leader

        async def released() -> bool:
            return not await raw.exists(name)

        await wait_until(released, what="the hold released by the exit")
    finally:
        await client.aclose()


async def test_run_campaigns_again_after_a_loss(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """run(): a lost term cancels the work and a new term runs it again; when the work
    returns, run() returns its value with the lock released."""
    client, admin = make_client(watchdog_timeout=FAST_WATCHDOG), make_client()
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


async def test_run_hands_over_to_the_next_candidate(make_client: ClientFactory, name: str) -> None:
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


async def test_run_cancelled_while_campaigning(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
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
        client.leader("x").run(1)  # type: ignore[arg-type, unused-coroutine]


def test_repr(client: aiolock.Client) -> None:
    assert repr(client.leader("jobs")) == "<aiolock.Leader 'jobs' (candidate)>"


async def test_cut_off_leader_stops_before_the_next_is_elected(
    proxy: FaultProxy, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """The leader cut off from Redis (the proxy stops forwarding) has its work cancelled
    before the next candidate's work starts, on this machine's clock; the next one starts
    within the lease + 1 s of the cut. Once the link is back, the old leader campaigns
    again (and waits: the new one leads)."""
    lease = 1.0
    cut_off = aiolock.Client.from_url(
        proxy.url + "?socket_timeout=0.3&socket_connect_timeout=0.3",
        watchdog_timeout=lease,
        retry_attempts=0,
    )
    other = make_client(watchdog_timeout=lease)
    spans: dict[str, list[float]] = {"a": [], "b": []}
    b_started = asyncio.Event()

    def work_of(who: str) -> Any:
        async def work() -> None:
            spans[who].append(time.monotonic())
            if who == "b":
                b_started.set()
            try:
                await asyncio.Event().wait()
            finally:
                spans[who].append(time.monotonic())

        return work

    try:
        a = asyncio.create_task(cut_off.leader(name).run(work_of("a")))
        await wait_until(lambda: len(spans["a"]) == 1, what="a elected")
        b_leader = other.leader(name)
        b = asyncio.create_task(b_leader.run(work_of("b")))
        await wait_until(lambda: b_leader.lock.statistics().tasks_waiting == 1, what="b waits")
        cut = time.monotonic()
        proxy.cut()
        await asyncio.wait_for(b_started.wait(), lease + 5)
        a_end = spans["a"][1]
        b_start = spans["b"][0]
        assert a_end <= b_start, f"a's work ran {b_start - a_end:.3f} s into b's"
        assert b_start - cut <= lease + 1.0
        await proxy.restore()
        for task in (b, a):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, LIMIT)
    finally:
        await proxy.restore()
        await cut_off.aclose()


async def test_aclose_ends_a_running_leader_without_a_loss_warning(
    redis_url: str, make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """c11: a clean aclose() ends run() with ClientClosedError, says nothing of a lost
    leadership nor of a new campaign, and hands the lock over at once."""
    client = aiolock.Client.from_url(redis_url)
    leader = client.leader(name)
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()  # runs until its term ends

    run = asyncio.create_task(leader.run(work))
    await started.wait()
    caplog.set_level(logging.WARNING, logger="aiolock")
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await run
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [line for line in warnings if "lost" in line or "campaign" in line], warnings
    successor = make_client().lock(name)
    assert await successor.try_lock(wait=0)  # released by the close
    await successor.unlock()


def test_close_ends_a_running_sync_leader_without_a_loss_warning(
    redis_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """c11, the sync face: close() from another thread ends run() with ClientClosedError,
    with no warning of a lost leadership nor of a new campaign."""
    client = aiolock.sync.Client.from_url(redis_url)
    leader = client.leader(name)
    started = threading.Event()
    ended: list[BaseException] = []

    def work(term: aiolock.sync.Hold) -> None:
        started.set()
        while True:
            term.sleep(LIMIT)  # raises LockLostError once the term ends

    def run() -> None:
        try:
            leader.run(work)
        except BaseException as exc:  # what run() raised is the outcome
            ended.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert started.wait(LIMIT)
        caplog.set_level(logging.WARNING, logger="aiolock")
    finally:
        client.close()
        thread.join(LIMIT)
    assert not thread.is_alive()
    assert [type(exc) for exc in ended] == [aiolock.ClientClosedError]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [line for line in warnings if "lost" in line or "campaign" in line], warnings
    with contextlib.closing(aiolock.sync.Client.from_url(redis_url)) as successor:
        assert successor.lock(name).try_lock(wait=0)  # released by the close
        successor.lock(name).unlock()
