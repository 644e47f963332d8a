"""A client where it does not belong: in a forked child, from another event loop.

Every public call of the client and of every handle kind (:data:`CALLS`) is made there and
must raise ``RuntimeError`` before any I/O: the client talks to the server through a fault
proxy that counts every command and connection, and must count none. The owner's client
goes on unaffected: its hold, its parked waiter (pub/sub) and its next calls all work.
A handle class that grows a public call fails :func:`test_every_public_call_is_enumerated`
until the call joins :data:`CALLS`, so a new call is covered the day it is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

import aiolock

from . import inside
from .faultproxy import FaultProxy
from .helpers import subscriptions_confirmed, wait_until

Call = Callable[[Any], Awaitable[object]]

# Forking a process that runs threads (pytest-xdist's worker does) warns from Python 3.12
# on; these children only make calls that must fail before any I/O, then _exit.
pytestmark = pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks")


async def _enter(cm: contextlib.AbstractAsyncContextManager[Any]) -> object:
    async with cm:
        return None


_LOCK: dict[str, Call] = {
    "lock": lambda h: h.lock(),
    "try_lock": lambda h: h.try_lock(),
    "unlock": lambda h: h.unlock(),
    "extend": lambda h: h.extend(5),
    "force_unlock": lambda h: h.force_unlock(),
    "is_locked": lambda h: h.is_locked(),
    "is_held_by_current_task": lambda h: h.is_held_by_current_task(),
    "hold_count": lambda h: h.hold_count(),
    "remaining_lease": lambda h: h.remaining_lease(),
    "acquired": lambda h: _enter(h.acquired()),
    "guarded": lambda h: _enter(h.guarded()),
    "__aenter__": lambda h: h.__aenter__(),
    "__aexit__": lambda h: h.__aexit__(None, None, None),
}
_PERMIT = "0" * 32  # a well-formed permit id: what is refused must be the place, not the id

#: Every public call that may do I/O, per handle kind (and the client's own).
CALLS: dict[str, dict[str, Call]] = {
    "lock": _LOCK,
    "fair_lock": _LOCK,
    "read_lock": _LOCK,
    "write_lock": _LOCK,
    "fair_read_lock": _LOCK,
    "fair_write_lock": _LOCK,
    "spin_lock": _LOCK,
    "fenced_lock": {
        **_LOCK,
        "lock_and_get_token": lambda h: h.lock_and_get_token(),
        "try_lock_and_get_token": lambda h: h.try_lock_and_get_token(),
    },
    "multi_lock": _LOCK,
    "red_lock": _LOCK,
    "leader": {
        "elected": lambda h: _enter(h.elected()),
        "run": lambda h: h.run(_nothing),
    },
    # A function decorated with client.locked(): its call takes the lock.
    "locked": {"__call__": lambda f: f(7)},
    "semaphore": {
        "acquire": lambda h: h.acquire(),
        "try_acquire": lambda h: h.try_acquire(),
        "release": lambda h: h.release(),
        "add_permits": lambda h: h.add_permits(1),
        "try_set_permits": lambda h: h.try_set_permits(1),
        "available_permits": lambda h: h.available_permits(),
        "drain_permits": lambda h: h.drain_permits(),
        "delete": lambda h: h.delete(),
        "acquired": lambda h: _enter(h.acquired()),
        "__aenter__": lambda h: h.__aenter__(),
        "__aexit__": lambda h: h.__aexit__(None, None, None),
    },
    "permit_expirable_semaphore": {
        "acquire": lambda h: h.acquire(),
        "try_acquire": lambda h: h.try_acquire(),
        "release": lambda h: h.release(_PERMIT),
        "add_permits": lambda h: h.add_permits(1),
        "try_set_permits": lambda h: h.try_set_permits(1),
        "available_permits": lambda h: h.available_permits(),
        "set_permits": lambda h: h.set_permits(1),
        "delete": lambda h: h.delete(),
        "acquired": lambda h: _enter(h.acquired()),
    },
    "count_down_latch": {
        "count_down": lambda h: h.count_down(),
        "get_count": lambda h: h.get_count(),
        "try_set_count": lambda h: h.try_set_count(1),
        "wait": lambda h: h.wait(0),
    },
    # Last: before the fix, aclose() would have closed the client for the calls after it.
    "client": {
        "aclose": lambda c: c.aclose(),
        "__aenter__": lambda c: c.__aenter__(),
        "__aexit__": lambda c: c.__aexit__(None, None, None),
    },
}

#: Public names that never do I/O (properties, statistics, handle factories).
LOCAL = frozenset(
    {
        "name",
        "owner",
        "client_id",
        "statistics",
        "tasks_waiting",
        "read_lock",
        "write_lock",
        "is_leader",
        # The client's listeners: local state, no I/O.
        "add_listener",
        "remove_listener",
    }
)


#: The client's handle factories: they send nothing.
FACTORIES = frozenset(
    {
        "lock",
        "fair_lock",
        "read_write_lock",
        "fair_read_write_lock",
        "fenced_lock",
        "spin_lock",
        "semaphore",
        "permit_expirable_semaphore",
        "count_down_latch",
        "leader",
        "locked",
    }
)


def handles(client: aiolock.Client, name: str) -> dict[str, Any]:
    """One handle of every kind on ``client`` (and the client itself), named after ``name``."""
    rw = client.read_write_lock(f"{name}:rw")
    frw = client.fair_read_write_lock(f"{name}:frw")
    return {
        "client": client,
        "lock": client.lock(f"{name}:lock"),
        "fair_lock": client.fair_lock(f"{name}:fair"),
        "read_lock": rw.read_lock(),
        "write_lock": rw.write_lock(),
        "fair_read_lock": frw.read_lock(),
        "fair_write_lock": frw.write_lock(),
        "spin_lock": client.spin_lock(f"{name}:spin"),
        "fenced_lock": client.fenced_lock(f"{name}:fenced"),
        "multi_lock": aiolock.MultiLock(client.lock(f"{name}:m1"), client.lock(f"{name}:m2")),
        "red_lock": aiolock.RedLock(
            client.lock(f"{name}:r1"), client.lock(f"{name}:r2"), client.lock(f"{name}:r3")
        ),
        "semaphore": client.semaphore(f"{name}:sem"),
        "permit_expirable_semaphore": client.permit_expirable_semaphore(f"{name}:psem"),
        "count_down_latch": client.count_down_latch(f"{name}:latch"),
        "leader": client.leader(f"{name}:leader"),
        "locked": client.locked(f"{name}:job:{{n}}")(_job),
    }


async def _nothing() -> None:
    return None


async def _job(n: int) -> int:
    return n


def test_every_public_call_is_enumerated() -> None:
    """CALLS names every public call of every handle kind: a new one must join it."""
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")
    for kind, handle in handles(client, "x").items():
        cls = type(handle)
        public = {n for n in dir(cls) if not n.startswith("_")}
        public |= {n for n in ("__aenter__", "__aexit__") if hasattr(cls, n)}
        if kind == "client":
            public -= FACTORIES | {"closed", "from_url"}
        if kind == "leader":
            public -= {"lock"}  # the property: the term's lock handle
        if kind == "locked":
            public = {"__call__"}
        assert public - LOCAL == set(CALLS[kind]), kind


async def _refusals(made: dict[str, Any]) -> dict[str, str]:
    """Make every call of CALLS on ``made``; map each that was not refused to its outcome.

    Refused means RuntimeError saying why (a process or event loop not the client's). Each
    call is bounded: one that did I/O could wait for a reply that never comes.
    """
    wrong: dict[str, str] = {}
    for kind, calls in CALLS.items():
        for call, fn in calls.items():
            try:
                async with asyncio.timeout(2):
                    await fn(made[kind])
                outcome = "returned"
            except RuntimeError as exc:
                if "process" in str(exc) or "event loop" in str(exc):
                    continue
                outcome = f"RuntimeError: {exc}"
            except BaseException as exc:  # any other outcome is the finding
                outcome = f"{type(exc).__name__}: {exc}"
            wrong[f"{kind}.{call}"] = outcome[:200]
    return wrong


def _counts(proxy: FaultProxy) -> tuple[int, int]:
    """Commands and connections the proxy has seen so far, from any process.

    Not PING: the owner's pub/sub keepalive (every 10 s of silence) may fall in the window
    on a slow run (a command its own loop sent, which the check must not count).
    """
    commands = proxy.stats.commands
    return sum(commands.values()) - commands["PING"], proxy.stats.connections_accepted


async def _in_child(
    child: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
) -> dict[str, Any]:
    """Fork; run ``child()`` in the child in a new event loop; return what it returned.

    The parent's loop keeps running meanwhile (its proxy, its client's tasks).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; it never returns into pytest
        status = 1
        try:
            os.close(read_fd)
            # Python 3.11 does not reset the running loop in a child forked inside it
            # (3.12 does): the child's asyncio.run() would refuse to start.
            asyncio.events._set_running_loop(None)
            os.write(write_fd, json.dumps(asyncio.run(child())).encode())
            status = 0
        except BaseException as exc:
            os.write(write_fd, json.dumps({"child failed": repr(exc)}).encode())
        finally:
            os._exit(status)
    os.close(write_fd)
    reaped = False

    async def ended() -> bool:
        nonlocal reaped
        reaped = os.waitpid(pid, os.WNOHANG) != (0, 0)  # noqa: ASYNC222 - WNOHANG never blocks
        return reaped

    try:
        await wait_until(ended, limit=20, what="the child exited")
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if not reaped:  # a child stuck past the limit
            os.kill(pid, 9)
            os.waitpid(pid, 0)  # noqa: ASYNC222
    result: dict[str, Any] = json.loads(b"".join(chunks))
    return result


