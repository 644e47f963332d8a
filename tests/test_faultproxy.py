"""The fault proxy does what each fault says, seen by plain redis-py clients through it.

What a client went through is checked against the server itself, with the direct ``raw``
client of conftest (which also fails the test if a key or a subscription is left behind).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import hiredis
import pytest
from redis._parsers.resp3 import _AsyncRESP3Parser
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aiolock._net.resp import error_reply
from aiolock._net.scripts import load_script

from .faultproxy import (
    REFUSALS,
    FaultProxy,
    ProtocolError,
    command,
    parse_command,
    reply_end,
    script,
)
from .helpers import wait_until

TIMEOUT = 0.3  # the clients' socket_timeout where a test waits for it to run out

Connect = Callable[..., Redis]
T = TypeVar("T")


async def _awaited(call: Awaitable[T]) -> T:
    return await call


def spawn(call: Awaitable[T]) -> asyncio.Task[T]:
    """Run a redis-py call (typed as a mere Awaitable) in a task of its own."""
    return asyncio.create_task(_awaited(call))


@pytest.fixture
async def connect(proxy: FaultProxy) -> AsyncIterator[Connect]:
    """Clients through the proxy, without retries (a retry would hide the fault)."""
    clients: list[Redis] = []

    def make(*, socket_timeout: float = TIMEOUT, **options: Any) -> Redis:
        redis = Redis.from_url(
            proxy.url,
            socket_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            **options,
        )
        clients.append(redis)
        return redis

    yield make
    for redis in clients:
        await redis.aclose()


# --- framing ---------------------------------------------------------------------------------


def test_parse_command_waits_for_the_whole_command() -> None:
    data = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nx!\r\n*1\r\n$4\r\nPING\r\n"
    first = data.index(b"*1")
    for cut in range(first):
        assert parse_command(data[:cut]) is None
    assert parse_command(data) == ([b"SET", b"k", b"v\r\nx!"], first)
    assert parse_command(data, first) == ([b"PING"], len(data))
    assert parse_command(b"PING  x\r\n") == ([b"PING", b"x"], 9)
    with pytest.raises(ProtocolError):
        parse_command(b"*1\r\n:1\r\n")


@pytest.mark.parametrize(
    "reply",
    [
        b"+OK\r\n",
        b"-ERR no\r\n",
        b":42\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"$4\r\nab\r\n\r\n",
        b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
        b"%2\r\n+a\r\n:1\r\n+b\r\n*0\r\n",
        b"~1\r\n,1.5\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
        b"_\r\n",
        b"#f\r\n",
        b"(12345678901234567890\r\n",
        b"=7\r\ntxt:abc\r\n",
        b"!5\r\nERR x\r\n",
    ],
)
def test_reply_end_frames_every_resp_type(reply: bytes) -> None:
    for cut in range(len(reply)):
        assert reply_end(reply[:cut]) is None
    assert reply_end(reply + b"+next\r\n") == len(reply)
    if reply.startswith(b"!"):
        return  # hiredis knows no blob errors (servers do not send them); the proxy passes them
    reader = hiredis.Reader(notEnoughData=Ellipsis)
    reader.feed(reply)
    assert reader.gets() is not Ellipsis
    assert reader.gets() is Ellipsis


def test_matchers() -> None:
    release = load_script("lock_release")
    matches = script("lock_release")
    assert matches([b"EVALSHA", release.sha.encode(), b"3", b"k"])
    assert matches([b"evalsha", release.sha.upper().encode(), b"0"])
    assert matches([b"EVAL", release.text.encode(), b"0"])
    assert not matches([b"EVALSHA", load_script("lock_acquire").sha.encode(), b"0"])
    assert not matches([b"GET", b"k"])
    setinfo = command("client", "SETINFO")
    assert setinfo([b"CLIENT", b"SETINFO", b"LIB-NAME", b"redis-py"])
    assert not setinfo([b"CLIENT", b"ID"])
    assert not setinfo([b"CLIENT"])


# --- plain forwarding ------------------------------------------------------------------------


async def test_forwards_and_counts(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
    redis = connect()
    big = "x" * 300_000  # spans many reads in both directions
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(100):
            pipe.set(f"{uid}:{i}", big if i == 50 else str(i))
        pipe.get(f"{uid}:50")
        results = await pipe.execute()
    assert results == [True] * 100 + [big]
    assert await raw.get(f"{uid}:99") == "99"
    assert proxy.stats.commands["SET"] == 100
    assert proxy.stats.commands["GET"] == 1
    assert proxy.stats.connections_accepted == 1
    assert proxy.stats.replies_dropped == 0
    await raw.delete(*[f"{uid}:{i}" for i in range(100)])


@pytest.mark.skipif(
    not hasattr(_AsyncRESP3Parser, "set_invalidation_push_handler"),
    reason="redis-py before 5.1 hands a RESP3 invalidation push to the next command as its reply",
)
async def test_resp3_push_does_not_shift_replies(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    """An invalidation push on a command connection is passed on, not taken as a reply."""
    key = f"{uid}:tracked"
    redis = connect(protocol=3, single_connection_client=True)
    await raw.set(key, "one")
    await redis.execute_command("CLIENT", "TRACKING", "ON")  # type: ignore[no-untyped-call]
    assert await redis.get(key) == "one"
    await raw.set(key, "two")  # the server pushes an invalidation to the tracking client
    get = proxy.watch("GET")
    assert await redis.get(key) == "two"
    assert proxy.stats.pushes == 1  # the invalidation came just before this reply
    assert get.reply == b"two"
    assert await redis.hgetall(f"{uid}:none") == {}  # a RESP3 map
    await raw.delete(key)


# --- dropped replies -------------------------------------------------------------------------


async def test_drop_reply_runs_the_command_and_the_client_times_out(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    key = f"{uid}:n"
    redis = connect()
    await redis.ping()
    drop = proxy.drop_reply(command("INCRBY", key))  # redis-py sends INCR as INCRBY
    with pytest.raises(RedisTimeoutError):
        await redis.incr(key)
    assert drop.executed.is_set()
    assert drop.reply == 1
    assert await raw.get(key) == "1"  # it ran: only the reply was lost
    assert not drop.active  # one-shot
    assert proxy.stats.replies_dropped == 1
    assert await redis.incr(key) == 2  # the client reconnects; later replies arrive
    await raw.delete(key)


async def test_drop_reply_then_close(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    key = f"{uid}:n"
    redis = connect(socket_timeout=10)  # a ConnectionError, not a wait for the timeout
    await redis.ping()
    drop = proxy.drop_reply("INCRBY", then="close")
    with pytest.raises(RedisConnectionError):
        await redis.incr(key)
    assert drop.executed.is_set()
    assert await raw.get(key) == "1"
    await raw.delete(key)


async def test_drop_reply_in_a_pipeline(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    """The reply of the matching command is lost and, as on one TCP stream, all after it."""
    redis = connect()
    await redis.ping()
    drop = proxy.drop_reply(command("INCRBY"))
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(f"{uid}:a", "a")
        pipe.incr(f"{uid}:b")
        pipe.set(f"{uid}:c", "c")
        with pytest.raises(RedisTimeoutError):
            await pipe.execute()
    assert drop.words == [b"INCRBY", f"{uid}:b".encode(), b"1"]
    assert await raw.mget(f"{uid}:a", f"{uid}:b", f"{uid}:c") == ["a", "1", "c"]
    await raw.delete(f"{uid}:a", f"{uid}:b", f"{uid}:c")


async def test_drop_reply_of_a_package_script(
    proxy: FaultProxy, connect: Connect, raw: Redis, name: str
) -> None:
    """``script(name)`` picks the EVALSHA of that aiolock script out of the traffic."""
    release = load_script("lock_release")
    await raw.script_load(release.text)
    await raw.hset(name, "holder", 1)
    latch = f"redisson_unlock_latch:{{{name}}}:r1"
    keys_and_args = (name, f"redisson_lock__channel:{{{name}}}", latch, "0", 30000)
    redis = connect()
    await redis.ping()  # connected first: the drop is for the script alone
    other = proxy.drop_reply(script("lock_acquire"))
    drop = proxy.drop_reply(script("lock_release"))
    with pytest.raises(RedisTimeoutError):
        await redis.evalsha(release.sha, 3, *keys_and_args, "holder", "PUBLISH", 5000)
    assert drop.executed.is_set()
    assert drop.reply == 1
    assert await raw.exists(name) == 0  # released on the server, unknown to the client
    assert await raw.get(latch) == "1"
    assert other.active  # the other script's drop is still armed
    other.remove()
    # A resend (as a client retries) is answered, from the unlock latch.
    assert await redis.evalsha(release.sha, 3, *keys_and_args, "holder", "PUBLISH", 5000) == 1
    await raw.delete(latch)


async def test_drop_reply_skips_noscript(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    """An EVALSHA the server refused unrun is not the reply to lose: the retry's is."""
    text = f"return redis.call('incr', KEYS[1]) -- {uid}"  # in no server's script cache
    sha = hashlib.sha1(text.encode()).hexdigest()
    key = f"{uid}:n"
    redis = connect()
    await redis.ping()
    drop = proxy.drop_reply(command("EVALSHA", sha))
    with pytest.raises(NoScriptError):
        await redis.evalsha(sha, 1, key)
    assert drop.active
    assert not drop.executed.is_set()
    assert await redis.script_load(text) == sha
    with pytest.raises(RedisTimeoutError):
        await redis.evalsha(sha, 1, key)
    assert drop.reply == 1
    assert await raw.get(key) == "1"
    await raw.delete(key)


