"""``@client.locked(template, ...)``: the name from the call's arguments, a guarded hold per
call, the wait as ``acquired()``'s, every lock kind, and bad input refused early."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, assert_type

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._objects.decorator import KINDS, lock_of_kind

from .conftest import ClientFactory
from .helpers import wait_until


async def test_name_from_positional_keyword_and_default_arguments(
    client: aiolock.Client, raw: Redis, uid: str
) -> None:
    """The name is formatted from the call's arguments however they were passed, defaults
    included; the lock is held (Redisson layout: a hash named so) during the call only."""
    seen: list[tuple[str, bool]] = []

    @client.locked(uid + ":{order_id}:{region}")
    async def pay(order_id: int, amount: int = 0, *, region: str = "eu") -> int:
        name = f"{uid}:{order_id}:{region}"
        seen.append((name, await client.lock(name).is_held_by_current_task()))
        return order_id + amount

    # ParamSpec: the decorated function keeps its signature for a type checker.
    assert assert_type(await pay(1), int) == 1
    assert await pay(2, 5, region="us") == 7
    assert await pay(order_id=3, amount=1) == 4
    assert seen == [(f"{uid}:1:eu", True), (f"{uid}:2:us", True), (f"{uid}:3:eu", True)]
    assert not await raw.exists(f"{uid}:1:eu", f"{uid}:2:us", f"{uid}:3:eu")


async def test_attributes_items_and_kwargs(client: aiolock.Client, uid: str) -> None:
    """Fields may reach into an argument (``{order.id}``, ``{ids[0]}``) or a ``**kwargs``."""

    @dataclasses.dataclass
    class Order:
        id: int

    names: list[str] = []

    @client.locked(uid + ":{order.id}:{ids[0]}:{tenant}")
    async def handle(order: Order, ids: list[int], **extra: Any) -> None:
        names.append(f"{uid}:{order.id}:{ids[0]}:{extra['tenant']}")
        assert await client.lock(names[-1]).is_held_by_current_task()

    await handle(Order(7), [9], tenant="acme")
    assert names == [f"{uid}:7:9:acme"]


async def test_calls_on_one_name_exclude_each_other(client: aiolock.Client, uid: str) -> None:
    """Calls for one name never run at once."""
    running: dict[int, int] = {1: 0, 2: 0}
    most: dict[int, int] = {1: 0, 2: 0}

    @client.locked(uid + ":{key}")
    async def work(key: int) -> None:
        running[key] += 1
        most[key] = max(most[key], running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1

    await asyncio.gather(work(1), work(1), work(2), work(1), work(2))
    assert most == {1: 1, 2: 1}


async def test_wait_runs_out_as_acquired(make_client: ClientFactory, uid: str) -> None:
    """``wait`` is ``acquired(wait=...)``'s: LockTimeoutError (a TimeoutError) when it runs
    out, and the function never runs."""
    holder, other = make_client(), make_client()
    ran: list[int] = []

    @other.locked(uid + ":{n}", wait=0.1)
    async def job(n: int) -> None:
        ran.append(n)

    async with holder.lock(f"{uid}:1"):
        with pytest.raises(aiolock.LockTimeoutError) as info:
            await job(1)
    assert isinstance(info.value, TimeoutError)
    assert info.value.name == f"{uid}:1"
    await job(1)
    assert ran == [1]


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind(client: aiolock.Client, raw: Redis, uid: str, kind: Any) -> None:
    """Each kind takes that kind of lock: another handle of the kind cannot take it (the
    ``raw`` fixture then finds nothing left)."""
    name = f"{uid}:{kind}"
    factory = {
        "read_lock": lambda: client.read_write_lock(name).write_lock(),
        "fair_read_lock": lambda: client.fair_read_write_lock(name).write_lock(),
    }.get(kind, lambda: None)

    async def probe() -> bool:
        # From another task (another holder): a writer for a read lock, else the same kind.
        lock = factory() or lock_of_kind(client, kind, name)
        return await lock.try_lock(wait=0)

    @client.locked(uid + ":{k}", kind=kind)
    async def body(k: str) -> bool:
        return await asyncio.create_task(probe())

    assert await body(kind) is False


async def test_the_call_is_guarded(make_client: ClientFactory, uid: str) -> None:
    """A call whose lock is taken from it (force_unlock) is cancelled and raises
    LockLostError; the next call takes the lock again."""
    # A watchdog renewed every 0.3 s: the renewal finds the lock gone within that.
    client, admin = make_client(watchdog_timeout=0.9), make_client()
    entered = asyncio.Event()

    @client.locked(uid + ":{n}")
    async def forever(n: int) -> None:
        entered.set()
        await asyncio.Event().wait()

    call = asyncio.create_task(forever(1))
    await entered.wait()
    assert await admin.lock(f"{uid}:1").force_unlock()
    with pytest.raises(aiolock.LockLostError):
        await asyncio.wait_for(call, 10)


async def test_outside_cancel_raises_cancelled_and_releases(
    client: aiolock.Client, raw: Redis, uid: str
) -> None:
    """A call cancelled from outside raises CancelledError and leaves the lock free."""
    entered = asyncio.Event()

    @client.locked(uid + ":{n}")
    async def forever(n: int) -> None:
        entered.set()
        await asyncio.Event().wait()

    call = asyncio.create_task(forever(1))
    await entered.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_until(lambda: _gone(raw, f"{uid}:1"), what="the lock released")


async def _gone(raw: Redis, key: str) -> bool:
    return not await raw.exists(key)


def test_keeps_the_function_s_identity(client: aiolock.Client) -> None:
    """functools.wraps: name, docstring and signature are the function's."""

    @client.locked("x:{a}")
    async def f(a: int, b: str = "") -> None:
        """Doc."""

    assert f.__name__ == "f"
    assert f.__doc__ == "Doc."
    assert list(__import__("inspect").signature(f).parameters) == ["a", "b"]