async def _in_use(client: aiolock.Client, other: aiolock.Client, name: str) -> asyncio.Task[bool]:
    """Put ``client`` to use: a watchdog hold (renewal) and a waiter parked on a lock
    ``other`` holds (pub/sub); return the waiter."""
    await client.lock(f"{name}:mine").lock()
    await other.lock(f"{name}:theirs").lock()
    theirs = client.lock(f"{name}:theirs")

    async def wait_then_release() -> bool:
        got = await theirs.try_lock(wait=30)
        if got:
            await theirs.unlock()
        return got

    waiter = asyncio.create_task(wait_then_release())
    await wait_until(lambda: subscriptions_confirmed(client), what="the waiter parked")
    return waiter


async def _unaffected(
    client: aiolock.Client, other: aiolock.Client, name: str, waiter: asyncio.Task[bool]
) -> None:
    """The owner's client works as before: its waiter is woken, its hold is its own."""
    mine = client.lock(f"{name}:mine")
    async with asyncio.timeout(5):
        # c06: a lock another client holds is not the owner's for the asking.
        assert not await client.lock(f"{name}:theirs").try_lock(wait=0)
        await other.lock(f"{name}:theirs").unlock()
        assert await waiter  # woken through its pub/sub connection
        assert await mine.hold_count() == 1
        await mine.unlock()


