"""What ``aiolock.instrument_opentelemetry`` and the event stream cost, per pair and per event.

Part 1, a real server: four clients, each looping lock+unlock pairs (every task on its own
name):

* ``none``: no listener;
* ``listener``: a listener that does nothing (the event stream's own cost);
* ``instrumented``: ``instrument_opentelemetry(client)`` with the global providers and no
  SDK configured (the ``aiolock[otel]`` extra installed, the application not exporting):
  the instrumentation's own cost, every instrument and span call made, into the API's no-op;
* ``metrics``: instrumented with an SDK meter provider as production has it (a
  ``PeriodicExportingMetricReader`` with a long interval, to an exporter that drops the
  data), spans off (a no-op tracer provider);
* ``metrics+spans``: the same and an SDK tracer provider as production has it (a
  ``BatchSpanProcessor``, to an exporter that drops the spans): the instrumentation's own
  cost, not an exporter's.

Interleaved: each repetition runs every configuration once for ``--duration`` seconds,
round-robin, the first one rotating, at 1 task, at ``--tasks`` tasks each on its own lock,
and at ``--tasks`` tasks on one lock (the main benchmark's contended N=16). Reported per
configuration: the median over the repetitions of pairs/s and of client CPU per pair
(``time.process_time``, every thread of the process: the batch processor's too; the server
is another process), with their range (min-max), and its CPU per pair minus ``none``'s,
taken per repetition (median and range).

Part 2, no server, per event: the emitter, the SDK's own calls and the instrumentation's
listener, each called in a loop with real event objects (CPU µs, the best of ``--repeat``
runs: the floor, with warm caches). Our code = the listener less the SDK calls it makes.
Then the listener timed inside the pairs of part 1 (1 task): with the event loop, the
transport and the server (same CPU when pinned) in between, its caches are cold.

Run from the repository root (the server as for the other benchmarks:
``aiolock.testing.redis_server()``, ``REDIS_URL`` to choose one)::

    python -m benchmarks.otel_overhead --pin-cpu 1 [--reps 5] [--duration 1.0] [--tasks 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from redis.asyncio import Redis

import aiolock
from aiolock import events
from aiolock._emitter import Emitter
from aiolock.testing import redis_server

CONFIGS = ("none", "listener", "instrumented", "metrics", "metrics+spans")

# What an event carries in part 2 (one kind, no lock names: the default attribute sets).
ACQUIRED = events.Acquired("lock", "orders:42", "c:1", 0.0004, reentrant=False)
RELEASED = events.Released("lock", "orders:42", "c:1", 0.0002)
ATTRS = {"aiolock.kind": "lock", "aiolock.outcome": "acquired"}


class _DropSpans(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _DropMetrics(MetricExporter):
    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _meter_provider(reader: str = "periodic") -> MeterProvider:
    """An SDK meter provider; ``periodic`` as production has it (an hour: never in a run)."""
    chosen: MetricReader = (
        InMemoryMetricReader()
        if reader == "in-memory"
        else PeriodicExportingMetricReader(_DropMetrics(), export_interval_millis=3_600_000)
    )
    return MeterProvider(metric_readers=[chosen])


def _tracer_provider(processor: str = "batch") -> TracerProvider:
    """An SDK tracer provider; ``batch`` as production has it, ``simple``, or ``sampled-off``."""
    if processor == "sampled-off":
        provider = TracerProvider(sampler=ALWAYS_OFF)
        processor = "batch"
    else:
        provider = TracerProvider()
    chosen: SpanProcessor = (
        # A queue that never fills in part 2's tight loop: a full one drops spans, cheaply.
        BatchSpanProcessor(_DropSpans(), max_queue_size=1 << 20)
        if processor == "batch"
        else SimpleSpanProcessor(_DropSpans())
    )
    provider.add_span_processor(chosen)
    return provider


class _Capture:
    """Stands for a client: keeps the listener that ``instrument_opentelemetry`` adds."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[object], None]] = []

    def add_listener(self, fn: Callable[[object], None]) -> None:
        self.listeners.append(fn)

    def remove_listener(self, fn: Callable[[object], None]) -> None:
        self.listeners.remove(fn)


def _instrumentation_listener(
    meter_provider: object, tracer_provider: object
) -> tuple[Callable[[object], None], Callable[[], None]]:
    """The instrumentation's listener, and what undoes it."""
    capture = _Capture()
    handle = aiolock.instrument_opentelemetry(
        capture,  # type: ignore[arg-type]
        meter_provider,  # type: ignore[arg-type]
        tracer_provider,  # type: ignore[arg-type]
    )
    (listener,) = capture.listeners
    return listener, handle.uninstrument


