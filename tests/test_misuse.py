"""Bad input and misuse, each with its exact error, on every lock type.

test_validation.py covers the arguments of ``client.lock()`` and of the client itself; this
module adds the other lock types' arguments, unlocking what the caller does not hold,
unlocking through a closed client, names whose keys hold another Redis type, and servers
that refuse the client (no or a wrong password; an ACL user without scripting, SCRIPT LOAD,
PUBLISH or SUBSCRIBE).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

import aiolock
from aiolock._engine.primitive import Call
from aiolock._keys import prefixed
from aiolock._objects.fair_lock import FairPrimitive
from aiolock._objects.handle import LockHandle
from aiolock.testing import LocalServer, start_local_server

from . import inside
from .conftest import ClientFactory
from .helpers import wait_until
from .test_conformance import LOCK_FACTORIES, LockKind, LockLike

# Safety net only: every call below ends on its own, with a result or an error.
LIMIT = 10.0

_RW_KINDS = [
    LockKind(
        "ReadWriteLock.read_lock",
        lambda client, name, **kw: client.read_write_lock(name, **kw).read_lock(),
        exclusive=False,
    ),
    LockKind(
        "ReadWriteLock.write_lock",
        lambda client, name, **kw: client.read_write_lock(name, **kw).write_lock(),
    ),
]
KINDS = [
    *(k for k in LOCK_FACTORIES if not k.composite),
    *(k for k in _RW_KINDS if k.id not in {f.id for f in LOCK_FACTORIES}),
]
ALL = [pytest.param(kind, id=kind.id) for kind in KINDS]
# client.lock()'s arguments are test_validation.py's.
NOT_LOCK = [pytest.param(kind, id=kind.id) for kind in KINDS if kind.id != "Lock"]

METHODS = [
    "lock",
    "try_lock",
    "unlock",
    "force_unlock",
    "is_locked",
    "hold_count",
    "is_held_by_current_task",
    "remaining_lease",
]


def call(handle: LockLike, method: str) -> Awaitable[object]:
    """Call one of the contract's lock methods with its default arguments."""
    methods: dict[str, Callable[[], Awaitable[object]]] = {
        "lock": handle.lock,
        "try_lock": handle.try_lock,
        "unlock": handle.unlock,
        "force_unlock": handle.force_unlock,
        "is_locked": handle.is_locked,
        "hold_count": handle.hold_count,
        "is_held_by_current_task": handle.is_held_by_current_task,
        "remaining_lease": handle.remaining_lease,
    }
    return methods[method]()


def my_holder(client: aiolock.Client) -> str:
    """The calling task's holder id on ``client``."""
    return inside.engine(client).holder(None)[0]


def assert_nothing_local(handle: LockLike) -> None:
    """The handle's client believes nobody holds or waits for the name."""
    stats = handle.statistics()
    assert (stats.hold_count, stats.held_by_current_task, stats.tasks_waiting) == (0, False, 0)