# --- delays ----------------------------------------------------------------------------------


async def test_delay_holds_matching_commands(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    key = f"{uid}:k"
    redis = connect(socket_timeout=10)
    await redis.ping()
    delay = proxy.delay(60, "SET")
    pending = spawn(redis.set(key, "v"))
    await delay.received.wait()
    assert await redis.get(key) is None  # other commands pass (on another connection)
    assert await raw.get(key) is None
    assert not delay.forwarded.is_set()
    delay.remove()  # lets the held SET go at once
    assert await pending is True
    assert delay.forwarded.is_set()
    assert await raw.get(key) == "v"
    await raw.delete(key)


async def test_delay_runs_its_time_and_can_outlast_the_timeout(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    key = f"{uid}:k"
    redis = connect()
    await redis.ping()
    loop = asyncio.get_running_loop()
    with proxy.delay(0.2) as delay:  # every command
        start = loop.time()
        assert await redis.ping() is True
        assert loop.time() - start >= 0.2
        assert delay.count == 1
    with proxy.delay(TIMEOUT + 0.2, "SET") as delay:
        with pytest.raises(RedisTimeoutError):
            await redis.set(key, "late")
        await delay.forwarded.wait()  # the client gave up; the command still arrives

    async def arrived() -> bool:
        return await raw.get(key) == "late"

    await wait_until(arrived, limit=2, what="the late SET ran")
    await raw.delete(key)


# --- partitions ------------------------------------------------------------------------------


async def test_partition_reset_discards_what_was_held(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    key = f"{uid}:k"
    old = connect(socket_timeout=10)
    await old.ping()
    sets = proxy.watch("SET")
    proxy.cut()
    held = spawn(old.set(key, "held"))
    await sets.received.wait()
    anything = proxy.watch()
    new = connect(socket_timeout=10)
    connecting = spawn(new.ping())
    await anything.received.wait()  # a connection made during the cut: accepted, no answer
    assert proxy.stats.connections_accepted == 2
    assert not sets.forwarded.is_set()
    assert await raw.get(key) is None
    await proxy.restore()  # reset
    assert proxy.connections == 0
    with pytest.raises(RedisConnectionError):
        await held
    with pytest.raises(RedisConnectionError):
        await connecting
    assert await old.set(key, "after") is True  # a fresh connection works
    assert await raw.get(key) == "after"  # and the held SET never arrives
    assert await new.ping() is True
    await raw.delete(key)


async def test_partition_resume_delivers_late_both_ways(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    queue, counter = f"{uid}:queue", f"{uid}:counter"
    redis, other = connect(socket_timeout=10), connect(socket_timeout=10)
    await redis.ping()
    await other.ping()
    blpop, incr = proxy.watch("BLPOP"), proxy.watch("INCRBY")
    popping = spawn(redis.blpop([queue], timeout=0))
    await blpop.forwarded.wait()
    proxy.cut()
    # The server answers the BLPOP during the cut: the reply reaches the proxy and stays.
    assert await raw.rpush(queue, "x") == 1
    await blpop.executed.wait()
    counting = spawn(other.incr(counter))
    await incr.received.wait()
    anything = proxy.watch()
    new = connect(socket_timeout=10)
    connecting = spawn(new.ping())
    await anything.received.wait()
    assert not popping.done()
    assert await raw.get(counter) is None
    await proxy.restore(mode="resume")
    popped = await popping
    assert popped is not None
    assert list(popped) == [queue, "x"]
    assert await counting == 1
    assert await connecting is True
    assert await raw.get(counter) == "1"
    await raw.delete(counter)


async def test_partition_context(proxy: FaultProxy, connect: Connect) -> None:
    redis = connect()
    await redis.ping()
    assert proxy.connections == 1
    async with proxy.partition():
        during = proxy.is_cut
    assert (during, proxy.is_cut) == (True, False)
    assert proxy.connections == 0  # reset: the connection of the cut is gone
    assert await connect().ping() is True


# --- killed connections and pub/sub ---------------------------------------------------------


async def test_kill_connections(proxy: FaultProxy, connect: Connect, uid: str) -> None:
    redis = connect(socket_timeout=10)
    await redis.ping()
    blpop = proxy.watch("BLPOP")
    popping = spawn(redis.blpop([f"{uid}:queue"], timeout=0))
    await blpop.forwarded.wait()
    assert await proxy.kill_connections() == 1
    with pytest.raises(RedisConnectionError):
        await popping
    assert proxy.connections == 0
    assert await redis.ping() is True


async def test_blackhole_pubsub(proxy: FaultProxy, connect: Connect, raw: Redis, uid: str) -> None:
    channel = f"{uid}:channel"
    redis = connect(socket_timeout=10)
    pubsub = redis.pubsub()

    async def message() -> tuple[str, str | int]:
        while (got := await pubsub.get_message(timeout=5)) is None:
            pass
        return got["type"], got["data"]

    await pubsub.subscribe(channel)
    assert await message() == ("subscribe", 1)
    assert await raw.publish(channel, "one") == 1
    assert await message() == ("message", "one")
    with proxy.blackhole_pubsub() as hole:
        assert await raw.publish(channel, "lost") == 1  # the server sent it
        await hole.swallowed.wait()
    assert await redis.set(f"{uid}:k", "v") is True  # command connections are unaffected
    assert await raw.publish(channel, "two") == 1
    assert await message() == ("message", "two")
    await pubsub.unsubscribe(channel)
    assert await message() == ("unsubscribe", 0)
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await raw.delete(f"{uid}:k")


# --- the proxy's own hygiene -----------------------------------------------------------------


async def test_exit_closes_everything(redis_url: str, uid: str) -> None:
    before = asyncio.all_tasks()
    async with FaultProxy.from_url(redis_url) as proxy:
        redis = Redis.from_url(proxy.url, socket_timeout=10, retry=Retry(NoBackoff(), 0))
        await redis.ping()
        gets = proxy.watch("GET")
        proxy.cut()
        held = spawn(redis.get(f"{uid}:k"))
        await gets.received.wait()
    assert asyncio.all_tasks() - before <= {held}  # nothing of the proxy's
    with pytest.raises(RedisConnectionError):
        await held
    await redis.aclose()


async def test_a_stream_that_is_not_resp_fails_the_test(redis_url: str) -> None:
    async def garble() -> None:
        async with FaultProxy.from_url(redis_url) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"*1\r\n:1\r\n")
            assert await reader.read() == b""  # the proxy gives up on this connection
            writer.close()
            await writer.wait_closed()

    with pytest.raises(ProtocolError):
        await garble()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_drop_messages_on_a_channel(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str, protocol: int
) -> None:
    """RESP2 arrays and RESP3 pushes alike: only the channel's messages, ``times`` times."""
    lost, kept = f"{uid}:lost", f"{uid}:kept"
    pubsub = connect(socket_timeout=10, protocol=protocol).pubsub()

    async def message() -> tuple[str, str, str | int]:
        while (got := await pubsub.get_message(timeout=5)) is None:
            pass
        return got["type"], got["channel"], got["data"]

    await pubsub.subscribe(lost, kept)
    assert [await message(), await message()] == [("subscribe", lost, 1), ("subscribe", kept, 2)]
    drop = proxy.drop_messages(f"{uid}:l*", times=2)
    for data in ("one", "two"):
        assert await raw.publish(lost, data) == 1  # the server sent it
        assert await raw.publish(kept, data) == 1
        assert await message() == ("message", kept, data)
    await drop.dropped.wait()
    assert (drop.count, drop.words, drop.active) == (2, [b"message", lost.encode(), b"two"], False)
    assert await raw.publish(lost, "three") == 1  # two taken: this one goes through
    assert await message() == ("message", lost, "three")
    await pubsub.unsubscribe(lost, kept)
    assert {await message(), await message()} == {
        ("unsubscribe", lost, 1),
        ("unsubscribe", kept, 0),
    }
    await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_drop_messages_until_removed_by_predicate_and_pattern_messages(
    proxy: FaultProxy, connect: Connect, raw: Redis, uid: str
) -> None:
    channel = f"{uid}:channel"
    pubsub = connect(socket_timeout=10).pubsub()

    async def message() -> tuple[str, str | int]:
        while (got := await pubsub.get_message(timeout=5)) is None:
            pass
        return got["type"], got["data"]

    await pubsub.psubscribe(f"{uid}:*")
    assert await message() == ("psubscribe", 1)
    with proxy.drop_messages(lambda name: name == channel.encode(), times=None) as drop:
        for data in ("one", "two", "three"):
            assert await raw.publish(channel, data) == 1
        await wait_until(lambda: drop.count == 3)
        assert drop.words == [b"pmessage", f"{uid}:*".encode(), channel.encode(), b"three"]
        assert proxy._message_drops == [drop]  # still active
    assert not drop.active
    assert await raw.publish(channel, "four") == 1
    assert await message() == ("pmessage", "four")
    await pubsub.punsubscribe(f"{uid}:*")
    assert await message() == ("punsubscribe", 0)
    await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_drop_messages_of_other_kinds_a_subscribe_confirmation(
    proxy: FaultProxy, connect: Connect, uid: str
) -> None:
    channel = f"{uid}:channel"
    pubsub = connect(socket_timeout=10).pubsub()
    drop = proxy.drop_messages(channel, kinds=("subscribe",))
    await pubsub.subscribe(channel)
    await drop.dropped.wait()  # the server subscribed it; the client never hears so
    await pubsub.unsubscribe(channel)
    while (got := await pubsub.get_message(timeout=5)) is None:
        pass
    assert (got["type"], got["data"]) == ("unsubscribe", 0)
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    with pytest.raises(ValueError, match="times"):
        proxy.drop_messages(channel, times=0)


# --- refusals: error replies in the server's place -------------------------------------------


@pytest.mark.parametrize("code", sorted(REFUSALS))
async def test_refuse_answers_with_the_error_and_never_forwards(
    code: str, proxy: FaultProxy, connect: Connect, raw: Redis, name: str
) -> None:
    """A refused command gets the error reply (as redis-py classes it) and never runs."""
    redis = connect()
    refuse = proxy.refuse(command("SET", name), code)
    with pytest.raises(ResponseError if code == "BUSY" else RedisError) as caught:
        await redis.set(name, "v")
    # As redis-py classes it: by its first word from 5.1 on; before, TRYAGAIN, CLUSTERDOWN
    # and MASTERDOWN only in its cluster client (here a plain ResponseError, whole text).
    assert type(caught.value) in {type(error_reply(REFUSALS[code])), ResponseError}
    assert REFUSALS[code].endswith(str(caught.value))
    assert refuse.answered.is_set()
    assert refuse.count == 1
    assert not refuse.forwarded.is_set()
    assert await raw.exists(name) == 0
    assert proxy.stats.commands["SET"] == 1
    refuse.remove()
    assert await redis.set(name, "v")
    assert await raw.get(name) == "v"
    await raw.delete(name)


async def test_refuse_times_then_forwards(
    proxy: FaultProxy, connect: Connect, raw: Redis, name: str
) -> None:
    """``times=n``: the first n matching commands are refused, the next ones run."""
    redis = connect()
    refuse = proxy.refuse(command("INCRBY", name), "TRYAGAIN", times=2)
    for _ in range(2):
        with pytest.raises(ResponseError, match="rehashing"):  # TryAgainError from 5.1 on
            await redis.incr(name)
    assert not refuse.active
    assert await redis.incr(name) == 1
    assert refuse.count == 2
    await raw.delete(name)


async def test_refused_reply_keeps_its_place_in_a_pipeline(
    proxy: FaultProxy, connect: Connect, raw: Redis, name: str
) -> None:
    """Pipelined around the refused command, the server's replies still pair with their
    commands: the refusal takes the refused command's place, no other (redis-py sends
    ``incr()`` as ``INCRBY 1``)."""
    redis = connect()
    proxy.refuse(command("INCRBY", name, "1"), "BUSY")
    async with redis.pipeline(transaction=False) as pipe:
        for queued in (
            lambda: pipe.set(name, "1"),
            lambda: pipe.incr(name),
            lambda: pipe.get(name),
            lambda: pipe.incrby(name, 5),
            lambda: pipe.get(name),
        ):
            queued()
        replies = await pipe.execute(raise_on_error=False)
    assert replies[0] is True
    assert isinstance(replies[1], ResponseError)
    assert str(replies[1]).startswith("BUSY")
    assert replies[2:] == ["1", 6, "6"]
    await raw.delete(name)


async def test_refuse_rejects_what_is_not_one_error_line(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="times"):
        proxy.refuse("SET", "OOM", times=0)
    with pytest.raises(ValueError, match="one line"):
        proxy.refuse("SET", "ERR a\r\nb")
