"""The event stream (``client.add_listener``), the slow-lock log and the outage log.

Every event is checked field by field against what really happened on a real server:
an acquisition, a reentrant one, a contended wait, each way an acquire fails, a release,
a hold lost, a renewal round, a reconnection. A listener that raises never breaks a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import pytest

import aiolock
from aiolock._keys import lock_channel
from aiolock.events import (
    KINDS,
    Acquired,
    AcquireFailed,
    Event,
    Kind,
    Lost,
    Reconnected,
    Released,
    RenewalRound,
    Waiting,
)

from . import inside
from .helpers import wait_until

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from .conftest import ClientFactory
    from .faultproxy import FaultProxy


def recorder(client: aiolock.Client) -> list[Event]:
    events: list[Event] = []
    client.add_listener(events.append)
    return events


def of(events: list[Event], kind: type[Any]) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


def holder_of(client: aiolock.Client) -> str:
    """The calling task's holder id."""
    return inside.engine(client).holder(None)[0]


async def test_acquire_reentrant_release(make_client: ClientFactory, name: str) -> None:
    """Acquired (reentrant or not) and one Released at the last unlock, with their fields."""
    client = make_client()
    events = recorder(client)
    lock = client.lock(name)
    async with lock, lock:
        pass
    me = holder_of(client)
    first, second, released = events
    assert isinstance(first, Acquired)
    assert (first.kind, first.name, first.holder, first.reentrant) == ("lock", name, me, False)
    assert 0 <= first.waited < 5
    assert isinstance(second, Acquired)
    assert second.reentrant
    assert isinstance(released, Released)
    assert released == Released("lock", name, me, released.held)
    assert 0 <= released.held < 5


@pytest.mark.parametrize("kind", KINDS)
async def test_every_lock_kind_names_itself(
    make_client: ClientFactory, name: str, kind: Kind
) -> None:
    """Each lock kind's events carry its kind (the names of client.locked(kind=...))."""
    from aiolock._objects.decorator import lock_of_kind  # noqa: PLC0415 - the kinds' factory

    client = make_client()
    events = recorder(client)
    async with lock_of_kind(client, kind, name):
        pass
    assert [(type(e).__name__, e.kind) for e in events] == [  # type: ignore[union-attr]
        ("Acquired", kind),
        ("Released", kind),
    ]


async def test_contended_wait_is_measured(make_client: ClientFactory, name: str) -> None:
    """A call that waited for another task's release reports the time it waited."""
    client = make_client()
    events = recorder(client)
    lock = client.lock(name)
    await lock.lock()
    loop = asyncio.get_running_loop()

    async def contender() -> None:
        async with client.lock(name):
            pass

    waiter = asyncio.create_task(contender())
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)
    # The call started no later than now (it waits already), and ends after the release:
    # its wait covers at least the time in between. (Not from a time taken in the
    # contender before its call: under load the call's own start can come later.)
    waiting_seen = loop.time()
    await asyncio.sleep(0.1)  # the hold the contender waits out
    released_at = loop.time()
    await lock.unlock()
    await waiter
    acquired = of(events, Acquired)
    assert len(acquired) == 2
    assert acquired[1].waited >= released_at - waiting_seen
    assert not acquired[1].reentrant
    assert len(of(events, Released)) == 2


async def test_acquire_failures(make_client: ClientFactory, name: str) -> None:
    """timeout (wait ran out, wait=0 included), cancelled, error, closed: each reported."""
    client = make_client()
    events = recorder(client)
    lock = client.lock(name)
    await lock.lock()

    async def other(wait: float | None) -> bool:
        return await client.lock(name).try_lock(wait=wait)

    assert not await asyncio.create_task(other(0))
    assert not await asyncio.create_task(other(0.05))
    failed = of(events, AcquireFailed)
    assert [(f.kind, f.name, f.reason) for f in failed] == [("lock", name, "timeout")] * 2
    assert failed[1].waited >= 0.05

    waiter = asyncio.create_task(client.lock(name).lock())
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert of(events, AcquireFailed)[-1].reason == "cancelled"

    rw = client.read_write_lock(name + ":rw")
    async with rw.read_lock():
        with pytest.raises(aiolock.LockUpgradeError):
            await rw.write_lock().lock()
    assert of(events, AcquireFailed)[-1] == AcquireFailed(
        "write_lock", name + ":rw", of(events, AcquireFailed)[-1].waited, "error"
    )
    await lock.unlock()

    # Closed: a waiter woken by aclose().
    closing = make_client()
    closed_events = recorder(closing)
    await lock.lock()
    waiter = asyncio.create_task(closing.lock(name).lock())
    await wait_until(lambda: inside.waiting_room(closing).waiting(name) == 1)
    await closing.aclose()
    with pytest.raises(aiolock.ClientClosedError):
        await waiter
    assert [f.reason for f in of(closed_events, AcquireFailed)] == ["closed"]
    await lock.unlock()