# -- bad input, refused before any call ---------------------------------------------------


def test_unknown_field_refused_at_decoration(client: aiolock.Client) -> None:
    """A template naming no parameter of the function fails when decorating, naming both."""
    with pytest.raises(ValueError, match=r"'order_idd'.*pay\(\) has no parameter"):

        @client.locked("orders:{order_idd}")
        async def pay(order_id: int) -> None: ...


@pytest.mark.parametrize("template", ["orders:{}", "orders:{0}", "orders:{a", "orders:}"])
def test_bad_template_refused(client: aiolock.Client, template: str) -> None:
    """Positional or malformed fields are refused when ``locked()`` is called."""
    with pytest.raises(ValueError, match="template"):
        client.locked(template)


@pytest.mark.parametrize("template", [None, 1, b"x"])
def test_template_type(client: aiolock.Client, template: Any) -> None:
    with pytest.raises(TypeError, match="template must be a str"):
        client.locked(template)


def test_empty_template(client: aiolock.Client) -> None:
    with pytest.raises(ValueError, match="template must be a non-empty str"):
        client.locked("")


def test_unknown_kind_refused(client: aiolock.Client) -> None:
    """An unknown kind fails at once, listing the kinds."""
    with pytest.raises(ValueError, match=r"kind must be one of 'lock'.*got 'semaphore'"):
        client.locked("x", kind="semaphore")  # type: ignore[arg-type]


@pytest.mark.parametrize(("arg", "value"), [("wait", -1), ("lease", 0), ("wait", "2")])
def test_bad_times_refused(client: aiolock.Client, arg: str, value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=arg):
        client.locked("x", **{arg: value})


def test_sync_function_refused(client: aiolock.Client) -> None:
    with pytest.raises(TypeError, match="coroutine functions"):
        client.locked("x")(lambda: None)  # type: ignore[arg-type, return-value]


async def test_format_failure_at_call(client: aiolock.Client, raw: Redis) -> None:
    """A name the arguments cannot format fails at the call with ValueError naming the
    template; a bad call fails as the function would (TypeError); nothing is taken."""

    @client.locked("x:{order.id}")
    async def f(order: object) -> None: ...

    with pytest.raises(ValueError, match=r"'x:\{order.id\}' could not be formatted"):
        await f(1)
    with pytest.raises(TypeError):
        await f()  # type: ignore[call-arg]

    @client.locked("{name}")
    async def g(name: str) -> None: ...

    with pytest.raises(ValueError, match="non-empty"):
        await g("")