async def assert_no_other_tasks() -> None:
    """Only the test's own task is left on the loop: nothing leaked, nothing still retrying."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    assert not tasks, f"tasks left behind: {tasks}"


async def drop_test_keys(raw: Redis, uid: str) -> None:
    """Delete what a test deliberately left in Redis (a hold nobody can release now)."""
    keys = [key async for key in raw.scan_iter(match=f"*{uid}*")]
    if keys:
        await raw.delete(*keys)


# -- arguments of the other lock types ------------------------------------------------------


@pytest.mark.parametrize("kind", NOT_LOCK)
@pytest.mark.parametrize("bad", [None, 1, b"x", ["x"]], ids=["None", "int", "bytes", "list"])
def test_name_type(offline: aiolock.Client, kind: LockKind, bad: Any) -> None:
    """A name that is not a str raises TypeError naming `name` and the type given."""
    with pytest.raises(TypeError, match=rf"^name must be a str, not {type(bad).__name__}$"):
        kind.make(offline, bad)


@pytest.mark.parametrize("kind", NOT_LOCK)
def test_name_empty(offline: aiolock.Client, kind: LockKind) -> None:
    """An empty name raises ValueError."""
    with pytest.raises(ValueError, match=r"^name must be a non-empty str$"):
        kind.make(offline, "")


@pytest.mark.parametrize("kind", NOT_LOCK)
def test_name_without_valid_hash_tag(offline: aiolock.Client, kind: LockKind) -> None:
    """A '{' without a valid {tag} is refused: the fair lock's and rwlock's keys would split."""
    with pytest.raises(ValueError, match=r"^name 'a\{b' has a '\{' without a valid hash tag"):
        kind.make(offline, "a{b")


@pytest.mark.parametrize("kind", NOT_LOCK)
@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        pytest.param("", ValueError, r"^owner must be a non-empty str$", id="empty"),
        pytest.param(1, TypeError, r"^owner must be a str, not int$", id="int"),
        pytest.param(b"job", TypeError, r"^owner must be a str, not bytes$", id="bytes"),
    ],
)
def test_owner(
    offline: aiolock.Client, kind: LockKind, bad: Any, error: type[Exception], message: str
) -> None:
    """A bad owner= raises at the factory call, naming `owner` and what is wrong."""
    with pytest.raises(error, match=message):
        kind.make(offline, "x", owner=bad)


BAD_LEASES = [
    pytest.param(-1, ValueError, r"^lease must be > 0 seconds, got -1", id="negative"),
    pytest.param(0, ValueError, r"^lease must be > 0 seconds, got 0", id="zero"),
    pytest.param(0.0001, ValueError, r"^lease must be at least 0\.001 seconds", id="sub-ms"),
    pytest.param(math.nan, ValueError, r"^lease must be finite, got nan", id="nan"),
    pytest.param(math.inf, ValueError, r"^lease must be finite, got inf", id="inf"),
    pytest.param(
        timedelta(seconds=-1), ValueError, r"^lease must be > 0 seconds", id="negative-timedelta"
    ),
    pytest.param("1", TypeError, r"^lease must be a number of seconds .*, not str$", id="str"),
    pytest.param(True, TypeError, r"^lease must be a number of seconds .*, not bool$", id="bool"),
]


@pytest.mark.parametrize("kind", NOT_LOCK)
@pytest.mark.parametrize(("bad", "error", "message"), BAD_LEASES)
async def test_lease(
    offline: aiolock.Client, kind: LockKind, bad: Any, error: type[Exception], message: str
) -> None:
    """lock(), try_lock() and acquired() refuse a bad lease before any I/O."""
    handle = kind.make(offline, "x")
    with pytest.raises(error, match=message):
        await handle.lock(lease=bad)
    with pytest.raises(error, match=message):
        await handle.try_lock(lease=bad)
    with pytest.raises(error, match=message):
        handle.acquired(lease=bad)
    assert_nothing_local(handle)


BAD_WAITS = [
    pytest.param(-1, ValueError, r"^wait must be >= 0 seconds, got -1", id="negative"),
    pytest.param(math.nan, ValueError, r"^wait must be finite, got nan", id="nan"),
    pytest.param(math.inf, ValueError, r"^wait must be finite, got inf", id="inf"),
    pytest.param(-math.inf, ValueError, r"^wait must be finite, got -inf", id="minus-inf"),
    pytest.param(
        timedelta(seconds=-1), ValueError, r"^wait must be >= 0 seconds", id="negative-timedelta"
    ),
    pytest.param("1", TypeError, r"^wait must be a number of seconds .*, not str$", id="str"),
    pytest.param(True, TypeError, r"^wait must be a number of seconds .*, not bool$", id="bool"),
]


@pytest.mark.parametrize("kind", NOT_LOCK)
@pytest.mark.parametrize(("bad", "error", "message"), BAD_WAITS)
async def test_wait(
    offline: aiolock.Client, kind: LockKind, bad: Any, error: type[Exception], message: str
) -> None:
    """try_lock() and acquired() refuse a bad wait before any I/O."""
    handle = kind.make(offline, "x")
    with pytest.raises(error, match=message):
        await handle.try_lock(wait=bad)
    with pytest.raises(error, match=message):
        handle.acquired(wait=bad)
    assert_nothing_local(handle)


# -- unlocking what the caller does not hold -----------------------------------------------


@pytest.mark.parametrize("kind", ALL)
async def test_unlock_never_locked(kind: LockKind, client: aiolock.Client, name: str) -> None:
    """unlock() without lock() raises LockNotOwnedError naming the lock and the caller."""
    handle = kind.make(client, name)
    with pytest.raises(aiolock.LockNotOwnedError) as info:
        await handle.unlock()
    holder = my_holder(client)
    assert type(info.value) is aiolock.LockNotOwnedError
    assert str(info.value) == f"lock {name!r} is not held by {holder}"
    assert (info.value.name, info.value.holder) == (name, holder)
    assert_nothing_local(handle)


@pytest.mark.parametrize("kind", ALL)
async def test_unlock_from_another_task(
    kind: LockKind, client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Another task's unlock() raises LockNotOwnedError naming *that* task; the hold stays."""
    handle = kind.make(client, name)
    await handle.lock()
    before = await raw.hgetall(name)

    async def other() -> tuple[str, aiolock.LockNotOwnedError]:
        with pytest.raises(aiolock.LockNotOwnedError) as info:
            await handle.unlock()
        return my_holder(client), info.value

    async with asyncio.timeout(LIMIT):
        other_holder, error = await asyncio.create_task(other())
    assert type(error) is aiolock.LockNotOwnedError
    assert other_holder != my_holder(client)
    # The error names the unlocking holder and says who does hold it: another task of
    # this client (the typical mistake: a child task of gather() or shield()).
    assert str(error).startswith(f"lock {name!r} is not held by {other_holder}: ")
    assert "held by another task of this client" in str(error)
    assert asyncio.current_task().get_name() in str(error)  # type: ignore[union-attr]
    assert await raw.hgetall(name) == before
    assert await handle.hold_count() == 1
    assert handle.statistics().hold_count == 1
    await handle.unlock()
    assert not await raw.exists(name)


