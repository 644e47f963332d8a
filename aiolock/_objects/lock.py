"""The reentrant lock, in Redisson's RLock layout (redisson-spec.md section 2)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from .._engine.primitive import Invocation, Primitive
from .._keys import lock_channel
from .._net.scripts import load_script
from .handle import LockHandle

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.engine import Engine
    from .._engine.primitive import Call
    from ..events import Kind

__all__ = ("ExclusivePrimitive", "Lock", "LockPrimitive")

log = logging.getLogger("aiolock")

_UNLOCK_MESSAGE = "0"


class ExclusivePrimitive(Primitive):
    """What the lock and the read-write lock's write side share: one holder field, one channel.

    A hold is one field of the lock hash, and a release that frees the lock publishes one
    message on one channel. Their scripts take the same KEYS and ARGV: a subclass names
    them and its message, and sets ``chan``.
    """

    __slots__ = ()

    no_barging = True
    chan: str
    acquire_script: ClassVar[str]
    rollback_script: ClassVar[str]
    release_script: ClassVar[str]
    unlock_message: ClassVar[str]

    def channel(self, holder: str) -> str:
        return self.chan

    @property
    def publish(self) -> str:
        """The command that publishes this lock's messages ('': none, where it polls)."""
        return "" if self.polls else self.settings.publish

    def acquire(self, call: Call, target: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script(self.acquire_script),
            [self.key, tombstone],
            [call.lease_ms, call.field, target],
        )

    def rollback(self, call: Call, target: int, tombstone: str, reapply_ms: int) -> Invocation:
        s = self.settings
        return Invocation(
            load_script(self.rollback_script),
            [self.key, self.chan, tombstone],
            [call.field, target, reapply_ms, self.publish, s.latch_ttl_ms],
        )

    def release(
        self, field: str, reapply_ms: int, latch: str, heir: Call | None = None
    ) -> Invocation:
        s = self.settings
        args: list[str | int] = [
            self.unlock_message,
            reapply_ms,
            field,
            self.publish,
            s.latch_ttl_ms,
        ]
        if heir is not None:
            args += [heir.field, heir.lease_ms]
        return Invocation(load_script(self.release_script), [self.key, self.chan, latch], args)


class LockPrimitive(ExclusivePrimitive):
    """The reentrant lock: a hash of holder to count, woken by ``0`` on its channel."""

    __slots__ = ("chan",)

    hands_over = True
    # Its channel carries a message while held only when forced (a release by its holder
    # is told apart by the hold's ``releasing``; a hand-over publishes nothing).
    watched = True
    lock_kind: ClassVar[Kind] = "lock"
    acquire_script = "lock_acquire"
    rollback_script = "lock_rollback"
    release_script = "lock_release"
    unlock_message = _UNLOCK_MESSAGE

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        self.chan = lock_channel(self.key)

    def takes_hand_over(self, releaser: Primitive) -> bool:
        # lock_release.lua writes the heir one hold with its lease: a reentrant lock's
        # acquisition exactly (a subclass that takes more says no).
        return isinstance(releaser, LockPrimitive) and releaser.key == self.key

    def force(self) -> Invocation:
        return Invocation(
            load_script("lock_force_unlock"),
            [self.key, self.chan],
            [_UNLOCK_MESSAGE, self.publish],
        )


class Lock(LockHandle):
    """A reentrant distributed lock; ``client.lock(name)`` creates one.

    State in Redis is exactly Redisson's RLock: a hash ``name`` of holder id to reentrancy
    count with a PEXPIRE lease, and the channel ``redisson_lock__channel:{name}``, which
    receives ``0`` when the lock is released.
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, LockPrimitive(engine.settings, name), owner=owner)
