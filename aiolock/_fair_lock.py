"""The fair (FIFO) lock, in Redisson's RFairLock layout (redisson-spec.md section 5)."""

from __future__ import annotations

from ._base import LockBase

__all__ = ("FairLock",)


class FairLock(LockBase):
    """A FIFO reentrant lock; ``client.fair_lock(name)`` creates one."""

    __slots__ = ()
