"""A hold still held when its client closes ends in the events and metrics (issue 37).

``aclose()`` does not release a lock a running task holds (the task may still be in its
critical section; the lock expires with its lease), but the client stops renewing and
releasing it: the hold ends there. Every ``Acquired`` has exactly one ``Released`` or
``Lost``, so a ``Lost`` with ``how="closed"`` is emitted, and OpenTelemetry's
``aiolock.held`` falls back to 0 instead of counting the hold for ever.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.sdk.metrics.export import NumberDataPoint
from redis.asyncio import Redis

import aiolock
import aiolock.sync
from aiolock import events

from .helpers import EventLedger
from .test_otel import Telemetry


def held_total(telemetry: Telemetry) -> int:
    points = telemetry.points("aiolock.held")
    return sum(int(p.value) for p in points if isinstance(p, NumberDataPoint))


async def test_a_hold_at_close_ends_in_one_lost_event_and_the_held_gauge_returns_to_zero(
    redis_url: str, raw: Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = aiolock.Client.from_url(redis_url)
    seen: list[events.Event] = []
    client.add_listener(seen.append)
    ledger = EventLedger(client)
    telemetry = Telemetry()
    telemetry.instrument(client)
    await client.lock(name).lock()
    await client.read_write_lock(f"{name}:rw").read_lock().lock()
    assert held_total(telemetry) == 2
    caplog.set_level(logging.WARNING, logger="aiolock")
    await client.aclose()

    ends = [e for e in seen if isinstance(e, events.Released | events.Lost)]
    assert sorted(
        (type(e).__name__, e.name, e.how) for e in ends if isinstance(e, events.Lost)
    ) == [
        ("Lost", name, "closed"),
        ("Lost", f"{name}:rw", "closed"),
    ]
    assert len(ends) == 2
    assert ledger.faults == []
    assert all(count == 0 for count in ledger.open.values()), ledger.open
    assert held_total(telemetry) == 0
    # Not released (the task may still be in its critical section): it expires with its
    # lease, and the close says so.
    assert await raw.exists(name) == 1
    assert any("client closed while" in r.getMessage() for r in caplog.records)
    await raw.delete(*[key async for key in raw.scan_iter(match=f"*{name}*")])


def test_a_sync_hold_at_close_ends_too(redis_url: str, name: str) -> None:
    client = aiolock.sync.Client.from_url(redis_url, watchdog_timeout=1)
    seen: list[events.Event] = []
    client.add_listener(seen.append)
    client.lock(name).lock()
    client.close()
    assert [
        type(e) for e in seen if isinstance(e, events.Acquired | events.Released | events.Lost)
    ] == [
        events.Acquired,
        events.Lost,
    ]


async def test_a_released_hold_ends_once_not_again_at_close(redis_url: str, name: str) -> None:
    client = aiolock.Client.from_url(redis_url)
    seen: list[events.Event] = []
    client.add_listener(seen.append)
    async with client.lock(name):
        await asyncio.sleep(0)
    await client.aclose()
    assert [type(e) for e in seen if isinstance(e, events.Released | events.Lost)] == [
        events.Released
    ]
