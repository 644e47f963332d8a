"""The read-write lock, in Redisson's RReadWriteLock layout (redisson-spec.md section 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import LockBase
from ._config import check_name, check_owner

if TYPE_CHECKING:
    from ._client import Client

__all__ = ("ReadLock", "ReadWriteLock", "WriteLock")


class ReadLock(LockBase):
    """The shared side of a read-write lock."""

    __slots__ = ()


class WriteLock(LockBase):
    """The exclusive side of a read-write lock."""

    __slots__ = ()


class ReadWriteLock:
    """A pair of views on one name: ``read_lock()`` (shared) and ``write_lock()``."""

    __slots__ = ("__weakref__", "_client", "_name", "_owner")

    def __init__(self, client: Client, name: str, *, owner: str | None = None) -> None:
        self._client = client
        self._name = check_name(name)
        self._owner = check_owner(owner)

    @property
    def name(self) -> str:
        """The lock's name as given (without ``key_prefix``)."""
        return self._name

    def read_lock(self) -> ReadLock:
        """The shared lock: many readers at once, no writer."""
        return ReadLock(self._client, self._name, owner=self._owner)

    def write_lock(self) -> WriteLock:
        """The exclusive lock: one writer, no reader (but its own)."""
        return WriteLock(self._client, self._name, owner=self._owner)
