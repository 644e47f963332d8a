"""The fenced lock: a reentrant lock whose every acquisition takes a token that only grows.

Redisson's RFencedLock (redisson-spec-2.md section 5).

A holder passes its token to the storage it writes to, which refuses a token lower than one
it has seen: a holder paused past its lease (a GC, a stalled event loop) and overtaken by
the next holder cannot then write with its stale token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._config import TimeArg, lease_seconds, wait_seconds
from .._engine.acquire import acquire
from .._engine.primitive import Invocation
from .._keys import fenced_token_key
from .._net.scripts import load_script
from .handle import LockHandle
from .lock import LockPrimitive

if TYPE_CHECKING:
    from .._config import Settings
    from .._engine.engine import Engine
    from .._engine.guard import Guarding
    from .._engine.primitive import Call, Primitive

__all__ = ("FencedLock", "FencedLockPrimitive")


class FencedLockPrimitive(LockPrimitive):
    """RLock's hash and channel, plus the token counter the acquire script advances."""

    __slots__ = ("token_key",)

    lock_kind = "fenced_lock"

    # A hand-over is an acquisition by the release script, which takes no token: a fenced
    # release frees the lock for everyone, and a fenced waiter is never an heir.
    hands_over = False

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        self.token_key = fenced_token_key(self.key)

    def takes_hand_over(self, releaser: Primitive) -> bool:
        return False

    def acquire(self, call: Call, target: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script(self.acquire_script),
            [self.key, tombstone, self.token_key],
            [call.lease_ms, call.field, target],
        )


class FencedLock(LockHandle):
    """A reentrant lock that also gives each acquisition a fencing token.

    ``client.fenced_lock(name)`` creates one. State in Redis is Redisson's RFencedLock: the
    RLock hash ``name`` and channel, and the counter ``redisson_lock_token:{name}``. Every
    successful acquisition, re-entrant ones included, takes the next token; a Lock and a
    FencedLock on one name exclude each other, but only fenced acquisitions take tokens.
    The lock methods (``lock()``, ``try_lock()``, ``async with``) take a token too, and
    drop it.
    """

    __slots__ = ()

    def __init__(self, engine: Engine, name: str, *, owner: str | None = None) -> None:
        super().__init__(engine, FencedLockPrimitive(engine.settings, name), owner=owner)

    async def _guard_acquire(self, wait: float | None, lease: float | None) -> Guarding | None:
        # A guarded hold carries its acquisition's token.
        receipt: list[int] = []
        if not await acquire(
            self._engine, self._primitive, self._owner, wait, lease, receipt=receipt, timed=True
        ):
            return None
        return self._guard_hold(lease, receipt[0])

    async def lock_and_get_token(self, lease: TimeArg = None) -> int:
        """Wait until acquired; return the acquisition's token. ``lease`` as for lock()."""
        receipt: list[int] = []
        await acquire(
            self._engine, self._primitive, self._owner, None, lease_seconds(lease), receipt=receipt
        )
        # Acquired means a token in the receipt: a call with one is never handed the lock
        # (Engine._offer), and an acquire reply without a token is refused (Engine._attempt).
        return receipt[0]

    async def try_lock_and_get_token(self, wait: TimeArg = 0, lease: TimeArg = None) -> int | None:
        """As try_lock(); the acquisition's token, or None if ``wait`` ran out."""
        receipt: list[int] = []
        acquired = await acquire(
            self._engine,
            self._primitive,
            self._owner,
            wait_seconds(wait),
            lease_seconds(lease),
            receipt=receipt,
        )
        return receipt[0] if acquired else None
