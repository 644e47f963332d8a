"""aiolock's own command connection on a real server, directly and through the fault proxy.

Every test runs on both wires: the direct one (hiredis on the socket's callbacks) and the
public-API fallback (redis-py's own reads and writes, ``AIOLOCK_WIRE=redis-py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
from aiolock._exceptions import ClientClosedError
from aiolock._net.resp import pack
from aiolock._net.scripts import ScriptRunner, load_script
from aiolock._net.topology import OneServer
from aiolock._net.transport import CommandTransport

from . import inside
from .faultproxy import FaultProxy, command

Make = Callable[..., CommandTransport]


@pytest.fixture(params=["direct", "redis-py"])
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which wire the transports of the test use."""
    kind: str = request.param
    monkeypatch.setenv("AIOLOCK_WIRE", kind)
    return kind


@pytest.fixture
async def make(wire: str, redis_url: str) -> AsyncIterator[Make]:
    """Transports to ``url`` (the test server by default), closed after the test."""
    made: list[CommandTransport] = []

    def build(
        url: str = redis_url, *, deadline: float = 30.0, limit: int = 4096
    ) -> CommandTransport:
        pool = Redis.from_url(url).connection_pool
        transport = CommandTransport(pool.make_connection, deadline=deadline, limit=limit)
        made.append(transport)
        return transport

    yield build
    for transport in made:
        await transport.aclose()


def _direct(transport: CommandTransport) -> bool:
    wire: Any = inside.wire_of(transport)
    return bool(wire is not None and wire.direct)


async def test_uses_the_wire_asked_for(make: Make, wire: str) -> None:
    transport = make()
    assert await transport.call(pack("PING")) == b"PONG"
    assert _direct(transport) == (wire == "direct")


async def test_many_concurrent_calls_each_get_their_own_reply(
    make: Make, raw: Redis, uid: str
) -> None:
    transport = make()
    keys = [f"{uid}:{i}" for i in range(300)]

    async def roundtrip(i: int) -> Any:
        await transport.call(pack("SET", keys[i], i))
        return await transport.call(pack("GET", keys[i]))

    replies = await asyncio.gather(*(roundtrip(i) for i in range(len(keys))))
    assert replies == [str(i).encode() for i in range(len(keys))]
    assert transport.connects == 1
    await raw.delete(*keys)


