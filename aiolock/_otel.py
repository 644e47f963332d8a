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

from collections.abc import Callable, Iterable, Mapping
from time import monotonic, time_ns
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
# True on a leader's term's measurements and spans (absent on other holds): a term is a hold
# of an ordinary lock, told apart from the application's own locks.
LEADER: Final = "aiolock.leader"
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
# How often (seconds, at most) a client instrumented before any tracer SDK was set looks
# whether one has been since: spans start within this long of it.
SDK_LOOK_INTERVAL = 1.0

Attributes = Mapping[str, Any]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - once

    try:
        return version("aiolock")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return ""


class _KindAttributes:
    """The attribute sets of one kind without lock names, built once.

    An event of that kind then costs attribute reads, not a dict per measurement and span.
    """

    __slots__ = ("acquired", "failed", "lost", "lost_reasons", "reentrant", "released", "series")

    def __init__(self, kind: str) -> None:
        self.acquired: Attributes = {KIND: kind, OUTCOME: "acquired"}
        self.reentrant: Attributes = {KIND: kind, OUTCOME: "acquired", REENTRANT: True}
        self.released: Attributes = {KIND: kind, OUTCOME: "released"}
        self.lost: Attributes = {KIND: kind, OUTCOME: "lost"}
        # reason -> the histogram's attributes, the span's (with error.type), its status
        self.failed: dict[str, tuple[Attributes, Attributes, Status]] = {}
        self.lost_reasons: dict[str, Attributes] = {}  # how -> aiolock.lease.lost's attributes
        self.series = (kind, "")  # its key in _held and _waiting

    def failure(self, reason: str) -> tuple[Attributes, Attributes, Status]:
        found = self.failed.get(reason)
        if found is None:
            attrs = {**self.acquired, OUTCOME: reason}
            found = self.failed[reason] = (
                attrs,
                {**attrs, ERROR_TYPE: reason},
                Status(StatusCode.ERROR, reason),
            )
        return found

    def loss(self, how: str) -> Attributes:
        found = self.lost_reasons.get(how)
        if found is None:
            found = self.lost_reasons[how] = {KIND: self.acquired[KIND], LOSS_REASON: how}
        return found


class _Kinds(dict[str, _KindAttributes]):
    """kind -> its ``_KindAttributes``, made on first use."""

    def __missing__(self, kind: str) -> _KindAttributes:
        made = self[kind] = _KindAttributes(kind)
        return made


