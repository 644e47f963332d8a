"""What this client believes it holds, per (lock key, holder field).

The server is the truth; this bookkeeping exists to tell a lost lease (``LockLostError``)
from a lock never held (``LockNotOwnedError``), to know what the watchdog renews and which
lease an unlock re-applies. It changes only in plain sync methods, called after the server
answered, so it never runs ahead of Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._emitter import Emitter

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from .._emitter import Announcement
    from .._net.scripts import Script

__all__ = ("Expiry", "HoldRecord", "HoldRegistry")

# Past this many holds of ended tasks remembered, those whose lease ran out are forgotten.
_ENDED_PRUNE = 1000

log = logging.getLogger("aiolock")


class Renews(Protocol):
    """How a hold renews, as its record keeps it (``primitive.Renewing``)."""

    @property
    def script(self) -> Script:
        """The script that renews a batch of such holds."""
        ...

    def keys(self, batch: Sequence[HoldRecord]) -> list[str]:
        """A batch's KEYS."""
        ...

    def args(self, batch: Sequence[HoldRecord]) -> list[str | bytes]:
        """A batch's ARGV after the lease."""
        ...


class Expiry:
    """One call in flight that sets a hold's expiry (``HoldRecord.expiry_sent``)."""

    __slots__ = ("floor", "until")

    def __init__(self, until: float) -> None:
        #: Its send time plus the lease it sets: the expiry runs at least until then.
        self.until = until
        #: The earliest ``until`` of this call and every call overlapping it.
        self.floor = until


class Watching(Protocol):
    """A guarded hold watching a record (``guard.Guarding``): told of its changes at once."""

    def confirmation_moved(self, until: float, *, earlier: bool) -> None:
        """The hold's confirmed expiry moved to ``until`` (``earlier``: it moved back)."""

    def member_lost(self, why: str) -> None:
        """The hold was lost, for ``why``."""


