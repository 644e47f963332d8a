"""What ``aiolock.instrument_opentelemetry`` costs a lock+unlock pair.

Five clients on one server, each looping lock+unlock pairs (every task on its own name):

* ``plain``: not instrumented;
* ``listener``: a listener that does nothing (the event stream's own cost);
* ``otel-noop``: instrumented with OpenTelemetry's API alone (no SDK: the no-op providers,
  what a library user gets until the application configures one);
* ``otel-metrics``: an SDK meter provider as below, spans off (a no-op tracer provider);
* ``otel-sdk``: instrumented with an SDK meter provider (an in-memory reader, collected
  once at the end) and an SDK tracer provider whose spans go to an exporter that drops them
  (the instrumentation's own cost, not an exporter's).

Interleaved: each repetition runs every configuration once for ``--duration`` seconds,
round-robin, the first one rotating, at 1 task and at ``--tasks`` tasks. Reported: medians
over the repetitions of pairs/s and of client CPU per pair (``time.process_time``: the
server is another process), and each instrumented configuration's CPU per pair minus
plain's, taken per repetition. Then the listener alone: the instrumentation's listener
called with an ``Acquired`` and a ``Released`` event in a loop, no server (CPU µs per pair).

Run from the repository root (the server as for the other benchmarks:
``aiolock.testing.redis_server()``, ``REDIS_URL`` to choose one)::

    python -m benchmarks.otel_overhead [--reps 5] [--duration 1.0] [--tasks 16] [--pin-cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable, Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from redis.asyncio import Redis

import aiolock
from aiolock import events
from aiolock.testing import redis_server

CONFIGS = ("plain", "listener", "otel-noop", "otel-metrics", "otel-sdk")


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _sdk() -> tuple[MeterProvider, TracerProvider]:
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_Drop()))
    return meter_provider, tracer_provider


async def _round(
    client: aiolock.Client, tasks: int, duration: float, tag: str
) -> tuple[int, float]:
    """Pairs done by ``tasks`` tasks in ``duration`` s, and the client CPU seconds spent."""
    deadline = time.monotonic() + duration
    done = [0] * tasks

    async def loop(i: int) -> None:
        lock = client.lock(f"bench:otel:{tag}:{i}")
        for _ in range(1_000_000):
            await lock.lock()
            await lock.unlock()
            done[i] += 1
            if time.monotonic() >= deadline:
                return

    cpu = time.process_time()
    await asyncio.gather(*(loop(i) for i in range(tasks)))
    return sum(done), time.process_time() - cpu


def _listener_cost(meter_provider: object, tracer_provider: object, n: int) -> float:
    """CPU µs per Acquired+Released pair through the instrumentation's listener alone."""
    listeners: list[Callable[[object], None]] = []

    class _Client:
        def add_listener(self, fn: Callable[[object], None]) -> None:
            listeners.append(fn)

        def remove_listener(self, fn: Callable[[object], None]) -> None:
            listeners.remove(fn)

    handle = aiolock.instrument_opentelemetry(
        _Client(),  # type: ignore[arg-type]
        meter_provider,  # type: ignore[arg-type]
        tracer_provider,  # type: ignore[arg-type]
    )
    (listener,) = listeners
    acquired = events.Acquired("lock", "orders:42", "c:1", 0.0004, reentrant=False)
    released = events.Released("lock", "orders:42", "c:1", 0.0002)
    start = time.process_time()  # CPU: the machine's other load does not count
    for _ in range(n):
        listener(acquired)
        listener(released)
    elapsed = time.process_time() - start
    handle.uninstrument()
    return elapsed / n * 1e6


async def _server_pid(url: str) -> int:
    redis = Redis.from_url(url)
    try:
        info = await redis.info("server")
        return int(info["process_id"])
    finally:
        await redis.aclose()


def _median(values: list[float]) -> float:
    return statistics.median(values)


async def main(reps: int, duration: float, tasks: int, pin: int | None) -> None:
    with redis_server() as server:
        if pin is not None:
            os.sched_setaffinity(0, {pin})
            os.sched_setaffinity(await _server_pid(server.url), {pin})
        clients = {config: aiolock.Client.from_url(server.url) for config in CONFIGS}
        sdk_meters, sdk_tracer = _sdk()
        clients["listener"].add_listener(lambda event: None)
        aiolock.instrument_opentelemetry(
            clients["otel-noop"], metrics.NoOpMeterProvider(), trace.NoOpTracerProvider()
        )
        aiolock.instrument_opentelemetry(
            clients["otel-metrics"], sdk_meters, trace.NoOpTracerProvider()
        )
        aiolock.instrument_opentelemetry(clients["otel-sdk"], sdk_meters, sdk_tracer)
        try:
            for client in clients.values():  # connections and scripts loaded
                await _round(client, tasks, 0.2, "warm")
            for n in (1, tasks):
                rate: dict[str, list[float]] = {c: [] for c in CONFIGS}
                cpu_us: dict[str, list[float]] = {c: [] for c in CONFIGS}
                for rep in range(reps):
                    first = rep % len(CONFIGS)
                    order = CONFIGS[first:] + CONFIGS[:first]
                    for config in order:
                        pairs, cpu = await _round(clients[config], n, duration, config)
                        rate[config].append(pairs / duration)
                        cpu_us[config].append(cpu / pairs * 1e6)
                print(f"\n{n} task(s), {reps} reps x {duration} s, medians")
                print(f"{'config':<12} {'pairs/s':>9} {'CPU µs/pair':>12} {'Δ CPU µs/pair':>14}")
                for config in CONFIGS:
                    delta = [a - b for a, b in zip(cpu_us[config], cpu_us["plain"], strict=True)]
                    print(
                        f"{config:<12} {_median(rate[config]):>9.0f} "
                        f"{_median(cpu_us[config]):>12.1f} {_median(delta):>+14.1f}"
                    )
        finally:
            for client in clients.values():
                await client.aclose()
            sdk_meters.shutdown()
            sdk_tracer.shutdown()
    print("\nlistener alone, CPU µs per Acquired+Released pair (median of 5 x 20000)")
    noop = [
        _listener_cost(metrics.NoOpMeterProvider(), trace.NoOpTracerProvider(), 20_000)
        for _ in range(5)
    ]
    sdk: list[float] = []
    for _ in range(5):
        meter_provider, tracer_provider = _sdk()
        sdk.append(_listener_cost(meter_provider, tracer_provider, 20_000))
        meter_provider.shutdown()
        tracer_provider.shutdown()
    metrics_only: list[float] = []
    for _ in range(5):
        meter_provider, _unused = _sdk()
        metrics_only.append(_listener_cost(meter_provider, trace.NoOpTracerProvider(), 20_000))
        meter_provider.shutdown()
    print(f"otel-noop     {_median(noop):.2f}")
    print(f"otel-metrics  {_median(metrics_only):.2f}")
    print(f"otel-sdk      {_median(sdk):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per round")
    parser.add_argument("--tasks", type=int, default=16, help="the concurrent case's tasks")
    parser.add_argument("--pin-cpu", type=int, default=None, help="pin client and server")
    args = parser.parse_args()
    asyncio.run(main(args.reps, args.duration, args.tasks, args.pin_cpu))
