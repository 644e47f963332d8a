"""aiolock: asyncio-native Redis distributed locks, wire-compatible with Redisson."""

from __future__ import annotations

from typing import Any

from . import events as events
from ._client import Client as Client
from ._count_down_latch import CountDownLatch as CountDownLatch
from ._exceptions import ClientClosedError as ClientClosedError
from ._exceptions import LockError as LockError
from ._exceptions import LockLostError as LockLostError
from ._exceptions import LockNotOwnedError as LockNotOwnedError
from ._exceptions import LockTimeoutError as LockTimeoutError
from ._exceptions import LockUpgradeError as LockUpgradeError
from ._exceptions import ReleaseError as ReleaseError
from ._exceptions import ReplicaAckError as ReplicaAckError
from ._fair_lock import FairLock as FairLock
from ._fair_rwlock import FairReadLock as FairReadLock
from ._fair_rwlock import FairReadWriteLock as FairReadWriteLock
from ._fair_rwlock import FairWriteLock as FairWriteLock
from ._fenced import FencedLock as FencedLock
from ._guard import Hold as Hold
from ._handle import LockStatistics as LockStatistics
from ._leader import Leader as Leader
from ._lock import Lock as Lock
from ._multilock import MultiLock as MultiLock
from ._multilock import RedLock as RedLock
from ._permit_expirable_semaphore import PermitExpirableSemaphore as PermitExpirableSemaphore
from ._rwlock import ReadLock as ReadLock
from ._rwlock import ReadWriteLock as ReadWriteLock
from ._rwlock import WriteLock as WriteLock
from ._semaphore import Semaphore as Semaphore
from ._spin import SpinLock as SpinLock

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
)

# Tracebacks and reprs say aiolock.Lock, not aiolock._lock.Lock.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415 - only when asked

        return version("aiolock")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