@dataclass(eq=False, slots=True)
class HoldRecord:
    """One holder's hold on one lock, with a lease entry per reentrant acquisition.

    ``leases`` has one entry per lock() still to be matched by an unlock(): the explicit
    lease in ms, or None for a watchdog lease. The key is renewed while any entry is None.
    """

    key: str
    field: str
    name: str
    holder: str
    # How it renews (its primitive's ``primitive.Renewing``): the renewal batches holds by it.
    renewing: Renews
    leases: list[int | None] = dataclasses.field(default_factory=list)
    lost: str | None = None
    # Releases in flight, and releases begun ever (``release_begins``): a renewal's
    # answer of "gone" judges the hold as it was when the round was sent.
    releasing: int = 0
    releases: int = 0
    # Extra data its renewal needs (the read lock's timeout-key prefix).
    extra: str = ""
    # The task it belongs to (None with owner=): its end stops the renewal.
    task: asyncio.Task[Any] | None = None
    # When this client last saw the hold begin (from a count of 0, or afresh after a loss),
    # on the registry's clock: a force_unlock() sent after that moment deleted it.
    since: int = 0
    # The registry's set of ``task``'s holds, this one among them: dropping the hold needs
    # no lookup in the registry's weak mapping (a weak lookup per unlock is measurable).
    task_holds: set[HoldRecord] | None = dataclasses.field(default=None, repr=False)
    # The primitive it is a hold of (the engine's ``Primitive``, opaque here): what
    # aclose() needs to release it once its task has ended.
    primitive: Any = dataclasses.field(default=None, repr=False)
    # Until when (loop.time()) the server keeps it at least (0: not known): a lower bound
    # of the key's expiry, kept by ``expiry_sent``/``expiry_settled`` (see there). The
    # guard reads it.
    confirmed: float = 0.0
    # The calls in flight that set this hold's expiry (see ``expiry_sent``), and the
    # release's among them (one release of a holder is in flight at a time: its turn).
    expiring: list[Expiry] = dataclasses.field(default_factory=list, repr=False)
    reapplying: Expiry | None = dataclasses.field(default=None, repr=False)
    # The guarded holds (``guard.Guarding``) watching this one: told at once when it is lost.
    guards: list[Watching] | None = dataclasses.field(default=None, repr=False)
    # The emitter's record of the acquisition that began it (an ``Acquired`` was told),
    # handed back to the emitter at the hold's end; None: begun otherwise (holds found on
    # the server, say), and its end is not announced either: every ``Released`` or
    # ``Lost`` matches one ``Acquired``.
    announced: Announcement | None = None

    def expiry_sent(self, until: float) -> Expiry:
        """A call that sets this hold's expiry is sent; it runs at least ``until`` (loop time).

        Every call that sets the key's expiry (an acquire or re-entry, ``extend()``, a
        renewal, an unlock's or a rollback's re-applied lease) is bracketed by this and
        ``expiry_settled``, so that ``confirmed`` stays a lower bound of the server's
        expiry whatever order the calls run in: the server runs a call after its send, so
        the expiry it sets is at least the send time plus its lease (``until``).

        * At the send ``confirmed`` drops to ``until`` if that is earlier: the call may
          run at any moment from now, and set a shorter lease than the one confirmed.
        * Its answer sets ``confirmed`` to the earliest ``until`` among this call and every
          call that overlapped it (in flight at its send, or sent before its answer):
          whichever of them ran last set the expiry, and no other can have run after it.
        """
        expiry = Expiry(until)
        floor = until
        for other in self.expiring:
            floor = min(floor, other.until)
            other.floor = min(other.floor, until)
        expiry.floor = floor
        self.expiring.append(expiry)
        if until < self.confirmed:
            self._confirm(until)
        return expiry

    def expiry_settled(self, expiry: Expiry, *, applied: bool) -> None:
        """The call of ``expiry`` ended; ``applied``: the server answered that it set it.

        Otherwise (no answer, an error, a call that may have left the expiry as it was)
        nothing more is learnt: the drop at its send stands.
        """
        # By identity: two tickets with equal fields are still two calls.
        self.expiring[:] = [e for e in self.expiring if e is not expiry]
        if applied:
            self._confirm(expiry.floor)

    def _confirm(self, until: float) -> None:
        earlier = until < self.confirmed
        self.confirmed = until
        if self.guards:
            # Earlier, the guards' timers armed for a later deadline must move now.
            for guarded in list(self.guards):
                guarded.confirmation_moved(until, earlier=earlier)

    def release_begins(self, reapply_until: float | None = None) -> None:
        """A release of this hold is sent (its end: ``release_ends``).

        ``reapply_until``: its send time plus the lease it re-applies should holds remain,
        for a guarded hold (its expiry is bracketed, see ``expiry_sent``).
        """
        self.releasing += 1
        self.releases += 1
        if reapply_until is not None:
            self.reapplying = self.expiry_sent(reapply_until)

    def release_ends(self, *, kept: bool) -> None:
        """A release of this hold ended; ``kept``: answered, with holds left (lease re-applied)."""
        self.releasing -= 1
        expiry, self.reapplying = self.reapplying, None
        if expiry is not None:
            self.expiry_settled(expiry, applied=kept)

    @property
    def count(self) -> int:
        """Reentrancy count as this client believes it."""
        return len(self.leases)

    @property
    def renewed(self) -> bool:
        """Whether the watchdog keeps this hold alive."""
        return self.lost is None and None in self.leases

    def attach_guard(self, guard: Watching) -> None:
        """A guarded hold (``guard.Guarding``) watches this one from now on."""
        if self.guards is None:
            self.guards = []
        self.guards.append(guard)

    def reapply_ms(self, watchdog_ms: int) -> int:
        """The lease an unlock re-applies while holds remain."""
        if None in self.leases or not self.leases:
            return watchdog_ms
        last = self.leases[-1]
        assert last is not None
        return last


class Renewal(Protocol):
    """What the registry needs of the watchdog (``renewal.RenewalService``)."""

    def track(self, hold: HoldRecord) -> None:
        """Renew ``hold`` from now on."""

    def untrack(self, hold: HoldRecord) -> None:
        """Stop renewing ``hold``."""


