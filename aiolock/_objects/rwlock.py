"""The read-write lock, in Redisson's RReadWriteLock layout (redisson-spec.md section 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._engine.primitive import Invocation, Primitive, Renewing, as_int
from .._exceptions import LockUpgradeError
from .._keys import rwlock_channel, rwlock_timeout_prefix, write_holder
from .._net.scripts import load_script
from .handle import LockHandle, ReadWritePair
from .lock import ExclusivePrimitive

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.engine import Engine
    from .._engine.holds import HoldRecord, HoldRegistry
    from .._engine.primitive import Call

__all__ = ("ReadLock", "ReadWriteLock", "WriteLock")

#: Published by a read release (and a read force_unlock) that frees the lock.
_READ_UNLOCK = "0"
#: Published by a write release (and a write force_unlock) that frees the lock.
_WRITE_UNLOCK = "1"


def rwlock_wake_count(data: bytes) -> int | None:
    """Read-write lock channels: any message wakes every reader and one writer.

    Both ``0`` (read unlock) and ``1`` (write unlock) are published only once the lock is
    free. Every reader can then get in together, but only one writer: waking them all
    would have every writer but one run its script for nothing.
    """
    return 1


def _timeout_key_prefix(key: str) -> str:
    """The ``{name}`` part every read hold's timeout key starts with (spec 6.1)."""
    return key if "{" in key else f"{{{key}}}"


class _Side(Primitive):
    """What the two sides share: the hash, the channel and the name's timeout-key prefix."""

    __slots__ = ("chan", "tag")

    mode: str
    message: str

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        self.chan = rwlock_channel(self.key)
        self.tag = _timeout_key_prefix(self.key)

    def channel(self, holder: str) -> str:
        return self.chan

    def wake_count(self, data: bytes) -> int | None:
        # Read and write waiters share the channel. Whatever Redisson publishes on it ("0"
        # or "1"), this client wakes every local reader but only one local writer: the
        # lock is free, and a writer that loses re-waits, bounded by the lease as ever.
        return rwlock_wake_count(data)

    def force(self) -> Invocation:
        return Invocation(
            load_script("rw_force_unlock"),
            [self.key, self.chan, self.tag],
            [self.mode, self.message, self.settings.publish],
        )


def _watchdog_holds(hold: HoldRecord) -> str:
    # Read hold k (1-based, in acquisition order) has its own timeout key and lease; only
    # those taken without an explicit lease are the watchdog's to renew.
    return ",".join(str(k) for k, lease in enumerate(hold.leases, 1) if lease is None)


#: A holder's read holds: KEYS[2i-1], KEYS[2i] = the hash of hold i and its holder's
#: timeout-key prefix (``extra``); ARGV[2i], ARGV[2i+1] = its field and the numbers of its
#: watchdog holds.
READ_RENEWAL = Renewing(
    "rw_read_renew",
    lambda batch: [key for hold in batch for key in (hold.key, hold.extra)],
    lambda batch: [arg for hold in batch for arg in (hold.field, _watchdog_holds(hold))],
)


class ReadPrimitive(_Side):
    """The read side: a field per reader and one timeout key per read hold."""

    __slots__ = ()

    lock_kind = "read_lock"

    # Every wake-up reaches every waiting reader: when one reader can get in, they all can.
    shared_waits = True
    mode = "read"
    message = _READ_UNLOCK

    # The watchdog renews the hash and this holder's own per-hold timeout keys.
    renewing = READ_RENEWAL

    def hold_extra(self, holder: str) -> str:
        return rwlock_timeout_prefix(self.key, holder)

    def extend(self, hold: HoldRecord, lease_ms: int) -> Invocation:
        # Every read hold of the holder gets the lease (its own timeout key), the hash the
        # longest lease left among every reader's: shorter too (the renewal only raises it,
        # so as not to cut another reader's longer lease short).
        holds = ",".join(str(k) for k in range(1, hold.count + 1))
        return Invocation(
            load_script("rw_read_extend"),
            [self.key, hold.extra, self.tag],
            [lease_ms, hold.field, holds],
        )

    def acquire(self, call: Call, target: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script("rw_read_acquire"),
            [self.key, rwlock_timeout_prefix(self.key, call.field), tombstone],
            [call.lease_ms, call.field, write_holder(call.field), target],
        )

    def rollback(self, call: Call, target: int, tombstone: str, reapply_ms: int) -> Invocation:
        s = self.settings
        timeouts = rwlock_timeout_prefix(self.key, call.field)
        return Invocation(
            load_script("rw_read_rollback"),
            [self.key, self.chan, timeouts, self.tag, tombstone],
            [call.field, target, s.publish, s.latch_ttl_ms],
        )

    def release(
        self, field: str, reapply_ms: int, latch: str, heir: Call | None = None
    ) -> Invocation:
        # No lease is re-applied: the script recomputes the hash TTL from the timeout keys.
        s = self.settings
        timeouts = rwlock_timeout_prefix(self.key, field)
        return Invocation(
            load_script("rw_read_release"),
            [self.key, self.chan, timeouts, self.tag, latch],
            [_READ_UNLOCK, field, s.publish, s.latch_ttl_ms],
        )

    def is_locked(self) -> Invocation:
        """Whether readers hold it: mode=read, or a writer that also took read holds."""
        return Invocation(load_script("rw_read_is_locked"), [self.key], [])


