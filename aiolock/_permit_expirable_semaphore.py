"""The permit-expirable semaphore: permits that are taken by id, each with its own lease.

Redisson's RPermitExpirableSemaphore (redisson-spec-2.md section 3). State in Redis is
Redisson's: the string ``name`` of available permits (shared with RSemaphore's layout and
channel ``redisson_sc:{name}``), and the ZSET ``{name}:timeout`` of the ids taken (16 raw
bytes each; users see 32 hex characters) scored with their expiry in epoch ms, or
922337203685477 for a permit that never expires. A permit whose lease ran out goes back to
the pool at the next script of any client (Redisson's reclaim step). A waiter waits at most
until the earliest permit taken expires, so an expiring permit is never waited past.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from ._config import TimeArg, lease_seconds, wait_seconds
from ._exceptions import LockLostError, LockNotOwnedError
from ._keys import suffixed
from ._primitive import Invocation, Outcome
from ._scripts import load_script
from ._semaphore import PermitCount, Permits

if TYPE_CHECKING:
    from ._config import Settings
    from ._engine import Engine

__all__ = ("PermitExpirableSemaphore", "PermitState")

#: Redisson's expiry score of a permit that never expires.
NEVER = 922337203685477
_ID = re.compile(r"[0-9a-f]{32}")


class PermitState(PermitCount):
    """The semaphore as the engine sees it: the count, and the ZSET of the ids taken."""

    __slots__ = ("timeouts",)

    def __init__(self, settings: Settings, name: str) -> None:
        super().__init__(settings, name)
        self.timeouts = suffixed(self.key, "timeout")

    def take(self, ids: list[bytes], lease_ms: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script("psem_acquire"),
            [self.key, self.timeouts, self.chan, tombstone],
            [lease_ms, NEVER, self.settings.publish, *ids],
        )

    def give_back(self, ids: list[bytes], tombstone: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("psem_rollback"),
            [self.key, self.timeouts, self.chan, tombstone],
            [s.publish, s.latch_ttl_ms, *ids],
        )

    def release(self, permit: bytes, latch: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("psem_release"),
            [self.key, self.timeouts, self.chan, latch],
            [permit, NEVER, s.publish, s.latch_ttl_ms],
        )

    def available(self) -> Invocation:
        return Invocation(
            load_script("psem_available"),
            [self.key, self.timeouts, self.chan],
            [self.settings.publish],
        )


def _decode(reply: Any) -> Outcome:
    """``{1}``: taken; ``{0, ms}``: not, and the earliest permit expires in ms (-1: none)."""
    if int(reply[0]) == 1:
        return Outcome(done=True)
    ms = int(reply[1])
    return Outcome(done=False, wait=None if ms < 0 else ms / 1000)


class PermitExpirableSemaphore(Permits):
    """A semaphore whose permits are taken by id, each with an optional lease.

    ``client.permit_expirable_semaphore(name)`` creates one. ``acquire()`` answers the
    permit's id (32 hex characters); any task of any client releases it with
    ``release(id)``. A permit whose lease ran out comes back by itself. Set the permits
    first with ``try_set_permits(n)``.
    """

    __slots__ = ()

    _s: PermitState

    def __init__(self, engine: Engine, name: str) -> None:
        super().__init__(engine, PermitState(engine.settings, name))

    async def available_permits(self) -> int:
        """The permits available now, those whose lease ran out included."""
        return int(await self._engine.ask(self._s, self._s.available()))

    async def acquire(self, lease: TimeArg = None) -> str:
        """Take a permit, waiting as long as it takes; its id. ``lease`` None: no expiry."""
        permit = await self._take(None, lease_seconds(lease))
        assert permit is not None
        return permit

    async def try_acquire(self, wait: TimeArg = 0, lease: TimeArg = None) -> str | None:
        """Take a permit within ``wait`` seconds (0: one attempt); its id, or None."""
        return await self._take(wait_seconds(wait), lease_seconds(lease))

    async def _take(self, wait: float | None, lease: float | None) -> str | None:
        s = self._s
        lease_ms = -1 if lease is None else max(1, round(lease * 1000))
        last: list[bytes] = []

        def attempt_for(tombstone: str) -> tuple[Invocation, Invocation]:
            # Fresh ids per attempt (as Redisson): a resend of one attempt carries its own.
            ids = [os.urandom(16)]
            last[:] = ids
            return s.take(ids, lease_ms, tombstone), s.give_back(ids, tombstone)

        if not await self._engine.take(s, attempt_for, wait, _decode):
            return None
        return last[0].hex()

    async def release(self, permit_id: str) -> None:
        """Give back the permit ``permit_id``; made once, even if cancelled or cut off.

        LockNotOwnedError if no permit has that id (never taken, or released already);
        LockLostError if its lease had run out (the permit is back all the same).
        """
        if not isinstance(permit_id, str):
            raise TypeError(f"permit_id must be a str, not {type(permit_id).__name__}")
        if not _ID.fullmatch(permit_id):
            raise ValueError(f"permit_id must be 32 hex characters, got {permit_id!r}")
        s = self._s
        permit = bytes.fromhex(permit_id)
        done = await self._engine.change(s, lambda latch: s.release(permit, latch), "release")
        if int(done) == 0:
            raise LockNotOwnedError(s.name, f"permit {permit_id}", "no permit has that id")
        if int(done) == 2:
            raise LockLostError(s.name, f"permit {permit_id}", "its lease had run out")
