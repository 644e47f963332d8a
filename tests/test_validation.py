"""Bad input fails at once, before any I/O, with a message naming the argument.

The validation tests use a client whose URL points at a closed port: had a call reached the
network first, it would raise redis-py's ConnectionError instead of TypeError/ValueError.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock._keys import fenced_token_key, lock_channel, unlock_latch_key

from . import inside
from .helpers import wait_until

ClientFactory = Callable[..., aiolock.Client]
CLOSED_PORT_URL = "redis://127.0.0.1:1/0"
LIMIT = 10.0

BAD_LEASES = [
    pytest.param(-1, ValueError, id="negative"),
    pytest.param(0, ValueError, id="zero"),
    pytest.param(0.0, ValueError, id="zero-float"),
    pytest.param(math.nan, ValueError, id="nan"),
    pytest.param(math.inf, ValueError, id="inf"),
    pytest.param(timedelta(0), ValueError, id="zero-timedelta"),
    pytest.param(timedelta(seconds=-1), ValueError, id="negative-timedelta"),
    pytest.param("1", TypeError, id="str"),
    pytest.param(True, TypeError, id="bool"),
    pytest.param([1], TypeError, id="list"),
    # More than the server can store as an expiry (PEXPIRE overflows): refused, never
    # half-written (issue 21, c01/s02).
    pytest.param(sys.maxsize, ValueError, id="maxsize"),
    pytest.param(1e17, ValueError, id="1e17"),
    pytest.param(10**9 + 1, ValueError, id="past-the-cap"),
    pytest.param(timedelta.max, ValueError, id="timedelta-max"),
]

BAD_WAITS = [
    pytest.param(-1, ValueError, id="negative"),
    pytest.param(-0.001, ValueError, id="slightly-negative"),
    pytest.param(math.nan, ValueError, id="nan"),
    pytest.param(math.inf, ValueError, id="inf"),
    pytest.param(-math.inf, ValueError, id="minus-inf"),
    pytest.param(timedelta(seconds=-1), ValueError, id="negative-timedelta"),
    pytest.param("1", TypeError, id="str"),
    pytest.param(True, TypeError, id="bool"),
    pytest.param(sys.maxsize, ValueError, id="maxsize"),
    pytest.param(1e300, ValueError, id="1e300"),
]


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.Client]:
    """A client whose server does not exist: any I/O raises ConnectionError."""
    client = aiolock.Client.from_url(CLOSED_PORT_URL, retry_attempts=0)
    yield client
    await client.aclose()


async def test_offline_client_really_is_offline(offline: aiolock.Client) -> None:
    """Control: a valid call on the closed-port client fails with ConnectionError."""
    with pytest.raises(RedisConnectionError):
        await offline.lock("valid").is_locked()


@pytest.mark.parametrize("bad", [None, 1, b"x", ["x"]], ids=["None", "int", "bytes", "list"])
def test_name_type(offline: aiolock.Client, bad: Any) -> None:
    """A name that is not a str raises TypeError naming `name`."""
    with pytest.raises(TypeError, match="name must be a str"):
        offline.lock(bad)


def test_name_empty(offline: aiolock.Client) -> None:
    """An empty name raises ValueError."""
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        offline.lock("")


@pytest.mark.parametrize("bad", ["a{b", "{}x", "x{}", "{", "a}{b", "job}1", "}", "a}b"])
def test_name_without_valid_hash_tag(offline: aiolock.Client, bad: str) -> None:
    """A name with a '{' but no non-empty {tag}, or a '}' but no '{', raises ValueError (its
    keys would split over two cluster slots: "job}1" becomes "{job}1}", tag "job")."""
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        offline.lock(bad)


@pytest.mark.parametrize("good", ["{tag}x", "a{b}c", "x{a}", "}a{b}", "{a}{", "ünïcode", " "])
def test_names_accepted(offline: aiolock.Client, good: str) -> None:
    """Names with a valid hash tag, or with no braces at all, are accepted."""
    assert offline.lock(good).name == good


def test_owner_empty(offline: aiolock.Client) -> None:
    """owner="" raises ValueError naming `owner`."""
    with pytest.raises(ValueError, match="owner"):
        offline.lock("x", owner="")


@pytest.mark.parametrize("bad", [1, b"job", object()], ids=["int", "bytes", "object"])
def test_owner_type(offline: aiolock.Client, bad: Any) -> None:
    """An owner that is not a str raises TypeError naming `owner`."""
    with pytest.raises(TypeError, match="owner"):
        offline.lock("x", owner=bad)


@pytest.mark.parametrize(("bad", "error"), BAD_LEASES)
async def test_lease_lock(offline: aiolock.Client, bad: Any, error: type[Exception]) -> None:
    """lock(lease=bad) raises before any I/O, naming `lease`."""
    with pytest.raises(error, match="lease"):
        await offline.lock("x").lock(lease=bad)


@pytest.mark.parametrize(("bad", "error"), BAD_LEASES)
async def test_lease_try_lock(offline: aiolock.Client, bad: Any, error: type[Exception]) -> None:
    """try_lock(lease=bad) raises before any I/O, naming `lease`."""
    with pytest.raises(error, match="lease"):
        await offline.lock("x").try_lock(lease=bad)


@pytest.mark.parametrize(("bad", "error"), BAD_LEASES)
def test_lease_acquired(offline: aiolock.Client, bad: Any, error: type[Exception]) -> None:
    """acquired(lease=bad) raises at the call, before the block is entered."""
    with pytest.raises(error, match="lease"):
        offline.lock("x").acquired(lease=bad)


@pytest.mark.parametrize(("bad", "error"), BAD_WAITS)
async def test_wait_try_lock(offline: aiolock.Client, bad: Any, error: type[Exception]) -> None:
    """try_lock(wait=bad) raises before any I/O, naming `wait`."""
    with pytest.raises(error, match="wait"):
        await offline.lock("x").try_lock(wait=bad)


@pytest.mark.parametrize(("bad", "error"), BAD_WAITS)
def test_wait_acquired(offline: aiolock.Client, bad: Any, error: type[Exception]) -> None:
    """acquired(wait=bad) raises at the call, before the block is entered."""
    with pytest.raises(error, match="wait"):
        offline.lock("x").acquired(wait=bad)


def td(**kwargs: float) -> Any:
    """A timedelta, typed Any: the lock methods are annotated ``float | None`` only."""
    return timedelta(**kwargs)


async def test_timedelta_lease(client: aiolock.Client, name: str) -> None:
    """A timedelta is accepted as a lease."""
    lock = client.lock(name)
    await lock.lock(lease=td(seconds=5))
    remaining = await lock.remaining_lease()
    assert remaining is not None
    assert 0 < remaining <= 5
    assert await lock.try_lock(wait=0, lease=td(milliseconds=4500))
    remaining = await lock.remaining_lease()
    assert remaining is not None
    assert 0 < remaining <= 4.5
    await lock.unlock()
    await lock.unlock()


async def test_timedelta_wait(client: aiolock.Client, name: str) -> None:
    """A timedelta is accepted as a wait, by try_lock and acquired."""
    lock = client.lock(name)
    await lock.lock()

    async def other() -> None:
        assert not await lock.try_lock(wait=td(milliseconds=50))
        with pytest.raises(aiolock.LockTimeoutError):
            async with lock.acquired(wait=td()):
                pytest.fail("acquired a held lock")

    async with asyncio.timeout(LIMIT):
        await asyncio.create_task(other())
    await lock.unlock()
    async with lock.acquired(wait=td(seconds=1), lease=td(seconds=5)):
        assert await lock.hold_count() == 1


@pytest.mark.parametrize(
    ("options", "error", "arg"),
    [
        pytest.param({"watchdog_timeout": 0}, ValueError, "watchdog_timeout", id="watchdog-0"),
        pytest.param({"watchdog_timeout": -1}, ValueError, "watchdog_timeout", id="watchdog-neg"),
        pytest.param(
            {"watchdog_timeout": math.nan}, ValueError, "watchdog_timeout", id="watchdog-nan"
        ),
        pytest.param(
            {"watchdog_timeout": math.inf}, ValueError, "watchdog_timeout", id="watchdog-inf"
        ),
        pytest.param({"watchdog_timeout": None}, TypeError, "watchdog_timeout", id="watchdog-none"),
        pytest.param({"watchdog_timeout": "30"}, TypeError, "watchdog_timeout", id="watchdog-str"),
        pytest.param({"retry_attempts": -1}, ValueError, "retry_attempts", id="retries-neg"),
        pytest.param({"retry_attempts": 1.5}, TypeError, "retry_attempts", id="retries-float"),
        pytest.param({"retry_attempts": True}, TypeError, "retry_attempts", id="retries-bool"),
        pytest.param({"retry_interval": -1}, ValueError, "retry_interval", id="interval-neg"),
        pytest.param({"subscribe_timeout": 0}, ValueError, "subscribe_timeout", id="sub-0"),
        pytest.param({"key_prefix": b"svc:"}, TypeError, "key_prefix", id="prefix-bytes"),
        # Every key would split over two cluster slots (issue 21, b07).
        pytest.param({"key_prefix": "x{}"}, ValueError, "key_prefix", id="prefix-empty-tag"),
        pytest.param({"key_prefix": "app{"}, ValueError, "key_prefix", id="prefix-open-brace"),
        pytest.param({"key_prefix": "app}"}, ValueError, "key_prefix", id="prefix-close-brace"),
        # The watchdog lease may not round to 0 ms, nor renewal every third of it be
        # meaningless (issue 21, c07); nor any time exceed what the server stores (c01).
        pytest.param(
            {"watchdog_timeout": timedelta(microseconds=400)},
            ValueError,
            "watchdog_timeout",
            id="watchdog-rounds-to-0",
        ),
        pytest.param(
            {"watchdog_timeout": 0.009}, ValueError, "watchdog_timeout", id="watchdog-floor"
        ),
        pytest.param(
            {"watchdog_timeout": sys.maxsize}, ValueError, "watchdog_timeout", id="watchdog-huge"
        ),
        pytest.param({"subscribe_timeout": 1e17}, ValueError, "subscribe_timeout", id="sub-huge"),
        pytest.param({"retry_interval": 1e17}, ValueError, "retry_interval", id="interval-huge"),
        pytest.param({"retry_attempts": 10**30}, ValueError, "retry_attempts", id="retries-huge"),
        pytest.param(
            {"fair_lock_wait_timeout": 0.0004},
            ValueError,
            "fair_lock_wait_timeout",
            id="fair-wait-rounds-to-0",
        ),
        pytest.param(
            {"fair_lock_wait_timeout": 1e17},
            ValueError,
            "fair_lock_wait_timeout",
            id="fair-wait-huge",
        ),
        pytest.param({"replica_acks": 2**63}, ValueError, "replica_acks", id="acks-huge"),
        pytest.param(
            {"replica_acks": 1, "replica_ack_timeout": 0.0004},
            ValueError,
            "replica_ack_timeout",
            id="ack-timeout-rounds-to-0",
        ),
        pytest.param({"replica_acks": -1}, ValueError, "replica_acks", id="acks-neg"),
        pytest.param({"replica_acks": 1.0}, TypeError, "replica_acks", id="acks-float"),
        pytest.param({"replica_acks": True}, TypeError, "replica_acks", id="acks-bool"),
        pytest.param(
            {"replica_acks": 1, "replica_ack_timeout": 0},
            ValueError,
            "replica_ack_timeout",
            id="ack-timeout-0",
        ),
        pytest.param(
            {"replica_acks": 1, "replica_ack_timeout": 30},
            ValueError,
            "replica_ack_timeout",
            id="ack-timeout-past-the-deadline",
        ),
    ],
)
def test_client_options(options: dict[str, Any], error: type[Exception], arg: str) -> None:
    """Bad client options raise at construction, naming the option."""
    with pytest.raises(error, match=arg):
        aiolock.Client.from_url(CLOSED_PORT_URL, **options)


async def test_client_options_on_wrapped_redis() -> None:
    """Client(redis, ...) validates its options the same way."""
    redis = Redis.from_url(CLOSED_PORT_URL)
    try:
        with pytest.raises(ValueError, match="watchdog_timeout"):
            aiolock.Client(redis, watchdog_timeout=0)
    finally:
        await redis.aclose()


def test_client_options_timedelta() -> None:
    """Time options accept a timedelta."""
    client = aiolock.Client.from_url(
        CLOSED_PORT_URL, watchdog_timeout=timedelta(seconds=9), retry_interval=timedelta(0)
    )
    assert inside.options(client).watchdog_timeout == 9.0
    assert inside.options(client).retry_interval == 0.0


def _async_client(**options: Any) -> object:
    return aiolock.Client.from_url(CLOSED_PORT_URL, **options)


def _sync_client(**options: Any) -> object:
    import aiolock.sync  # noqa: PLC0415 - only this test needs it

    return aiolock.sync.Client.from_url(CLOSED_PORT_URL, **options)


def _fastapi_lifespan(**options: Any) -> object:
    fastapi = pytest.importorskip("aiolock.integrations.fastapi")
    return fastapi.lifespan(CLOSED_PORT_URL, **options)


def _aiohttp_setup(**options: Any) -> object:
    aiohttp = pytest.importorskip("aiolock.integrations.aiohttp")
    web = pytest.importorskip("aiohttp.web")
    return aiohttp.setup(web.Application(), CLOSED_PORT_URL, **options)


@pytest.mark.parametrize(
    "make",
    [_async_client, _sync_client, _fastapi_lifespan, _aiohttp_setup],
    ids=["from_url", "sync", "fastapi", "aiohttp"],
)
@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        pytest.param({"watchdog_timout": 9}, TypeError, "'watchdog_timout'", id="misspelt"),
        pytest.param({"retry_attempts": -1}, ValueError, "retry_attempts", id="bad-value"),
        pytest.param({"cluster": "yes"}, TypeError, "cluster", id="bad-cluster"),
    ],
)
def test_every_entry_point_checks_options_when_given(
    make: Callable[..., object], options: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A misspelt or bad option fails where it is given, naming it: also in the helpers that
    make their client later, at the app's startup."""
    with pytest.raises(error, match=match):
        make(**options)