# -- part 1: pairs on a server --------------------------------------------------------------


async def _round(
    client: aiolock.Client, tasks: int, duration: float, tag: str, *, one_lock: bool = False
) -> tuple[int, float]:
    """Pairs done by ``tasks`` tasks in ``duration`` s, and the client CPU seconds spent.

    ``one_lock``: every task on the same lock (the main benchmark's contended N), else each
    on its own.
    """
    deadline = time.monotonic() + duration
    done = [0] * tasks

    async def loop(i: int) -> None:
        lock = client.lock(f"bench:otel:{tag}" if one_lock else f"bench:otel:{tag}:{i}")
        for _ in range(1_000_000):
            await lock.lock()
            await lock.unlock()
            done[i] += 1
            if time.monotonic() >= deadline:
                return

    cpu = time.process_time()
    await asyncio.gather(*(loop(i) for i in range(tasks)))
    return sum(done), time.process_time() - cpu


async def _server_pid(url: str) -> int:
    redis = Redis.from_url(url)
    try:
        info = await redis.info("server")
        return int(info["process_id"])
    finally:
        await redis.aclose()


def _spread(values: list[float], fmt: str) -> str:
    """``median (min-max)``."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})".strip()


async def _in_situ(client: aiolock.Client, listener: Callable[[object], None]) -> float:
    """µs per event of ``listener`` called from the client's own pairs (1 task): the
    median of the calls, so that the few the machine's other load preempts do not count."""
    spent: list[int] = []

    def timed(event: object) -> None:
        start = time.perf_counter_ns()
        listener(event)
        spent.append(time.perf_counter_ns() - start)

    client.add_listener(timed)
    try:
        lock = client.lock("bench:otel:in-situ")
        for _ in range(300):  # warm
            await lock.lock()
            await lock.unlock()
        spent.clear()
        for _ in range(3000):
            await lock.lock()
            await lock.unlock()
    finally:
        client.remove_listener(timed)
    return statistics.median(spent) / 1000


async def pairs(reps: int, duration: float, tasks: int, pin: int | None) -> None:
    with redis_server() as server:
        if pin is not None:
            os.sched_setaffinity(0, {pin})
            os.sched_setaffinity(await _server_pid(server.url), {pin})
        clients = {config: aiolock.Client.from_url(server.url) for config in CONFIGS}
        meter_provider, tracer_provider = _meter_provider(), _tracer_provider()
        clients["listener"].add_listener(lambda event: None)
        # No SDK in this process: the global providers are the API's proxies, no-ops.
        aiolock.instrument_opentelemetry(clients["instrumented"])
        aiolock.instrument_opentelemetry(
            clients["metrics"], meter_provider, trace.NoOpTracerProvider()
        )
        aiolock.instrument_opentelemetry(clients["metrics+spans"], meter_provider, tracer_provider)
        try:
            for client in clients.values():  # connections and scripts loaded
                await _round(client, tasks, 0.2, "warm")
            cases = (
                (1, False, "1 task"),
                (tasks, False, f"{tasks} tasks, each on its own lock"),
                (tasks, True, f"N={tasks}: {tasks} tasks on one lock (pairs = acquisitions)"),
            )
            for n, one_lock, label in cases:
                rate: dict[str, list[float]] = {c: [] for c in CONFIGS}
                cpu_us: dict[str, list[float]] = {c: [] for c in CONFIGS}
                for rep in range(reps):
                    first = rep % len(CONFIGS)
                    for config in CONFIGS[first:] + CONFIGS[:first]:
                        done, cpu = await _round(
                            clients[config], n, duration, f"{config}:{rep}", one_lock=one_lock
                        )
                        rate[config].append(done / duration)
                        cpu_us[config].append(cpu / done * 1e6)
                print(f"\n{label}, {reps} reps x {duration} s: median (min-max)")
                print(f"{'config':<14} {'pairs/s':>20} {'CPU µs/pair':>20} {'Δ CPU µs/pair':>22}")
                for config in CONFIGS:
                    delta = [a - b for a, b in zip(cpu_us[config], cpu_us["none"], strict=True)]
                    print(
                        f"{config:<14} {_spread(rate[config], '.0f'):>20} "
                        f"{_spread(cpu_us[config], '.1f'):>20} {_spread(delta, '+.1f'):>22}"
                    )
            print(
                "\nthe listener timed in the pairs above (1 task, median µs per event, cold caches)"
            )
            for label, meters, tracers in (
                ("instrumented", metrics.get_meter_provider(), trace.get_tracer_provider()),
                ("metrics", meter_provider, trace.NoOpTracerProvider()),
                ("metrics+spans", meter_provider, tracer_provider),
            ):
                listener, undo = _instrumentation_listener(meters, tracers)
                print(f"  {label:<14} {await _in_situ(clients['none'], listener):6.2f}")
                undo()
        finally:
            for client in clients.values():
                await client.aclose()
            meter_provider.shutdown()
            tracer_provider.shutdown()