class Instrumentation:
    """What ``aiolock.instrument_opentelemetry`` returns.

    The client's listener that feeds the instruments and spans; `uninstrument()`
    removes it.
    """

    __slots__ = (
        "_acquire_wait",
        "_client",
        "_held",
        "_hold_duration",
        "_holds",
        "_kinds",
        "_lease_lost",
        "_listener",
        "_name_attributes",
        "_next_look",
        "_renewal_attrs",
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
        # An explicit no-op provider turns spans off (metrics only): skip building them.
        self._spans = not isinstance(self._tracer, trace.NoOpTracer)
        # Until a tracer SDK is set, the global provider is a proxy whose spans record
        # nothing yet still cost time, so spans are skipped; whether one has been set (seen
        # through the public API only) is looked at every SDK_LOOK_INTERVAL at most,
        # because a look at every event would cost as much as the span it saves.
        self._next_look = float("inf")
        if self._spans and _before_sdk(tracer_provider):
            self._spans, self._next_look = False, 0.0
        self._name_attributes = name_attributes
        # Attribute sets without a lock name are few (kinds x outcomes), so each is built
        # once, as the SDK's own copy and hash of them per measurement dwarfs this work.
        self._kinds = _Kinds()
        self._renewal_attrs: dict[bool, Attributes] = {
            failed: {OUTCOME: "failed" if failed else "renewed"} for failed in (False, True)
        }
        # The holds this client has now, (kind, name, holder) -> 1 (a holder's read holds
        # of one lock are one hold: events say reentrant=True for the others).
        self._holds: dict[tuple[str, str, str], int] = {}
        # aiolock.held and aiolock.waiting per attribute set ((kind, name or "")), read by
        # the asynchronous up-down counters at collection, so a hold costs two dict
        # updates rather than two synchronous measurements, which the SDK makes dear.
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
        on_acquired, on_released = self._on_acquired, self._on_released
        others: dict[type[Any], Callable[[Any], None]] = {
            events.AcquireFailed: self._on_acquire_failed,
            events.Waiting: self._on_waiting,
            events.Lost: self._on_lost,
            events.RenewalRound: self._on_renewal_round,
        }

        def listener(event: object) -> None:
            # The two events of every hold first, without a dict lookup.
            cls = type(event)
            if cls is events.Acquired:
                on_acquired(event)  # type: ignore[arg-type]
            elif cls is events.Released:
                on_released(event)  # type: ignore[arg-type]
            else:
                handler = others.get(cls)
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

    def _named(self, kind: str, name: str, key: str, value: Any) -> dict[str, Any]:
        """``name_attributes=True``'s attributes: kind, the lock's name and ``key: value``."""
        return {KIND: kind, LOCK_NAME: name, key: value}

    def _series(self, kind: str, name: str) -> tuple[str, str]:
        """The key of ``kind`` and ``name``'s series in ``_held`` and ``_waiting``."""
        return (kind, name) if self._name_attributes else self._kinds[kind].series

    def _observer(
        self, counts: dict[tuple[str, str], int]
    ) -> Callable[[metrics.CallbackOptions], Iterable[metrics.Observation]]:
        named = self._name_attributes

        def observe(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            return [
                metrics.Observation(count, {KIND: kind, LOCK_NAME: name} if named else {KIND: kind})
                for (kind, name), count in list(counts.items())
            ]

        return observe

    # -- handlers -------------------------------------------------------------------------

    def _on_acquired(self, event: events.Acquired) -> None:
        kind: str = event.kind
        if self._name_attributes:
            attrs: Attributes = self._named(kind, event.name, OUTCOME, "acquired")
            span_attrs = {**attrs, REENTRANT: True} if event.reentrant else attrs
            series = (kind, event.name)
        else:
            table = self._kinds[kind]
            attrs = table.acquired
            span_attrs = table.reentrant if event.reentrant else attrs
            series = table.series
        if event.leader:
            attrs, span_attrs = {**attrs, LEADER: True}, {**span_attrs, LEADER: True}
        self._acquire_wait.record(event.waited, attrs)
        # Permits have no holder to release them: aiolock.held counts locks only.
        if not event.reentrant and kind not in events.SEMAPHORE_KINDS:
            hold = (kind, event.name, event.holder)
            if hold not in self._holds:
                self._holds[hold] = 1
                self._held[series] = self._held.get(series, 0) + 1
        if self._spans or self._sdk_arrived():
            now = time_ns()
            self._tracer.start_span(
                "aiolock.acquire", attributes=span_attrs, start_time=now - round(event.waited * _NS)
            ).end(now)

    def _on_acquire_failed(self, event: events.AcquireFailed) -> None:
        reason = event.reason
        if self._name_attributes:
            attrs: Attributes = self._named(event.kind, event.name, OUTCOME, reason)
            span_attrs: Attributes = {**attrs, ERROR_TYPE: reason}
            status = Status(StatusCode.ERROR, reason)
        else:
            attrs, span_attrs, status = self._kinds[event.kind].failure(reason)
        self._acquire_wait.record(event.waited, attrs)
        if self._spans or self._sdk_arrived():
            now = time_ns()
            span = self._tracer.start_span(
                "aiolock.acquire", attributes=span_attrs, start_time=now - round(event.waited * _NS)
            )
            span.set_status(status)
            span.end(now)

    def _on_released(self, event: events.Released) -> None:
        kind, held = event.kind, event.held
        spans = self._spans or self._sdk_arrived()
        if self._name_attributes:
            ended: Attributes = self._named(kind, event.name, OUTCOME, "released")
            if spans:
                attrs = {KIND: kind, HOLD_DURATION: held, LOCK_NAME: event.name}
        else:
            ended = self._kinds[kind].released
            if spans:
                attrs = {KIND: kind, HOLD_DURATION: held}
        if event.leader:
            ended = {**ended, LEADER: True}
            if spans:
                attrs[LEADER] = True
        self._end_hold(event, ended)
        if spans:
            now = time_ns()
            self._tracer.start_span("aiolock.release", attributes=attrs, start_time=now).end(now)

    def _on_lost(self, event: events.Lost) -> None:
        if self._name_attributes:
            ended: Attributes = self._named(event.kind, event.name, OUTCOME, "lost")
            attrs: Attributes = self._named(event.kind, event.name, LOSS_REASON, event.how)
        else:
            table = self._kinds[event.kind]
            ended, attrs = table.lost, table.loss(event.how)
        if event.leader:
            ended, attrs = {**ended, LEADER: True}, {**attrs, LEADER: True}
        self._end_hold(event, ended)
        self._lease_lost.add(1, attrs)

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
        self._renewal_duration.record(event.duration, self._renewal_attrs[bool(event.failed)])

    # -- helpers --------------------------------------------------------------------------

    def _sdk_arrived(self) -> bool:
        """Whether spans are now due: a tracer SDK was set globally since instrumenting."""
        if self._next_look > monotonic():
            return False
        if _before_sdk(None):
            self._next_look = monotonic() + SDK_LOOK_INTERVAL
            return False
        self._spans, self._next_look = True, float("inf")
        return True

    def _end_hold(self, event: events.Released | events.Lost, attrs: Attributes) -> None:
        self._hold_duration.record(event.held, attrs)
        if self._holds.pop((event.kind, event.name, event.holder), None) is None:
            return  # acquired before instrumenting
        series = self._series(event.kind, event.name)
        left = self._held[series] - 1
        if left or not self._name_attributes:
            self._held[series] = left
        else:
            del self._held[series]  # one series per name: drop it, or they pile up


def _before_sdk(tracer_provider: trace.TracerProvider | None) -> bool:
    """Whether ``tracer_provider`` (None: the global one) is the proxy of no SDK yet."""
    provider = trace.get_tracer_provider() if tracer_provider is None else tracer_provider
    return isinstance(provider, trace.ProxyTracerProvider)


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