async def test_lost_by_force_unlock(make_client: ClientFactory, name: str) -> None:
    """A hold deleted by this client's force_unlock(), or another's: one Lost each."""
    client = make_client()
    events = recorder(client)
    lock = client.lock(name)
    await lock.lock()
    assert await lock.force_unlock()
    lost = of(events, Lost)
    assert len(lost) == 1
    assert (lost[0].kind, lost[0].name, lost[0].how) == ("lock", name, "forced")
    assert lost[0].holder == holder_of(client)
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    assert not of(events, Released)  # lost, not released: one end per hold

    await lock.lock()
    other = make_client()
    assert await other.lock(name).force_unlock()
    await inside.renewal(client).renew_once()
    assert [loss.how for loss in of(events, Lost)] == ["forced", "renewal"]
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    assert len(of(events, Lost)) == 2


async def test_renewal_round(make_client: ClientFactory, name: str) -> None:
    """Each watchdog round: one server, the holds it renewed, its duration, no failure."""
    client = make_client(watchdog_timeout=0.3)
    events = recorder(client)
    async with client.lock(name), client.lock(name + ":2"):
        await wait_until(lambda: bool(of(events, RenewalRound)))
    round_ = of(events, RenewalRound)[0]
    assert (round_.servers, round_.holds, round_.failed) == (1, 2, 0)
    assert 0 <= round_.duration < 5


async def test_reconnected_after_client_kill(
    make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """The pub/sub and the command connections each report their reconnection."""
    client = make_client()
    events = recorder(client)
    lock = client.lock(name)
    await lock.lock()

    async def contender() -> None:
        async with client.lock(name):
            pass

    waiter = asyncio.create_task(contender())
    await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)

    async def subscribed() -> bool:
        # The waiter counts as waiting before its SUBSCRIBE is sent: a kill before the
        # pub/sub connection is open would leave nothing to reconnect.
        counts = await raw.execute_command("PUBSUB", "NUMSUB", lock_channel(name))  # type: ignore[no-untyped-call]
        return int(counts[1]) == 1

    await wait_until(subscribed, what="the waiter subscribed on the server")
    await raw.execute_command("CLIENT", "KILL", "TYPE", "pubsub")  # type: ignore[no-untyped-call]
    await wait_until(lambda: bool(of(events, Reconnected)), what="pub/sub reconnected")
    await raw.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # type: ignore[no-untyped-call]
    await lock.unlock()  # the command connection reconnects for it
    await waiter
    port = raw.connection_pool.connection_kwargs["port"]
    reconnected = of(events, Reconnected)
    assert len(reconnected) == 2
    for event in reconnected:
        assert event.server.endswith(f":{port}")
        assert 0 <= event.after < 5


