"""aiolock.sync: the blocking API for threads (Django, Flask, Celery, scripts).

``Client.from_url(url, **options)`` takes the async client's options; every object and
method of ``aiolock.Client`` is here, blocking, with the same errors (``aiolock.LockError``
and its subclasses). Holders are the calling threads. A background event-loop thread runs
the async client: same keys and messages, so sync, async and Java clients exclude and wake
each other on the same names.

ONE loop thread per process (a daemon): every sync client of the process runs its own async
client (connections, renewals) in that one loop, because a MultiLock or RedLock over
handles of several clients (a RedLock's members are on independent servers) runs as one
task, which needs all its members in one loop. It starts with the first call and stops when
the last client is closed.

Cost: each blocking call is one hand-off to that thread and back, so a lock+unlock pair
costs the async pair plus two hand-offs (docs/benchmarks.md, "Design figures").
"""

from __future__ import annotations

from ._client import Client as Client
from ._hold import Hold as Hold
from ._locks import FairLock as FairLock
from ._locks import FairReadLock as FairReadLock
from ._locks import FairReadWriteLock as FairReadWriteLock
from ._locks import FairWriteLock as FairWriteLock
from ._locks import FencedLock as FencedLock
from ._locks import Lock as Lock
from ._locks import MultiLock as MultiLock
from ._locks import ReadLock as ReadLock
from ._locks import ReadWriteLock as ReadWriteLock
from ._locks import RedLock as RedLock
from ._locks import SpinLock as SpinLock
from ._locks import WriteLock as WriteLock
from ._objects import CountDownLatch as CountDownLatch
from ._objects import Leader as Leader
from ._objects import PermitExpirableSemaphore as PermitExpirableSemaphore
from ._objects import Semaphore as Semaphore

__all__ = (
    "Client",
    "CountDownLatch",
    "FairLock",
    "FairReadLock",
    "FairReadWriteLock",
    "FairWriteLock",
    "FencedLock",
    "Hold",
    "Leader",
    "Lock",
    "MultiLock",
    "PermitExpirableSemaphore",
    "ReadLock",
    "ReadWriteLock",
    "RedLock",
    "Semaphore",
    "SpinLock",
    "WriteLock",
)

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
