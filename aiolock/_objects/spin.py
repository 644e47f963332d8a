"""The spin lock: RLock's layout with no messages; waiters poll with back-off.

Redisson's RSpinLock (redisson-spec-2.md section 6). Nothing is published when it frees,
so nobody subscribes: a waiter tries again after pauses that double from 1 ms up to
128 ms, with jitter, as Redisson's default back-off does. It exists for clusters where the
pub/sub fan-out of many lock channels costs more than the polling (Redisson's issue
#3349). This client's own releases wake its own waiters at once.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from .handle import LockHandle
from .lock import LockPrimitive

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .._engine.engine import Engine

__all__ = ("SpinLock", "SpinLockPrimitive")

_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.128


class SpinLockPrimitive(LockPrimitive):
    """RLock's hash, scripts and renewal; no publish, waiters poll."""

    __slots__ = ()

    polls = True
    watched = False  # nothing is published on it (a force included)
    lock_kind = "spin_lock"
    # Nobody parks on a message: there is no waiter to hand the lock to.
    hands_over = False
    no_barging = False

    def pauses(self) -> Iterator[float]:
        # Doubling from 1 ms to 128 ms, each plus up to (attempt) ms of jitter so that
        # waiters of several clients that started together drift apart.
        pause = _FIRST_PAUSE
        attempt = 0
        while True:
            attempt += 1
            yield pause
            pause = min(_LONGEST_PAUSE, pause * 2 + random.uniform(0, attempt / 1000))  # noqa: S311


class SpinLock(LockHandle):
    """A reentrant lock whose waiters poll with back-off instead of subscribing.

    ``client.spin_lock(name)`` creates one. State in Redis is Redisson's RSpinLock: the RLock
    hash ``name`` (a Lock and a SpinLock on one name exclude each other), and nothing is
    ever published. A waiter of another client learns of a release at its next attempt,
    at most 128 ms (plus jitter) later.
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, SpinLockPrimitive(engine.settings, name), owner=owner)