@pytest.mark.parametrize(
    "bad", [object(), None, "redis://127.0.0.1:1"], ids=["object", "None", "url"]
)
def test_client_needs_redis(bad: Any) -> None:
    """Client(x) with anything but a redis.asyncio.Redis raises TypeError naming `redis`."""
    with pytest.raises(TypeError, match="redis"):
        aiolock.Client(bad)


@pytest.mark.parametrize("bad", [None, b"redis://127.0.0.1:1"], ids=["None", "bytes"])
def test_from_url_needs_str(bad: Any) -> None:
    """Client.from_url(x) with a non-str URL raises TypeError naming `url`."""
    with pytest.raises(TypeError, match="url"):
        aiolock.Client.from_url(bad)


CLOSED_CALLS = ["lock", "try_lock", "unlock", "is_locked", "is_held_by_current_task"]
CLOSED_CALLS += ["hold_count", "remaining_lease", "force_unlock", "async_with", "acquired"]


@pytest.mark.parametrize("call", CLOSED_CALLS)
async def test_calls_after_close(make_client: ClientFactory, name: str, call: str) -> None:
    """Every lock call made after aclose() raises ClientClosedError."""
    client = make_client()
    lock = client.lock(name)
    await client.aclose()
    assert client.closed

    async def async_with() -> None:
        async with lock:
            pytest.fail("entered a lock of a closed client")

    async def acquired() -> None:
        async with lock.acquired(wait=1):
            pytest.fail("entered a lock of a closed client")

    calls: dict[str, Callable[[], Any]] = {
        "lock": lock.lock,
        "try_lock": lock.try_lock,
        "unlock": lock.unlock,
        "is_locked": lock.is_locked,
        "is_held_by_current_task": lock.is_held_by_current_task,
        "hold_count": lock.hold_count,
        "remaining_lease": lock.remaining_lease,
        "force_unlock": lock.force_unlock,
        "async_with": async_with,
        "acquired": acquired,
    }
    with pytest.raises(aiolock.ClientClosedError):
        await calls[call]()
    # A handle made after the close fails the same way.
    with pytest.raises(aiolock.ClientClosedError):
        await client.lock(name).lock()


