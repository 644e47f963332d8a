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

import contextlib
import os
import re
from typing import TYPE_CHECKING, Any

from .._config import TimeArg, check_count, lease_seconds, wait_seconds
from .._engine.counting import change, let_go_permit, take, took_permit
from .._engine.primitive import Invocation, Outcome
from .._exceptions import LockLostError, LockNotOwnedError, LockTimeoutError
from .._keys import suffixed
from .._net.scripts import load_script
from .handle import release_at_exit
from .semaphore import PermitCount, Permits, declared

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._config import Settings
    from .._engine.engine import Engine

__all__ = ("PermitExpirableSemaphore", "PermitState")

#: Redisson's expiry score of a permit that never expires.
NEVER = 922337203685477
_ID = re.compile(r"[0-9a-f]{32}")


class PermitState(PermitCount):
    """The semaphore as the engine sees it: the count, and the ZSET of the ids taken."""

    __slots__ = ("timeouts",)

    def __init__(self, settings: Settings, name: str, permits: int | None = None) -> None:
        super().__init__(settings, name, permits)
        self.timeouts = suffixed(self.key, "timeout")

    def take(self, ids: list[bytes], lease_ms: int, tombstone: str) -> Invocation:
        return Invocation(
            load_script("psem_acquire"),
            [self.key, self.timeouts, self.chan, tombstone],
            [lease_ms, NEVER, self.settings.publish, self.seed, *ids],
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

    def set_permits(self, permits: int, latch: str) -> Invocation:
        s = self.settings
        return Invocation(
            load_script("psem_set_permits"),
            [self.key, self.timeouts, self.chan, latch],
            [permits, s.publish, s.latch_ttl_ms],
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
    first with ``try_set_permits(n)``, or declare them with ``permits=n``: an acquire that
    finds no state sets them first, atomically (a restart without persistence or a
    failover then re-seeds instead of starving every caller).
    """

    __slots__ = ()

    _state: PermitState

    def __init__(self, engine: Engine, name: str, permits: int | None = None) -> None:
        super().__init__(engine, PermitState(engine.settings, name, declared(permits)))

    async def available_permits(self) -> int:
        """The permits available now, those whose lease ran out included."""
        return int(await self._engine.ask(self._state, self._state.available()))

    async def set_permits(self, permits: int) -> None:
        """Set the total of permits, those taken included (Redisson's setPermits).

        The available count becomes ``permits`` minus the permits taken now (it may go
        below 0: nobody gets one until enough come back); a semaphore never set gets
        ``permits``. Made once, even if the call is cancelled or cut off.
        """
        n = check_count(permits, "permits", minimum=0)
        s = self._state
        await change(self._engine, s, lambda latch: s.set_permits(n, latch), "set permits of")

    async def delete(self) -> bool:
        """Remove the semaphore and its permits taken as Redisson does; True if found.

        This client's renewed permits of it are lost (their release raises
        LockLostError); as in Redisson nothing is published.
        """
        s = self._state
        return await self._engine.delete(s, s.key, s.timeouts)

    def acquired(
        self, wait: TimeArg = None, lease: TimeArg = None
    ) -> contextlib.AbstractAsyncContextManager[str]:
        """``async with psem.acquired(wait=5) as permit_id:`` takes a permit, released on exit.

        ``lease`` None: the watchdog renews the permit while the task lives (its expiry in
        ``{name}:timeout`` moves forward, as a Java client sees it), so it comes back by
        itself within ``watchdog_timeout`` once its holder's process dies; found gone, it
        is reported lost (WARNING) and the exit raises LockLostError. Else the permit
        expires after ``lease`` seconds. LockTimeoutError once ``wait`` ran out (None:
        forever).
        """
        return self._acquired(wait_seconds(wait), lease_seconds(lease))

    @contextlib.asynccontextmanager
    async def _acquired(self, wait: float | None, lease: float | None) -> AsyncIterator[str]:
        permit = await self._take(wait, lease, renewed=lease is None)
        if permit is None:
            assert wait is not None
            raise LockTimeoutError(self.name, wait)

        async def release() -> None:
            await self.release(permit)

        try:
            yield permit
        except BaseException as exc:
            await release_at_exit(self.name, release, exc, "semaphore")
            raise
        await release_at_exit(self.name, release, None, "semaphore")

    async def acquire(self, lease: TimeArg = None) -> str:
        """Take a permit, waiting as long as it takes; its id. ``lease`` None: no expiry."""
        permit = await self._take(None, lease_seconds(lease))
        assert permit is not None
        return permit

    async def try_acquire(self, wait: TimeArg = 0, lease: TimeArg = None) -> str | None:
        """Take a permit within ``wait`` seconds (0: one attempt); its id, or None."""
        return await self._take(wait_seconds(wait), lease_seconds(lease))

    async def _take(
        self, wait: float | None, lease: float | None, *, renewed: bool = False
    ) -> str | None:
        """Take a permit within ``wait``; ``renewed``: with the watchdog's lease, renewed."""
        s = self._state
        if renewed:
            lease_ms = self._engine.settings.lease_ms
        else:
            lease_ms = -1 if lease is None else max(1, round(lease * 1000))
        last: list[bytes] = []

        def attempt_for(tombstone: str) -> tuple[Invocation, Invocation]:
            # Fresh ids per attempt (as Redisson): a resend of one attempt carries its own.
            ids = [os.urandom(16)]
            last[:] = ids
            return s.take(ids, lease_ms, tombstone), s.give_back(ids, tombstone)

        if not await take(
            self._engine, s, attempt_for, wait, _decode, kind="permit_expirable_semaphore"
        ):
            return None
        permit = last[0].hex()
        if renewed:
            took_permit(self._engine, s, permit, s.timeouts)
        return permit

    async def release(self, permit_id: str) -> None:
        """Give back the permit ``permit_id``; made once, even if cancelled or cut off.

        LockNotOwnedError if no permit has that id (never taken, or released already);
        LockLostError if its lease had run out (the permit is back all the same), or if it
        was a permit renewed by the watchdog (``acquired()``) that was found gone.
        """
        if not isinstance(permit_id, str):
            raise TypeError(f"permit_id must be a str, not {type(permit_id).__name__}")
        if not _ID.fullmatch(permit_id):
            raise ValueError(f"permit_id must be 32 hex characters, got {permit_id!r}")
        s = self._state
        permit = bytes.fromhex(permit_id)
        renewed, lost = let_go_permit(self._engine, s, permit_id)
        done = await change(self._engine, s, lambda latch: s.release(permit, latch), "release")
        if renewed and (lost is not None or int(done) != 1):
            # This client held it: gone is lost (its lease ran out unrenewed, it was
            # reclaimed, the semaphore deleted), not a permit it never had.
            why = lost or ("its lease had run out" if int(done) == 2 else "it was gone")
            raise LockLostError(s.name, f"permit {permit_id}", why, what="semaphore")
        if int(done) == 0:
            raise LockNotOwnedError(
                s.name, f"permit {permit_id}", "no permit has that id", what="semaphore"
            )
        if int(done) == 2:
            raise LockLostError(
                s.name, f"permit {permit_id}", "its lease had run out", what="semaphore"
            )