async def test_raising_listener_never_breaks_a_call(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call succeeds; the error is logged once; other listeners still get events."""
    client = make_client()

    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    client.add_listener(broken)
    events = recorder(client)
    with caplog.at_level(logging.ERROR, logger="aiolock"):
        for _ in range(3):
            async with client.lock(name):
                pass
    assert len(events) >= 6
    errors = [r for r in caplog.records if "event listener" in r.getMessage()]
    assert len(errors) == 1
    assert errors[0].exc_info is not None
    client.remove_listener(broken)
    client.remove_listener(broken)  # not a listener any more: nothing happens
    with pytest.raises(TypeError, match="listener must be callable"):
        client.add_listener(42)  # type: ignore[arg-type]


async def test_slow_wait_and_slow_hold_logged(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A wait past slow_wait and a hold past slow_hold: a WARNING naming lock, holder, time."""
    client = make_client(slow_wait=0.05, slow_hold=0.05)
    lock = client.lock(name)
    holders: list[str] = []

    async def contender() -> None:
        async with client.lock(name):
            holders.append(holder_of(client))

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await lock.lock()
        waiter = asyncio.create_task(contender())
        await wait_until(lambda: inside.waiting_room(client).waiting(name) == 1)
        await asyncio.sleep(0.1)  # held, and waited for, past both thresholds
        await lock.unlock()
        await waiter
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    waited = [m for m in messages if "after waiting" in m]
    held = [m for m in messages if "after being held" in m]
    assert len(waited) == 1
    assert repr(name) in waited[0]
    assert holders[0] in waited[0]
    assert len(held) == 1
    assert repr(name) in held[0]


async def test_slow_hold_logged_once_while_held(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A watchdog hold past slow_hold is logged once while held; its release at INFO."""
    client = make_client(watchdog_timeout=0.15, slow_hold=0.05)
    with caplog.at_level(logging.INFO, logger="aiolock"):
        async with client.lock(name):
            await wait_until(lambda: any("still held" in r.getMessage() for r in caplog.records))
            rounds = inside.renewal(client).rounds
            await wait_until(lambda: inside.renewal(client).rounds >= rounds + 2)
    still = [r for r in caplog.records if "still held" in r.getMessage()]
    assert len(still) == 1
    assert still[0].levelno == logging.WARNING
    released = [r for r in caplog.records if "after being held" in r.getMessage()]
    assert [r.levelno for r in released] == [logging.INFO]


async def test_slow_log_off(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """slow_wait=None, slow_hold=None: nothing logged, however long."""
    client = make_client(slow_wait=None, slow_hold=None, watchdog_timeout=0.15)
    with caplog.at_level(logging.INFO, logger="aiolock"):
        async with client.lock(name):
            rounds = inside.renewal(client).rounds
            await wait_until(lambda: inside.renewal(client).rounds >= rounds + 2)
    assert not [r for r in caplog.records if "slow_" in r.getMessage()]


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("slow_wait", -1, ValueError),
        ("slow_hold", float("nan"), ValueError),
        ("slow_wait", "5", TypeError),
        ("slow_hold", True, TypeError),
    ],
)
def test_slow_options_validated(option: str, value: object, error: type[Exception]) -> None:
    """Bad slow_wait / slow_hold fail at construction, naming the option."""
    with pytest.raises(error, match=option):
        aiolock.Client.from_url("redis://127.0.0.1:1/0", **{option: value})  # type: ignore[arg-type]


async def test_renewal_outage_logged_once_with_count(
    proxy: FaultProxy, name: str, caplog: pytest.LogCaptureFixture, raw: Redis
) -> None:
    """A cut of several renewal periods: one WARNING, then one with the count at recovery."""
    client = aiolock.Client.from_url(
        proxy.url + "?socket_timeout=0.1", watchdog_timeout=0.6, retry_attempts=0
    )
    try:
        lock = client.lock(name)
        with caplog.at_level(logging.DEBUG, logger="aiolock"):
            await lock.lock()
            proxy.cut()

            def failures() -> int:
                return sum("renewal on" in r.getMessage() for r in caplog.records)

            await wait_until(lambda: failures() >= 3, what="renewals failing")
            await proxy.restore()
            await wait_until(
                lambda: any("works again" in r.getMessage() for r in caplog.records),
                what="recovery logged",
            )
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("could not renew" in m for m in warnings) == 1
        recovered = [m for m in warnings if "works again" in m]
        assert len(recovered) == 1
        count = int(recovered[0].split("after ")[1].split(" failed")[0])
        assert count >= 4
        with contextlib.suppress(aiolock.LockLostError):
            await lock.unlock()
    finally:
        await client.aclose()


async def test_semaphore_acquires_emit_the_acquire_events(
    make_client: ClientFactory, name: str
) -> None:
    """A semaphore's acquire calls: Acquired (no holder; nothing ends it), AcquireFailed and
    Waiting, with the semaphore's kind; drain_permits() and the latch emit nothing."""
    client = make_client()
    events = recorder(client)
    sem = client.semaphore(name)
    assert await sem.try_set_permits(1)
    await sem.acquire()
    assert not await sem.try_acquire(wait=0)
    waiting = asyncio.create_task(sem.try_acquire(wait=10))
    cancelled = asyncio.create_task(sem.acquire())
    await wait_until(lambda: len(of(events, Waiting)) == 2)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await sem.release()
    assert await waiting
    await sem.release()
    assert await sem.drain_permits() == 1
    await sem.delete()
    psem = client.permit_expirable_semaphore(name + ":p")
    assert await psem.try_set_permits(1)
    permit = await psem.acquire()
    await psem.release(permit)
    await psem.delete()
    latch = client.count_down_latch(name + ":l")
    assert await latch.try_set_count(1)
    await latch.count_down()
    assert await latch.wait(1)

    shape = [
        (type(e).__name__, e.kind, getattr(e, "reason", getattr(e, "waiting", None)))
        for e in events
        if isinstance(e, Acquired | AcquireFailed | Waiting)
    ]
    assert shape == [
        ("Acquired", "semaphore", None),
        ("AcquireFailed", "semaphore", "timeout"),
        ("Waiting", "semaphore", 1),
        ("Waiting", "semaphore", 2),
        ("Waiting", "semaphore", 1),
        ("AcquireFailed", "semaphore", "cancelled"),
        ("Waiting", "semaphore", 0),
        ("Acquired", "semaphore", None),
        ("Acquired", "permit_expirable_semaphore", None),
    ]
    for event in of(events, Acquired):
        assert event.name in {name, name + ":p"}
        assert (event.holder, event.reentrant) == ("", False)
    assert not of(events, Released)
    assert not of(events, Lost)
