"""The fair read-write lock: readers and writers served in arrival order.

aiolock's own object: Redisson has none (its read-write lock lets new readers in while a
writer waits, so a stream of readers can starve a writer). Here every waiter queues in
Redis in arrival order; the readers at the head of the queue share the lock; a writer
waits only for the holders and the waiters ahead of it. Re-entry is never queued.

Layout (all keys in the name's hash slot; no Redisson object uses these names):

* ``aiolock_frw:{name}``: hash of the holds, ``r:<holder>`` / ``w:<holder>`` -> reentrancy
  count, and ``mode`` = ``read`` or ``write``; deleted when the last hold goes;
* ``aiolock_frw_leases:{name}``: sorted set, each hold's field -> when its lease ends
  (server clock, epoch ms): a hold whose lease ran out is purged by the next script, so
  a dead reader never holds a writer up for longer than its own lease;
* ``aiolock_frw_queue:{name}``: list of the waiters (the same ``r:``/``w:`` strings), in
  arrival order, and ``aiolock_frw_deadlines:{name}``: sorted set, waiter -> when it is
  dropped unless it tries again before (a waiter of a dead client is dropped within
  ``watchdog_timeout``);
* ``aiolock_frw_admitted:{name}``: sorted set, the readers let in together from the head
  of the queue (popped from the list by the first of them to try) that have not taken
  their hold yet -> their deadline: each finds itself there in O(1), and a writer waits
  until it is empty (an older aiolock on the same name ignores it, see
  ``fragments/frw_admit.lua``);
* ``aiolock_frw__channel:{name}``: ``1`` whenever someone may get in (a release, a waiter
  leaving, readers let in with more readers next); every local waiter looks again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from .._engine.primitive import Invocation, Primitive, Renewing
from .._exceptions import LockUpgradeError
from .._keys import prefixed
from .._net.scripts import load_script
from .handle import LockHandle, ReadWritePair

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.engine import Engine
    from .._engine.holds import HoldRegistry
    from .._engine.primitive import Call

__all__ = ("FairReadLock", "FairReadWriteLock", "FairWriteLock")


#: A hold of a fair read-write lock: KEYS[2i-1], KEYS[2i] = the holds' hash of hold i and
#: its leases ZSET (``extra``); ARGV[i+1] = its field.
FAIR_RW_RENEWAL = Renewing(
    "frw_renew",
    lambda batch: [key for hold in batch for key in (hold.key, hold.extra)],
    lambda batch: [hold.field for hold in batch],
)


class _FairSide(Primitive):
    """One side of the fair read-write lock; the two differ by their field's prefix."""

    __slots__ = ("admitted", "chan", "deadlines", "leases", "queue")

    leaves_queue = True
    # Every message may let any waiter in (the queue decides who): wake them all.
    shared_waits = True
    side: ClassVar[str]

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        base = self.key
        # The holds' hash is the key this lock's holds, waits and queries are about.
        self.key = prefixed("aiolock_frw", base)
        self.leases = prefixed("aiolock_frw_leases", base)
        self.queue = prefixed("aiolock_frw_queue", base)
        self.deadlines = prefixed("aiolock_frw_deadlines", base)
        self.admitted = prefixed("aiolock_frw_admitted", base)
        self.chan = prefixed("aiolock_frw__channel", base)

    def field(self, holder: str) -> str:
        return f"{self.side}:{holder}"

    def channel(self, holder: str) -> str:
        return self.chan

    def wake_count(self, data: bytes) -> int | None:
        return None

    # The hold's entry in the leases ZSET ends at now + lease (extend() too).
    renewing = FAIR_RW_RENEWAL

    def hold_extra(self, holder: str) -> str:
        return self.leases

    @property
    def _queued_ms(self) -> int:
        # A waiter not seen for this long is dropped: two thirds of watchdog_timeout, so
        # that with the sleep it takes to notice (at most _retry_ms, below) a dead
        # client's waiter holds those behind it up for less than watchdog_timeout.
        return round(self.settings.ttl_cap * 2000 / 3)

    @property
    def _retry_ms(self) -> int:
        # A live waiter tries again (refreshing its deadline) at least this often: about
        # three times per _queued_ms, so a stalled loop or a lost reply is not fatal.
        return round(self.settings.ttl_cap * 250)

    def _keys(self, last: str) -> list[str]:
        return [self.key, self.leases, self.queue, self.deadlines, self.chan, last, self.admitted]

    def acquire(self, call: Call, target: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script("frw_acquire"),
            self._keys(tombstone),
            [
                call.lease_ms,
                call.field,
                target,
                "0" if call.wait == 0 else "1",
                self._queued_ms,
                self.settings.publish,
                self._retry_ms,
            ],
        )

    def rollback(self, call: Call, target: int, tombstone: str, reapply_ms: int) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("frw_rollback"),
            self._keys(tombstone),
            [call.field, target, reapply_ms, s.publish, s.latch_ttl_ms],
        )

    def leave(self, call: Call) -> tuple[Invocation, int] | None:
        if call.wait == 0:
            return None  # try_lock(wait=0) never queues
        invocation = Invocation(
            load_script("frw_leave"),
            [self.queue, self.deadlines, self.chan, self.admitted],
            [call.field, self.settings.publish],
        )
        return invocation, self._queued_ms

    def release(
        self, field: str, reapply_ms: int, latch: str, heir: Call | None = None
    ) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("frw_release"),
            self._keys(latch),
            [field, reapply_ms, s.publish, s.latch_ttl_ms],
        )

    def force(self) -> Invocation:
        return Invocation(
            load_script("frw_force_unlock"),
            [self.key, self.leases, self.chan],
            [self.settings.publish],
        )