async def test_callers_woken_together_send_in_one_write(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 callers in lockstep: each round of their commands leaves in one write, not two.

    The first caller woken by a read finds nothing in flight; were it written at once, the
    other 31 would follow in a second write (and the server read two batches a round).
    """
    monkeypatch.setenv("AIOLOCK_WIRE", "direct")
    transport = CommandTransport(
        Redis.from_url(redis_url).connection_pool.make_connection, deadline=30
    )
    try:
        await transport.call(pack("PING"))
        wire: Any = inside.wire_of(transport)
        writes = 0
        write = wire.write

        def counted(data: bytes) -> None:
            nonlocal writes
            writes += 1
            write(data)

        wire.write = counted
        rounds = 20

        async def caller() -> None:
            for _ in range(rounds):
                assert await transport.call(pack("PING")) == b"PONG"

        await asyncio.gather(*(caller() for _ in range(32)))
        # The first round's writes are two (the first call finds the connection idle); a
        # read split in two chunks may cost a round one more. Two writes a round: 40.
        assert writes <= rounds + 5, writes
    finally:
        await transport.aclose()


async def test_callers_woken_by_one_connection_send_to_another_in_one_write(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a cluster's callers do: woken by one server's replies, they send to another.

    That other connection is idle when the first of them sends; the pass's commands still
    leave in one write to it, not the first alone and the rest after.
    """
    monkeypatch.setenv("AIOLOCK_WIRE", "direct")
    make = Redis.from_url(redis_url).connection_pool.make_connection
    first = CommandTransport(make, deadline=30)
    second = CommandTransport(make, deadline=30)
    try:
        await first.call(pack("PING"))
        await second.call(pack("PING"))
        wire: Any = inside.wire_of(second)
        writes = 0
        write = wire.write

        def counted(data: bytes) -> None:
            nonlocal writes
            writes += 1
            write(data)

        wire.write = counted
        rounds = 20

        async def caller() -> None:
            for _ in range(rounds):
                assert await first.call(pack("PING")) == b"PONG"
                assert await second.call(pack("PING")) == b"PONG"

        # Started in flight ahead of the callers, so that their first round leaves in one
        # write too. (The first command of a round written alone, its lone reply would
        # wake one caller, whose command would find the other connection idle again: a
        # split that lasts, each lone command answered sooner than a gathered one.)
        ahead = asyncio.ensure_future(first.call(pack("PING")))
        await asyncio.gather(ahead, *(caller() for _ in range(32)))
        # One write a round, give or take a read split in two. Two a round: 40.
        assert writes <= rounds + 5, writes
    finally:
        await first.aclose()
        await second.aclose()


async def test_an_error_reply_fails_only_its_caller(make: Make, raw: Redis, uid: str) -> None:
    transport = make()
    await raw.set(f"{uid}:text", "not a number")
    calls = [
        transport.call(pack("INCR", f"{uid}:n")),
        transport.call(pack("INCR", f"{uid}:text")),
        transport.call(pack("INCR", f"{uid}:n")),
    ]
    first, failed, third = await asyncio.gather(*calls, return_exceptions=True)
    assert (first, third) == (1, 2)
    assert isinstance(failed, ResponseError)
    assert "not an integer" in str(failed)
    many = await transport.call_many(
        [pack("INCR", f"{uid}:text"), pack("INCR", f"{uid}:n"), pack("NOSUCHCOMMAND")]
    )
    assert isinstance(many[0], ResponseError)
    assert many[1] == 3
    assert isinstance(many[2], ResponseError)
    assert transport.connects == 1
    await raw.delete(f"{uid}:n", f"{uid}:text")


async def test_error_replies_are_redis_py_classes(make: Make) -> None:
    transport = make()
    with pytest.raises(NoScriptError):
        await transport.call(pack("EVALSHA", "0" * 40, 0))


async def test_cancelled_callers_leave_the_stream_in_step(make: Make, raw: Redis, uid: str) -> None:
    """Callers cancelled with their commands written: their replies are read and dropped,
    every other caller gets its own, and the connection stays up."""
    transport = make()
    await transport.call(pack("PING"))
    for round_ in range(20):
        tasks = [asyncio.create_task(transport.call(pack("INCR", f"{uid}:{i}"))) for i in range(40)]
        for _ in range(round_ % 3):
            await asyncio.sleep(0)  # cancel at a different point of the send each round
        for task in tasks[::2]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for i, result in enumerate(results):
            if not isinstance(result, asyncio.CancelledError):
                assert result == int(await raw.get(f"{uid}:{i}") or 0)
        assert await transport.call(pack("ECHO", f"round {round_}")) == f"round {round_}".encode()
    assert transport.connects == 1
    assert transport.in_flight == 0
    await raw.delete(*[f"{uid}:{i}" for i in range(40)])


async def test_backpressure_bounds_what_is_in_flight(make: Make, raw: Redis, uid: str) -> None:
    limit = 8
    transport = make(limit=limit)
    await transport.call(pack("PING"))
    most = 0

    def counted(*args: Any) -> None:
        nonlocal most
        original(*args)
        most = max(most, transport.in_flight)

    original = inside.wrap_put(transport, counted)
    replies = await asyncio.gather(
        *(transport.call(pack("INCR", f"{uid}:n")) for _ in range(200)),
        transport.call_many([pack("INCR", f"{uid}:n")] * 5),
    )
    assert most <= limit
    singles = sorted(replies[:-1])
    assert len(set(singles)) == 200
    assert await raw.get(f"{uid}:n") == "205"
    # A batch bigger than the limit still goes, alone.
    assert await transport.call_many([pack("PING")] * (limit * 3)) == [b"PONG"] * (limit * 3)
    await raw.delete(f"{uid}:n")


async def test_a_caller_cancelled_while_waiting_for_room_passes_it_on(make: Make) -> None:
    transport = make(limit=1)
    await transport.call(pack("PING"))
    first = asyncio.create_task(transport.call(pack("PING")))
    waiting = [asyncio.create_task(transport.call(pack("PING"))) for _ in range(5)]
    await asyncio.sleep(0)
    waiting[0].cancel()
    done = await asyncio.gather(first, *waiting, return_exceptions=True)
    assert isinstance(done[1], asyncio.CancelledError)
    assert [d for i, d in enumerate(done) if i != 1] == [b"PONG"] * 5


async def test_noscript_is_reloaded_through_the_same_connection(make: Make, raw: Redis) -> None:
    transport = make()
    runner = ScriptRunner(OneServer(transport, sentinel=False), retry_attempts=0, retry_interval=0)
    script = load_script("lock_force_unlock")
    await raw.script_flush()
    name = "test:transport:noscript"
    assert (
        await runner.run(script, [name, f"redisson_lock__channel:{{{name}}}"], [0, "PUBLISH"]) == 0
    )
    assert transport.connects == 1


async def test_the_users_settings_are_honoured(make: Make, redis_url: str, uid: str) -> None:
    """db and client name from the URL reach aiolock's own connection."""
    transport = make(f"{redis_url.rsplit('/', 1)[0]}/5?client_name=aiolock-{uid}")
    assert await transport.call(pack("CLIENT", "GETNAME")) == f"aiolock-{uid}".encode()
    await transport.call(pack("SET", f"{uid}:db5", 1))
    async with Redis.from_url(redis_url.rsplit("/", 1)[0] + "/5") as db5:
        assert await db5.get(f"{uid}:db5") == b"1"
        await db5.delete(f"{uid}:db5")


async def test_resp3(make: Make, redis_url: str, raw: Redis, uid: str) -> None:
    transport = make(redis_url + "?protocol=3")
    await raw.hset(f"{uid}:h", "f", "v")
    assert await transport.call(pack("HGETALL", f"{uid}:h")) == {b"f": b"v"}
    assert await transport.call(pack("GET", f"{uid}:none")) is None
    await raw.delete(f"{uid}:h")


# --- faults -------------------------------------------------------------------------------


async def test_a_dropped_connection_fails_everything_in_flight(
    make: Make, proxy: FaultProxy, raw: Redis, uid: str
) -> None:
    transport = make(proxy.url)
    await transport.call(pack("PING"))
    drop = proxy.drop_reply(command("INCRBY", f"{uid}:held"), then="close")
    held = asyncio.create_task(transport.call(pack("INCRBY", f"{uid}:held", 1)))
    await drop.executed.wait()
    behind = [asyncio.create_task(transport.call(pack("PING"))) for _ in range(10)]
    results = await asyncio.gather(held, *behind, return_exceptions=True)
    assert all(isinstance(r, RedisConnectionError) for r in results), results
    assert transport.in_flight == 0
    # The next call reconnects.
    assert await transport.call(pack("INCRBY", f"{uid}:held", 1)) == 2
    assert transport.connects == 2
    await raw.delete(f"{uid}:held")


async def test_a_silent_connection_is_dead_after_the_deadline(
    make: Make, proxy: FaultProxy, raw: Redis, uid: str
) -> None:
    """A reply that never comes fails it and everything behind it with TimeoutError."""
    transport = make(proxy.url, deadline=0.3)
    await transport.call(pack("PING"))
    drop = proxy.drop_reply(command("INCRBY"))
    held = asyncio.create_task(transport.call(pack("INCRBY", f"{uid}:n", 1)))
    await drop.executed.wait()
    behind = asyncio.create_task(transport.call(pack("PING")))
    for outcome in await asyncio.gather(held, behind, return_exceptions=True):
        assert isinstance(outcome, RedisTimeoutError), outcome
    assert await transport.call(pack("GET", f"{uid}:n")) == b"1"  # it ran; a new connection
    assert transport.connects == 2
    await raw.delete(f"{uid}:n")


async def test_an_idle_connection_has_no_deadline(make: Make, proxy: FaultProxy) -> None:
    """Silence with nothing in flight is no fault: the deadline runs only while waiting."""
    transport = make(proxy.url, deadline=0.05)
    await transport.call(pack("PING"))
    await asyncio.sleep(0.2)  # several deadlines of idleness, on purpose
    assert await transport.call(pack("PING")) == b"PONG"
    assert transport.connects == 1


async def test_a_cut_fails_calls_until_it_is_restored(make: Make, proxy: FaultProxy) -> None:
    transport = make(proxy.url, deadline=0.3)
    await transport.call(pack("PING"))
    proxy.cut()
    with pytest.raises((RedisConnectionError, RedisTimeoutError)):
        await transport.call(pack("PING"))
    await proxy.restore()
    assert await transport.call(pack("PING")) == b"PONG"


def _opened_then(redis_url: str, act: Callable[[CommandTransport], None]) -> CommandTransport:
    """A transport that runs ``act`` as each connection opens, before its callers resume."""
    pool = Redis.from_url(redis_url).connection_pool
    transport = CommandTransport(
        pool.make_connection, deadline=30.0, on_open=lambda: act(transport)
    )
    return transport


async def _three_calls(transport: CommandTransport) -> list[Any]:
    # Bounded: a caller left waiting for a reply that never comes fails the test.
    async with asyncio.timeout(10):
        return await asyncio.gather(
            *(transport.call(pack("PING")) for _ in range(3)), return_exceptions=True
        )


async def test_a_connection_lost_as_it_opens_fails_its_callers(wire: str, redis_url: str) -> None:
    """Lost between the connect and the callers' turn: they get an error to resend on, and
    the next call connects again."""
    lost = [False]

    def lose_the_first(transport: CommandTransport) -> None:
        if not lost[0]:
            lost[0] = True
            transport.reset(RedisConnectionError("lost as it opened"))

    transport = _opened_then(redis_url, lose_the_first)
    try:
        replies = await _three_calls(transport)
        assert all(isinstance(reply, RedisConnectionError) for reply in replies), replies
        assert await transport.call(pack("PING")) == b"PONG"
        assert transport.connects == 2
    finally:
        await transport.aclose()


async def test_retired_as_it_opens_fails_its_callers_with_the_reason(
    wire: str, redis_url: str
) -> None:
    """A cluster node retired while a connection to it opens (a stale slot map read at that
    moment): its callers fail with the reason, to be resent to the slot's owner."""
    closing: list[asyncio.Task[None]] = []

    def retire(transport: CommandTransport) -> None:
        closing.append(asyncio.ensure_future(transport.aclose("node retired")))

    transport = _opened_then(redis_url, retire)
    replies = await _three_calls(transport)
    await asyncio.gather(*closing)
    assert [str(reply) for reply in replies] == ["node retired"] * 3, replies
    assert all(isinstance(reply, RedisConnectionError) for reply in replies)


async def test_closed_transport_refuses_calls(make: Make) -> None:
    transport = make()
    await transport.call(pack("PING"))
    await transport.aclose()
    with pytest.raises(ClientClosedError):
        await transport.call(pack("PING"))


# --- the client on it ---------------------------------------------------------------------


async def test_client_on_either_wire(wire: str, redis_url: str, name: str) -> None:
    async with aiolock.Client.from_url(redis_url) as client:
        lock = client.lock(name)
        waiter_started = asyncio.Event()

        async def waiter() -> bool:
            waiter_started.set()
            got = await lock.try_lock(10)
            await lock.unlock()
            return got

        async with lock:
            task = asyncio.create_task(waiter())
            await waiter_started.wait()
        assert await task  # woken through the pub/sub connection on the same wire kind
        used = inside.wire_of(inside.transport(client))
        assert used is not None
        assert used.direct == (wire == "direct")
