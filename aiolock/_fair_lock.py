"""The fair (FIFO) lock, in Redisson's RFairLock layout (redisson-spec.md section 5)."""

from __future__ import annotations

import contextvars
import time
from typing import TYPE_CHECKING

from ._base import LockBase
from ._keys import fair_channel_base, fair_queue_key, fair_timeout_key
from ._scripts import AcquireReply, as_int, load_script

if TYPE_CHECKING:
    from ._client import Client

__all__ = ("FairLock",)

_UNLOCK_MESSAGE = "0"

#: The acquire call running in this context: (its W in ms, whether it may join the queue).
#: The base class runs the hooks that undo a call (leaving the queue, rolling back an
#: attempt cut off in flight) in tasks spawned from that call, and a task starts with a copy
#: of its creator's context: this is how those hooks learn the call's W, which they need to
#: move the waiters behind it up by the right amount.
_current_call: contextvars.ContextVar[tuple[int, bool]] = contextvars.ContextVar(
    "aiolock_fair_lock_call"
)


def _now_ms() -> int:
    # Wall clock, not monotonic: deadlines are stored in Redis and compared by every client
    # (Java ones included) against their own clocks.
    return time.time_ns() // 1_000_000


class FairLock(LockBase):
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

    __slots__ = ("_chan", "_queue", "_timeouts")

    _leaves_queue = True

    def __init__(self, client: Client, name: str, *, owner: str | None = None) -> None:
        super().__init__(client, name, owner=owner)
        self._queue = fair_queue_key(self._key)
        self._timeouts = fair_timeout_key(self._key)
        self._chan = fair_channel_base(self._key)

    def _channel(self, holder: str) -> str:
        return f"{self._chan}:{holder}"

    def _wait_ms(self, wait: float | None) -> int:
        """W of a call: its wait in ms if > 0, else the client's fair-lock wait timeout."""
        ms = round(wait * 1000) if wait else 0
        if ms > 0:
            return ms
        return round(self._client._options.fair_lock_wait_timeout * 1000)

    def _call(self) -> tuple[int, bool]:
        return _current_call.get((self._wait_ms(None), True))

    async def _acquire(self, wait: float | None, lease: float | None) -> bool:
        token = _current_call.set((self._wait_ms(wait), wait != 0))
        try:
            return await super()._acquire(wait, lease)
        finally:
            _current_call.reset(token)

    async def _try_once(
        self, field: str, lease_ms: int, target: int, tombstone: str, *, wait: float | None
    ) -> AcquireReply:
        client = self._client
        raw = await self._run(
            load_script("fair_acquire"),
            [self._key, self._queue, self._timeouts, tombstone],
            [
                lease_ms,
                field,
                self._wait_ms(wait),
                _now_ms(),
                target,
                "0" if wait == 0 else "1",
                round(client._ttl_cap * 1000),
            ],
        )
        return AcquireReply.decode(raw)

    async def _rollback(self, field: str, target: int, tombstone: str) -> None:
        client = self._client
        wait_ms, joins_queue = self._call()
        hold = client._holds.get(self._key, field)
        await self._run(
            load_script("fair_rollback"),
            [self._key, self._queue, self._timeouts, self._chan, tombstone],
            [
                field,
                target,
                hold.reapply_ms(client._lease_ms) if hold else client._lease_ms,
                wait_ms,
                _now_ms(),
                _UNLOCK_MESSAGE,
                client._publish,
                client._latch_ttl_ms,
                "1" if joins_queue else "0",
            ],
        )

    async def _leave_queue(self, holder: str) -> None:
        wait_ms, joins_queue = self._call()
        if not joins_queue:
            # try_lock(wait=0) runs the no-wait variant, which never queues.
            return
        # Left in the queue, the entry would hold up everyone behind it until it times
        # out: resend through connection errors (leaving twice removes nothing more).
        await self._until_answered(
            f"take a waiter of fair lock {self._name!r} out of its queue",
            lambda: self._run(
                load_script("fair_leave"),
                [self._key, self._queue, self._timeouts, self._chan],
                [self._field(holder), wait_ms, _now_ms(), _UNLOCK_MESSAGE, self._client._publish],
            ),
            wait_ms,
        )

    async def _release_once(self, field: str, reapply_ms: int, latch: str) -> int | None:
        client = self._client
        raw = await self._run(
            load_script("fair_release"),
            [self._key, self._queue, self._timeouts, self._chan, latch],
            [
                _UNLOCK_MESSAGE,
                reapply_ms,
                field,
                _now_ms(),
                client._publish,
                client._latch_ttl_ms,
            ],
        )
        return as_int(raw)

    async def _force_once(self) -> bool:
        raw = await self._run(
            load_script("fair_force_unlock"),
            [self._key, self._queue, self._timeouts, self._chan],
            [_UNLOCK_MESSAGE, _now_ms(), self._client._publish],
        )
        return as_int(raw) == 1
