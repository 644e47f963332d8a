"""A leader's term as events, metrics and the slow-hold log tell it (issue 37).

A term is a hold of the ordinary lock ``name`` (``kind="lock"``, Redisson's layout), but
its ``Acquired``, ``Released`` and ``Lost`` events say ``leader=True`` and OpenTelemetry's
measurements carry ``aiolock.leader=true``, so a dashboard tells terms from the
application's locks. A term is meant to be long: the client's ``slow_hold`` does not apply
to it; ``client.leader(name, slow_hold=s)`` asks for its own threshold.
"""

from __future__ import annotations

import asyncio
import logging
from time import monotonic

import pytest

import aiolock
import aiolock.sync
from aiolock.events import Acquired, Event, Lost, Released

from . import inside
from .conftest import ClientFactory
from .helpers import wait_until
from .test_otel import Telemetry


def recorder(client: aiolock.Client) -> list[Event]:
    seen: list[Event] = []
    client.add_listener(seen.append)
    return seen


def ends(seen: list[Event]) -> list[tuple[str, str, bool]]:
    return [
        (type(e).__name__, e.kind, e.leader)
        for e in seen
        if isinstance(e, Acquired | Released | Lost)
    ]


async def test_a_terms_events_say_leader(make_client: ClientFactory, name: str) -> None:
    client = make_client()
    seen = recorder(client)
    async with client.leader(name).elected():
        pass
    async with client.lock(name + ":app"):
        pass
    assert ends(seen) == [
        ("Acquired", "lock", True),
        ("Released", "lock", True),
        ("Acquired", "lock", False),
        ("Released", "lock", False),
    ]


async def test_a_term_lost_says_leader(make_client: ClientFactory, name: str) -> None:
    client, other = make_client(), make_client()
    seen = recorder(client)

    async def forced_term() -> None:
        async with client.leader(name).elected():
            assert await other.lock(name).force_unlock()
            await asyncio.Event().wait()  # cancelled by the guard

    with pytest.raises(aiolock.LockLostError):
        await forced_term()
    assert [(e.kind, e.name, e.how, e.leader) for e in seen if isinstance(e, Lost)] == [
        ("lock", name, "forced", True)
    ]


async def test_opentelemetry_tells_terms_apart(make_client: ClientFactory, name: str) -> None:
    client = make_client()
    otel = Telemetry()
    otel.instrument(client)
    try:
        async with client.leader(name).elected():
            pass
        async with client.lock(name + ":app"):
            pass
        term = {"aiolock_kind": "lock", "aiolock_leader": True}
        assert otel.count("aiolock.acquire.wait", aiolock_outcome="acquired", **term) == 1
        assert otel.count("aiolock.hold.duration", aiolock_outcome="released", **term) == 1
        plain = {"aiolock_kind": "lock"}
        assert otel.count("aiolock.acquire.wait", aiolock_outcome="acquired", **plain) == 1
        assert otel.count("aiolock.hold.duration", aiolock_outcome="released", **plain) == 1
        spans = [dict(s.attributes or {}) for s in otel.spans("aiolock.release")]
        assert sorted(bool(s.get("aiolock.leader")) for s in spans) == [False, True]
    finally:
        otel.meter_provider.shutdown()
        otel.tracer_provider.shutdown()


def slow_logs(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "slow_hold" in r.getMessage() and repr(name) in r.getMessage()
    ]


async def held_past(client: aiolock.Client, seconds: float) -> None:
    """Return once held past ``seconds`` and two more renewal rounds (each logs slow holds)."""
    start = monotonic()
    await wait_until(lambda: monotonic() - start > seconds, what="held past the threshold")
    rounds = inside.renewal(client).rounds
    await wait_until(lambda: inside.renewal(client).rounds >= rounds + 2, what="two renewal rounds")


async def test_the_clients_slow_hold_spares_a_term(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(watchdog_timeout=0.15, slow_hold=0.05)
    with caplog.at_level(logging.INFO, logger="aiolock"):
        async with client.leader(name).elected():
            await held_past(client, 0.1)
        # The same client's own lock, held as long, is logged: the threshold is live.
        async with client.lock(name + ":app"):
            await held_past(client, 0.1)
    assert slow_logs(caplog, name) == []
    assert len(slow_logs(caplog, name + ":app")) == 2  # still held, then released


async def test_a_leader_with_its_own_slow_hold_is_logged(
    make_client: ClientFactory, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(watchdog_timeout=0.15, slow_hold=None)
    with caplog.at_level(logging.INFO, logger="aiolock"):
        async with client.leader(name, slow_hold=0.05).elected():
            await wait_until(lambda: bool(slow_logs(caplog, name)), what="the slow term logged")
    logged = slow_logs(caplog, name)
    assert "still held" in logged[0]
    assert "slow_hold: 0.05 s" in logged[0]


def test_a_leaders_slow_hold_is_checked(redis_url: str, name: str) -> None:
    client = aiolock.Client.from_url(redis_url)
    with aiolock.sync.Client.from_url(redis_url) as sync_client:
        for bad, error in ((-1, ValueError), ("5", TypeError)):
            with pytest.raises(error, match="slow_hold"):
                client.leader(name, slow_hold=bad)  # type: ignore[arg-type]
            with pytest.raises(error, match="slow_hold"):
                sync_client.leader(name, slow_hold=bad)  # type: ignore[arg-type]


def test_a_sync_terms_slow_hold_is_its_own(
    redis_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        aiolock.sync.Client.from_url(redis_url, watchdog_timeout=0.15, slow_hold=None) as client,
        caplog.at_level(logging.INFO, logger="aiolock"),
    ):

        def work(term: aiolock.sync.Hold) -> None:
            deadline = monotonic() + 10
            while not slow_logs(caplog, name) and monotonic() < deadline:
                term.sleep(0.01)  # the term's own sleep: raises at once if it is lost

        client.leader(name, slow_hold=0.05).run(work)
    assert "still held" in slow_logs(caplog, name)[0]