# -- part 2: per event, no server -----------------------------------------------------------


def _best(fn: Callable[[], object], repeat: int, number: int = 20_000) -> float:
    """CPU µs per call of ``fn``: the best of ``repeat`` runs of ``number`` calls."""
    runs = timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)
    return min(runs) / number * 1e6


def per_event(repeat: int) -> None:
    print(f"\nper event, no server: CPU µs, best of {repeat} x 20000 calls (warm caches)")
    emitter = Emitter(slow_wait=5.0, slow_hold=60.0)

    def hook() -> None:
        emitter.acquired("lock", "orders:42", "c:1", 0.0004, reentrant=False)

    emitter_none = _best(hook, repeat, 200_000)
    emitter.add(lambda event: None)
    emitter_noop = _best(hook, repeat, 200_000)
    print(f"  emitter, no listener (an Acquired hook)          {emitter_none:7.3f}")
    print(f"  emitter, a no-op listener (the event built, called) {emitter_noop:5.3f}")

    sdk: dict[str, float] = {}
    for reader in ("in-memory", "periodic"):
        provider = _meter_provider(reader)
        histogram = provider.get_meter("bench").create_histogram("h", unit="s")
        sdk[reader] = _best(lambda h=histogram: h.record(0.0004, ATTRS), repeat)  # type: ignore[misc]
        provider.shutdown()
        print(f"  SDK Histogram.record, 2 attributes, {reader:<10}      {sdk[reader]:7.3f}")
    for processor in ("batch", "simple", "sampled-off"):
        tracer_provider = _tracer_provider(processor)
        tracer = tracer_provider.get_tracer("bench")

        def start_and_end(tracer: trace.Tracer = tracer) -> None:
            now = time.time_ns()
            tracer.start_span("aiolock.acquire", attributes=ATTRS, start_time=now - 400_000).end(
                now
            )

        sdk[processor] = _best(start_and_end, repeat)
        tracer_provider.shutdown()
        print(f"  SDK start_span+end, {processor:<12}                {sdk[processor]:7.3f}")

    # (label, meter provider, tracer provider, the SDK record's figure, the span's figure)
    setups: list[tuple[str, Callable[[], object], Callable[[], object], str, str]] = [
        ("API only (no SDK: global providers)", metrics.get_meter_provider,
         trace.get_tracer_provider, "", ""),
        ("metrics, in-memory reader", lambda: _meter_provider("in-memory"),
         trace.NoOpTracerProvider, "in-memory", ""),
        ("metrics, periodic reader", _meter_provider, trace.NoOpTracerProvider, "periodic", ""),
        ("metrics + spans, batch", _meter_provider, _tracer_provider, "periodic", "batch"),
        ("metrics + spans, simple", _meter_provider, lambda: _tracer_provider("simple"),
         "periodic", "simple"),
        ("metrics + spans, sampled off", _meter_provider,
         lambda: _tracer_provider("sampled-off"), "periodic", "sampled-off"),
    ]  # fmt: skip
    print("  the instrumentation's listener            Acquired  Released  ours/event")
    for label, make_meters, make_tracers, record, span in setups:
        providers = (make_meters(), make_tracers())
        listener, undo = _instrumentation_listener(*providers)
        acquired = _best(lambda listener=listener: listener(ACQUIRED), repeat)  # type: ignore[misc]
        released = _best(lambda listener=listener: listener(RELEASED), repeat)  # type: ignore[misc]
        undo()
        for made in providers:
            shutdown = getattr(made, "shutdown", None)
            if shutdown is not None:
                shutdown()
        # Each of the two events makes one histogram record, and one span when spans are on.
        ours = (acquired + released) / 2 - sdk.get(record, 0.0) - sdk.get(span, 0.0)
        print(f"  {label:<40} {acquired:8.3f} {released:9.3f} {ours:11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per round")
    parser.add_argument("--tasks", type=int, default=16, help="the concurrent case's tasks")
    parser.add_argument("--pin-cpu", type=int, default=None, help="pin client and server")
    parser.add_argument("--repeat", type=int, default=7, help="part 2's runs per figure")
    parser.add_argument("--events-only", action="store_true", help="part 2 only")
    args = parser.parse_args()
    if not args.events_only:
        asyncio.run(pairs(args.reps, args.duration, args.tasks, args.pin_cpu))
    elif args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    per_event(args.repeat)


if __name__ == "__main__":
    main()
