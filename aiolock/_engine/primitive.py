"""What a synchronizer tells the engine about itself: the vocabulary between the two.

A primitive (the reentrant lock, the fair lock, each side of the read-write lock) is a
small, I/O-free description: which scripts it runs with which keys and arguments, which
channel wakes its waiters and how many a message wakes, whether newcomers queue behind
local waiters, whether a waiter that gives up must tell the server, and how a hold renews.
The engine (``engine.py``) does everything else, once, for all of them: attempts, waiting,
deadlines, cancellation and undo, the order of one holder's calls, lease-lost reports.

**Replies**: what the scripts' replies mean; every reply and error reply is decoded here, once.

The scripts answer with small integers and pairs (their headers in ``aiolock/_net/lua/`` say
which); the engine works with the values below. Error replies become a `LockError`
naming the lock where the server's text allows (wrong key type, missing permission).
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from redis.exceptions import ResponseError

from .._config import check_name
from .._exceptions import LockError
from .._net.scripts import load_script

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from .._config import Settings
    from .._net.scripts import Script
    from ..events import Kind
    from .holds import HoldRecord, HoldRegistry

__all__ = (
    "HASH_RENEWAL",
    "AcquireReply",
    "Call",
    "Invocation",
    "Outcome",
    "Primitive",
    "Release",
    "Renewing",
    "Waitable",
    "as_int",
    "decode_force",
    "decode_release",
    "lock_wake_count",
    "script_error",
)


def lock_wake_count(data: bytes) -> int | None:
    """Lock channels: ``0`` (unlock) wakes one waiter, ``1`` (write unlock) wakes all."""
    return None if data == b"1" else 1


class Invocation(NamedTuple):
    """One script call, ready to send: the engine runs it and decodes its reply."""

    script: Script
    keys: list[str]
    args: Sequence[str | int | bytes]


class Renewing:
    """How one kind of hold is renewed, which its primitive supplies: the renewal knows no kind.

    ``script`` renews a batch of holds (one cluster slot) to the lease in its ``ARGV[1]``;
    ``keys(batch)`` and ``args(batch)`` are its KEYS and the ARGV after the lease, from the
    holds' records (``holds.HoldRecord``: key, field, extra data, leases). It answers one entry
    per hold: 1 renewed, 0 gone. ``extend()`` is a renewal of a batch of one with the
    caller's lease (``Primitive.extend``).
    """

    __slots__ = ("args", "keys", "script_name")

    def __init__(
        self,
        script_name: str,
        keys: Callable[[Sequence[HoldRecord]], list[str]],
        args: Callable[[Sequence[HoldRecord]], list[str | bytes]],
    ) -> None:
        self.script_name = script_name
        self.keys = keys
        self.args = args

    def __repr__(self) -> str:
        return f"<Renewing by {self.script_name}>"

    @property
    def script(self) -> Script:
        """The renewal script (loaded once, by name)."""
        return load_script(self.script_name)

    def invocation(self, batch: Sequence[HoldRecord], lease_ms: int) -> Invocation:
        """The script call that gives every hold of ``batch`` ``lease_ms`` from now."""
        return Invocation(self.script, self.keys(batch), [lease_ms, *self.args(batch)])


#: A hold that is one field of a hash, whose expiry is the hash's (the reentrant, fair,
#: write, fenced and spin locks): KEYS[i] = the hash of hold i; ARGV[i+1] = its field.
HASH_RENEWAL = Renewing(
    "lock_renew",
    lambda batch: [hold.key for hold in batch],
    lambda batch: [hold.field for hold in batch],
)


class Outcome(NamedTuple):
    """One attempt of a counting object (a take, or a look at a latch).

    What the engine's waiting loop needs to know of it.
    """

    #: It took (or found) what the call waits for.
    done: bool
    #: How long the caller may wait at most before it tries again (None: until woken, or
    #: the engine's re-check).
    wait: float | None = None
    #: Not done, but something is left another waiter could use (fewer permits than this
    #: call asked for): a wake-up it was given goes on to the next waiter.
    spare: bool = False
    #: Done, and this many are left that waiters behind could use (a semaphore's permits
    #: left after the take): the call wakes that many of this client's waiters itself, so
    #: none of them waits with permits free for a message that has come and gone.
    left: int = 0


class Call(NamedTuple):
    """What one acquire call fixed before its first round trip.

    A NamedTuple, not a frozen dataclass: one is made per acquire call, and a tuple is
    built several times faster.
    """

    holder: str
    task: asyncio.Task[Any] | None
    field: str
    lease_ms: int
    # The lease recorded for the hold: None means the watchdog renews it.
    won_lease: int | None
    # The caller's wait: None forever, 0 a single attempt that never queues.
    wait: float | None
    deadline: float | None
    # The task's count of cancel requests when the call started (see cancel.py).
    mark: int
    # Where the acquisition's token goes (a fenced lock's caller asks for it), else None.
    receipt: list[int] | None = None
    # The task that made the call (None outside one), for its cancel checks; it differs
    # from ``task`` when the call is made for an explicit owner=.
    caller: asyncio.Task[Any] | None = None
    # A guarded acquire: note the send time of the attempt that takes the hold (the
    # guard's confirmation), which plain acquires spare themselves.
    timed: bool = False
    # When the call began (time.monotonic()): its events' and slow-wait log's time waited.
    started: float = 0.0


class Waitable:
    """What the engine's waiting needs of any object.

    Its name and key, the channel that wakes its waiters, and how many waiters a message
    wakes.

    The counting objects (the semaphore, the count-down latch) are waitables with scripts
    of their own; the lock types are waitables with holds (`Primitive`).
    """

    __slots__ = ("key", "name", "settings")

    #: Waiters are shared: every message wakes them all, as what lets one in lets them
    #: all in (readers); else only as many as the message's count says.
    shared_waits: ClassVar[bool] = False
    #: A successful take leaves a receipt under its tombstone's name (the semaphore), to
    #: delete once the take has returned.
    receipts: ClassVar[bool] = False
    #: A message's count is how many are available in all (a semaphore's permits), not
    #: how many it frees: waiters woken already are counted in it (``WaitingRoom.add``).
    counts_available: ClassVar[bool] = False
    #: Newcomers queue behind this client's waiters instead of barging (lock types whose
    #: release wakes one waiter, the semaphore): else the task that just released, trying
    #: at once, re-takes what its release woke a waiter for, whose attempt then runs for
    #: nothing.
    no_barging: ClassVar[bool] = False

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings = settings
        #: The name as the user gave it (for messages).
        self.name = check_name(name)
        #: The key that holds the state: holds, waits and a holder's calls are per key.
        self.key = settings.key_prefix + name

    def channel(self, holder: str) -> str:  # pragma: no cover - abstract
        """The channel whose messages wake ``holder``'s waits."""
        raise NotImplementedError

    def wake_count(self, data: bytes) -> int | None:
        """How many exclusive local waiters a message ``data`` on the channel wakes."""
        return lock_wake_count(data)


