"""OpenTelemetry metrics and traces for a client, built on its event stream only.

``aiolock.instrument_opentelemetry`` imports this module on first call, so ``import aiolock``
never imports ``opentelemetry`` (the ``aiolock[otel]`` extra). Everything here is a listener
of ``client.add_listener``: it sees what the engine already emits and adds no round trip.

Events are emitted once a step is over (an acquire's event carries how long it waited), so
the ``aiolock.acquire`` span is created afterwards with an explicit start time (the event's
time minus the wait) and ended at once. A listener runs synchronously in the task that made
the call, so that span's parent is whatever span the caller has open.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode

from . import events

# Attribute names, namespaced as OpenTelemetry's semantic conventions ask.
KIND: Final = "aiolock.kind"
OUTCOME: Final = "aiolock.outcome"
LOCK_NAME: Final = "aiolock.lock.name"
HOLDER: Final = "aiolock.holder"
LOSS_REASON: Final = "aiolock.loss.reason"
REENTRANT: Final = "aiolock.reentrant"
HOLD_DURATION: Final = "aiolock.hold.duration"
ERROR_TYPE: Final = "error.type"  # the conventions' own name for why an operation failed

# Bucket advice in seconds: the SDK's default buckets (0 to 10000) are made for
# milliseconds and would put every wait under a second into one bucket.
_WAIT_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 300.0,
)  # fmt: skip
_HOLD_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
_RENEWAL_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

_SCOPE: Final = "aiolock"
_NS: Final = 1_000_000_000

Attributes = Mapping[str, Any]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - once

    try:
        return version("aiolock")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return ""


class Instrumentation:
    """What ``aiolock.instrument_opentelemetry`` returns.

    The client's listener that feeds the instruments and spans; :meth:`uninstrument`
    removes it.
    """

    __slots__ = (
        "_acquire_wait",
        "_attrs",
        "_client",
        "_held",
        "_hold_duration",
        "_holds",
        "_lease_lost",
        "_listener",
        "_name_attributes",
        "_renewal_duration",
        "_spans",
        "_tracer",
        "_waiting",
        "_waiting_told",
    )

    def __init__(
        self,
        client: Any,
        meter_provider: metrics.MeterProvider | None,
        tracer_provider: trace.TracerProvider | None,
        *,
        name_attributes: bool,
    ) -> None:
        version = _version()
        meter = metrics.get_meter(_SCOPE, version, meter_provider)
        self._tracer = trace.get_tracer(_SCOPE, version, tracer_provider)
        # An explicit no-op provider turns spans off (metrics only): skip building them. The
        # global provider's proxy tracer may get an SDK later, so it is always called.
        self._spans = not isinstance(self._tracer, trace.NoOpTracer)
        self._name_attributes = name_attributes
        # Attribute sets without a lock name are few (kinds x outcomes): built once each,
        # so that an event costs dict lookups, not allocations.
        self._attrs: dict[tuple[str, str, str], Attributes] = {}
        # The holds this client has now, (kind, name, holder) -> 1 (a holder's read holds
        # of one lock are one hold: events say reentrant=True for the others).
        self._holds: dict[tuple[str, str, str], int] = {}
        # aiolock.held and aiolock.waiting per attribute set ((kind, name or "")), read by
        # the asynchronous up-down counters at collection: a hold costs two dict updates,
        # not two synchronous measurements (about 10 us with the SDK).
        self._held: dict[tuple[str, str], int] = {}
        self._waiting: dict[tuple[str, str], int] = {}
        # The last waiting count told per (kind, name), to add its change to its series.
        self._waiting_told: dict[tuple[str, str], int] = {}
        self._acquire_wait = meter.create_histogram(
            "aiolock.acquire.wait",
            unit="s",
            description="How long an acquire call waited, from its start to its outcome.",
            explicit_bucket_boundaries_advisory=_WAIT_BUCKETS,
        )
        self._hold_duration = meter.create_histogram(
            "aiolock.hold.duration",
            unit="s",
            description="How long a lock was held, until released or lost.",
            explicit_bucket_boundaries_advisory=_HOLD_BUCKETS,
        )
        meter.create_observable_up_down_counter(
            "aiolock.held",
            callbacks=[self._observer(self._held)],
            unit="{lock}",
            description="Locks this client holds now.",
        )
        meter.create_observable_up_down_counter(
            "aiolock.waiting",
            callbacks=[self._observer(self._waiting)],
            unit="{acquire}",
            description="Acquire calls of this client waiting now.",
        )
        self._lease_lost = meter.create_counter(
            "aiolock.lease.lost",
            unit="{lease}",
            description="Holds this client lost before releasing them (expired or taken).",
        )
        self._renewal_duration = meter.create_histogram(
            "aiolock.renewal.duration",
            unit="s",
            description="How long one watchdog renewal round took, all servers included.",
            explicit_bucket_boundaries_advisory=_RENEWAL_BUCKETS,
        )
        handlers: dict[type[Any], Callable[[Any], None]] = {
            events.Acquired: self._on_acquired,
            events.AcquireFailed: self._on_acquire_failed,
            events.Waiting: self._on_waiting,
            events.Released: self._on_released,
            events.Lost: self._on_lost,
            events.RenewalRound: self._on_renewal_round,
        }

        def listener(event: object) -> None:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(event)

        self._listener: Callable[[object], None] | None = listener
        self._client = client
        client.add_listener(listener)

    def uninstrument(self) -> None:
        """Stop recording. Idempotent.

        Removes the listener; ``aiolock.held`` and ``aiolock.waiting`` report nothing more.
        """
        listener, self._listener = self._listener, None
        if listener is None:
            return
        self._client.remove_listener(listener)
        self._holds.clear()
        self._held.clear()
        self._waiting.clear()
        self._waiting_told.clear()

    # -- attributes ---------------------------------------------------------------------

    def _attributes(self, kind: str, name: str, key: str = "", value: str = "") -> Attributes:
        """``aiolock.kind``, the lock's name when asked, and ``key: value`` if given."""
        if self._name_attributes:
            attrs = {KIND: kind, LOCK_NAME: name}
            if key:
                attrs[key] = value
            return attrs
        cache_key = (kind, key, value)
        cached = self._attrs.get(cache_key)
        if cached is None:
            cached = self._attrs[cache_key] = {KIND: kind, key: value} if key else {KIND: kind}
        return cached

    def _series(self, kind: str, name: str) -> tuple[str, str]:
        """The key of ``kind`` and ``name``'s series in ``_held`` and ``_waiting``."""
        return (kind, name if self._name_attributes else "")

    def _observer(
        self, counts: dict[tuple[str, str], int]
    ) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        def observe(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            return [
                metrics.Observation(count, self._attributes(kind, name))
                for (kind, name), count in list(counts.items())
            ]

        return observe

    # -- handlers -------------------------------------------------------------------------

    def _on_acquired(self, event: events.Acquired) -> None:
        attrs = self._attributes(event.kind, event.name, OUTCOME, "acquired")
        self._acquire_wait.record(event.waited, attrs)
        if event.reentrant:
            self._span_acquire(event.waited, {**attrs, REENTRANT: True}, failure=None)
            return
        if event.kind in events.SEMAPHORE_KINDS:
            # Permits have no holder to release them: aiolock.held counts locks only.
            self._span_acquire(event.waited, attrs, failure=None)
            return
        hold = (event.kind, event.name, event.holder)
        if hold not in self._holds:
            self._holds[hold] = 1
            series = self._series(event.kind, event.name)
            self._held[series] = self._held.get(series, 0) + 1
        self._span_acquire(event.waited, attrs, failure=None)

    def _on_acquire_failed(self, event: events.AcquireFailed) -> None:
        attrs = self._attributes(event.kind, event.name, OUTCOME, event.reason)
        self._acquire_wait.record(event.waited, attrs)
        self._span_acquire(event.waited, {**attrs, ERROR_TYPE: event.reason}, failure=event.reason)

    def _on_released(self, event: events.Released) -> None:
        self._end_hold(event.kind, event.name, event.holder, event.held, "released")
        if not self._spans:
            return
        attrs: dict[str, Any] = {KIND: event.kind, HOLD_DURATION: event.held}
        if self._name_attributes:
            attrs[LOCK_NAME] = event.name
        now = time.time_ns()
        self._tracer.start_span("aiolock.release", attributes=attrs, start_time=now).end(now)

    def _on_lost(self, event: events.Lost) -> None:
        self._end_hold(event.kind, event.name, event.holder, event.held, "lost")
        self._lease_lost.add(1, self._attributes(event.kind, event.name, LOSS_REASON, event.how))

    def _on_waiting(self, event: events.Waiting) -> None:
        # The event gives the count of (kind, name); its series (without lock names: all
        # names of a kind) adds the change since the count last told.
        told = (event.kind, event.name)
        change = event.waiting - self._waiting_told.get(told, 0)
        if event.waiting:
            self._waiting_told[told] = event.waiting
        else:
            self._waiting_told.pop(told, None)
        series = self._series(event.kind, event.name)
        now = self._waiting.get(series, 0) + change
        if now or not self._name_attributes:
            self._waiting[series] = now
        else:
            self._waiting.pop(series, None)

    def _on_renewal_round(self, event: events.RenewalRound) -> None:
        key = ("", OUTCOME, "failed" if event.failed else "renewed")
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._attrs[key] = {OUTCOME: key[2]}
        self._renewal_duration.record(event.duration, attrs)

    # -- helpers --------------------------------------------------------------------------

    def _end_hold(self, kind: str, name: str, holder: str, held: float, outcome: str) -> None:
        self._hold_duration.record(held, self._attributes(kind, name, OUTCOME, outcome))
        if self._holds.pop((kind, name, holder), None) is None:
            return  # acquired before instrumenting
        series = self._series(kind, name)
        left = self._held[series] - 1
        if left or not self._name_attributes:
            self._held[series] = left
        else:
            del self._held[series]  # one series per name: drop it, or they pile up

    def _span_acquire(self, waited: float, attrs: Attributes, *, failure: str | None) -> None:
        if not self._spans:
            return
        now = time.time_ns()
        span = self._tracer.start_span(
            "aiolock.acquire", attributes=attrs, start_time=now - round(waited * _NS)
        )
        if failure is not None:
            span.set_status(Status(StatusCode.ERROR, failure))
        span.end(now)


def instrument(
    client: Any,
    meter_provider: Any = None,
    tracer_provider: Any = None,
    *,
    name_attributes: bool = False,
) -> Instrumentation:
    """``aiolock.instrument_opentelemetry``'s body, its arguments checked."""
    if not callable(getattr(client, "add_listener", None)):
        raise TypeError(f"client must be an aiolock.Client, got {type(client).__name__}")
    if meter_provider is not None and not isinstance(meter_provider, metrics.MeterProvider):
        raise TypeError(
            "meter_provider must be an opentelemetry MeterProvider or None, "
            f"got {type(meter_provider).__name__}"
        )
    if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
        raise TypeError(
            "tracer_provider must be an opentelemetry TracerProvider or None, "
            f"got {type(tracer_provider).__name__}"
        )
    if not isinstance(name_attributes, bool):
        raise TypeError(f"name_attributes must be a bool, got {type(name_attributes).__name__}")
    return Instrumentation(client, meter_provider, tracer_provider, name_attributes=name_attributes)
