"""Values at the server's limits: every one is refused before any I/O, or honoured whole.

Hypothesis draws every numeric argument from ordinary values and from the edges: tiny
times that round to 0 ms, the cap (aiolock._config.MAX_SECONDS) and far past it,
``sys.maxsize``, int64's bounds, 2**53. Each value is first given to a client whose server
does not exist: a ValueError there is a refusal before I/O (it must name the argument). A
value that reaches the network there must then be honoured by a real server, with nothing
half-written: every hold has an expiry no longer than asked (nothing on the server without
one, but Redisson's token counter, which never has one), a count is stored as given, and a
change the server refuses (an int64 overflow) leaves the count as it was.

Scripts called directly with values the client never sends (a bypassing caller) fail
before they write: tests/test_lua.py's layout checks pair with the last test here.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

import aiolock
from aiolock._config import MAX_COUNT, MAX_MS, MAX_SECONDS
from aiolock._net.scripts import load_script

from . import inside
from .conftest import CLOSED_PORT_URL

LIMIT = 10.0
INT64_MIN = -(2**63)

EDGE_TIMES: list[Any] = [
    sys.maxsize,
    2**63,
    2**63 - 1,
    2**53,
    2**53 + 1,
    MAX_SECONDS,
    MAX_SECONDS + 1,
    1e17,
    1e300,
    0.0004999,
    0.0005,
    0.001,
    0.0015,
    timedelta(microseconds=400),
    timedelta(milliseconds=1),
    timedelta.max,
    timedelta(seconds=MAX_SECONDS),
]
#: Times: tiny (rounding to 0 ms), ordinary, around the cap and far past it.
TIMES = st.one_of(
    st.sampled_from(EDGE_TIMES),
    st.floats(min_value=1e-12, max_value=0.002),
    st.floats(min_value=0.5, max_value=5.0),
    st.floats(min_value=MAX_SECONDS * 0.9, max_value=1e300),
    st.integers(min_value=MAX_SECONDS - 2, max_value=2**70),
)
EDGE_COUNTS = [0, 1, 2**53, 2**53 + 1, MAX_COUNT - 1, MAX_COUNT, 2**63, 2**64, INT64_MIN]
COUNTS = st.one_of(
    st.sampled_from(EDGE_COUNTS),
    st.integers(min_value=-2, max_value=3),
    st.integers(min_value=2**62, max_value=2**65),
    st.integers(min_value=-(2**65), max_value=INT64_MIN + 2),
)

LOCKS: dict[str, Callable[[aiolock.Client, str], Any]] = {
    "lock": lambda c, n: c.lock(n),
    "fenced": lambda c, n: c.fenced_lock(n),
    "spin": lambda c, n: c.spin_lock(n),
    "fair": lambda c, n: c.fair_lock(n),
    "read": lambda c, n: c.read_write_lock(n).read_lock(),
    "write": lambda c, n: c.read_write_lock(n).write_lock(),
    "fair_read": lambda c, n: c.fair_read_write_lock(n).read_lock(),
    "fair_write": lambda c, n: c.fair_read_write_lock(n).write_lock(),
}

LIMITS_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


async def refused_offline(call: Callable[[aiolock.Client], Any], *args: str) -> bool:
    """Whether ``call`` is refused before any I/O (True), or reaches the network (False).

    A refusal must be a ValueError naming one of ``args``.
    """
    offline = aiolock.Client.from_url(CLOSED_PORT_URL, retry_attempts=0)
    refusal: ValueError | None = None
    try:
        await call(offline)
    except ValueError as exc:
        refusal = exc
    except RedisConnectionError:
        return False
    else:
        raise AssertionError("the offline client answered")
    finally:
        await offline.aclose()
    assert any(arg in str(refusal) for arg in args), refusal
    return True


async def keys_of(raw: Redis, name: str) -> list[str]:
    return [key async for key in raw.scan_iter(match=f"*{name}*")]


def seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@LIMITS_SETTINGS
@given(kind=st.sampled_from(sorted(LOCKS)), lease=TIMES, wait=st.one_of(st.just(0), TIMES))
def test_a_lease_is_refused_or_honoured(redis_url: str, kind: str, lease: Any, wait: Any) -> None:
    """lease and wait of every lock kind: refused before I/O, or a hold whose keys all
    expire within the lease (none left without an expiry, none left at all after unlock)."""
    name = f"limits:{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        def attempt(c: aiolock.Client) -> Any:
            return LOCKS[kind](c, name).try_lock(wait=wait, lease=lease)

        if await refused_offline(attempt, "lease", "wait"):
            return
        lease_ms = seconds(lease) * 1000
        assert 1 <= lease_ms <= MAX_MS
        client = aiolock.Client.from_url(redis_url)
        raw = Redis.from_url(redis_url, decode_responses=True)
        try:
            lock = LOCKS[kind](client, name)
            async with asyncio.timeout(LIMIT):
                assert await lock.try_lock(wait=0, lease=lease)
            for key in await keys_of(raw, name):
                if key.startswith("redisson_lock_token:"):
                    continue  # Redisson's counter: never given an expiry (issue 21, s03)
                ttl = await raw.pttl(key)
                assert ttl != -1, f"{key} has no expiry"
                assert ttl <= max(lease_ms, inside.settings(client).latch_ttl_ms) + 1, (key, ttl)
            try:
                async with asyncio.timeout(LIMIT):
                    await lock.unlock()
            except aiolock.LockLostError:
                assert lease_ms < 1000  # only a lease that ran out meanwhile
            left = [
                key
                for key in await keys_of(raw, name)
                if not key.startswith("redisson_lock_token:") and await raw.pttl(key) == -1
            ]
            assert left == []
        finally:
            await client.aclose()
            for key in await keys_of(raw, name):
                await raw.delete(key)
            await raw.aclose()

    asyncio.run(main())


@LIMITS_SETTINGS
@given(lease=TIMES)
def test_a_permit_lease_is_refused_or_honoured(redis_url: str, lease: Any) -> None:
    """The permit-expirable semaphore's lease: refused before I/O, or a permit that expires
    within it."""
    name = f"limits:{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        def attempt(c: aiolock.Client) -> Any:
            return c.permit_expirable_semaphore(name).try_acquire(wait=0, lease=lease)

        if await refused_offline(attempt, "lease"):
            return
        client = aiolock.Client.from_url(redis_url)
        raw = Redis.from_url(redis_url, decode_responses=True)
        try:
            sem = client.permit_expirable_semaphore(name)
            assert await sem.try_set_permits(1)
            permit = await sem.try_acquire(wait=0, lease=lease)
            assert permit is not None
            # Its expiry is a lease, never Redisson's "never expires" score.
            timeouts = f"{{{name}}}:timeout"
            assert await raw.zcount(timeouts, "-inf", "+inf") == 1
            assert await raw.zcount(timeouts, 922337203685477, "+inf") == 0
        finally:
            await client.aclose()
            for key in await keys_of(raw, name):
                await raw.delete(key)
            await raw.aclose()

    asyncio.run(main())


@LIMITS_SETTINGS
@given(
    option=st.sampled_from(
        [
            "watchdog_timeout",
            "subscribe_timeout",
            "retry_interval",
            "fair_lock_wait_timeout",
            "replica_ack_timeout",
            "slow_wait",
            "slow_hold",
        ]
    ),
    value=TIMES,
)
def test_a_time_option_is_refused_or_kept_whole(option: str, value: Any) -> None:
    """Every time option: refused at construction (naming it), or every time the client
    derives from it is 1 ms .. MAX_MS (none rounds to 0 ms, none overflows an expiry)."""
    refusal: ValueError | None = None
    try:
        client = aiolock.Client.from_url(CLOSED_PORT_URL, **{option: value})
    except ValueError as exc:
        refusal = exc
    if refusal is not None:
        assert option in str(refusal) or "lower" in str(refusal), refusal
        return
    s = inside.settings(client)
    for ms in (s.lease_ms, s.latch_ttl_ms, s.resend_window_ms, s.fair_wait_ms):
        assert 1 <= ms <= MAX_MS
    if option == "watchdog_timeout":
        # Renewal every third of the lease: at least a few ms (see MIN_WATCHDOG_SECONDS).
        assert s.lease_ms >= 10
    asyncio.run(client.aclose())


@LIMITS_SETTINGS
@given(first=COUNTS, second=COUNTS)
def test_counts_are_refused_or_stored_whole(redis_url: str, first: int, second: int) -> None:
    """Semaphore permits and latch counts: refused before I/O, or stored as given; a sum
    the server cannot store (int64 overflow) is refused by it with the count unchanged."""
    name = f"limits:{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        if await refused_offline(lambda c: c.semaphore(name).try_set_permits(first), "permits"):
            assert not 0 <= first <= MAX_COUNT
            return
        client = aiolock.Client.from_url(redis_url)
        raw = Redis.from_url(redis_url, decode_responses=True)
        try:
            sem = client.semaphore(name)
            assert await sem.try_set_permits(first)
            assert await sem.available_permits() == first
            if not await refused_offline(
                lambda c: c.semaphore(name).add_permits(second), "permits"
            ):
                try:
                    await sem.add_permits(second)
                except ResponseError:
                    assert not INT64_MIN <= first + second <= MAX_COUNT
                    assert await sem.available_permits() == first
                else:
                    assert await sem.available_permits() == first + second
            latch = client.count_down_latch(name + ":latch")
            assert await latch.try_set_count(first)
            assert await latch.get_count() == first
            if first:
                await latch.count_down()
                assert await latch.get_count() == first - 1
        finally:
            await client.aclose()
            for key in await keys_of(raw, name):
                await raw.delete(key)
            await raw.aclose()

    asyncio.run(main())


# Each one Redis refuses as a time ("0100": a leading zero, which Lua would read as 100),
# and one past aiolock's cap that Redis would take.
@pytest.mark.parametrize(
    "lease", ["100000000000000000000", "1000000000001", "1e3", "0", "0100", "-5", "x", ""]
)
async def test_a_script_refuses_a_bad_lease_before_it_writes(
    raw: Redis, name: str, lease: str
) -> None:
    """A caller bypassing the client's checks (a lease PEXPIRE cannot take) gets an error
    and leaves nothing: the script checks before it writes (issue 21, c01/s02)."""
    acquire = load_script("lock_acquire").text
    with pytest.raises(ResponseError, match="aiolock: a time of"):
        await raw.eval(acquire, 2, name, f"{name}:tomb", lease, "holder:1", "1")
    assert await raw.exists(name) == 0
    # The largest time it takes is a lease like any other.
    await raw.eval(acquire, 2, name, f"{name}:tomb", "1000000000000", "holder:1", "1")
    assert await raw.pttl(name) > 999_000_000_000
    await raw.delete(name)


@pytest.mark.parametrize("count", ["2" * 20, "9223372036854775808", "007", "-1", "1.5", ""])
async def test_a_script_refuses_a_bad_count_before_it_writes(
    raw: Redis, name: str, count: str
) -> None:
    """A count Redis cannot store, or stores as a string it then cannot count with
    ("007"), is refused before anything is written."""
    try_set = load_script("semaphore_try_set").text
    keys = (name, f"{name}:channel", f"{name}:latch")
    with pytest.raises(ResponseError, match="aiolock: a count of"):
        await raw.eval(try_set, 3, *keys, count, "PUBLISH", "1000")
    assert await raw.exists(name) == 0
    # The largest count it takes is stored whole.
    assert await raw.eval(try_set, 3, *keys, "9223372036854775807", "PUBLISH", "1000")
    assert await raw.get(name) == "9223372036854775807"
    await raw.delete(name, f"{name}:latch")