async def test_a_forked_child_is_refused_every_call(
    proxy: FaultProxy, make_client: Any, raw: Redis, name: str
) -> None:
    """c06: in a forked child every call raises RuntimeError and sends nothing, garbage
    collection closes nothing of the parent's, and the parent goes on unaffected."""
    # A long watchdog: the owner's renewal (every third of it) stays out of the window.
    client = aiolock.Client.from_url(proxy.url, watchdog_timeout=300)
    other = make_client()
    waiter = await _in_use(client, other, name)
    made = handles(client, name)
    before = _counts(proxy)

    async def child() -> dict[str, Any]:
        wrong = await _refusals(made)
        # Below the calls: the inherited command connection is never written either.
        try:
            await inside.transport(client).call(b"*1\r\n$4\r\nPING\r\n")
            wrong["transport.call"] = "returned"
        except RuntimeError as exc:
            if "forked" not in str(exc):
                wrong["transport.call"] = repr(exc)
        # What garbage collection and interpreter exit run: the client warns of nothing,
        # and redis-py's connections close nothing (in a running loop, as at a child's
        # asyncio.run() end). A close would unregister the parent's sockets from the
        # epoll instance the child shares with it: the parent would never hear again.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client.__del__()
            for wire in inside.open_wires():
                # redis-py 5.1 on has one
                collect = getattr(inside.connection_of(wire), "__del__", None)
                if collect is not None:
                    collect()
        if caught:
            wrong["__del__"] = str(caught[0].message)
        return wrong

    assert await _in_child(child) == {}
    assert _counts(proxy) == before, "the child sent a command or opened a connection"
    await _unaffected(client, other, name, waiter)
    await client.aclose()


async def test_a_client_first_used_in_a_forked_child_is_the_childs(
    make_client: Any, raw: Redis, name: str
) -> None:
    """A client made before a fork but used first in the child (gunicorn --preload) works
    there, on connections of its own; the parent's copy works in the parent."""
    client = make_client()

    async def child() -> dict[str, Any]:
        lock = client.lock(name)
        async with client:
            await lock.lock()
            held = await lock.hold_count()
            await lock.unlock()
        return {"held": held}

    assert await _in_child(child) == {"held": 1}
    lock = client.lock(name)
    await lock.lock()
    assert await lock.hold_count() == 1
    await lock.unlock()


async def test_another_event_loop_is_refused_every_call(
    proxy: FaultProxy, make_client: Any, raw: Redis, name: str
) -> None:
    """c05: from a second event loop (another thread's) every call raises RuntimeError and
    sends nothing; the client goes on in its own loop."""
    # A long watchdog: the owner's renewal (every third of it) stays out of the window.
    client = aiolock.Client.from_url(proxy.url, watchdog_timeout=300)
    other = make_client()
    waiter = await _in_use(client, other, name)
    made = handles(client, name)
    before = _counts(proxy)
    wrong: list[dict[str, str]] = []
    # A plain thread, joined once done: an idle executor thread would make later forks
    # in this process warn.
    thread = threading.Thread(target=lambda: wrong.append(asyncio.run(_refusals(made))))
    thread.start()
    await wait_until(lambda: not thread.is_alive(), what="the other loop's calls ended")
    thread.join()
    assert wrong == [{}]
    assert _counts(proxy) == before, "a command or connection came from the other loop"
    await _unaffected(client, other, name, waiter)
    await client.aclose()


def test_a_second_asyncio_run_is_refused_before_any_io(redis_url: str, name: str) -> None:
    """c05: the loop that used a client has ended; a second asyncio.run() with it is told
    so, and never takes the lock (held by nobody for its lease, before the fix)."""
    client = aiolock.Client.from_url(redis_url)
    lock = client.lock(name)
    first = asyncio.new_event_loop()
    try:

        async def once() -> None:
            await lock.lock()
            await lock.unlock()

        first.run_until_complete(once())
        with pytest.raises(RuntimeError, match="another one"):
            asyncio.run(lock.lock())
        redis = SyncRedis.from_url(redis_url)
        try:
            assert not redis.exists(name), "the second loop's acquire reached the server"
        finally:
            redis.close()
        first.run_until_complete(client.aclose())
    finally:
        first.close()