async def test_enter_closed_client(make_client: ClientFactory) -> None:
    """`async with client` after aclose() raises ClientClosedError; aclose() is idempotent."""
    client = make_client()
    await client.aclose()
    await client.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        async with client:
            pytest.fail("entered a closed client")


def _waits(lock: aiolock.Lock) -> bool:
    return lock.statistics().tasks_waiting == 1


async def test_close_wakes_waiter(make_client: ClientFactory, name: str) -> None:
    """aclose() returns promptly and a task waiting in lock() raises ClientClosedError."""
    holder = make_client().lock(name)
    await holder.lock()
    try:
        # The close lands at a different point of the waiter's subscribe/attempt/wait
        # sequence each round: after 0, 1, 2, ... extra turns of the event loop.
        for turns in range(40):
            closing_client = make_client()
            waiting = closing_client.lock(name)
            task = asyncio.create_task(waiting.lock())
            await wait_until(partial(_waits, waiting), what="a waiter")
            for _ in range(turns):
                await asyncio.sleep(0)
            closing = asyncio.create_task(closing_client.aclose())
            # Safety net: a hung aclose() must fail the test, not end the run.
            done, _ = await asyncio.wait([closing], timeout=LIMIT)
            assert closing in done, f"aclose() hung (closed {turns} loop turns in)"
            await closing
            with pytest.raises(aiolock.ClientClosedError):
                async with asyncio.timeout(LIMIT):
                    await task
    finally:
        await holder.unlock()


