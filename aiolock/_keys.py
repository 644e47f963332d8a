"""Key, channel and field names in Redisson's layout (redisson-spec.md section 1.1).

Pure functions: every derived name puts the object name in a ``{hash tag}`` (unless the name
already has one), so all keys and channels of one object land in one Redis Cluster slot.
"""

from __future__ import annotations

import functools

__all__ = (
    "acquire_tombstone_key",
    "fair_channel_base",
    "fair_queue_key",
    "fair_timeout_key",
    "fenced_token_key",
    "latch_channel",
    "lock_channel",
    "prefixed",
    "rwlock_channel",
    "rwlock_timeout_prefix",
    "semaphore_channel",
    "suffixed",
    "unlock_latch_key",
    "write_holder",
)


# Cached: every acquire and unlock names a per-call key from it (a tombstone, a latch),
# and a hit costs less than the call it saves.
@functools.lru_cache(maxsize=4096)
def prefixed(prefix: str, name: str) -> str:
    """Redisson's prefix form: ``prefix:{name}``, or ``prefix:name`` if it has a ``{``."""
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


def suffixed(name: str, suffix: str) -> str:
    """Redisson's suffix form: ``{name}:suffix``, or ``name:suffix`` if it has a ``{``."""
    return f"{name}:{suffix}" if "{" in name else f"{{{name}}}:{suffix}"


def lock_channel(name: str) -> str:
    """The RLock/fenced lock channel, which receives ``0`` on full release."""
    return prefixed("redisson_lock__channel", name)


def semaphore_channel(name: str) -> str:
    """The semaphore's channel (both semaphore kinds): the new available count."""
    return prefixed("redisson_sc", name)


def latch_channel(name: str) -> str:
    """The count-down latch's channel: ``0`` when it opens, ``1`` when a count is set.

    Redisson always wraps the name in braces here, even a name with a hash tag of its own
    (then the channel hashes elsewhere than the key: see CountDownLatch).
    """
    return f"redisson_countdownlatch__channel__{{{name}}}"


def unlock_latch_key(name: str, request_id: str) -> str:
    """The per-unlock-call latch that makes a retried unlock replay, not decrement twice."""
    return f"{prefixed('redisson_unlock_latch', name)}:{request_id}"


def acquire_tombstone_key(name: str, call_id: str) -> str:
    """The per-attempt tombstone a rollback leaves, so a late copy of the attempt is void."""
    return f"{prefixed('aiolock_acquire_cancel', name)}:{call_id}"


def fenced_token_key(name: str) -> str:
    """The fenced lock's token counter, which every acquisition advances."""
    return prefixed("redisson_lock_token", name)


def fair_queue_key(name: str) -> str:
    """The fair lock's FIFO list of waiting holder ids."""
    return prefixed("redisson_lock_queue", name)


def fair_timeout_key(name: str) -> str:
    """The fair lock's sorted set of waiter eviction deadlines (epoch ms)."""
    return prefixed("redisson_lock_timeout", name)


def fair_channel_base(name: str) -> str:
    """The fair lock's channel base; each waiter listens on ``base:<holder id>``."""
    return lock_channel(name)


def rwlock_channel(name: str) -> str:
    """The read-write lock's channel: ``0`` on read release, ``1`` on write release."""
    return prefixed("redisson_rwlock", name)


def rwlock_timeout_prefix(name: str, holder: str) -> str:
    """Prefix of one read holder's per-hold timeout keys (``...:<k>`` for hold k)."""
    return f"{suffixed(name, holder)}:rwlock_timeout"


def write_holder(holder: str) -> str:
    """The hash field of a write hold."""
    return f"{holder}:write"
