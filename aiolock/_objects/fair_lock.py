"""The fair (FIFO) lock, in Redisson's RFairLock layout (redisson-spec.md section 5)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._engine.primitive import Invocation, Primitive
from .._keys import fair_channel_base, fair_queue_key, fair_timeout_key
from .._net.scripts import load_script
from .handle import LockHandle

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.engine import Engine
    from .._engine.primitive import Call

__all__ = ("FairLock", "FairPrimitive")

_UNLOCK_MESSAGE = "0"


def _now_ms() -> int:
    # Wall clock, not monotonic: deadlines are stored in Redis and compared by every client
    # (Java ones included) against their own clocks.
    return time.time_ns() // 1_000_000


class FairPrimitive(Primitive):
    """The fair lock: the RLock hash, a queue of waiters and their eviction deadlines.

    Each waiter has its own channel; a release wakes only the head of the queue.
    """

    __slots__ = ("chan", "queue", "timeouts")

    lock_kind = "fair_lock"

    leaves_queue = True

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        self.queue = fair_queue_key(self.key)
        self.timeouts = fair_timeout_key(self.key)
        self.chan = fair_channel_base(self.key)

    def channel(self, holder: str) -> str:
        return f"{self.chan}:{holder}"

    def _wait_ms(self, call: Call) -> int:
        """W of a call: its wait in ms if > 0, else the client's fair-lock wait timeout."""
        ms = round(call.wait * 1000) if call.wait else 0
        return ms if ms > 0 else self.settings.fair_wait_ms

    def acquire(self, call: Call, target: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script("fair_acquire"),
            [self.key, self.queue, self.timeouts, tombstone],
            [
                call.lease_ms,
                call.field,
                self._wait_ms(call),
                _now_ms(),
                target,
                "0" if call.wait == 0 else "1",
                round(self.settings.ttl_cap * 1000),
            ],
        )

    def rollback(self, call: Call, target: int, tombstone: str, reapply_ms: int) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("fair_rollback"),
            [self.key, self.queue, self.timeouts, self.chan, tombstone],
            [
                call.field,
                target,
                reapply_ms,
                self._wait_ms(call),
                _now_ms(),
                _UNLOCK_MESSAGE,
                s.publish,
                s.latch_ttl_ms,
                "0" if call.wait == 0 else "1",
            ],
        )

    def leave(self, call: Call) -> tuple[Invocation, int] | None:
        if call.wait == 0:
            # try_lock(wait=0) runs the no-wait variant, which never queues.
            return None
        wait_ms = self._wait_ms(call)
        invocation = Invocation(
            load_script("fair_leave"),
            [self.key, self.queue, self.timeouts, self.chan],
            [call.field, wait_ms, _now_ms(), _UNLOCK_MESSAGE, self.settings.publish],
        )
        return invocation, wait_ms

    def release(
        self, field: str, reapply_ms: int, latch: str, heir: Call | None = None
    ) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("fair_release"),
            [self.key, self.queue, self.timeouts, self.chan, latch],
            [_UNLOCK_MESSAGE, reapply_ms, field, _now_ms(), s.publish, s.latch_ttl_ms],
        )

    def force(self) -> Invocation:
        return Invocation(
            load_script("fair_force_unlock"),
            [self.key, self.queue, self.timeouts, self.chan],
            [_UNLOCK_MESSAGE, _now_ms(), self.settings.publish],
        )


class FairLock(LockHandle):
    """A FIFO reentrant lock; ``client.fair_lock(name)`` creates one.

    State in Redis is exactly Redisson's RFairLock: the RLock hash ``name`` (holder id to
    reentrancy count, PEXPIRE lease), the list ``redisson_lock_queue:{name}`` of waiting
    holder ids and the sorted set ``redisson_lock_timeout:{name}`` of their eviction
    deadlines (epoch ms, from the client's clock). Each waiter listens on its own channel
    ``redisson_lock__channel:{name}:<holder id>``; a release publishes ``0`` only to the
    waiter at the head of the queue, so exactly one waiter wakes, on any client.

    Waiters acquire in the order they queued, whichever client they are on. A waiter whose
    deadline has passed when it reaches the head is presumed dead and purged; the deadline
    allows W per waiter ahead of it, W being the ``try_lock`` wait or, without one, the
    client's ``fair_lock_wait_timeout`` (300 s). As in Redisson, a live waiter purged because
    the lock was held longer than that rejoins at the tail. ``try_lock(wait=0)`` never
    queues; a waiter that gives up, is cancelled or fails leaves the queue at once.
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, FairPrimitive(engine.settings, name), owner=owner)