class WritePrimitive(_Side, ExclusivePrimitive):
    """The write side: the ``<holder>:write`` field; a release may downgrade to reads."""

    __slots__ = ()

    # While a write hold is held, only a force publishes on the channel (a downgrade and
    # the holder's own read unlocks do not: they never free the lock).
    watched = True

    # A write unlock wakes one local writer: without this the releasing task, trying at
    # once, would re-take the lock before that writer could.
    no_barging = True
    # A write unlock that frees the lock hands it to a writer of this client parked on it
    # (rw_write_release.lua, reply 3): one round trip for the release and that writer's
    # acquisition, where a freeing "1" wakes a writer in every client, and all but one
    # try for nothing (4 processes x 8 writers: 5 round trips per acquisition).
    hands_over = True
    mode = "write"
    lock_kind = "write_lock"
    message = _WRITE_UNLOCK
    acquire_script = "rw_write_acquire"
    rollback_script = "rw_write_rollback"
    release_script = "rw_write_release"
    unlock_message = _WRITE_UNLOCK

    def field(self, holder: str) -> str:
        return write_holder(holder)

    def takes_hand_over(self, releaser: Primitive) -> bool:
        # rw_write_release.lua writes the heir one write hold with its lease, mode kept
        # "write": this side's acquisition of a free lock exactly.
        return isinstance(releaser, WritePrimitive) and releaser.key == self.key

    def check_acquire(self, holder: str, holds: HoldRegistry) -> None:
        # An upgrade waits for the holder's own read holds to go: it never succeeds
        # (Redisson deadlocks until a lease runs out). This client knows every hold it has;
        # a write hold known lost no longer makes its holder a writer.
        if holds.count(self.key, holder) and not holds.holding(self.key, write_holder(holder)):
            raise LockUpgradeError(self.name, holder)


class ReadLock(LockHandle):
    """The shared side of a read-write lock: ``rw.read_lock()``.

    Any number of holders (tasks, clients, Java threads) hold it at once while no writer
    does; a holder may re-enter it. The task that holds the write lock may take it too
    (see `ReadWriteLock` on downgrading). Each read hold has its own timeout key
    and lease; the hash lives as long as the longest of them.
    """

    __slots__ = ()

    _primitive: ReadPrimitive

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, ReadPrimitive(engine.settings, name), owner=owner)

    async def is_locked(self) -> bool:
        """Whether readers hold it: mode=read, or a writer that also took read holds."""
        return as_int(await self._engine.ask(self._primitive, self._primitive.is_locked())) == 1

    async def force_unlock(self) -> bool:
        """Delete the lock if it is in read mode, whoever holds it; True if it was.

        A lock held for writing is left alone (False). Waiters are woken with ``0``, as
        Redisson does.
        """
        return await super().force_unlock()


class WriteLock(LockHandle):
    """The exclusive side of a read-write lock: ``rw.write_lock()``.

    One holder at a time, and no reader but the writer itself; re-entrant (each re-entry
    ADDS its lease to the remaining TTL, as Redisson does). Asking for it while holding
    only read holds of the same lock raises `LockUpgradeError` at once
    (see `ReadWriteLock`).
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, WritePrimitive(engine.settings, name), owner=owner)

    async def is_locked(self) -> bool:
        """Whether a writer holds it (mode=write)."""
        mode = await self._query("HGET", self._key, "mode")
        return mode in {b"write", "write"}

    async def force_unlock(self) -> bool:
        """Delete the lock if it is in write mode, whoever holds it; True if it was.

        A lock held by readers only is left alone (False). Waiters are woken with ``1``,
        as Redisson does.
        """
        return await super().force_unlock()


class ReadWriteLock(ReadWritePair):
    """A read-write lock: ``client.read_write_lock(name)``; its two views share one state.

    ``read_lock()`` is shared, ``write_lock()`` exclusive; both are re-entrant and take the
    handle's ``owner=``. State in Redis is exactly Redisson's RReadWriteLock:

    * the hash ``name``: ``mode`` = ``read`` or ``write``, one field ``<holder>`` per
      reader (its read count) and ``<holder>:write`` for the writer (its write count);
    * one string key per read hold, ``{name}:<holder>:rwlock_timeout:<k>`` for
      k = 1..count, each with that hold's lease; a read unlock sets the hash TTL to the
      longest of every holder's keys;
    * the channel ``redisson_rwlock:{name}``: a read release that frees the lock publishes
      ``0``, a write release ``1``. Either wakes every reader waiting in this client and
      one of its waiting writers.

    **Downgrade.** The writer may take the read lock while it writes and then release the
    two in either order. Releasing the write hold first leaves the lock in read mode,
    held by the former writer's read holds. Redisson publishes nothing at that point and
    aiolock matches it, since what is published is part of the wire contract: readers of
    *other* clients (Java or aiolock) waiting on the name get in at their next
    TTL-bounded retry, at most one lease later. Readers waiting in the *same* client are
    woken locally at once, without a message.

    **Upgrade.** A holder with read holds but no write hold that asks for the write lock
    would wait for its own read holds: Redisson deadlocks until a lease runs out.
    aiolock raises `LockUpgradeError` at once instead and changes
    nothing. It knows from this client's own holds, so a read hold taken through another
    client (or by Java) is not seen; neither can share a holder id with this task.

    A waiting writer does not stop new readers (as in Redisson): under a steady stream of
    readers a writer can starve.
    """

    __slots__ = ()

    def read_lock(self) -> ReadLock:
        """The shared lock: many readers at once, no writer (but the reader's own)."""
        return ReadLock(self._engine, self._name, owner=self._owner)

    def write_lock(self) -> WriteLock:
        """The exclusive lock: one writer, no reader (but its own)."""
        return WriteLock(self._engine, self._name, owner=self._owner)