@pytest.mark.parametrize("prefix", ["", "svc:", "{svc}:", "}{svc}"])
@pytest.mark.parametrize("name", ["job", "{tag}job", "job{x}"])
def test_prefix_and_name_make_one_slot(prefix: str, name: str) -> None:
    """Every accepted prefix with every accepted name makes a key whose derived keys hash
    to the key's own slot (issue 21, c08/b07)."""
    client = aiolock.Client.from_url(CLOSED_PORT_URL, key_prefix=prefix)
    key = prefix + client.lock(name).name
    slot = key_slot(key.encode())
    for derived in (lock_channel(key), fenced_token_key(key), unlock_latch_key(key, "r")):
        assert key_slot(derived.encode()) == slot, (key, derived)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c: c.semaphore("s").try_set_permits(2**63), id="try_set_permits"),
        pytest.param(lambda c: c.semaphore("s").add_permits(2**63), id="add_permits"),
        pytest.param(lambda c: c.semaphore("s").add_permits(-(2**63) - 1), id="add_permits-neg"),
        pytest.param(lambda c: c.semaphore("s").release(2**64), id="release"),
        pytest.param(lambda c: c.semaphore("s").try_acquire(2**63), id="try_acquire"),
        pytest.param(
            lambda c: c.permit_expirable_semaphore("p").try_set_permits(2**63),
            id="psem-try_set_permits",
        ),
        pytest.param(lambda c: c.count_down_latch("l").try_set_count(2**63), id="latch"),
    ],
)
async def test_counts_beyond_int64(offline: aiolock.Client, call: Any) -> None:
    """A count or a number of permits Redis cannot store as an integer is refused before any
    I/O, naming the argument (issue 21, s05)."""
    with pytest.raises(ValueError, match=r"permits|count"):
        await call(offline)