class Primitive(Waitable):
    """A lock type as the engine sees it: plain, sync methods, no I/O.

    A lock type subclasses it and supplies its scripts (``acquire``, ``rollback``,
    ``release``, ``force``) and its ``channel``; the rest has defaults for a hash-field
    hold woken by Redisson's lock messages.
    """

    __slots__ = ()

    #: A release that frees the lock may hand it straight to a waiter of the same client
    #: (``release(heir=...)``), saving a message and the waiters' attempts; only to a
    #: waiter whose primitive takes it (`takes_hand_over()`).
    hands_over: ClassVar[bool] = False
    #: A waiter that gives up must tell the server (the fair lock's queue).
    leaves_queue: ClassVar[bool] = False
    #: The lock kind its events name (``aiolock.events.Kind``).
    lock_kind: ClassVar[Kind]
    #: Nothing is published when the lock frees (the spin lock): waiters try again after
    #: the pauses of ``pauses()`` instead of subscribing. This client's own releases
    #: still wake its own waiters at once.
    polls: ClassVar[bool] = False
    #: A message on the holder's channel while it holds means the lock was forced open
    #: (only a force publishes then): a guarded hold watches it (``Engine.watch_taken``).
    watched: ClassVar[bool] = False
    #: Its holds are a leader's terms (``client.leader()``): their events say so.
    leader: ClassVar[bool] = False

    def slow_hold(self, default: float | None) -> float | None:
        """Past how long (s) a hold of it is logged as slow, None for never.

        ``default``: the client's ``slow_hold``; an object of its own setting (a leader's
        term) overrides it.
        """
        return default

    def pauses(self) -> Iterator[float]:  # pragma: no cover - only where ``polls``
        """The seconds a polling waiter waits before each next attempt (fresh per call)."""
        raise NotImplementedError

    def field(self, holder: str) -> str:
        """The hash field of ``holder`` (the write lock appends ``:write``)."""
        return holder

    def takes_hand_over(self, releaser: Primitive) -> bool:
        """Whether this primitive's waiting call may be handed the lock by ``releaser``.

        Only where the hold ``releaser``'s release script writes for its heir is exactly what
        this primitive's own acquisition takes: else the heir would hold the lock without
        part of its acquisition (a fenced lock's token). A waiter that does not take it is
        woken by the release's message and tries itself.
        """
        return False

    def check_acquire(self, holder: str, holds: HoldRegistry) -> None:
        """Raise if an acquire by ``holder`` can never succeed (an upgrade); else nothing."""

    #: How its holds renew (the renewal service batches holds of one ``Renewing``).
    renewing: ClassVar[Renewing] = HASH_RENEWAL

    def hold_extra(self, holder: str) -> str:
        """The extra data ``renewing`` needs of ``holder``'s hold (kept on its record)."""
        return ""

    def extend(self, hold: HoldRecord, lease_ms: int) -> Invocation:
        """Give ``hold`` a lease of ``lease_ms`` from now: ``[1]``, or ``[0]`` if gone.

        The watchdog's own renewal of the hold's kind, on a batch of one: an extend is a
        renewal with a lease of the caller's choosing.
        """
        return self.renewing.invocation([hold], lease_ms)

    def acquire(
        self, call: Call, target: int, tombstone: str
    ) -> Invocation:  # pragma: no cover - abstract
        """One attempt: take a hold if the holder has ``target - 1`` of them."""
        raise NotImplementedError

    def rollback(
        self, call: Call, target: int, tombstone: str, reapply_ms: int
    ) -> Invocation:  # pragma: no cover - abstract
        """Undo an attempt cut off in flight: give back hold ``target`` if it was taken."""
        raise NotImplementedError

    def leave(self, call: Call) -> tuple[Invocation, int] | None:
        """How to tell the server the call stopped waiting (None: nothing to tell).

        With the invocation comes how many ms its entry lives there at most: resending it
        longer is pointless.
        """
        return None

    def release(
        self, field: str, reapply_ms: int, latch: str, heir: Call | None = None
    ) -> Invocation:  # pragma: no cover - abstract
        """Release one hold of ``field``; ``latch`` makes a resend replay the first reply.

        ``heir`` (only where ``hands_over``): if this frees the lock, give it to that
        waiting call's holder instead, with the call's lease.
        """
        raise NotImplementedError

    def force(self) -> Invocation:  # pragma: no cover - abstract
        """Delete the lock whoever holds it, and wake its waiters."""
        raise NotImplementedError


# Replies


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