class HoldRegistry:
    """Every hold of one client, and the link to its renewal service."""

    __slots__ = ("_by_task", "_clock", "_ended", "_holds", "_renewal", "_watchdog_ms", "events")

    def __init__(
        self, renewal: Renewal, *, watchdog_ms: int = 30_000, events: Emitter | None = None
    ) -> None:
        self._renewal = renewal
        #: Told when a hold ends (``Released``, ``Lost``); the engine tells it of acquisitions.
        self.events = events if events is not None else Emitter()
        self._watchdog_ms = watchdog_ms
        # Holds whose task ended holding them, each with how many holds it kept and the
        # latest (loop) time its lease can still run: aclose() releases them at once.
        self._ended: dict[HoldRecord, tuple[int, float]] = {}
        # Counts the holds begun; see HoldRecord.since.
        self._clock = 0
        self._holds: dict[tuple[str, str], HoldRecord] = {}
        # Weak by task (as holders.HolderIds keeps its ids: a fresh reference finds the
        # entry; the stored one's callback drops it), without a WeakKeyDictionary's
        # Python-level get() per acquisition.
        self._by_task: dict[weakref.ref[asyncio.Task[Any]], set[HoldRecord]] = {}

    def get(self, key: str, field: str) -> HoldRecord | None:
        """The hold of ``field`` on ``key``, if this client believes it has one."""
        return self._holds.get((key, field))

    def holding(self, key: str, field: str) -> bool:
        """Whether ``field`` holds ``key`` now, as far as this client knows."""
        hold = self._holds.get((key, field))
        return hold is not None and hold.count > 0 and hold.lost is None

    def count(self, key: str, field: str) -> int:
        """How many holds ``field`` has on ``key`` as this client believes (lost or not)."""
        hold = self._holds.get((key, field))
        return hold.count if hold is not None else 0

    def on_key(self, key: str) -> list[HoldRecord]:
        """Every hold of this client on ``key``."""
        return [hold for hold in self._holds.values() if hold.key == key]

    def __iter__(self) -> Iterator[HoldRecord]:
        return iter(list(self._holds.values()))

    def __len__(self) -> int:
        return len(self._holds)

    def clock(self) -> int:
        """Now, on the clock of HoldRecord.since: every hold begun later has a greater ``since``."""
        return self._clock

    def _begin(self, hold: HoldRecord) -> None:
        self._clock += 1
        hold.since = self._clock

    def acquired(
        self,
        *,
        key: str,
        field: str,
        name: str,
        holder: str,
        task: asyncio.Task[Any] | None,
        count: int,
        lease_ms: int | None,
        renewing: Renews,
        extra: str = "",
        confirmed: float | None = None,
        expiry: Expiry | None = None,
        primitive: Any = None,
        announced: Announcement | None = None,
    ) -> bool:
        """Record a successful acquisition; ``count`` is the server's count after it.

        ``confirmed``: until when the acquire's answer shows the lease runs (its send time
        plus its lease); None: no new confirmation. ``expiry``: the acquire's ticket when it
        was sent for a hold already recorded (``HoldRecord.expiry_sent``). ``primitive``:
        the engine's, kept for aclose(). ``announced``: the emitter's record of the
        acquisition, announced (None: a hold merely found on the server). Whether it
        re-entered a hold already announced and still believed held.
        """
        hold = self._holds.get((key, field))
        reentrant = (
            hold is not None
            and len(hold.leases) > 0
            and hold.lost is None
            and hold.announced is not None
        )
        if hold is None:
            hold = self._holds[key, field] = HoldRecord(
                key, field, name, holder, renewing, extra=extra, task=task
            )
            if task is not None:
                self._watch_task(task, hold)
            self._begin(hold)
            afresh = count != 1
        else:
            afresh = hold.lost is not None or len(hold.leases) + 1 != count
            if afresh:
                self._begin(hold)
        if afresh:
            if hold.count:
                log.warning(
                    "aiolock: %s re-entered lock %r, but %d earlier hold(s) had been lost "
                    "(%s); its hold count is now %d",
                    holder,
                    name,
                    hold.count,
                    hold.lost or "count mismatch",
                    count,
                )
            hold.leases = [lease_ms] * (count - 1)
            hold.lost = None
        hold.leases.append(lease_ms)
        if expiry is not None and expiry in hold.expiring:
            hold.expiry_settled(expiry, applied=True)
        elif confirmed is not None:
            # A hold begun by this acquire: nothing else set its expiry meanwhile.
            hold.confirmed = confirmed
        # hold.renewed (it is not lost here), the lease just added first.
        if lease_ms is None or None in hold.leases:
            self._renewal.track(hold)
        hold.primitive = primitive
        if announced is not None and not reentrant:
            hold.announced = announced
        return reentrant

    def reapply_ms(self, hold: HoldRecord | None) -> int:
        """The lease an unlock or a rollback re-applies to the holds ``hold`` keeps."""
        return hold.reapply_ms(self._watchdog_ms) if hold else self._watchdog_ms

    def held_by_sibling(self, key: str, holder: str) -> str:
        """Why a non-holder's unlock fails, when another task of this client holds it."""
        for hold in self.on_key(key):
            if hold.holder != holder and hold.count and hold.task is not None:
                return (
                    f"it is held by another task of this client ({hold.task.get_name()}): "
                    "a lock belongs to the task that acquired it (a child task of gather() "
                    "or shield() is another task); use owner= to hand a lock over"
                )
        return ""

    def released(self, hold: HoldRecord, *, fully: bool) -> None:
        """Record an unlock the server confirmed."""
        if fully:
            announced = hold.announced
            if announced is not None and hold.lost is None:
                self.events.released(announced, hold.name, hold.holder)
            self.drop(hold)
            return
        if hold.leases:
            hold.leases.pop()
        # Renewal may have been paused while the release went unanswered: the holds left
        # need it again.
        if hold.renewed:
            self._renewal.track(hold)
        else:
            self._renewal.untrack(hold)

    def extended(self, hold: HoldRecord, lease_ms: int) -> None:
        """Record an extend() the server confirmed: explicit leases become ``lease_ms``.

        Watchdog entries stay None: the hold stays renewed.
        """
        hold.leases = [lease if lease is None else lease_ms for lease in hold.leases]

    def drop(self, hold: HoldRecord, *, ended: str | None = None) -> None:
        """Forget ``hold`` entirely.

        ``ended``: the hold ends here unreleased, and unknown to be lost (its task ended,
        its release went unanswered): a ``Lost`` event with this ``how``.
        """
        if ended is not None and hold.count and hold.lost is None:
            self._ended_unreleased(hold, ended)
        hold.leases.clear()
        self._renewal.untrack(hold)
        if self._holds.get((hold.key, hold.field)) is hold:
            del self._holds[hold.key, hold.field]
        if hold.task_holds is not None:
            # A long-lived task takes many holds; only the current ones are kept.
            hold.task_holds.discard(hold)

    def disown(self, key: str, field: str) -> None:
        """Detach the hold of ``field`` from its task, which may end before it is released.

        A hand-over the task left before it landed: no "ended while held" warning then.
        """
        hold = self._holds.get((key, field))
        if hold is None:
            return
        if hold.task_holds is not None:
            hold.task_holds.discard(hold)
            hold.task_holds = None
        hold.task = None

    def _ended_unreleased(self, hold: HoldRecord, how: str) -> None:
        announced = hold.announced
        if announced is not None:
            self.events.lost(announced, hold.name, hold.holder, how)
            hold.announced = None  # announced once

    def mark_lost(self, hold: HoldRecord, why: str, how: str = "renewal") -> None:
        """The hold is gone on the server: stop renewing, remember why for unlock().

        ``how``: what found it (a ``Lost`` event's ``how``).
        """
        if hold.lost is None:
            if hold.count:
                self._ended_unreleased(hold, how)
            hold.lost = why
        self._renewal.untrack(hold)
        if hold.guards:
            # Guarded bodies stop at once (the guard only schedules their cancellation).
            for guarded in list(hold.guards):
                guarded.member_lost(why)

    def report_lost(self, hold: HoldRecord, why: str, how: str = "renewal") -> None:
        """A hold found gone on the server: log it once, then mark it lost."""
        log.warning(
            "aiolock: lock %r held by %s was lost (%s): mutual exclusion is no longer "
            "guaranteed; its unlock() will raise LockLostError",
            hold.name,
            hold.holder,
            why,
        )
        self.mark_lost(hold, why, how)

    def mark_key_lost(self, key: str, why: str, *, begun_by: int) -> None:
        """Mark lost every local hold on ``key`` begun by ``begun_by`` (a ``clock()``).

        A force_unlock() sent at that moment deleted them. A hold begun later may have
        been taken after the deletion and is left alone; if the deletion took it too, the
        watchdog or its unlock() finds and reports that.
        """
        for hold in list(self._holds.values()):
            if hold.key == key and hold.since <= begun_by:
                self.mark_lost(hold, why, "forced")

    def _watch_task(self, task: asyncio.Task[Any], hold: HoldRecord) -> None:
        holds = self._by_task.get(weakref.ref(task))
        if holds is None:
            holds = self._by_task[weakref.ref(task, self._forget_task)] = set()
            task.add_done_callback(self._task_done)
        holds.add(hold)
        hold.task_holds = holds

    def ended(self, now: float) -> list[tuple[HoldRecord, int]]:
        """Take the holds whose task ended holding them, with how many holds each kept.

        Only those whose lease may still run at ``now`` (loop time).
        """
        ended, self._ended = self._ended, {}
        return [(hold, kept) for hold, (kept, until) in ended.items() if until > now]

    def _remember_ended(self, hold: HoldRecord, kept: int, watchdog_ms: int) -> None:
        now = asyncio.get_running_loop().time()
        # The lease runs at most this long from now: the renewal stops here.
        longest = max([watchdog_ms, *(lease for lease in hold.leases if lease is not None)])
        if len(self._ended) >= _ENDED_PRUNE:
            # A long-lived client whose tasks keep ending holding: forget the expired.
            self._ended = {h: v for h, v in self._ended.items() if v[1] > now}
        self._ended[hold] = (kept, now + longest / 1000)

    def _forget_task(self, ref: weakref.ref[asyncio.Task[Any]]) -> None:
        # A task collected without ending (never done: no _task_done). A dead reference
        # still finds its own entry (its hash was kept; it equals itself).
        self._by_task.pop(ref, None)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        # A task cannot unlock after it ended: its holds would otherwise be renewed forever.
        # A copy: drop() takes each hold out of the set.
        for hold in list(self._by_task.pop(weakref.ref(task), ())):
            if self._holds.get((hold.key, hold.field)) is not hold:
                continue
            # An unlock() cut off by a cancellation finishes in the background and settles
            # the hold itself: the task let go of those holds, it did not end holding them.
            kept = hold.count - hold.releasing
            # A hold already known lost was reported when it was found.
            if kept > 0 and hold.lost is None:
                log.warning(
                    "aiolock: task %s ended while %s held lock %r (%d hold(s)); it is no "
                    "longer renewed and expires with its lease, or is released when the "
                    "client closes%s",
                    task.get_name(),
                    hold.holder,
                    hold.name,
                    kept,
                    _ran_only_aiolock(task),
                )
                self._remember_ended(hold, kept, self._watchdog_ms)
            if kept > 0:
                self.drop(hold, ended="task_ended")


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ran_only_aiolock(task: asyncio.Task[Any]) -> str:
    """A hint for the warning when ``task`` ran nothing but an aiolock call.

    An acquire given a task of its own (``asyncio.shield(lock.lock())``, ``create_task``,
    ``gather``) holds for that task, which ends at once.
    """
    code = getattr(task.get_coro(), "cr_code", None)
    if code is None or not os.path.abspath(code.co_filename).startswith(_PACKAGE):
        return ""
    return (
        ". It ran only aiolock's "
        f"{code.co_qualname}(): an acquire run in a task of its own (asyncio.shield(), "
        "create_task(), gather()) holds for that task; await it directly, or pass owner= "
        "to hold for someone else"
    )
