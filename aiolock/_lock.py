"""The reentrant lock, in Redisson's RLock layout (redisson-spec.md section 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from ._base import LockBase
from ._keys import lock_channel
from ._scripts import AcquireReply, as_int, load_script

if TYPE_CHECKING:
    from ._client import Client

__all__ = ("ExclusiveLockBase", "Lock")

_UNLOCK_MESSAGE = "0"


class ExclusiveLockBase(LockBase):
    """What the lock and the read-write lock's write side share: one holder field, one channel.

    A hold is one field of the lock hash, and a release that frees the lock publishes one
    message on one channel. Their scripts take the same KEYS and ARGV: a subclass names
    them and its message, and sets ``_chan`` in ``__init__``.
    """

    __slots__ = ()

    _chan: str
    _acquire_script: ClassVar[str]
    _rollback_script: ClassVar[str]
    _release_script: ClassVar[str]
    _unlock_message: ClassVar[str]

    def _channel(self, holder: str) -> str:
        return self._chan

    async def _try_once(
        self, field: str, lease_ms: int, target: int, tombstone: str, *, wait: float | None
    ) -> AcquireReply:
        raw = await self._run(
            load_script(self._acquire_script), [self._key, tombstone], [lease_ms, field, target]
        )
        return AcquireReply.decode(raw)

    async def _rollback(self, field: str, target: int, tombstone: str) -> None:
        client = self._client
        hold = client._holds.get(self._key, field)
        await self._run(
            load_script(self._rollback_script),
            [self._key, self._chan, tombstone],
            [
                field,
                target,
                hold.reapply_ms(client._lease_ms) if hold else client._lease_ms,
                client._publish,
                client._latch_ttl_ms,
            ],
        )

    async def _release_once(self, field: str, reapply_ms: int, latch: str) -> int | None:
        client = self._client
        raw = await self._run(
            load_script(self._release_script),
            [self._key, self._chan, latch],
            [self._unlock_message, reapply_ms, field, client._publish, client._latch_ttl_ms],
        )
        return as_int(raw)


class Lock(ExclusiveLockBase):
    """A reentrant distributed lock; ``client.lock(name)`` creates one.

    State in Redis is exactly Redisson's RLock: a hash ``name`` of holder id to reentrancy
    count with a PEXPIRE lease, and the channel ``redisson_lock__channel:{name}``, which
    receives ``0`` when the lock is released.
    """

    __slots__ = ("_chan",)

    _no_barging = True
    _acquire_script = "lock_acquire"
    _rollback_script = "lock_rollback"
    _release_script = "lock_release"
    _unlock_message = _UNLOCK_MESSAGE

    def __init__(self, client: Client, name: str, *, owner: str | None = None) -> None:
        super().__init__(client, name, owner=owner)
        self._chan = lock_channel(self._key)

    async def _force_once(self) -> bool:
        raw = await self._run(
            load_script("lock_force_unlock"),
            [self._key, self._chan],
            [_UNLOCK_MESSAGE, self._client._publish],
        )
        return as_int(raw) == 1
