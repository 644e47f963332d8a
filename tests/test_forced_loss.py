"""A hold deleted by a force is reported as ``Lost(how="forced")`` (issue 37).

aiolock knows a force when its own ``force_unlock()`` deleted the hold, and when a guarded
hold's watch hears its lock's channel while it holds (only a force publishes then): both
say ``"forced"``. The watchdog that merely finds a hold gone cannot tell a force from a
lease that ran out: ``"renewal"``. OpenTelemetry's ``aiolock.loss.reason`` is the event's
``how``.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import aiolock
from aiolock.events import Event, Lost

from . import inside
from .conftest import ClientFactory
from .test_otel import Telemetry


def recorder(client: aiolock.Client) -> list[Event]:
    seen: list[Event] = []
    client.add_listener(seen.append)
    return seen


async def forced_while_held(
    term: contextlib.AbstractAsyncContextManager[object], forcer: aiolock.Lock
) -> None:
    """Enter ``term`` (a guarded hold, a leader's term), force its lock open from inside.

    The body starts once the watch is in place: the unlock message ends the hold, and the
    guard cancels the body (the block then raises ``LockLostError``).
    """
    async with term:
        assert await forcer.force_unlock()
        await asyncio.Event().wait()


def hows(seen: list[Event]) -> list[str]:
    return [event.how for event in seen if isinstance(event, Lost)]


async def test_a_guarded_hold_forced_by_another_client_is_lost_as_forced(
    make_client: ClientFactory, name: str
) -> None:
    holder, other = make_client(), make_client()
    seen = recorder(holder)
    with pytest.raises(aiolock.LockLostError):
        await forced_while_held(holder.lock(name).guarded(), other.lock(name))
    assert hows(seen) == ["forced"]


async def test_a_leader_forced_out_is_lost_as_forced(make_client: ClientFactory, name: str) -> None:
    holder, other = make_client(), make_client()
    seen = recorder(holder)
    with pytest.raises(aiolock.LockLostError):
        await forced_while_held(holder.leader(name).elected(), other.lock(name))
    assert hows(seen) == ["forced"]


@pytest.mark.parametrize("guarded", [False, True])
async def test_this_clients_own_force_unlock_is_forced(
    make_client: ClientFactory, name: str, guarded: bool
) -> None:
    client = make_client()
    seen = recorder(client)
    lock = client.lock(name)
    if guarded:
        with pytest.raises(aiolock.LockLostError):
            await forced_while_held(lock.guarded(), client.lock(name))
    else:
        await lock.lock()
        assert await lock.force_unlock()
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()
    assert hows(seen) == ["forced"]


async def test_a_hold_the_renewal_finds_gone_stays_renewal(
    make_client: ClientFactory, name: str
) -> None:
    """Unguarded, a force elsewhere is found by the renewal, which cannot tell why."""
    client, other = make_client(), make_client()
    seen = recorder(client)
    lock = client.lock(name)
    await lock.lock()
    assert await other.lock(name).force_unlock()
    await inside.renewal(client).renew_once()
    assert hows(seen) == ["renewal"]
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()


async def test_opentelemetry_counts_a_forced_loss_as_forced(
    make_client: ClientFactory, name: str
) -> None:
    holder, other = make_client(), make_client()
    otel = Telemetry()
    otel.instrument(holder)
    with pytest.raises(aiolock.LockLostError):
        await forced_while_held(holder.leader(name).elected(), other.lock(name))
    lost = {
        point.attributes.get("aiolock.loss.reason"): point.value  # type: ignore[union-attr]
        for point in otel.points("aiolock.lease.lost")
    }
    assert lost.get("forced") == 1, lost
    otel.meter_provider.shutdown()
    otel.tracer_provider.shutdown()
