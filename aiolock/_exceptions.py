"""The error tree of aiolock: one root, documented leaves.

Transport errors from redis-py (``redis.exceptions.ConnectionError``, ``TimeoutError``) are
deliberately not wrapped: they pass through after the client's retries.
"""

from __future__ import annotations

__all__ = (
    "ClientClosedError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockUpgradeError",
    "ReleaseError",
    "ReplicaAckError",
)


class LockError(Exception):
    """Root of every error aiolock raises on its own account."""


class LockNotOwnedError(LockError):
    """Raised by ``unlock()`` when the calling holder does not hold the lock.

    The holder never held it, or already released every hold it had.
    """

    def __init__(self, name: str, holder: str, detail: str = "", *, what: str = "lock") -> None:
        why = f": {detail}" if detail else ""
        # ``what``: the object's kind in words ("semaphore" for a permit's).
        super().__init__(f"{what} {name!r} is not held by {holder}{why}")
        self.name = name
        self.holder = holder


class LockLostError(LockError):
    """Raised by ``unlock()`` when the holder's lease ran out or was taken from it.

    The holder believed it held the lock, but Redis no longer has its hold: the lease
    expired (a starved event loop, a fixed ``lease`` that was too short), someone called
    ``force_unlock()``, or a failover or restart dropped the key. Mutual exclusion may have
    been violated while the holder kept working. The watchdog logs a WARNING as soon as it
    notices; this error reports it to the holder at its next ``unlock()``.
    """

    def __init__(self, name: str, holder: str, detail: str = "", *, what: str = "lock") -> None:
        why = f" ({detail})" if detail else ""
        super().__init__(f"{what} {name!r} held by {holder} was lost{why}")
        self.name = name
        self.holder = holder


class LockTimeoutError(LockError, TimeoutError):
    """Raised by ``acquired(wait=...)`` and other deadline-bound waits that ran out.

    It is also a ``TimeoutError``, so ``except TimeoutError`` handles it with asyncio's own
    timeouts.
    """

    def __init__(self, name: str, wait: float) -> None:
        super().__init__(f"could not acquire {name!r} within {wait:g} s")
        self.name = name
        self.wait = wait


class LockUpgradeError(LockError):
    """Raised when a task holding only read holds asks for the write lock of the same name.

    Redisson lets that thread wait for itself until a lease runs out; aiolock refuses at once
    because the wait could never succeed. Release the read holds first.
    """

    def __init__(self, name: str, holder: str) -> None:
        super().__init__(
            f"{holder} holds read locks on {name!r} and asked for its write lock: "
            "upgrading a read lock can never succeed; release the read holds first"
        )
        self.name = name
        self.holder = holder


class ClientClosedError(LockError):
    """Raised for calls made, or waits still pending, after ``Client.aclose()``."""

    def __init__(self, what: str = "the aiolock client") -> None:
        super().__init__(f"{what} is closed")


class ReplicaAckError(LockError):
    """Raised by an acquisition that fewer replicas acknowledged than the client asks for.

    With ``replica_acks=n`` the client follows each acquisition with ``WAIT n`` on the
    server that took it. When fewer than ``n`` replicas confirmed the write within
    ``replica_ack_timeout``, the hold is given back (in the background, as for a cancelled
    call) and the caller gets this error instead of a lock that a failover could lose.
    """

    def __init__(self, name: str, acked: int, wanted: int, timeout: float) -> None:
        super().__init__(
            f"lock {name!r}: {acked} of {wanted} replicas acknowledged the acquisition "
            f"within {timeout:g} s; the lock was given back"
        )
        self.name = name
        self.acked = acked
        self.wanted = wanted


class ReleaseError(LockError):
    """Raised at the end of ``async with lock:`` / ``acquired()`` when the release failed.

    The block's body finished (its work was done); releasing the lock then failed, for a
    reason that is not the lock's (the server unreachable after the client's retries, a
    script error): the redis-py error is its ``__cause__``. So a caller tells "the work was
    done, the release failed" from an acquire that failed (which raises the redis-py error
    as it is). A release cut off that way is finished in the background, or the lock runs
    out with its lease. ``unlock()`` called directly raises the redis-py error as it is.
    """

    def __init__(self, name: str, cause: BaseException, *, what: str = "lock") -> None:
        super().__init__(f"{what} {name!r}: the block finished, but releasing it failed: {cause!r}")
        self.name = name
