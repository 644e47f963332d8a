"""The read-write lock, in Redisson's RReadWriteLock layout (redisson-spec.md section 6)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ._base import LockBase
from ._cancel import cancel_mark, cancelled_since
from ._config import check_name, check_owner
from ._exceptions import LockUpgradeError
from ._keys import rwlock_channel, rwlock_timeout_prefix, write_holder
from ._lock import ExclusiveLockBase
from ._pubsub import rwlock_wake_count
from ._scripts import AcquireReply, as_int, load_script

if TYPE_CHECKING:
    from ._client import Client
    from ._pubsub import WakeCount
    from ._scripts import Script

__all__ = ("ReadLock", "ReadWriteLock", "WriteLock")

#: Published by a read release (and a read force_unlock) that frees the lock.
_READ_UNLOCK = "0"
#: Published by a write release (and a write force_unlock) that frees the lock.
_WRITE_UNLOCK = "1"
#: rw_write_release.lua: the write hold is gone, the holder's read holds remain.
_DOWNGRADED = 2


def _timeout_key_prefix(key: str) -> str:
    """The ``{name}`` part every read hold's timeout key starts with (spec 6.1)."""
    return key if "{" in key else f"{{{key}}}"


class _Side(LockBase):
    """What the two views share: the hash, the channel and the name's timeout-key prefix."""

    __slots__ = ("_chan", "_tag")

    _chan: str
    _tag: str

    # Read and write waiters share the channel. Whatever Redisson publishes on it ("0" or
    # "1"), this client wakes every local reader but only one local writer: the lock is
    # free, and a writer that loses re-waits, bounded by the lease as every wait is.
    _wake_count: WakeCount = staticmethod(rwlock_wake_count)

    def __init__(self, client: Client, name: str, *, owner: str | None = None) -> None:
        super().__init__(client, name, owner=owner)
        self._chan = rwlock_channel(self._key)
        self._tag = _timeout_key_prefix(self._key)

    def _channel(self, holder: str) -> str:
        return self._chan

    async def _force(self, mode: str, message: str) -> bool:
        raw = await self._run(
            load_script("rw_force_unlock"),
            [self._key, self._chan, self._tag],
            [mode, message, self._client._publish],
        )
        return as_int(raw) == 1

    async def _ask(self, script: Script, keys: list[str], args: list[str | int]) -> Any:
        """Run a read-only query script, with the checks and error mapping of _query."""
        mark = cancel_mark()
        self._client._check_open()
        try:
            reply = await self._run(script, keys, args)
        except ResponseError as exc:
            raise self._script_error(exc) from exc
        if cancelled_since(mark):
            raise asyncio.CancelledError
        return reply


class ReadLock(_Side):
    """The shared side of a read-write lock: ``rw.read_lock()``.

    Any number of holders (tasks, clients, Java threads) hold it at once while no writer
    does; a holder may re-enter it. The task that holds the write lock may take it too
    (see :class:`ReadWriteLock` on downgrading). Each read hold has its own timeout key
    and lease; the hash lives as long as the longest of them.
    """

    __slots__ = ()

    # Every wake-up reaches every waiting reader: when one reader can get in, they all can.
    _shared_waits = True

    def _hold_kind(self, holder: str) -> tuple[str, str]:
        # The watchdog renews the hash and this holder's own per-hold timeout keys.
        return "read", rwlock_timeout_prefix(self._key, holder)

    async def _try_once(
        self, field: str, lease_ms: int, target: int, tombstone: str, *, wait: float | None
    ) -> AcquireReply:
        raw = await self._run(
            load_script("rw_read_acquire"),
            [self._key, rwlock_timeout_prefix(self._key, field), tombstone],
            [lease_ms, field, write_holder(field), target],
        )
        return AcquireReply.decode(raw)

    async def _rollback(self, field: str, target: int, tombstone: str) -> None:
        client = self._client
        await self._run(
            load_script("rw_read_rollback"),
            [self._key, self._chan, rwlock_timeout_prefix(self._key, field), self._tag, tombstone],
            [field, target, client._publish, client._latch_ttl_ms],
        )

    async def _release_once(self, field: str, reapply_ms: int, latch: str) -> int | None:
        # No lease is re-applied: the script recomputes the hash TTL from the timeout keys.
        client = self._client
        raw = await self._run(
            load_script("rw_read_release"),
            [self._key, self._chan, rwlock_timeout_prefix(self._key, field), self._tag, latch],
            [_READ_UNLOCK, field, client._publish, client._latch_ttl_ms],
        )
        return as_int(raw)

    async def _force_once(self) -> bool:
        return await self._force("read", _READ_UNLOCK)

    async def is_locked(self) -> bool:
        """Whether readers hold it: mode=read, or a writer that also took read holds."""
        raw = await self._ask(load_script("rw_read_is_locked"), [self._key], [])
        return as_int(raw) == 1

    async def force_unlock(self) -> bool:
        """Delete the lock if it is in read mode, whoever holds it; True if it was.

        A lock held for writing is left alone (False). Waiters are woken with ``0``, as
        Redisson does.
        """
        return await super().force_unlock()


