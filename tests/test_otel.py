"""aiolock.instrument_opentelemetry on a real server, read back with the OpenTelemetry SDK.

The SDK's in-memory metric reader and span exporter see exactly what an application's
exporter would: instrument names, units, attributes and span timing.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import aiolock
from aiolock import events
from aiolock._otel import Instrumentation

from .conftest import ClientFactory
from .helpers import wait_until

Point = HistogramDataPoint | NumberDataPoint


class Telemetry:
    """An SDK meter and tracer provider whose output the test reads back."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def instrument(self, client: aiolock.Client, **options: Any) -> Instrumentation:
        return aiolock.instrument_opentelemetry(
            client, self.meter_provider, self.tracer_provider, **options
        )

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        if data is None:
            return {}
        return {
            metric.name: metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            if scope.scope.name == "aiolock"
            for metric in scope.metrics
        }

    def points(self, name: str) -> list[Point]:
        metric = self.metrics().get(name)
        return [] if metric is None else list(metric.data.data_points)  # type: ignore[arg-type]

    def point(self, name: str, **attributes: Any) -> Point:
        """The one data point of ``name`` whose attributes are exactly ``attributes``
        (keyword ``aiolock_lock_name`` for ``aiolock.lock.name``, and so on)."""
        wanted = {k.replace("_", "."): v for k, v in attributes.items()}
        found = [p for p in self.points(name) if dict(p.attributes or {}) == wanted]
        assert len(found) == 1, (wanted, [dict(p.attributes or {}) for p in self.points(name)])
        return found[0]

    def count(self, name: str, **attributes: Any) -> int:
        """A histogram's count for those attributes, 0 if it has no such point."""
        wanted = {k.replace("_", "."): v for k, v in attributes.items()}
        return sum(
            p.count
            for p in self.points(name)
            if isinstance(p, HistogramDataPoint) and dict(p.attributes or {}) == wanted
        )

    def value(self, name: str, **attributes: Any) -> int | float:
        """A sum's value for those attributes, 0 if it has no such point."""
        wanted = {k.replace("_", "."): v for k, v in attributes.items()}
        return sum(
            p.value
            for p in self.points(name)
            if isinstance(p, NumberDataPoint) and dict(p.attributes or {}) == wanted
        )

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    yield telemetry
    telemetry.meter_provider.shutdown()
    telemetry.tracer_provider.shutdown()


def recorder(client: aiolock.Client) -> list[object]:
    """The events ``client`` emits, to compare the telemetry with."""
    seen: list[object] = []
    client.add_listener(seen.append)
    return seen


def attribute_names(otel: Telemetry) -> set[str]:
    names = {
        k for m in otel.metrics().values() for p in m.data.data_points for k in p.attributes or {}
    }
    return names | {k for s in otel.exporter.get_finished_spans() for k in s.attributes or {}}


async def test_lock_and_unlock(client: aiolock.Client, otel: Telemetry, name: str) -> None:
    """A hold: its wait and duration histograms, aiolock.held up then down, both spans."""
    otel.instrument(client)
    async with client.lock(name):
        assert otel.value("aiolock.held", aiolock_kind="lock") == 1
    assert otel.value("aiolock.held", aiolock_kind="lock") == 0

    found = otel.metrics()
    for metric, unit in [
        ("aiolock.acquire.wait", "s"),
        ("aiolock.hold.duration", "s"),
        ("aiolock.held", "{lock}"),
    ]:
        assert found[metric].unit == unit
        assert found[metric].description
    wait = otel.point("aiolock.acquire.wait", aiolock_kind="lock", aiolock_outcome="acquired")
    assert isinstance(wait, HistogramDataPoint)
    assert wait.count == 1
    # Advice in seconds, not the SDK's millisecond defaults.
    assert wait.explicit_bounds[0] < 0.01
    held = otel.point("aiolock.hold.duration", aiolock_kind="lock", aiolock_outcome="released")
    assert isinstance(held, HistogramDataPoint)
    assert held.count == 1

    (acquire,) = otel.spans("aiolock.acquire")
    assert acquire.status.status_code is StatusCode.UNSET
    assert dict(acquire.attributes or {}) == {"aiolock.kind": "lock", "aiolock.outcome": "acquired"}
    (release,) = otel.spans("aiolock.release")
    assert dict(release.attributes or {}) == {
        "aiolock.kind": "lock",
        "aiolock.hold.duration": held.sum,
    }
    # Lock names are unbounded: none by default.
    assert "aiolock.lock.name" not in attribute_names(otel)


