"""Who of this client waits for which lock, and what its waiters last saw of the lease.

Plain sync bookkeeping, changed as calls start and stop waiting. It answers three
questions: how many tasks wait on a lock (statistics, repr), whether a holder's wait is the
last one it has on a lock (a fair lock's queue entry is one per holder, left only when its
last waiting call gives up), and how long a newcomer may wait before the lease it queued
behind runs out (a lost release message costs at most that).
"""

from __future__ import annotations

import asyncio

__all__ = ("WaitingRoom",)


class WaitingRoom:
    """Counts of one client's waiting calls per lock and per (lock, holder field)."""

    __slots__ = ("_by_field", "_by_key", "_lease_until")

    def __init__(self) -> None:
        self._by_key: dict[str, int] = {}
        self._by_field: dict[tuple[str, str], int] = {}
        # Lock key -> loop time its lease runs out, as this client's waiters last saw it.
        self._lease_until: dict[str, float] = {}

    def enter(self, key: str, field: str) -> None:
        """A call of ``field``'s holder starts waiting on ``key``."""
        self._by_key[key] = self._by_key.get(key, 0) + 1
        line = (key, field)
        self._by_field[line] = self._by_field.get(line, 0) + 1

    def leave(self, key: str, field: str) -> None:
        """That call stopped waiting (acquired, gave up, failed or was cancelled)."""
        count = self._by_key[key] - 1
        if count:
            self._by_key[key] = count
        else:
            del self._by_key[key]
            self._lease_until.pop(key, None)
        line = (key, field)
        held = self._by_field[line] - 1
        if held:
            self._by_field[line] = held
        else:
            del self._by_field[line]

    def waiting(self, key: str) -> int:
        """How many of this client's calls wait on ``key``."""
        return self._by_key.get(key, 0)

    def field_waiting(self, key: str, field: str) -> int:
        """How many calls of ``field``'s holder wait on ``key``."""
        return self._by_field.get((key, field), 0)

    def saw_lease(self, key: str, ttl_ms: int) -> None:
        """A waiter's attempt found ``ttl_ms`` left on the lease (-1: no expiry)."""
        if ttl_ms >= 0:
            self._lease_until[key] = asyncio.get_running_loop().time() + ttl_ms / 1000

    def lease_left_ms(self, key: str) -> int:
        """Ms left on ``key``'s lease as local waiters last saw it; -1 if unknown."""
        until = self._lease_until.get(key)
        if until is None:
            return -1
        return max(0, round((until - asyncio.get_running_loop().time()) * 1000))

    def total(self) -> int:
        """How many of this client's calls wait, on any lock."""
        return sum(self._by_key.values())
