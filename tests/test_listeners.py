"""Listeners never reach aiolock's own calls and tasks, whatever they are or raise.

A listener runs inside ``lock()`` (``Acquired``), inside the renewal task
(``RenewalRound``), inside the connections' reconnects (``Reconnected``)... Review-4 s5: an
unhashable listener (a ``@dataclass`` with ``__call__``) that raised escaped the "logged,
never propagated" guard: on ``RenewalRound`` it ended the renewal task (every hold of the
client then expired while held), on ``Acquired`` it made ``lock()`` raise with the lock
taken. Each listener kind below is registered ahead of a recorder and goes through every
event kind on a real server; the calls return as they would without it, the renewal keeps
a hold past its watchdog lease, and the listeners after it still get every event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

import aiolock
from aiolock.events import (
    Acquired,
    AcquireFailed,
    Event,
    Lost,
    Reconnected,
    Released,
    RenewalRound,
    Waiting,
)

from .helpers import wait_until

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from .conftest import ClientFactory

WATCHDOG = 0.45  # renewed every 0.15 s: a hold outlives it only through the renewal task


class Bug(Exception):
    pass


class BaseBug(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


@dataclasses.dataclass
class Unhashable:
    """A stateful listener as one writes it: ``eq=True`` makes it unhashable."""

    seen: list[str] = dataclasses.field(default_factory=list)

    def __call__(self, event: Event) -> None:
        self.seen.append(type(event).__name__)
        raise Bug("listener bug")


class BadRepr:
    """Raises, and so does its repr (which the error log would print)."""

    def __call__(self, event: Event) -> None:
        raise Bug("listener bug")

    def __repr__(self) -> str:
        raise Bug("repr bug")


class AsyncCall:
    """A callable whose call returns a coroutine: never awaited by anyone."""

    async def __call__(self, event: Event) -> None:
        raise Bug("never runs")


def raises(exc: BaseException) -> Callable[[Event], None]:
    def listener(event: Event) -> None:
        raise exc

    return listener


def slow(event: Event) -> None:
    time.sleep(0.01)  # busy for a while inside the emitting call, as a blocking listener is


@dataclasses.dataclass
class Churn:
    """Removes itself and adds itself back, and adds or removes another raising listener,
    from inside every call."""

    client: aiolock.Client
    other: Callable[[Event], None] = dataclasses.field(
        default_factory=lambda: raises(Bug("churned"))
    )
    added: bool = False

    def __call__(self, event: Event) -> None:
        self.client.remove_listener(self)
        self.client.add_listener(self)
        if self.added:
            self.client.remove_listener(self.other)
        else:
            self.client.add_listener(self.other)
        self.added = not self.added


#: Each listener kind, and whether it raises (its error must then be logged).
LISTENERS: dict[str, tuple[Callable[[aiolock.Client], Any], bool]] = {
    "exception": (lambda c: raises(Bug("listener bug")), True),
    "unhashable": (lambda c: Unhashable(), True),
    "cancelled_error": (lambda c: raises(asyncio.CancelledError()), True),
    "base_exception": (lambda c: raises(BaseBug()), True),
    "generator_exit": (lambda c: raises(GeneratorExit()), True),
    "bad_repr": (lambda c: BadRepr(), True),
    "returns_coroutine": (lambda c: AsyncCall(), True),
    "slow": (lambda c: slow, False),
    "churn": (Churn, True),  # the listener it adds raises
}


def of(events: list[Event], kind: type[Any]) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


EVENT_KINDS: tuple[type[Event], ...] = (
    Acquired,
    Waiting,
    AcquireFailed,
    RenewalRound,
    Reconnected,
    Released,
    Lost,
)


async def _through_every_event(
    client: aiolock.Client, other: aiolock.Client, raw: Redis, name: str
) -> list[Event]:
    """Make ``client`` emit every event kind, checking each call behaves as it should;
    what a recorder added last got."""
    events: list[Event] = []
    client.add_listener(events.append)
    lock = client.lock(name)
    await lock.lock()  # Acquired: returns, holding
    assert await lock.hold_count() == 1
    # Another task of the client: Waiting, then AcquireFailed (timeout).
    assert not await asyncio.create_task(client.lock(name).try_lock(wait=0.01))
    # Held past its lease by the renewal task alone: rounds go on, for over WATCHDOG.
    rounds = len(of(events, RenewalRound))
    await wait_until(
        lambda: len(of(events, RenewalRound)) >= rounds + 4, what="renewal rounds go on"
    )
    assert not await other.lock(name).try_lock(wait=0)
    assert await lock.is_held_by_current_task()
    # The connections reconnect (Reconnected) and the hold is still renewed.
    await raw.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # type: ignore[no-untyped-call]
    assert await lock.hold_count() == 1
    await wait_until(lambda: bool(of(events, Reconnected)), what="reconnected")
    await lock.unlock()  # Released
    await lock.lock()
    assert await other.lock(name).force_unlock()
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()  # Lost
    for event_kind in EVENT_KINDS:
        assert of(events, event_kind), f"the recorder got no {event_kind.__name__}"
    return events


def _listener_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "event listener" in r.getMessage()]


@pytest.mark.parametrize("kind", list(LISTENERS))
async def test_a_listener_never_reaches_the_calls_nor_the_renewal(
    kind: str,
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every event kind goes through the listener: lock() returns, a hold outlives its
    watchdog lease by the renewal, every call behaves as without the listener, and a
    recorder added after it gets every event."""
    client = make_client(watchdog_timeout=WATCHDOG)
    make, raising = LISTENERS[kind]
    client.add_listener(make(client))
    caplog.set_level(logging.ERROR, logger="aiolock")
    await _through_every_event(client, make_client(), raw, name)
    if raising:
        assert _listener_errors(caplog), "the listener's error was not logged"
    else:
        assert not _listener_errors(caplog)


@pytest.mark.parametrize("event_kind", EVENT_KINDS, ids=lambda k: k.__name__)
async def test_an_unhashable_listener_failing_on_one_event_kind(
    event_kind: type[Event],
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review-4 s5 as reported: a stateful (unhashable) listener that fails on one kind of
    event only (RenewalRound has no ``name``): its first error there is logged, and the
    calls and the renewal go on."""

    @dataclasses.dataclass
    class PerName:
        counts: dict[str, int] = dataclasses.field(default_factory=dict)

        def __call__(self, event: Event) -> None:
            if isinstance(event, event_kind):
                raise Bug(f"fails on {event_kind.__name__}")
            self.counts[type(event).__name__] = self.counts.get(type(event).__name__, 0) + 1

    client = make_client(watchdog_timeout=WATCHDOG)
    listener = PerName()
    client.add_listener(listener)
    caplog.set_level(logging.ERROR, logger="aiolock")
    await _through_every_event(client, make_client(), raw, name)
    errors = _listener_errors(caplog)
    assert errors
    assert f"raised on {event_kind.__name__}" in errors[0].getMessage()
    assert event_kind.__name__ not in listener.counts
    client.remove_listener(listener)  # an unhashable listener is removed as any other


async def test_an_async_listener_is_refused(make_client: ClientFactory) -> None:
    """A coroutine function would never run (nobody awaits it): refused when added."""
    client = make_client()

    async def listener(event: Event) -> None:
        pass

    with pytest.raises(TypeError, match="coroutine function"):
        client.add_listener(listener)