async def test_reentrant_hold_counts_once(
    client: aiolock.Client, otel: Telemetry, name: str
) -> None:
    """A reentrant acquire is a wait (and a span) but not a second hold."""
    otel.instrument(client)
    lock = client.lock(name)
    async with lock, lock:
        assert otel.value("aiolock.held", aiolock_kind="lock") == 1
    assert otel.value("aiolock.held", aiolock_kind="lock") == 0
    assert otel.count("aiolock.acquire.wait", aiolock_kind="lock", aiolock_outcome="acquired") == 2
    assert otel.count("aiolock.hold.duration", aiolock_kind="lock", aiolock_outcome="released") == 1
    # The reentrant one says so; the first has no such attribute.
    spans = otel.spans("aiolock.acquire")
    assert [dict(s.attributes or {}).get("aiolock.reentrant") for s in spans] == [None, True]


async def test_contended_wait_span_covers_the_wait(
    make_client: ClientFactory, otel: Telemetry, name: str
) -> None:
    """A waiter's span starts when its call did (the event's time minus the wait) and
    is a child of the span the caller had open."""
    holder, waiter = make_client(), make_client()
    otel.instrument(waiter)
    seen = recorder(waiter)
    await holder.lock(name).lock()
    tracer = otel.tracer_provider.get_tracer("test")

    async def wait_for_it() -> None:
        with tracer.start_as_current_span("request"):
            async with waiter.lock(name).acquired(wait=10):
                pass

    task = asyncio.create_task(wait_for_it())
    await wait_until(lambda: waiter.lock(name).statistics().tasks_waiting == 1)
    await holder.lock(name).unlock()
    await task

    (acquired,) = [e for e in seen if isinstance(e, events.Acquired)]
    (span,) = otel.spans("aiolock.acquire")
    (request,) = otel.spans("request")
    assert span.start_time is not None
    assert span.end_time is not None
    assert span.end_time - span.start_time == round(acquired.waited * 1e9)
    assert span.parent is not None
    assert span.parent.span_id == request.context.span_id
    wait = otel.point("aiolock.acquire.wait", aiolock_kind="lock", aiolock_outcome="acquired")
    assert wait.sum == acquired.waited  # type: ignore[union-attr]