class _FairRead(_FairSide):
    __slots__ = ()
    side = "r"
    lock_kind = "fair_read_lock"


class _FairWrite(_FairSide):
    __slots__ = ()
    side = "w"
    lock_kind = "fair_write_lock"

    def check_acquire(self, holder: str, holds: HoldRegistry) -> None:
        # Waiting for the write lock while holding read locks would wait for itself. A
        # write hold known lost no longer makes its holder a writer.
        if holds.count(self.key, f"r:{holder}") and not holds.holding(self.key, f"w:{holder}"):
            raise LockUpgradeError(self.name, holder)


class FairReadLock(LockHandle):
    """The shared side of a fair read-write lock: ``frw.read_lock()``.

    Readers share the lock while no writer holds it and none waits ahead of them. The
    holder of the write lock may take it too.
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, _FairRead(engine.settings, name), owner=owner)

    async def is_locked(self) -> bool:
        """Whether readers hold it (and no writer)."""
        return await self._query("HGET", self._key, "mode") in {b"read", "read"}


class FairWriteLock(LockHandle):
    """The exclusive side of a fair read-write lock: ``frw.write_lock()``.

    Asking for it while holding only read locks of the same lock raises
    `LockUpgradeError` at once.
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, _FairWrite(engine.settings, name), owner=owner)

    async def is_locked(self) -> bool:
        """Whether a writer holds it."""
        return await self._query("HGET", self._key, "mode") in {b"write", "write"}


class FairReadWriteLock(ReadWritePair):
    """A read-write lock that serves readers and writers in arrival order.

    ``client.fair_read_write_lock(name)``; ``read_lock()`` and ``write_lock()`` are its two
    views, both re-entrant, both taking the handle's ``owner=``. No writer is starved by
    readers: a reader arriving after a waiting writer waits for it. ``try_lock(wait=0)``
    never jumps ahead of queued waiters. ``force_unlock()`` on either view deletes every
    hold (waiters keep their places). The layout is aiolock's own (see the module), so a
    Redisson client cannot take part.
    """

    __slots__ = ()

    def read_lock(self) -> FairReadLock:
        """The shared lock: readers in arrival order, together."""
        return FairReadLock(self._engine, self._name, owner=self._owner)

    def write_lock(self) -> FairWriteLock:
        """The exclusive lock: one writer, in its turn."""
        return FairWriteLock(self._engine, self._name, owner=self._owner)
