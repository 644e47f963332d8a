"""What a client tells its listeners: one event per thing that happened to a lock.

``client.add_listener(fn)`` calls ``fn(event)`` with each of these frozen dataclasses, in
the event loop, at the moment the client's own bookkeeping records what happened: no event
costs a round trip. A listener must be cheap and must not block (it runs inside the call
that made the event); whatever one raises (``KeyboardInterrupt`` and ``SystemExit`` aside)
is logged and never breaks the call, nor the renewal task.

Common fields:

* ``kind``: the lock kind, one of `KINDS` (the names of ``client.locked(kind=...)``):
  ``"lock"``, ``"fair_lock"``, ``"fenced_lock"``, ``"spin_lock"``, ``"read_lock"``,
  ``"write_lock"``, ``"fair_read_lock"``, ``"fair_write_lock"``; or, for the acquire
  events ([`Acquired`][aiolock.events.Acquired], [`AcquireFailed`][aiolock.events.AcquireFailed],
  `Waiting`) of a semaphore's ``acquire()``/``try_acquire()``/``acquired()``, one of
  `SEMAPHORE_KINDS`: ``"semaphore"``, ``"permit_expirable_semaphore"``. Permits have no holder to
  release them: a semaphore's [`Acquired`][aiolock.events.Acquired] has ``holder=""`` and
  ``reentrant=False``, and no [`Released`][aiolock.events.Released] or [`Lost`][aiolock.events.Lost]
  follows it. The count-down latch emits none.
* ``name``: the lock's name as given to the client (without ``key_prefix``). Unbounded: do
  not make it a metric label without thinking.
* ``holder``: the holder id, ``"<client id>:<n>"`` for a task, or ``owner=`` as given.
* ``leader`` ([`Acquired`][aiolock.events.Acquired], [`Released`][aiolock.events.Released],
  [`Lost`][aiolock.events.Lost]): the hold is a leader's term (``client.leader(name)``), a
  hold of the lock ``name`` (``kind="lock"``, as Redisson sees it) that metrics and logs
  can tell from the application's own locks. False for every other hold. Last, with a
  default: an event built positionally as before is still valid.
* Times are seconds (``float``), measured on a monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

__all__ = (
    "KINDS",
    "SEMAPHORE_KINDS",
    "AcquireFailed",
    "AcquireKind",
    "Acquired",
    "Event",
    "FailReason",
    "Kind",
    "Lost",
    "Reconnected",
    "Released",
    "RenewalRound",
    "SemaphoreKind",
    "Waiting",
)

#: The kinds of lock that emit events.
Kind: TypeAlias = Literal[
    "lock",
    "fair_lock",
    "fenced_lock",
    "spin_lock",
    "read_lock",
    "write_lock",
    "fair_read_lock",
    "fair_write_lock",
]
#: Every `Kind`, in declaration order (read off the literal, not written out again).
KINDS: tuple[Kind, ...] = get_args(Kind)

#: The semaphores, whose acquire calls emit the acquire events (not Released nor Lost).
SemaphoreKind: TypeAlias = Literal["semaphore", "permit_expirable_semaphore"]
#: Every `SemaphoreKind` (read off the literal).
SEMAPHORE_KINDS: tuple[SemaphoreKind, ...] = get_args(SemaphoreKind)
#: The kind of an acquire event.
AcquireKind: TypeAlias = Kind | SemaphoreKind

#: Why an acquire call ended without the lock (see [`AcquireFailed`][aiolock.events.AcquireFailed]).
FailReason: TypeAlias = Literal["timeout", "cancelled", "closed", "error"]


@dataclass(frozen=True, slots=True)
class Acquired:
    """An acquire call took the lock (``lock()``, ``try_lock()``, ``acquired()``, ...).

    Emitted once per successful call, when the server's answer is recorded (or when a
    release of this client hands the lock straight to the waiting call).
    ``waited``: seconds from the call's start to the acquisition, the round trip included.
    ``reentrant``: the holder already held it (a reentrant acquisition, or another read
    hold of the same holder); only a non-reentrant acquisition starts a hold that a
    [`Released`][aiolock.events.Released] or a [`Lost`][aiolock.events.Lost] ends.
    """

    kind: AcquireKind
    name: str
    holder: str
    waited: float
    reentrant: bool
    leader: bool = False


@dataclass(frozen=True, slots=True)
class Waiting:
    """How many of this client's acquire calls wait for the lock changed: now ``waiting``.

    A call waits from the moment it finds the lock held and has time left (its first
    attempt answered "held", or it queued behind this client's earlier waiters) until it
    takes the lock or gives up; calls that get the lock at once, or ``wait=0``, never
    wait. One event when a call starts waiting (``waiting`` one more) and one when it stops
    (one less); the call then ends with its [`Acquired`][aiolock.events.Acquired] or
    [`AcquireFailed`][aiolock.events.AcquireFailed], as every call does, so the count is back to 0
    once nothing waits (an up-down counter of waiting calls adds ``waiting`` less the last value it
    saw).
    """

    kind: AcquireKind
    name: str
    waiting: int


@dataclass(frozen=True, slots=True)
class AcquireFailed:
    """An acquire call ended without the lock.

    ``reason``: ``"timeout"`` (its ``wait`` ran out, ``wait=0`` included: the lock was
    held), ``"cancelled"`` (the calling task was cancelled), ``"closed"`` (the client
    was closed), ``"error"`` (any other exception: the server unreachable past the
    retries, an upgrade refused, ...). ``waited``: seconds from the call's start.
    """

    kind: AcquireKind
    name: str
    waited: float
    reason: FailReason


@dataclass(frozen=True, slots=True)
class Released:
    """A hold ended by its holder's release, confirmed by the server.

    Emitted when the holder's last hold on the lock is released (a reentrant hold's
    inner unlocks emit nothing), also when the release hands the lock to a waiter or
    downgrades a write hold. ``held``: seconds since the [`Acquired`][aiolock.events.Acquired] that
    began it.
    """

    kind: Kind
    name: str
    holder: str
    held: float
    leader: bool = False


@dataclass(frozen=True, slots=True)
class Lost:
    """A hold ended without its holder's release: the lock may be someone else's now.

    Emitted once per hold, when this client finds out. ``how``: ``"forced"`` (deleted
    under its holder: this client's ``force_unlock()`` or ``delete()`` deleted it, or a
    message on the lock's channel while it was held told a ``force_unlock()`` from
    anywhere, Redisson's ``forceUnlock()`` and the CLI's ``force-unlock`` included),
    ``"renewal"`` (the watchdog, or a guarded hold's look at the server, found it gone,
    with nothing to say why: a force between two renewals, or a lease that ran out),
    ``"unlock"``, ``"lock"`` and ``"extend"`` (that call of the holder found it gone),
    ``"task_ended"``
    (its task ended holding it: no longer renewed, it expires with its lease or is
    released at ``aclose()``), ``"release_unanswered"`` (a release cut off by a cancel or
    an outage got no answer within the resend window: it expires with its lease),
    ``"closed"`` (the client was closed while a running task held it: not released, it
    expires with its lease).
    ``held``: seconds since the [`Acquired`][aiolock.events.Acquired] that began it.
    """

    kind: Kind
    name: str
    holder: str
    held: float
    how: str
    leader: bool = False


@dataclass(frozen=True, slots=True)
class RenewalRound:
    """The watchdog renewed the client's watchdog-held leases (every ``watchdog_timeout/3``).

    Emitted once per round, when the last server's share of it has answered (or failed);
    also for a round run at once (a guarded hold or a leader renews on a message on its
    lock's channel, to find a forced unlock early).
    ``servers``: how many servers the round went to; ``holds``: how many holds it renewed;
    ``duration``: seconds from the round's start to its last answer; ``failed``: how many
    servers' shares failed (not answered, or an error): their holds are retried a quarter
    period later.
    """

    servers: int
    holds: int
    duration: float
    failed: int


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A connection of the client to ``server`` (``"host:port"``) was made again.

    The client keeps a command connection and, while anything waits, a pub/sub
    connection per server: each emits its own. ``after``: seconds since the connection
    was lost. The pub/sub connection reconnects at once (backing off); the command
    connection reconnects at the next command (at the latest the next renewal round while
    anything is held), so its ``after`` may be longer than the outage.
    """

    server: str
    after: float


#: Every event a listener may get.
Event: TypeAlias = Acquired | AcquireFailed | Waiting | Released | Lost | RenewalRound | Reconnected