class WriteLock(_Side, ExclusiveLockBase):
    """The exclusive side of a read-write lock: ``rw.write_lock()``.

    One holder at a time, and no reader but the writer itself; re-entrant (each re-entry
    ADDS its lease to the remaining TTL, as Redisson does). Asking for it while holding
    only read holds of the same lock raises :class:`~aiolock.LockUpgradeError` at once
    (see :class:`ReadWriteLock`).
    """

    __slots__ = ()

    # A write unlock wakes one local writer: without this the releasing task, trying at
    # once, would re-take the lock before that writer could.
    _no_barging = True
    _acquire_script = "rw_write_acquire"
    _rollback_script = "rw_write_rollback"
    _release_script = "rw_write_release"
    _unlock_message = _WRITE_UNLOCK

    def _field(self, holder: str) -> str:
        return write_holder(holder)

    def _check_acquire(self, holder: str) -> None:
        # An upgrade waits for the holder's own read holds to go: it never succeeds
        # (Redisson deadlocks until a lease runs out). This client knows every hold it has.
        holds = self._client._holds
        read = holds.get(self._key, holder)
        if read is None or not read.count:
            return
        write = holds.get(self._key, write_holder(holder))
        if write is None or not write.count:
            raise LockUpgradeError(self._name, holder)

    async def _release_once(self, field: str, reapply_ms: int, latch: str) -> int | None:
        client = self._client
        raw = await super()._release_once(field, reapply_ms, latch)
        if raw == _DOWNGRADED:
            # Redisson publishes nothing here, and neither does aiolock (the wire must
            # match). This client's own readers need no message: wake them directly, so
            # they get in now instead of after their TTL-bounded wait. Writers stay
            # parked: the read holds left keep them out.
            channel = client._dispatcher._channels.get(self._chan)
            if channel is not None:
                channel.wake(0)
            return 1
        return raw

    async def _force_once(self) -> bool:
        return await self._force("write", _WRITE_UNLOCK)

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


class ReadWriteLock:
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
    aiolock raises :class:`~aiolock.LockUpgradeError` at once instead and changes
    nothing. It knows from this client's own holds, so a read hold taken through another
    client (or by Java) is not seen; neither can share a holder id with this task.

    A waiting writer does not stop new readers (as in Redisson): under a steady stream of
    readers a writer can starve.
    """

    __slots__ = ("__weakref__", "_client", "_name", "_owner")

    def __init__(self, client: Client, name: str, *, owner: str | None = None) -> None:
        self._client = client
        self._name = check_name(name)
        self._owner = check_owner(owner)

    @property
    def name(self) -> str:
        """The lock's name as given (without ``key_prefix``)."""
        return self._name

    def __repr__(self) -> str:
        owner = f" owner={self._owner!r}" if self._owner else ""
        return f"<aiolock.ReadWriteLock {self._name!r}{owner}>"

    def read_lock(self) -> ReadLock:
        """The shared lock: many readers at once, no writer (but the reader's own)."""
        return ReadLock(self._client, self._name, owner=self._owner)

    def write_lock(self) -> WriteLock:
        """The exclusive lock: one writer, no reader (but its own)."""
        return WriteLock(self._client, self._name, owner=self._owner)
