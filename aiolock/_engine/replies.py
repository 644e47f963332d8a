"""What the scripts' replies mean: every reply and error reply is decoded here, once.

The scripts answer with small integers and pairs (their headers in ``aiolock/_net/lua/`` say
which); the engine works with the values below. Error replies become a `LockError`
naming the lock where the server's text allows (wrong key type, missing permission).
"""

from __future__ import annotations

import enum
from typing import Any

from redis.exceptions import ResponseError

from .._exceptions import LockError

__all__ = ("AcquireReply", "Release", "as_int", "decode_force", "decode_release", "script_error")


class AcquireReply:
    """Decoded reply of an acquire script (a plain class: one per attempt, built fast).

    ``acquired`` with ``count`` = the holder's reentrancy count after the call; otherwise
    ``ttl_ms`` = the ms left on the current holder's lease (-1: no expiry), or ``stale``
    with ``count`` = the holder's count on the server, which is not the one it believed
    (nothing was taken). A fenced lock's acquisition also has its ``token``.
    """

    __slots__ = ("acquired", "count", "stale", "token", "ttl_ms")

    def __init__(
        self,
        *,
        acquired: bool,
        count: int = 0,
        ttl_ms: int = -1,
        stale: bool = False,
        token: int | None = None,
    ) -> None:
        self.acquired = acquired
        self.count = count
        self.ttl_ms = ttl_ms
        self.stale = stale
        self.token = token

    def __repr__(self) -> str:
        return (
            f"AcquireReply(acquired={self.acquired}, count={self.count}, "
            f"ttl_ms={self.ttl_ms}, stale={self.stale}, token={self.token})"
        )

    @classmethod
    def decode(cls, raw: Any) -> AcquireReply:
        """Map the script's ``{status, value}`` pair to a reply.

        Status -1 (the call's tombstone exists) only ever answers a late copy of a call
        whose caller has gone, so nobody reads it: it decodes as "not acquired".
        """
        status, value = int(raw[0]), int(raw[1])
        if status == 1:
            return cls(acquired=True, count=value, token=int(raw[2]) if len(raw) > 2 else None)
        if status == -2:
            return cls(acquired=False, stale=True, count=value)
        return cls(acquired=False, ttl_ms=value if status == 0 else 0)


class Release(enum.Enum):
    """What a release script did with the holder's hold."""

    #: The holder had no hold: nothing changed.
    NOT_HELD = "not held"
    #: One hold released; the holder has more.
    KEPT = "kept"
    #: The holder's last hold released; the lock is free (its message was published).
    FREED = "freed"
    #: A write lock's last write hold released while the holder's read holds remain: the
    #: lock is now in read mode, and (as in Redisson) nothing was published.
    DOWNGRADED = "downgraded"
    #: The holder's last hold went straight to the heir named in the call (a waiter of
    #: the same client): the lock was never free, and nothing was published.
    HANDED = "handed"


_RELEASES = {0: Release.KEPT, 1: Release.FREED, 2: Release.DOWNGRADED, 3: Release.HANDED}


def decode_release(raw: Any) -> Release:
    """Map a release script's nil / 0 / 1 / 2 / 3 reply."""
    if raw is None:
        return Release.NOT_HELD
    return _RELEASES[int(raw)]


def decode_force(raw: Any) -> bool:
    """A force-unlock script's reply: whether it deleted the lock."""
    return as_int(raw) == 1


def as_int(raw: Any) -> int | None:
    """Decode an integer reply that may come as int, bytes or str (decode_responses)."""
    if raw is None:
        return None
    return int(raw)


def script_error(name: str, key: str, exc: ResponseError) -> Exception:
    """The error to raise for an error reply to a call on lock ``name`` (key ``key``)."""
    message = str(exc)
    if message.startswith("WRONGTYPE"):
        # The reply does not say which key: a fair lock's queue or timeout key, or a read
        # hold's timeout key, can be the culprit as well as the lock key.
        return LockError(
            f"lock {name!r}: a key it uses ({key!r}, or one derived from that name) holds a "
            f"value of another type, not lock state: is the name used for something else? "
            f"({message})"
        )
    # NOPERM replies (redis-py's NoPermissionError) and ACL refusals inside a script (an
    # ERR reply) both say "no permissions"; neither names the lock. Redis 7.0 words a
    # refusal inside a script differently, without the command.
    lowered = message.lower()
    if "no permissions" in lowered or "can't run this command" in lowered:
        return LockError(
            f"lock {name!r}: the server refused a command for lack of permission "
            f"({message}); aiolock's ACL user needs EVALSHA, SCRIPT LOAD, PUBLISH and "
            "SUBSCRIBE, and access to the lock's keys and channels"
        )
    return exc
