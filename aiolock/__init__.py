"""aiolock: asyncio-native Redis distributed locks, wire-compatible with Redisson."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import events as events
from ._client import Client as Client
from ._engine.guard import Hold as Hold
from ._exceptions import ClientClosedError as ClientClosedError
from ._exceptions import LockError as LockError
from ._exceptions import LockLostError as LockLostError
from ._exceptions import LockNotOwnedError as LockNotOwnedError
from ._exceptions import LockTimeoutError as LockTimeoutError
from ._exceptions import LockUpgradeError as LockUpgradeError
from ._exceptions import ReleaseError as ReleaseError
from ._exceptions import ReplicaAckError as ReplicaAckError
from ._objects.count_down_latch import CountDownLatch as CountDownLatch
from ._objects.fair_lock import FairLock as FairLock
from ._objects.fair_rwlock import FairReadLock as FairReadLock
from ._objects.fair_rwlock import FairReadWriteLock as FairReadWriteLock
from ._objects.fair_rwlock import FairWriteLock as FairWriteLock
from ._objects.fenced import FencedLock as FencedLock
from ._objects.handle import LockStatistics as LockStatistics
from ._objects.leader import Leader as Leader
from ._objects.lock import Lock as Lock
from ._objects.multilock import MultiLock as MultiLock
from ._objects.permit_expirable_semaphore import (
    PermitExpirableSemaphore as PermitExpirableSemaphore,
)
from ._objects.redlock import RedLock as RedLock
from ._objects.rwlock import ReadLock as ReadLock
from ._objects.rwlock import ReadWriteLock as ReadWriteLock
from ._objects.rwlock import WriteLock as WriteLock
from ._objects.semaphore import Semaphore as Semaphore
from ._objects.spin import SpinLock as SpinLock
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from ._otel import Instrumentation

__all__ = (
    "Client",
    "ClientClosedError",
    "CountDownLatch",
    "FairLock",
    "FairReadLock",
    "FairReadWriteLock",
    "FairWriteLock",
    "FencedLock",
    "Hold",
    "Leader",
    "Lock",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "LockTimeoutError",
    "LockUpgradeError",
    "MultiLock",
    "PermitExpirableSemaphore",
    "ReadLock",
    "ReadWriteLock",
    "RedLock",
    "ReleaseError",
    "ReplicaAckError",
    "Semaphore",
    "SpinLock",
    "WriteLock",
    "instrument_opentelemetry",
)


def instrument_opentelemetry(
    client: Client,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    *,
    name_attributes: bool = False,
) -> Instrumentation:
    """Record ``client``'s lock activity as OpenTelemetry metrics and spans.

    Needs the ``aiolock[otel]`` extra (``opentelemetry-api``); the providers default to the
    global ones (no-ops until an SDK is configured; with the global tracer provider, spans
    start within a second of an SDK being set). Instruments: ``aiolock.acquire.wait``,
    ``aiolock.hold.duration`` and ``aiolock.renewal.duration`` (histograms, seconds),
    ``aiolock.held`` and ``aiolock.waiting`` (up-down counters), ``aiolock.lease.lost``
    (counter); spans ``aiolock.acquire`` and ``aiolock.release``. Lock names become the
    ``aiolock.lock.name`` attribute only with ``name_attributes=True``: they are unbounded.
    Built on ``client.add_listener``; the returned handle's ``uninstrument()`` stops it.
    """
    from ._otel import instrument  # noqa: PLC0415 - opentelemetry only when asked for

    return instrument(client, meter_provider, tracer_provider, name_attributes=name_attributes)


# Tracebacks and reprs say aiolock.Lock, not aiolock._lock.Lock.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