async def test_timeout_and_cancel_are_failed_acquires(
    make_client: ClientFactory, otel: Telemetry, name: str
) -> None:
    """A timed-out and a cancelled acquire: their outcome, and spans with status ERROR."""
    holder, waiter = make_client(), make_client()
    otel.instrument(waiter)
    await holder.lock(name).lock()
    assert not await waiter.lock(name).try_lock(wait=0.05)
    task = asyncio.create_task(waiter.lock(name).lock())
    await wait_until(lambda: waiter.lock(name).statistics().tasks_waiting == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await holder.lock(name).unlock()

    for outcome in ("timeout", "cancelled"):
        point = otel.point("aiolock.acquire.wait", aiolock_kind="lock", aiolock_outcome=outcome)
        assert point.count == 1  # type: ignore[union-attr]
    spans = {s.attributes["error.type"]: s for s in otel.spans("aiolock.acquire")}  # type: ignore[index]
    assert set(spans) == {"timeout", "cancelled"}
    for reason, span in spans.items():
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == reason
    assert otel.value("aiolock.held", aiolock_kind="lock") == 0


async def test_waiting_counts_the_calls_waiting_now(
    make_client: ClientFactory, otel: Telemetry, name: str
) -> None:
    """aiolock.waiting: up while calls wait (a spin lock's polls too), 0 once each got the
    lock, timed out or was cancelled; a call that gets the lock at once never counts."""
    holder, waiter = make_client(), make_client()
    otel.instrument(waiter)
    assert await waiter.lock(name).try_lock(wait=0)  # at once: not waiting
    await waiter.lock(name).unlock()
    await holder.lock(name).lock()
    await holder.spin_lock(name + ":spin").lock()
    gets = asyncio.create_task(waiter.lock(name, owner="w").try_lock(wait=10))
    cancelled = asyncio.create_task(waiter.lock(name).lock())
    times_out = asyncio.create_task(waiter.lock(name).try_lock(wait=0.3))
    spins = asyncio.create_task(waiter.spin_lock(name + ":spin", owner="w").try_lock(wait=10))
    await wait_until(lambda: waiter.lock(name).statistics().tasks_waiting == 3)
    await wait_until(lambda: otel.value("aiolock.waiting", aiolock_kind="spin_lock") == 1)
    assert otel.value("aiolock.waiting", aiolock_kind="lock") == 3
    cancelled.cancel()
    assert not await times_out
    assert otel.value("aiolock.waiting", aiolock_kind="lock") == 1
    await holder.lock(name).unlock()
    await holder.spin_lock(name + ":spin").unlock()
    assert await gets
    assert await spins
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert otel.value("aiolock.waiting", aiolock_kind="lock") == 0
    assert otel.value("aiolock.waiting", aiolock_kind="spin_lock") == 0
    await waiter.lock(name, owner="w").unlock()
    await waiter.spin_lock(name + ":spin", owner="w").unlock()


async def test_semaphore_acquires_are_waits_not_holds(
    make_client: ClientFactory, otel: Telemetry, name: str
) -> None:
    """A semaphore's acquire: in aiolock.acquire.wait and aiolock.waiting under its kind;
    never in aiolock.held (its permits have no holder to release them)."""
    client = make_client()
    otel.instrument(client)
    sem = client.semaphore(name)
    assert await sem.try_set_permits(1)
    await sem.acquire()
    waiting = asyncio.create_task(sem.try_acquire(wait=10))
    await wait_until(lambda: otel.value("aiolock.waiting", aiolock_kind="semaphore") == 1)
    await sem.release()
    assert await waiting
    assert otel.value("aiolock.waiting", aiolock_kind="semaphore") == 0
    assert (
        otel.count("aiolock.acquire.wait", aiolock_kind="semaphore", aiolock_outcome="acquired")
        == 2
    )
    assert otel.value("aiolock.held", aiolock_kind="semaphore") == 0
    await sem.delete()


async def test_loss_and_renewal_rounds(
    make_client: ClientFactory, otel: Telemetry, name: str
) -> None:
    """Renewal rounds of a short watchdog, then a hold lost to another client's
    force_unlock(): the lease.lost counter, a hold ended as lost, nothing held."""
    holder, other = make_client(watchdog_timeout=0.3), make_client()
    otel.instrument(holder)
    lock = holder.lock(name)
    await lock.lock()
    await wait_until(
        lambda: otel.count("aiolock.renewal.duration", aiolock_outcome="renewed") >= 2,
        what="two renewal rounds",
    )
    renewal = otel.metrics()["aiolock.renewal.duration"]
    assert renewal.unit == "s"

    assert await other.lock(name).force_unlock()
    await wait_until(
        lambda: (
            otel.value("aiolock.lease.lost", aiolock_kind="lock", aiolock_loss_reason="renewal")
            == 1
        ),
        what="the loss counted",
    )
    assert otel.metrics()["aiolock.lease.lost"].unit == "{lease}"
    lost = otel.point("aiolock.hold.duration", aiolock_kind="lock", aiolock_outcome="lost")
    assert lost.count == 1  # type: ignore[union-attr]
    assert otel.value("aiolock.held", aiolock_kind="lock") == 0
    with contextlib.suppress(aiolock.LockLostError):
        await lock.unlock()


async def test_name_attributes_when_asked(
    client: aiolock.Client, otel: Telemetry, name: str
) -> None:
    otel.instrument(client, name_attributes=True)
    async with client.lock(name):
        pass
    point = otel.point(
        "aiolock.acquire.wait",
        aiolock_kind="lock",
        aiolock_outcome="acquired",
        aiolock_lock_name=name,
    )
    assert point.count == 1  # type: ignore[union-attr]
    for span in otel.exporter.get_finished_spans():
        assert span.attributes is not None
        assert span.attributes["aiolock.lock.name"] == name


async def test_uninstrument(client: aiolock.Client, otel: Telemetry, name: str) -> None:
    """uninstrument() stops recording and takes the holds it counted back out."""
    handle = otel.instrument(client)
    lock = client.lock(name)
    await lock.lock()
    assert otel.value("aiolock.held", aiolock_kind="lock") == 1
    handle.uninstrument()
    handle.uninstrument()
    assert otel.value("aiolock.held", aiolock_kind="lock") == 0
    await lock.unlock()
    async with lock:
        pass
    assert otel.count("aiolock.acquire.wait", aiolock_kind="lock", aiolock_outcome="acquired") == 1
    assert otel.count("aiolock.hold.duration", aiolock_kind="lock", aiolock_outcome="released") == 0


async def test_works_without_an_sdk(make_client: ClientFactory, name: str) -> None:
    """With the global providers (no SDK configured) or explicit no-op ones, an
    instrumented client locks, waits and fails as before."""
    holder, client = make_client(), make_client()
    handles = [
        aiolock.instrument_opentelemetry(client),
        aiolock.instrument_opentelemetry(
            client, metrics.NoOpMeterProvider(), trace.NoOpTracerProvider(), name_attributes=True
        ),
    ]
    async with client.lock(name):
        assert not await holder.lock(name).try_lock(wait=0.01)
    async with holder.lock(name):
        assert not await client.lock(name).try_lock(wait=0.01)
    for handle in handles:
        handle.uninstrument()


_SDK_LATER = """
import asyncio, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import aiolock
from aiolock import _otel

_otel.SDK_LOOK_INTERVAL = 0.0  # look at every event: the test does not wait out a second

async def main(url, name):
    async with aiolock.Client.from_url(url) as client:
        aiolock.instrument_opentelemetry(client)
        async with client.lock(name):
            pass
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        async with client.lock(name):
            pass
        print(sorted(span.name for span in exporter.get_finished_spans()))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_spans_start_once_an_sdk_is_set_after_instrumenting(redis_url: str, name: str) -> None:
    """Instrumented before any tracer SDK is set (the global providers' proxies), a client
    makes no span while none is set, and makes them once one is: the common order of an
    application that instruments at import and configures OpenTelemetry in main()."""
    out = subprocess.run(
        [sys.executable, "-c", _SDK_LATER, redis_url, name],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['aiolock.acquire', 'aiolock.release']", out.stdout


async def test_bad_arguments(client: aiolock.Client) -> None:
    with pytest.raises(TypeError, match="client"):
        aiolock.instrument_opentelemetry(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="meter_provider"):
        aiolock.instrument_opentelemetry(client, meter_provider=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tracer_provider"):
        aiolock.instrument_opentelemetry(client, tracer_provider=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name_attributes"):
        aiolock.instrument_opentelemetry(client, name_attributes=1)  # type: ignore[arg-type]


def test_import_aiolock_does_not_import_opentelemetry() -> None:
    """``import aiolock`` adds no opentelemetry module beyond what redis-py itself imports
    (redis-py 8 may import it); ``instrument_opentelemetry`` brings it when called."""
    code = (
        "import sys; import redis, redis.asyncio; "
        "base = {m for m in sys.modules if m.startswith('opentelemetry')}; "
        "import aiolock; "
        "after = {m for m in sys.modules if m.startswith('opentelemetry')}; "
        "print(sorted(after - base), 'aiolock._otel' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[] False", out.stdout


@pytest.mark.parametrize("named", [False, True], ids=["kinds", "names"])
async def test_exported_data_is_what_the_events_say(
    make_client: ClientFactory, otel: Telemetry, name: str, named: bool
) -> None:
    """Every histogram point (count, sum, min, max, buckets), counter and span, compared
    with what the events of the same calls say: holds, a reentrant and a read hold, a
    timeout, a semaphore permit, a hold lost to force_unlock(); with and without lock names."""
    client, other = make_client(), make_client()
    otel.instrument(client, name_attributes=named)
    seen = recorder(client)
    lock = client.lock(name)
    async with lock, lock:
        assert not await other.lock(name).try_lock(wait=0)
    async with client.read_write_lock(name + ":rw").read_lock():
        pass
    await other.lock(name + ":x").lock()
    assert not await client.lock(name + ":x").try_lock(wait=0.01)
    sem = client.semaphore(name + ":sem")
    assert await sem.try_set_permits(1)
    await sem.acquire()
    await client.fair_lock(name + ":fair").lock()
    assert await client.fair_lock(name + ":fair").force_unlock()
    await wait_until(lambda: any(isinstance(e, events.Lost) for e in seen), what="the loss")
    await other.lock(name + ":x").unlock()  # another client's: no event here
    await sem.delete()

    Key = frozenset[tuple[str, Any]]

    def key(event: Any, **more: Any) -> dict[str, Any]:
        """The attributes of ``event``'s points and spans, and ``more`` (dots for _)."""
        attrs = {"aiolock.kind": event.kind} | {k.replace("_", "."): v for k, v in more.items()}
        return attrs | {"aiolock.lock.name": event.name} if named else attrs

    def exported(metric: str) -> dict[Key, Point]:
        return {frozenset(dict(p.attributes or {}).items()): p for p in otel.points(metric)}

    def expect_histogram(metric: str, values: dict[Key, list[float]]) -> None:
        points = exported(metric)
        assert set(points) == set(values)
        for attrs, got in values.items():
            point = points[attrs]
            assert isinstance(point, HistogramDataPoint)
            assert (point.count, point.sum, point.min, point.max) == (
                len(got),
                sum(got),
                min(got),
                max(got),
            )
            buckets = [0] * (len(point.explicit_bounds) + 1)
            for value in got:
                buckets[bisect.bisect_left(point.explicit_bounds, value)] += 1
            assert list(point.bucket_counts) == buckets

    waits: dict[Key, list[float]] = {}
    holds: dict[Key, list[float]] = {}
    lost: dict[Key, int] = {}
    acquire_spans: list[tuple[dict[str, Any], StatusCode, str | None, int]] = []
    release_spans: list[dict[str, Any]] = []
    for event in seen:
        if isinstance(event, events.Acquired):
            attrs = key(event, aiolock_outcome="acquired")
            waits.setdefault(frozenset(attrs.items()), []).append(event.waited)
            if event.reentrant:
                attrs["aiolock.reentrant"] = True
            acquire_spans.append((attrs, StatusCode.UNSET, None, round(event.waited * 1e9)))
        elif isinstance(event, events.AcquireFailed):
            attrs = key(event, aiolock_outcome=event.reason)
            waits.setdefault(frozenset(attrs.items()), []).append(event.waited)
            attrs["error.type"] = event.reason
            acquire_spans.append((attrs, StatusCode.ERROR, event.reason, round(event.waited * 1e9)))
        elif isinstance(event, events.Released):
            attrs = key(event, aiolock_outcome="released")
            holds.setdefault(frozenset(attrs.items()), []).append(event.held)
            release_spans.append(key(event) | {"aiolock.hold.duration": event.held})
        elif isinstance(event, events.Lost):
            attrs = key(event, aiolock_outcome="lost")
            holds.setdefault(frozenset(attrs.items()), []).append(event.held)
            reason = frozenset(key(event, aiolock_loss_reason=event.how).items())
            lost[reason] = lost.get(reason, 0) + 1
    assert any(("aiolock.outcome", "timeout") in attrs for attrs in waits)
    assert any(("aiolock.kind", "semaphore") in attrs for attrs in waits)
    assert any(("aiolock.loss.reason", "forced") in attrs for attrs in lost)
    expect_histogram("aiolock.acquire.wait", waits)
    expect_histogram("aiolock.hold.duration", holds)
    counted = exported("aiolock.lease.lost")
    assert {
        attrs: p.value for attrs, p in counted.items() if isinstance(p, NumberDataPoint)
    } == lost
    assert [
        (dict(s.attributes or {}), s.status.status_code, s.status.description,
         (s.end_time or 0) - (s.start_time or 0))
        for s in otel.spans("aiolock.acquire")
    ] == acquire_spans  # fmt: skip
    assert [dict(s.attributes or {}) for s in otel.spans("aiolock.release")] == release_spans
    for span in otel.spans("aiolock.release"):
        assert span.start_time == span.end_time
    # Nothing held now: a 0 per kind; with lock names, no series left.
    held = [(dict(p.attributes or {}), p) for p in otel.points("aiolock.held")]
    assert {
        attrs["aiolock.kind"]: p.value for attrs, p in held if isinstance(p, NumberDataPoint)
    } == ({} if named else {"lock": 0, "read_lock": 0, "fair_lock": 0})