@pytest.mark.parametrize("kind", ALL)
async def test_unlock_through_another_owner(
    kind: LockKind, client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A lock taken with owner= is not released by a handle without it, or with another."""
    job = kind.make(client, name, owner="job-1")
    await job.lock()
    before = await raw.hgetall(name)
    for handle, holder in [
        (kind.make(client, name), my_holder(client)),
        (kind.make(client, name, owner="job-2"), f"{client.id}:owner:job-2"),
    ]:
        with pytest.raises(aiolock.LockNotOwnedError) as info:
            await handle.unlock()
        assert str(info.value) == f"lock {name!r} is not held by {holder}"
    assert await raw.hgetall(name) == before
    await job.unlock()
    assert not await raw.exists(name)


@pytest.mark.parametrize("held", ["read", "write"])
async def test_unlock_the_other_side_of_a_read_write_lock(
    client: aiolock.Client, raw: Redis, name: str, held: str
) -> None:
    """Holding one side, unlock() of the other raises LockNotOwnedError; the hold stays."""
    rw = client.read_write_lock(name)
    sides: list[LockLike] = [rw.read_lock(), rw.write_lock()]
    mine, other = sides if held == "read" else sides[::-1]
    await mine.lock()
    before = await raw.hgetall(name)
    with pytest.raises(aiolock.LockNotOwnedError) as info:
        await other.unlock()
    assert str(info.value) == f"lock {name!r} is not held by {my_holder(client)}"
    assert await raw.hgetall(name) == before
    assert await mine.hold_count() == 1
    await mine.unlock()
    assert not await raw.exists(name)


@pytest.mark.parametrize("kind", ALL)
async def test_unlock_after_aclose_while_held(
    kind: LockKind, make_client: ClientFactory, raw: Redis, name: str, uid: str
) -> None:
    """unlock() after aclose() raises ClientClosedError, and the hold is left to its lease."""
    client = make_client()
    handle = kind.make(client, name)
    await handle.lock()
    await client.aclose()
    try:
        with pytest.raises(aiolock.ClientClosedError) as info:
            await handle.unlock()
        assert type(info.value) is aiolock.ClientClosedError
        assert str(info.value) == "the aiolock client is closed"
        # aclose() does not release (documented): the hold is still there, with a lease.
        assert await raw.exists(kind.key(name))
        assert await raw.pttl(kind.key(name)) > 0
    finally:
        await drop_test_keys(raw, uid)


# -- a name whose keys hold another Redis type ---------------------------------------------


async def put_foreign(raw: Redis, key: str, value_type: str) -> Callable[[], Awaitable[None]]:
    """Store a value of ``value_type`` at ``key``; return a check that it is untouched."""
    if value_type == "string":
        await raw.set(key, "not a lock")
    else:
        await raw.rpush(key, "not", "a", "lock")

    async def untouched() -> None:
        if value_type == "string":
            assert await raw.get(key) == "not a lock"
        else:
            assert await raw.lrange(key, 0, -1) == ["not", "a", "lock"]
        assert await raw.pttl(key) == -1

    return untouched


def assert_wrong_type_error(error: BaseException, name: str, key: str | None = None) -> None:
    """A LockError naming the lock, saying what is wrong, with Redis's WRONGTYPE as cause."""
    assert type(error) is aiolock.LockError
    message = str(error)
    assert message.startswith(f"lock {name!r}: a key it uses ({(key or name)!r}"), message
    assert "holds a value of another type" in message
    assert isinstance(error.__cause__, ResponseError)
    assert str(error.__cause__).startswith("WRONGTYPE")


@pytest.mark.parametrize("value_type", ["string", "list"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ALL)
async def test_wrong_type_at_the_lock_key(
    client: aiolock.Client, raw: Redis, name: str, *, kind: LockKind, method: str, value_type: str
) -> None:
    """Every method raises LockError naming the lock, and leaves the foreign value alone."""
    untouched = await put_foreign(raw, kind.key(name), value_type)
    handle = kind.make(client, name)
    try:
        with pytest.raises(aiolock.LockError) as info:
            async with asyncio.timeout(LIMIT):
                await call(handle, method)
        assert_wrong_type_error(info.value, name, kind.key(name))
        await untouched()
        assert_nothing_local(handle)
    finally:
        await raw.delete(kind.key(name))


@pytest.mark.parametrize(
    ("key", "value_type", "method"),
    [
        *[("queue", "string", m) for m in ("lock", "try_lock", "unlock", "force_unlock")],
        *[("timeout", t, m) for t in ("string", "list") for m in ("lock", "try_lock")],
    ],
)
async def test_wrong_type_at_a_fair_lock_key(
    client: aiolock.Client, raw: Redis, name: str, *, key: str, value_type: str, method: str
) -> None:
    """A fair lock's queue or timeout key of another type: LockError naming the lock.

    Only the calls that read that key fail; the hash queries never touch it.
    """
    foreign = f"redisson_lock_{key}:{{{name}}}"
    untouched = await put_foreign(raw, foreign, value_type)
    handle = client.fair_lock(name)
    try:
        with pytest.raises(aiolock.LockError) as info:
            async with asyncio.timeout(LIMIT):
                await call(handle, method)
        assert_wrong_type_error(info.value, name)
        await untouched()
        assert not await raw.exists(name)
        assert_nothing_local(handle)
    finally:
        await raw.delete(foreign)


# -- servers that refuse the client --------------------------------------------------------

_PASSWORD = "s3cret"
_ACL_PASSWORD = "pw"


@dataclass(frozen=True)
class Guarded:
    """A private server whose default user needs a password, plus restricted ACL users."""

    server: LocalServer

    def url(self, user: str = "", password: str = "") -> str:
        auth = f"{user}:{password}@" if user or password else ""
        return f"redis://{auth}{self.server.host}:{self.server.port}/0"


@pytest.fixture(scope="module")
def guarded() -> Iterator[Guarded]:
    """Its own process: the session server must stay open to every other test."""
    server = start_local_server()
    try:
        with redis.Redis.from_url(server.url) as admin:
            # Everything but scripting: the plain-command queries still work.
            admin.execute_command(
                "ACL", "SETUSER", "noscripting", "on", f">{_ACL_PASSWORD}", "~*", "&*", "+@all",
                "-@scripting",
            )  # fmt: skip
            # EVALSHA is allowed, but a script missing from the cache cannot be loaded.
            admin.execute_command(
                "ACL", "SETUSER", "noload", "on", f">{_ACL_PASSWORD}", "~*", "&*", "+@all",
                "-script",
            )  # fmt: skip
            # Scripts run, but a release's PUBLISH inside them is refused.
            admin.execute_command(
                "ACL", "SETUSER", "nopublish", "on", f">{_ACL_PASSWORD}", "~*", "&*", "+@all",
                "-publish",
            )  # fmt: skip
            # Everything but a waiter's subscription to its lock's channel.
            admin.execute_command(
                "ACL", "SETUSER", "nosubscribe", "on", f">{_ACL_PASSWORD}", "~*", "&*", "+@all",
                "-subscribe", "-ssubscribe", "-psubscribe",
            )  # fmt: skip
            admin.config_set("requirepass", _PASSWORD)
        yield Guarded(server)
    finally:
        server.close()


# Short: a hang must fail the test quickly, and each call here takes milliseconds.
AUTH_LIMIT = 5.0


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(
    ("password", "message"),
    [
        pytest.param("", r"(?i)authenticat", id="no-password"),
        pytest.param("wrong", r"invalid username-password pair", id="wrong-password"),
    ],
)
async def test_server_needs_a_password(
    guarded: Guarded, name: str, kind: LockKind, password: str, message: str
) -> None:
    """Every call raises redis-py's AuthenticationError as it is; nothing hangs or leaks.

    The calls come one after another on one client: a failed call must not leave anything
    behind (a background rollback or release) that the next call of the same task waits for.
    """
    # Retries cannot help here; a short pause keeps them from slowing the test down.
    client = aiolock.Client.from_url(guarded.url("", password), retry_interval=0.01)
    handle = kind.make(client, name)
    try:
        for method in METHODS:
            with pytest.raises(AuthenticationError, match=message) as info:
                async with asyncio.timeout(AUTH_LIMIT):
                    await call(handle, method)
            # Left as it is: the contract's rule for redis-py's ConnectionError family.
            assert type(info.value) is AuthenticationError, method
            assert_nothing_local(handle)
    finally:
        async with asyncio.timeout(AUTH_LIMIT):
            await client.aclose()
    assert client.closed
    await assert_no_other_tasks()


# Which calls run a script; the others are plain commands the ACL user may run.
def _scripted(kind: LockKind, method: str) -> bool:
    if method in {"lock", "try_lock", "unlock", "force_unlock"}:
        return True
    return kind.id == "ReadWriteLock.read_lock" and method == "is_locked"


_QUERY_ANSWERS: dict[str, object] = {
    "is_locked": False,
    "hold_count": 0,
    "is_held_by_current_task": False,
    "remaining_lease": None,
}


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("method", METHODS)
async def test_acl_forbids_scripting(
    guarded: Guarded, name: str, kind: LockKind, method: str
) -> None:
    """Without EVAL/EVALSHA, scripted calls raise LockError naming the lock and 'evalsha'."""
    client = aiolock.Client.from_url(guarded.url("noscripting", _ACL_PASSWORD))
    handle = kind.make(client, name)
    try:
        if _scripted(kind, method):
            with pytest.raises(aiolock.LockError) as info:
                async with asyncio.timeout(LIMIT):
                    await call(handle, method)
            assert type(info.value) is aiolock.LockError
            assert str(info.value).startswith(
                f"lock {name!r}: the server refused a command for lack of permission"
            )
            assert "no permissions to run the 'evalsha' command" in str(info.value)
            assert isinstance(info.value.__cause__, NoPermissionError)
        else:
            # Control: the same user's plain commands work, so the refusal is scripting's.
            assert await call(handle, method) == _QUERY_ANSWERS[method]
        assert_nothing_local(handle)
    finally:
        await client.aclose()
    await assert_no_other_tasks()


@pytest.mark.parametrize("kind", ALL)
async def test_acl_forbids_script_load(guarded: Guarded, name: str, kind: LockKind) -> None:
    """EVALSHA allowed, SCRIPT LOAD not, scripts not cached: LockError naming 'script|load'."""
    with redis.Redis.from_url(guarded.url("", _PASSWORD)) as admin:
        admin.script_flush()
    client = aiolock.Client.from_url(guarded.url("noload", _ACL_PASSWORD))
    handle = kind.make(client, name)
    try:
        with pytest.raises(aiolock.LockError) as info:
            async with asyncio.timeout(LIMIT):
                await handle.lock()
        assert type(info.value) is aiolock.LockError
        assert str(info.value).startswith(f"lock {name!r}: the server refused a command")
        assert "no permissions to run the 'script|load' command" in str(info.value)
        assert isinstance(info.value.__cause__, NoPermissionError)
        assert_nothing_local(handle)
    finally:
        await client.aclose()
    await assert_no_other_tasks()


# A fair lock's release publishes only to a queued waiter, so a lone holder never needs it.
# A spin lock never publishes nor subscribes (test_spin_lock_needs_no_pubsub_permission).
PUBLISHING = [param for param in ALL if param.id not in {"FairLock", "SpinLock"}]
SUBSCRIBING = [param for param in ALL if param.id != "SpinLock"]


@pytest.fixture
def guarded_admin(guarded: Guarded, name: str) -> Iterator[redis.Redis]:
    """The guarded server's default user; the test's keys are deleted at the end."""
    with redis.Redis.from_url(guarded.url("", _PASSWORD), decode_responses=True) as admin:
        yield admin
        keys = admin.keys(f"*{name}*")
        if keys:
            admin.delete(*keys)


@pytest.mark.parametrize("kind", PUBLISHING)
async def test_acl_forbids_publish(
    guarded: Guarded, guarded_admin: redis.Redis, name: str, kind: LockKind
) -> None:
    """A release whose script may not PUBLISH raises LockError naming the lock and 'publish'."""
    client = aiolock.Client.from_url(guarded.url("nopublish", _ACL_PASSWORD))
    handle = kind.make(client, name)
    try:
        await handle.lock()
        with pytest.raises(aiolock.LockError) as info:
            async with asyncio.timeout(LIMIT):
                await handle.unlock()
        assert type(info.value) is aiolock.LockError
        assert str(info.value).startswith(
            f"lock {name!r}: the server refused a command for lack of permission"
        )
        assert _refused_publish(str(info.value))
        assert isinstance(info.value.__cause__, ResponseError)
    finally:
        await client.aclose()
    await assert_no_other_tasks()


@pytest.mark.parametrize("kind", PUBLISHING)
async def test_release_refused_by_acl_changes_nothing(
    guarded: Guarded, guarded_admin: redis.Redis, name: str, kind: LockKind
) -> None:
    """An unlock() that raises leaves the lock held, as the client's bookkeeping assumes."""
    client = aiolock.Client.from_url(guarded.url("nopublish", _ACL_PASSWORD))
    handle = kind.make(client, name)
    try:
        await handle.lock()
        with pytest.raises(aiolock.LockError):
            await handle.unlock()
        assert handle.statistics().hold_count == 1
        assert guarded_admin.exists(kind.key(name))
        assert await handle.hold_count() == 1
    finally:
        await client.aclose()


def _refused_publish(text: str) -> bool:
    """Whether ``text`` reports a refused PUBLISH inside a script, as Valkey and Redis 7.2+
    word it (naming the command) or as Redis 7.0 does (without naming it)."""
    return (
        "no permissions to run the 'publish' command" in text
        or "can't run this command or subcommand script" in text
    )


def _snapshot(admin: redis.Redis, name: str) -> dict[str, tuple[str, object, bool]]:
    """Every key of the name: its type, value and whether it has an expiry."""
    read: dict[str, Callable[[str], object]] = {
        "hash": admin.hgetall,
        "list": lambda key: admin.lrange(key, 0, -1),
        "zset": lambda key: admin.zrange(key, 0, -1, withscores=True),
        "string": admin.get,
    }
    state = {}
    for key in map(str, admin.keys(f"*{name}*")):
        kind = str(admin.type(key))
        state[key] = (kind, read[kind](key), admin.pttl(key) > 0)
    return state


async def _set_up_publishing(
    handle: LockHandle, admin: redis.Redis, operation: str
) -> Callable[[], Awaitable[object]]:
    """Set ``handle``'s lock up so that ``operation`` must publish; return the call."""
    engine, p = inside.engine(handle), inside.primitive_of(handle)
    holder = engine.holder(inside.owner_of(handle))[0]
    # The call the engine would make for a lock() by this holder.
    call = Call(holder, None, p.field(holder), engine.settings.lease_ms, None, None, None, 0)
    run = inside.engine(handle).services.runner.run
    if operation != "leave":
        await handle.lock()
    if isinstance(handle, aiolock.FairLock):
        assert isinstance(p, FairPrimitive)
        # A fair lock publishes only to the waiter at the head of its queue: queue one.
        deadline = time.time() * 1000 + 60_000
        if operation == "leave":
            # This holder at the head and the lock free: leaving makes the ghost the head.
            # The ghost's deadline counts W after the holder's, which leaving takes back.
            behind = deadline + engine.settings.fair_wait_ms
            admin.rpush(p.queue, holder, "ghost")
            admin.zadd(p.timeouts, {holder: deadline, "ghost": behind})
            leave = p.leave(call)
            assert leave is not None
            return lambda: run(*leave[0])
        admin.rpush(p.queue, "ghost")
        admin.zadd(p.timeouts, {"ghost": deadline})
    if operation == "rollback":
        # What the undo of a cut-off acquire runs: give back the hold that acquire took.
        tombstone = f"{prefixed('aiolock_acquire_cancel', p.key)}:1"
        return lambda: run(*p.rollback(call, 1, tombstone, engine.settings.lease_ms))
    return handle.unlock if operation == "unlock" else handle.force_unlock


_OPERATIONS = [
    pytest.param(kind, operation, id=f"{kind.id}-{operation}")
    for kind in KINDS
    for operation in ["unlock", "force_unlock", "rollback", "leave"]
    if (operation != "leave" or kind.id == "FairLock") and kind.id != "SpinLock"
]


@pytest.mark.parametrize(("kind", "operation"), _OPERATIONS)
async def test_publish_refused_by_acl_changes_nothing(
    guarded: Guarded, guarded_admin: redis.Redis, name: str, kind: LockKind, operation: str
) -> None:
    """A script whose PUBLISH is refused fails with every key as it was before the call.

    The refusal is an error inside the script, and Redis keeps the writes a script made
    before an error: each script that publishes must do so before it writes anything.
    """
    client = aiolock.Client.from_url(guarded.url("nopublish", _ACL_PASSWORD))
    handle = kind.make(client, name)
    assert isinstance(handle, LockHandle)
    try:
        run = await _set_up_publishing(handle, guarded_admin, operation)
        before = _snapshot(guarded_admin, name)
        with pytest.raises((aiolock.LockError, ResponseError)) as info:
            async with asyncio.timeout(LIMIT):
                await run()
        assert _refused_publish(str(info.value))
        assert _snapshot(guarded_admin, name) == before
    finally:
        await client.aclose()


@pytest.mark.parametrize("user", ["nopublish", "nosubscribe"])
async def test_spin_lock_needs_no_pubsub_permission(
    guarded: Guarded, guarded_admin: redis.Redis, name: str, user: str
) -> None:
    """A spin lock is taken, waited for, and released without PUBLISH or SUBSCRIBE."""
    client = aiolock.Client.from_url(guarded.url(user, _ACL_PASSWORD))
    holder = client.spin_lock(name, owner="holder")
    try:
        await holder.lock()

        async def take() -> bool:
            spin = client.spin_lock(name)
            taken = await spin.try_lock(wait=LIMIT)
            await spin.unlock()
            return taken

        waiter = asyncio.create_task(take())
        await wait_until(lambda: holder.statistics().tasks_waiting == 1)
        await holder.unlock()
        async with asyncio.timeout(LIMIT):
            assert await waiter
        assert not guarded_admin.exists(name)
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", SUBSCRIBING)
async def test_acl_forbids_subscribe(
    guarded: Guarded,
    guarded_admin: redis.Redis,
    name: str,
    kind: LockKind,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without SUBSCRIBE, a waiter fails at once with the refusal, not after subscribe_timeout.

    The pub/sub reader keeps asking (the ACL may be fixed) but backs off, and logs the
    refusal once, without a traceback.
    """
    caplog.set_level(logging.DEBUG, logger="aiolock")
    # Waiting out a subscribe_timeout longer than LIMIT fails the test.
    client = aiolock.Client.from_url(
        guarded.url("nosubscribe", _ACL_PASSWORD), subscribe_timeout=60
    )
    if kind.exclusive:
        blocker = kind.make(client, name, owner="blocker")
    elif kind.id == "FairReadLock":
        blocker = client.fair_read_write_lock(name, owner="blocker").write_lock()
    else:
        blocker = client.read_write_lock(name, owner="blocker").write_lock()
    handle = kind.make(client, name)
    try:
        assert await blocker.try_lock()
        # The second waiter comes while the reader is still retrying the refused channel.
        waits: list[Callable[[], Awaitable[object]]] = [
            handle.lock,
            lambda: handle.try_lock(wait=LIMIT * 2),
        ]
        for wait in waits:
            with pytest.raises(aiolock.LockError) as info:
                async with asyncio.timeout(LIMIT):
                    await wait()
            assert type(info.value) is aiolock.LockError
            assert isinstance(info.value.__cause__, NoPermissionError)
            assert "no permissions to run the 'subscribe' command" in str(info.value)
            assert f"lock {name!r}" in str(info.value)
            assert_nothing_local(handle)
        await blocker.unlock()
    finally:
        await client.aclose()
    await assert_no_other_tasks()
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [r.levelname for r in refusals if r.levelno >= logging.WARNING] == ["WARNING"]
    assert not [r for r in caplog.records if r.exc_info]
    # Backing off, the reader asks a handful of times in this test's second or so; without
    # it, it asked about 90 times a second.
    assert len(refusals) <= 15, len(refusals)
