"""A systematic cancellation sweep over the public calls of every lock type.

One *case* runs one public call (``lock()``, ``try_lock(wait=0)``, ``unlock()``, an
``async with`` entry or exit, ...) of one lock type in one scenario, and cancels it at the
k-th event-loop iteration after it started. One *sweep* runs the cases k = 0, 1, 2, ...
until a case where the call completed before its cancel was due ("untouched"). After every
case, once both clients are quiet, it checks the contract:

1. the call raised ``CancelledError`` if a cancel was delivered while it ran, else it
   returned what it should (never a normal return after a delivered cancel);
2. Redis holds exactly what the client believes, for the holder and for the rival: an
   acquire that completed counts one more, a cancelled one nothing; an unlock or an
   ``async with`` exit releases one hold whether cancelled or not; no orphan field, no
   leftover read-timeout key, no stale fair-queue entry, no waiter and no subscription
   reference left in either client;
3. the holder's next call works (``try_lock(wait=0)`` then ``unlock()``), and so does the
   release of everything it holds;
4. nothing of the lock is left in Redis once everything is released.

Holders are tasks, so the holder is a :class:`Holder`: a long-lived task that makes the
calls of one holder on request, among them the call under test. A cancel aimed at that call
is ``holder.task.cancel()`` while the call runs, and the holder takes the
``CancelledError`` as ``asyncio.timeout()`` does (``uncancel()``) and carries on, so the
same task can make the checks and the follow-up calls of invariant 3.

Loop iterations are counted by a self-rescheduling ``loop.call_soon`` chain started right
after the call was handed to the holder task (so iteration 0 is the call's first
suspension). A rival holder on a second client, where the scenario has one, releases at a
fixed point of that chain, placed by the call's progress rather than by a fixed count (a
round trip takes anywhere from 2 to 40 iterations): ``raced``, the first iteration at
which the call is parked (its waiter registered on a confirmed subscription), so the
release wakes it; ``raced_subscribing``, the first at which it counts as waiting (it is
still subscribing); ``raced_early`` and ``try_lock(wait=0)``, iteration 0. The cancel
therefore sweeps the first attempt, the subscription, the wait, the wake-up by the
release and the re-attempt.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeAlias, TypeVar, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

import aiolock
from aiolock._engine.guard import guarding_of
from aiolock._keys import fair_queue_key, fair_timeout_key, prefixed

from . import inside
from .helpers import dispatchers_of, quiesce, wait_until

__all__ = (
    "GUARDED_CALLS",
    "LEADER_CALLS",
    "AnyLock",
    "Call",
    "Holder",
    "Kind",
    "Scenario",
    "Spec",
    "Sweep",
    "SweepResult",
    "Ticker",
    "all_specs",
    "cut_off_ks",
    "handle",
    "k_schedule",
    "parked",
    "rival_handle",
    "rival_kind",
    "state_key",
    "unlock_cut_off_then_lock",
)

T = TypeVar("T")

AnyLock: TypeAlias = (
    aiolock.Lock
    | aiolock.FairLock
    | aiolock.ReadLock
    | aiolock.WriteLock
    | aiolock.FencedLock
    | aiolock.SpinLock
    | aiolock.FairReadLock
    | aiolock.FairWriteLock
)
Releaser: TypeAlias = Callable[[], Awaitable[object]]

#: The highest k swept every round: the calls complete within 5-80 iterations as a rule.
CAP = 400
#: Past CAP, k doubles until the call completes untouched, up to this. An iteration is one
#: ``call_soon`` hop, 2-3 microseconds while the loop has nothing else to do, and a round
#: trip sometimes takes over a millisecond (seen on a 2-core machine with the fallback
#: wire): longer than CAP hops. A call that has not completed by STRETCH_CAP never will.
STRETCH_CAP = CAP * 2**8
#: Safety nets (never reached when the library works): a case's call, a setup call.
CALL_LIMIT = 15.0
STEP_LIMIT = 15.0
#: Keys that outlive a case by design: cancel tombstones and unlock latches expire (or are
#: swept) on their own; they are not lock state.
_TRANSIENT = ("aiolock_acquire_cancel:", "redisson_unlock_latch:", "redisson_lock_token:")


class Kind(enum.Enum):
    """A lock type."""

    LOCK = "lock"
    FAIR = "fair_lock"
    READ = "read_lock"
    WRITE = "write_lock"
    FENCED = "fenced_lock"
    SPIN = "spin_lock"
    FREAD = "fair_read_lock"
    FWRITE = "fair_write_lock"


#: The two sides of the fair read-write lock, whose holds live in a hash of their own.
FAIR_RW = frozenset({Kind.FREAD, Kind.FWRITE})
#: The sides of either read-write lock: each excludes the other.
_OTHER_SIDE = {
    Kind.READ: Kind.WRITE,
    Kind.WRITE: Kind.READ,
    Kind.FREAD: Kind.FWRITE,
    Kind.FWRITE: Kind.FREAD,
}


def state_key(kind: Kind, name: str) -> str:
    """The hash holding the holds of ``kind`` on ``name`` (the name itself but for the fair
    read-write lock)."""
    return prefixed("aiolock_frw", name) if kind in FAIR_RW else name


class Call(enum.Enum):
    """A public call of a lock handle."""

    LOCK = "lock"
    TRY0 = "try_lock0"
    TRY5 = "try_lock5"
    ACQUIRED = "acquired5_enter"
    AENTER = "async_with_enter"
    AEXIT = "async_with_exit"
    ACQUIRED_EXIT = "acquired5_exit"
    #: A guarded block's entry and exit (``guarded(wait=5)``, issue 22).
    GUARDED = "guarded5_enter"
    GUARDED_EXIT = "guarded5_exit"
    #: A leader's term entered and left (``client.leader(name).elected()``, issue 22).
    ELECTED = "elected_enter"
    ELECTED_EXIT = "elected_exit"
    UNLOCK = "unlock"
    FORCE = "force_unlock"
    EXTEND = "extend"

    @property
    def acquires(self) -> bool:
        """Whether the call takes a hold."""
        return self in _ACQUIRES

    @property
    def releases(self) -> bool:
        """Whether the call gives back one hold."""
        return self in _RELEASES


_ACQUIRES = frozenset(
    {Call.LOCK, Call.TRY0, Call.TRY5, Call.ACQUIRED, Call.AENTER, Call.GUARDED, Call.ELECTED}
)
_RELEASES = frozenset(
    {Call.UNLOCK, Call.AEXIT, Call.ACQUIRED_EXIT, Call.GUARDED_EXIT, Call.ELECTED_EXIT}
)
#: The guarded block's calls (the quick sweep takes them on the plain lock only).
GUARDED_CALLS = frozenset({Call.GUARDED, Call.GUARDED_EXIT})
#: The channel a guarded hold of each watched kind watches, for a lock named ``{}``.
_WATCHED_CHANNEL = {
    "lock": "redisson_lock__channel:{{{}}}",
    "fenced_lock": "redisson_lock__channel:{{{}}}",
    "write_lock": "redisson_rwlock:{{{}}}",
}
#: A leader's calls: an election is on the plain lock, held by a task (no owner=).
LEADER_CALLS = frozenset({Call.ELECTED, Call.ELECTED_EXIT})


class Scenario(enum.Enum):
    """The state a call starts from."""

    #: Acquire or force_unlock: nothing holds the lock.
    FREE = "free"
    #: Acquire: the holder already holds the lock once.
    REENTRANT = "reentrant"
    #: Acquire: a rival (another client) holds it and releases while the call runs, at the
    #: first iteration the call is parked: its waiter registered on a confirmed
    #: subscription, so the release wakes it (try_lock(wait=0): at iteration 0).
    RACED = "raced"
    #: Acquire: the same, the release sent at the first iteration the call counts as
    #: waiting, racing its subscription.
    RACED_SUBSCRIBING = "raced_subscribing"
    #: Acquire: the same, the release sent at iteration 0, racing the call's first attempt.
    RACED_EARLY = "raced_early"
    #: Release: the holder holds it once / twice.
    COUNT1 = "count1"
    COUNT2 = "count2"
    #: Release: the holder holds it once and a rival waits for it (the release wakes it).
    WOKEN = "woken"
    #: Release (reentrant lock): the holder holds it once and a sibling, another task of
    #: the same client, is parked waiting for it: the release may hand it straight over.
    HANDED = "handed"
    #: Acquire (reentrant lock, task holder): a sibling task of the same client holds it
    #: and releases at the first iteration the call is parked in its wait: the release
    #: may hand it to the call.
    RACED_SIBLING = "raced_sibling"
    #: force_unlock: the calling holder holds it / a rival holds it.
    HELD_SELF = "held_self"
    HELD_RIVAL = "held_rival"


_RACED = frozenset({Scenario.RACED, Scenario.RACED_SUBSCRIBING, Scenario.RACED_EARLY})


def scenarios_of(call: Call, kind: Kind) -> tuple[Scenario, ...]:
    """The scenarios that apply to ``call`` on ``kind``.

    The hand-over scenarios apply where a release hands over (the reentrant lock, and the
    read-write lock's write side, to a writer).
    """
    hands_over = kind in {Kind.LOCK, Kind.WRITE}
    # A spin lock's waiter never subscribes: racing the subscription is racing the wait.
    subscribes = kind is not Kind.SPIN
    if call is Call.TRY0:
        return (Scenario.FREE, Scenario.REENTRANT, Scenario.RACED)
    if call.acquires:
        return (
            Scenario.FREE,
            Scenario.REENTRANT,
            Scenario.RACED,
            *((Scenario.RACED_SUBSCRIBING,) if subscribes else ()),
            Scenario.RACED_EARLY,
            *((Scenario.RACED_SIBLING,) if hands_over else ()),
        )
    if call is Call.EXTEND:
        # It only moves an expiry: the holder's count stays, cancelled or not.
        return (Scenario.COUNT1, Scenario.COUNT2)
    if call.releases:
        return (
            Scenario.COUNT1,
            Scenario.COUNT2,
            Scenario.WOKEN,
            *((Scenario.HANDED,) if hands_over else ()),
        )
    return (Scenario.FREE, Scenario.HELD_SELF, Scenario.HELD_RIVAL)


@dataclass(frozen=True)
class Spec:
    """One sweep: a lock type, a call, a scenario and whether the holder is an ``owner=``."""

    kind: Kind
    call: Call
    scenario: Scenario
    owner: str | None

    @property
    def id(self) -> str:
        """A readable test id."""
        who = "owner" if self.owner else "task"
        return f"{self.kind.value}-{self.call.value}-{self.scenario.value}-{who}"


def all_specs() -> list[Spec]:
    """Every combination: 8 lock types x 10 calls x their 3 or 4 scenarios x (task, owner=)."""
    return [
        Spec(kind, call, scenario, owner)
        for kind in Kind
        for call in Call
        for scenario in scenarios_of(call, kind)
        for owner in (None, "holder")
        # A hand-over goes to a task's call only: an owner= holder's never is the heir.
        if not (scenario is Scenario.RACED_SIBLING and owner is not None)
        and not (call in LEADER_CALLS and (kind is not Kind.LOCK or owner is not None))
    ]


def _stretch(last: int) -> list[int]:
    """The k tried after ``last`` while the call has not completed: doubling to STRETCH_CAP."""
    ks = []
    k = max(last, 1) * 2
    while k <= STRETCH_CAP:
        ks.append(k)
        k *= 2
    return ks


def k_schedule(*, full: bool) -> list[int]:
    """The k swept: all up to CAP in full mode; every k up to 40 then sparse in quick mode."""
    if full:
        return list(range(CAP + 1))
    return [*range(41), 48, 56, 64, 80, 96, 128, 160, 200, 256, 320, CAP]


def handle(client: aiolock.Client, kind: Kind, name: str, owner: str | None) -> AnyLock:
    """The handle of ``kind`` on ``name``."""
    if kind is Kind.LOCK:
        return client.lock(name, owner=owner)
    if kind is Kind.FAIR:
        return client.fair_lock(name, owner=owner)
    if kind is Kind.FENCED:
        return client.fenced_lock(name, owner=owner)
    if kind is Kind.SPIN:
        return client.spin_lock(name, owner=owner)
    if kind in FAIR_RW:
        frw = client.fair_read_write_lock(name, owner=owner)
        return frw.read_lock() if kind is Kind.FREAD else frw.write_lock()
    rw = client.read_write_lock(name, owner=owner)
    return rw.read_lock() if kind is Kind.READ else rw.write_lock()


def rival_kind(kind: Kind) -> Kind:
    """The lock type a rival holds to exclude a holder of ``kind``."""
    # A writer excludes a reader; a reader excludes a writer (its release publishes "0",
    # which covers the other wake-up path of the read-write lock).
    return _OTHER_SIDE.get(kind, kind)


def rival_handle(client: aiolock.Client, kind: Kind, name: str, *, same: bool = False) -> AnyLock:
    """The rival's handle (an ``owner=``, so any task may lock or unlock it).

    It excludes a holder of ``kind``, or with ``same`` holds the same side (a read-write
    lock's force_unlock() deletes only the side it is called on).
    """
    return handle(client, kind if same else rival_kind(kind), name, "rival")


def parked(client: aiolock.Client, name: str, kind: Kind | None = None) -> bool:
    """Whether a waiter of ``client`` is registered on a confirmed subscription of ``name``.

    ``statistics().tasks_waiting`` counts a call from the moment it starts waiting, before
    it has subscribed; a release sent then races the subscription instead of waking a
    waiter. (The dispatcher's internals: no public call tells.) A spin lock's waiter
    subscribes to nothing: it is parked as soon as it waits.
    """
    if kind is Kind.SPIN:
        return handle(client, kind, name, "probe").statistics().tasks_waiting > 0
    return any(
        name in channel_name
        and channel.confirmed.is_set()
        and inside.waiting_room(client).has_waiters(channel_name)
        for dispatcher in dispatchers_of(client)
        for channel_name, channel in inside.channels_of(dispatcher).items()
    )


def heir_parked(client: aiolock.Client, name: str) -> bool:
    """Whether a waiter of ``client`` on ``name`` is parked in its wait.

    A release of the same client may then hand the lock to it. (The waiting room's
    internals.)
    """
    return any(
        waiter.parked is not None
        for channel_name in inside.pubsub(client).channels()
        if name in channel_name
        for waiter in inside.waiting_room(client).waiters(channel_name)
    )


# -- the holder task ----------------------------------------------------------------------


@dataclass(eq=False)
class Job(Generic[T]):
    """One call a :class:`Holder` makes, and how it ended."""

    fn: Callable[[], Awaitable[T]]
    done: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set in the very step in which the call returned or raised.
    finished: bool = False
    value: T | None = None
    error: BaseException | None = None
    #: Whether a cancel was delivered to the holder task while the call ran.
    cancel_delivered: bool = False
    #: ``task.cancelling()`` when the call ended (before the holder uncancels).
    cancelling: int = 0


class Holder:
    """A task that makes the calls of one holder, one after the other, on request.

    A holder is an asyncio task (or an ``owner=``): to sweep a call of a holder that
    already holds the lock, and to check afterwards what the same holder sees, all of its
    calls run in this one task.
    """

    def __init__(self, label: str) -> None:
        self._jobs: asyncio.Queue[Job[Any] | None] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._serve(), name=label)

    def submit(self, fn: Callable[[], Awaitable[T]]) -> Job[T]:
        """Hand ``fn`` to the task; it starts at the next loop iteration."""
        if self.task.done():
            raise RuntimeError(f"holder task {self.task.get_name()} is gone")
        job: Job[T] = Job(fn)
        self._jobs.put_nowait(job)
        return job

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` in the holder task and return its result (or raise its error)."""
        job = self.submit(fn)
        async with asyncio.timeout(STEP_LIMIT):
            await job.done.wait()
        if job.error is not None:
            raise job.error
        return cast("T", job.value)

    def cancel(self, job: Job[Any]) -> bool:
        """Cancel the task if ``job`` is still running; whether a cancel was delivered."""
        if job.finished:
            return False
        job.cancel_delivered = self.task.cancel()
        return job.cancel_delivered

    async def stop(self) -> None:
        """End the task once its calls are done (cancel it if one of them is stuck)."""
        self._jobs.put_nowait(None)
        done, _ = await asyncio.wait([self.task], timeout=STEP_LIMIT)
        if not done:
            self.task.cancel()
            await asyncio.wait([self.task])

    async def _serve(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        while (job := await self._jobs.get()) is not None:
            try:
                job.value = await job.fn()
            except BaseException as exc:  # reported to the test, which judges it
                job.error = exc
            finally:
                job.finished = True
                job.cancelling = task.cancelling()
                # Take the cancel as asyncio.timeout() does, and serve the next call.
                while task.cancelling():
                    task.uncancel()
                job.done.set()


# -- counting loop iterations -------------------------------------------------------------


class Ticker:
    """A ``call_soon`` chain: one hop per loop iteration after a call was submitted.

    At hop ``k`` it cancels the call unless it has completed ("untouched"). If given a
    ``release``, it starts it at the first hop where ``release_due(hop)`` holds (or once
    the call finished), so a rival lets go at a fixed point of the call's progress.
    """

    def __init__(
        self,
        holder: Holder,
        job: Job[Any],
        k: int,
        *,
        release: Callable[[], Awaitable[object]] | None = None,
        release_due: Callable[[int], bool] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._holder = holder
        self._job = job
        self._k = k
        self._release = release
        self._release_due = release_due or (lambda _hop: True)
        self.hops = 0
        self.decided = False
        self.untouched = False
        self.released_at: int | None = None
        self.release_task: asyncio.Task[object] | None = None
        #: Set once the release (if any) has started.
        self.release_started = asyncio.Event()
        if release is None:
            self.release_started.set()
        self._loop.call_soon(self._hop)

    def _hop(self) -> None:
        hop = self.hops
        self.hops += 1
        release = self._release
        if (
            release is not None
            and self.release_task is None
            and (self._job.finished or self._release_due(hop))
        ):
            self.released_at = hop
            self.release_task = self._loop.create_task(_awaited(release))
            self.release_started.set()
        if not self.decided:
            if self._job.finished:
                self.decided = self.untouched = True
            elif hop >= self._k:
                self._holder.cancel(self._job)
                self.decided = True
        if not self.decided or (self._release is not None and self.release_task is None):
            self._loop.call_soon(self._hop)


async def _awaited(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


# -- a release cut off, then the same task's next call ------------------------------------


def cut_off_ks(*, full: bool) -> list[int]:
    """The k of :func:`unlock_cut_off_then_lock`: the schedule, then doubling past it."""
    ks = k_schedule(full=full)
    return [*ks, *_stretch(ks[-1])]


async def unlock_cut_off_then_lock(released: AnyLock, then: AnyLock, k: int) -> bool:
    """In the calling task: ``released.unlock()`` cut off by ``asyncio.timeout()`` at loop
    iteration ``k`` (it is finished in the background), then ``then.lock()`` at once.

    Returns whether the unlock was cut off (False: it completed before iteration k).
    """
    loop = asyncio.get_running_loop()
    unlocked = False
    try:
        async with asyncio.timeout(None) as cut:

            def hop(left: int) -> None:
                if unlocked:
                    return
                if left:
                    loop.call_soon(hop, left - 1)
                else:
                    cut.reschedule(loop.time())

            hop(k)
            await released.unlock()
            unlocked = True
    except TimeoutError:
        cut_off = True
    else:
        cut_off = False
    await then.lock()
    return cut_off


# -- log capture --------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        messages = [record.getMessage() for record in self.records]
        self.records.clear()
        return messages


# -- one case -----------------------------------------------------------------------------


@dataclass
class CaseResult:
    """What one case saw."""

    k: int
    untouched: bool
    outcome: str
    violations: list[str]


class _Case:
    """One call, cancelled at iteration k, and the checks after it."""

    def __init__(self, sweep: Sweep, k: int, round_: int) -> None:
        self.sweep = sweep
        self.spec = spec = sweep.spec
        self.k = k
        self.name = f"{sweep.base}/{spec.kind.value}/{round_}.{k}/"
        self.h = handle(sweep.a, spec.kind, self.name, spec.owner)
        same = spec.call is Call.FORCE
        self.rival_kind = spec.kind if same else rival_kind(spec.kind)
        self.rival = rival_handle(sweep.b, spec.kind, self.name, same=same)
        # Owner handles that never hold: statistics() needs no task for them.
        self.probe = handle(sweep.a, spec.kind, self.name, "probe")
        self.rival_probe = handle(sweep.b, spec.kind, self.name, "probe")
        self.holder = Holder(f"holder-{spec.id}-{k}")
        #: How to give back each hold the holder has, innermost last.
        self.stack: list[Releaser] = []
        #: The leaders whose terms the case enters (a term watches its lock's channel).
        self.leaders: list[aiolock.Leader] = []
        #: The guarded holds the case enters (one of a watched kind watches its channel).
        self.guarded: list[aiolock.Hold] = []
        self.rival_count = 0
        #: Whether force_unlock() deleted the rival's hold (its unlock then raises).
        self.rival_forced = False
        self.rival_waiter: asyncio.Task[None] | None = None
        # The sibling of the hand-over scenarios: a task of the holder's client, waiting
        # for (or holding) the same kind, which a release hands over to.
        self.sibling: Holder | None = None
        self.sibling_h = handle(sweep.a, spec.kind, self.name, None)
        self.sibling_count = 0
        self.sibling_waiter: Job[None] | None = None
        self.violations: list[str] = []

    def fail(self, message: str) -> None:
        """Record a violation, worded the same whatever k (so equal ones group)."""
        for client, who in ((self.sweep.a, "A"), (self.sweep.b, "B")):
            message = re.sub(rf"{client.id}:(\d+)\b", f"{who}:<task>", message)
            message = message.replace(client.id, who)
        self.violations.append(message.replace(self.name, "<name>"))

    # -- setup ----------------------------------------------------------------------------

    async def _take(self, how: Call) -> None:
        """The holder takes one hold the way ``how`` releases it."""
        h = self.h
        if how is Call.AEXIT:
            await self.holder.call(h.__aenter__)
            self.stack.append(partial(h.__aexit__, None, None, None))
        elif how is Call.ACQUIRED_EXIT:
            cm = h.acquired(wait=5)
            await self.holder.call(cm.__aenter__)
            self.stack.append(_exit_of(cm))
        elif how is Call.GUARDED_EXIT:
            guarded = h.guarded(wait=5)
            await self.holder.call(guarded.__aenter__)
            self.stack.append(_exit_of(guarded))
        elif how is Call.ELECTED_EXIT:
            term = self._leader().elected()
            await self.holder.call(term.__aenter__)
            self.stack.append(_exit_of(term))
        else:
            await self.holder.call(h.lock)
            self.stack.append(h.unlock)

    async def setup(self) -> None:
        scenario, call = self.spec.scenario, self.spec.call
        if scenario in {Scenario.REENTRANT, Scenario.HELD_SELF}:
            await self._take(Call.UNLOCK)
        elif scenario is Scenario.COUNT2:
            await self._take(Call.UNLOCK)
            await self._take(call)
        elif scenario is Scenario.COUNT1:
            await self._take(call)
        elif scenario is Scenario.WOKEN:
            await self._take(call)
            self.rival_waiter = asyncio.create_task(self.rival.lock())
            b, name = self.sweep.b, self.name
            kind = self.spec.kind
            await wait_until(lambda: parked(b, name, kind), what="the rival waits, subscribed")
        elif scenario is Scenario.HANDED:
            await self._take(call)
            self.sibling = Holder(f"sibling-{self.spec.id}-{self.k}")
            self.sibling_waiter = self.sibling.submit(self.sibling_h.lock)
            a, name = self.sweep.a, self.name
            await wait_until(lambda: heir_parked(a, name), what="the sibling is parked")
        elif scenario is Scenario.RACED_SIBLING:
            self.sibling = Holder(f"sibling-{self.spec.id}-{self.k}")
            await self.sibling.call(self.sibling_h.lock)
            self.sibling_count = 1
        if scenario in _RACED or scenario is Scenario.HELD_RIVAL:
            await self.rival.lock()
            self.rival_count = 1

    # -- the call -------------------------------------------------------------------------

    def _call_fn(self) -> tuple[Callable[[], Awaitable[object]], Releaser | None]:
        """The call under test, and how to give back the hold it takes (acquires)."""
        h, call = self.h, self.spec.call
        fn: Callable[[], Awaitable[object]]
        releaser: Releaser | None = h.unlock
        if call is Call.LOCK:

            async def fn() -> object:
                await h.lock()
                return True

        elif call is Call.TRY0:
            fn = partial(h.try_lock, wait=0)
        elif call is Call.TRY5:
            fn = partial(h.try_lock, wait=5)
        elif call is Call.ACQUIRED:
            cm = h.acquired(wait=5)
            fn, releaser = cm.__aenter__, _exit_of(cm)
        elif call is Call.AENTER:
            fn, releaser = h.__aenter__, partial(h.__aexit__, None, None, None)
        elif call is Call.GUARDED:
            guarded = h.guarded(wait=5)

            async def fn() -> object:
                # Entered: the hold is guarded, not lost.
                hold = await guarded.__aenter__()
                self.guarded.append(hold)
                return not hold.lost

            releaser = _exit_of(guarded)
        elif call is Call.ELECTED:
            term = self._leader().elected()

            async def fn() -> object:
                # Elected: the term's hold is guarded, not lost.
                return not (await term.__aenter__()).lost

            releaser = _exit_of(term)
        elif call is Call.FORCE:
            fn, releaser = h.force_unlock, None
        elif call is Call.EXTEND:
            fn, releaser = partial(h.extend, 20), None
        else:
            # A release: the hold it gives back is the innermost one.
            fn, releaser = self.stack.pop(), None
        return fn, releaser

    async def run_call(self) -> tuple[Job[object], Ticker]:
        fn, releaser = self._call_fn()
        job = self.holder.submit(fn)
        release: Callable[[], Awaitable[object]] | None = None
        release_due: Callable[[int], bool] | None = None
        scenario = self.spec.scenario
        if scenario in _RACED:
            release = self.rival.unlock
            probe, a, name, kind = self.probe, self.sweep.a, self.name, self.spec.kind
            if self.spec.call is Call.TRY0 or scenario is Scenario.RACED_EARLY:
                release_due = None  # at iteration 0
            elif scenario is Scenario.RACED:

                def release_due(_hop: int) -> bool:
                    return parked(a, name, kind)

            else:

                def release_due(_hop: int) -> bool:
                    return probe.statistics().tasks_waiting > 0

        elif scenario is Scenario.RACED_SIBLING:
            assert self.sibling is not None
            release = partial(self.sibling.call, self.sibling_h.unlock)
            a, name = self.sweep.a, self.name

            def release_due(_hop: int) -> bool:
                return heir_parked(a, name)

        ticker = Ticker(self.holder, job, self.k, release=release, release_due=release_due)
        try:
            async with asyncio.timeout(CALL_LIMIT):
                await job.done.wait()
                # The chain starts the release at its next hop at the latest.
                await ticker.release_started.wait()
                if ticker.release_task is not None:
                    try:
                        await ticker.release_task
                    except Exception as exc:
                        self.fail(f"the rival's release raised {exc!r}")
                    else:
                        self.rival_count = self.sibling_count = 0
        except TimeoutError:
            self.fail(f"the call did not end within {CALL_LIMIT} s (k={self.k})")
            raise
        if releaser is not None and job.error is None and job.value is not False:
            self.stack.append(releaser)
        return job, ticker

    # -- checks ---------------------------------------------------------------------------

    def judge_outcome(self, job: Job[object], ticker: Ticker) -> str:
        """Invariant 1; returns a short outcome label."""
        call, scenario = self.spec.call, self.spec.scenario
        if job.cancel_delivered:
            if isinstance(job.error, asyncio.CancelledError):
                return "cancelled"
            if job.error is None:
                self.fail(
                    f"returned {_short(job.value)} although a cancel was delivered while it "
                    f"ran (cancelling()={job.cancelling} at return)"
                )
                return "returned-after-cancel"
            self.fail(f"raised {job.error!r} instead of CancelledError")
            return "error"
        if job.error is not None:
            self.fail(f"raised {job.error!r} without being cancelled")
            return "error"
        assert ticker.untouched
        if call is Call.TRY0 and scenario is Scenario.RACED:
            # The release races the one attempt: either answer is right.
            if job.value not in {True, False}:
                self.fail(f"try_lock(wait=0) returned {job.value!r}")
        elif call is Call.FORCE:
            expected = scenario is not Scenario.FREE
            if job.value is not expected:
                self.fail(f"force_unlock() returned {job.value!r}, expected {expected}")
        elif call.acquires and job.value is False:
            self.fail("the acquire returned False although the lock was free to take")
        return "untouched"

    async def truth_and_belief(self) -> tuple[int, int]:
        h = self.h

        async def belief() -> int:
            return h.statistics().hold_count

        return await self.holder.call(h.hold_count), await self.holder.call(belief)

    async def check_state(self, before: int, outcome: str) -> bool:
        """Invariant 2, once both clients are quiet; returns whether force_unlock hit."""
        spec = self.spec
        await self._let_waiters_in()
        truth, belief = await self.truth_and_belief()
        rival_truth = await self.rival.hold_count()
        forced = False
        expected = before
        call = spec.call
        if call.acquires and outcome != "cancelled":
            expected = len(self.stack)
        elif call.releases:
            expected = before - 1
        elif call is Call.FORCE and spec.scenario is not Scenario.FREE:
            forced = await self.sweep.raw.exists(state_key(spec.kind, self.name)) == 0
            if outcome == "untouched" and not forced:
                self.fail("force_unlock() returned but the lock is still held")
        if forced:
            # The holder's hold is gone: its next unlock() raises LockLostError (checked
            # later); the rival's likewise.
            expected = 0
            self.rival_forced = self.rival_count > 0
            self.rival_count = 0
            if truth != 0 or rival_truth != 0:
                self.fail(f"force_unlock() left holds: holder {truth}, rival {rival_truth}")
        else:
            if truth != expected:
                self.fail(f"Redis holds {truth} for the holder, expected {expected} ({outcome})")
            if belief != truth:
                self.fail(f"the client believes {belief} holds, Redis has {truth} ({outcome})")
            if rival_truth != self.rival_count:
                self.fail(f"Redis holds {rival_truth} for the rival, expected {self.rival_count}")
        await self.check_no_leftovers(
            holder_count=0 if forced else expected,
            rival_count=0 if forced else self.rival_count,
        )
        return forced

    async def _let_waiters_in(self) -> None:
        """Wait for the rival's or the sibling's lock() the release let in (checked)."""
        sweep = self.sweep
        await quiesce(sweep.a)
        await quiesce(sweep.b)
        if self.rival_waiter is not None:
            try:
                async with asyncio.timeout(STEP_LIMIT):
                    await self.rival_waiter
                self.rival_count = 1
            except TimeoutError:
                self.fail("the rival waiting for the lock was never let in")
                self.rival_waiter.cancel()
            self.rival_waiter = None
            await quiesce(sweep.b)
        if self.sibling_waiter is not None:
            try:
                async with asyncio.timeout(STEP_LIMIT):
                    await self.sibling_waiter.done.wait()
            except TimeoutError:
                self.fail("the sibling waiting for the lock was never let in")
            else:
                if self.sibling_waiter.error is not None:
                    self.fail(f"the sibling's lock() raised {self.sibling_waiter.error!r}")
                else:
                    self.sibling_count = 1
            self.sibling_waiter = None
        if self.sibling is not None:
            await self._check_sibling()

    async def _check_sibling(self) -> None:
        assert self.sibling is not None
        sibling_h = self.sibling_h

        async def belief() -> int:
            return sibling_h.statistics().hold_count

        truth = await self.sibling.call(sibling_h.hold_count)
        believed = await self.sibling.call(belief)
        if truth != self.sibling_count or believed != truth:
            self.fail(
                f"the sibling holds {truth} in Redis, believes {believed}, expected "
                f"{self.sibling_count}"
            )

    def _leader(self) -> aiolock.Leader:
        leader = self.sweep.a.leader(self.name)
        self.leaders.append(leader)
        return leader

    async def check_no_leftovers(self, *, holder_count: int, rival_count: int) -> None:
        """No orphan hold, timeout key, queue entry, waiter or subscription reference."""
        sweep, raw, name = self.sweep, self.sweep.raw, self.name
        kind = self.spec.kind
        fields = await raw.hgetall(state_key(kind, name))
        mode = fields.pop("mode", None)
        counts = sorted(int(value) for value in fields.values())
        wanted = sorted(c for c in (holder_count, rival_count, self.sibling_count) if c)
        if counts != wanted:
            self.fail(f"lock hash counts {counts} (fields {sorted(fields)}), expected {wanted}")
        if kind in _OTHER_SIDE and (mode is None) != (not wanted):
            self.fail(f"read-write lock mode {mode!r} with holds {counts}")
        await self._check_kind_keys(holder_count, rival_count, sorted(map(str, fields)))
        for side, probe in (("holder", self.probe), ("rival", self.rival_probe)):
            if probe.statistics().tasks_waiting:
                self.fail(f"{side}'s client still counts a waiter")
        for side, client in (("holder", sweep.a), ("rival", sweep.b)):
            refs = {ch: n for ch, n in inside.pubsub(client).channels().items() if n}
            mine = {ch: n for ch, n in refs.items() if name in ch}
            # A leader's term under way watches its lock's channel (Engine.watch_taken), as
            # does a guarded hold of a kind whose channel tells a force (Primitive.watched).
            terms = sum(1 for leader in self.leaders if leader.is_leader) if side == "holder" else 0
            watched = _WATCHED_CHANNEL.get(kind.value)
            if side == "holder" and watched is not None:
                terms += sum(
                    1 for hold in self.guarded if not hold.lost and not guarding_of(hold).over
                )
            channel = (watched or "redisson_lock__channel:{{{}}}").format(name)
            if terms and mine == {channel: terms}:
                continue
            if mine:
                self.fail(f"{side}'s client still references subscriptions {mine}")
            if len(refs) > len(mine):
                # Reported by their own case already, unless they leaked after its checks.
                self.fail(f"{side}'s client references channels of earlier cases")

    async def _check_kind_keys(self, holder_count: int, rival_count: int, holds: list[str]) -> None:
        """The keys a lock type keeps beside its holds: read timeouts, queues, leases."""
        raw, name, kind = self.sweep.raw, self.name, self.spec.kind
        if kind in {Kind.READ, Kind.WRITE}:
            readers = (holder_count if kind is Kind.READ else 0) + (
                rival_count if self.rival_kind is Kind.READ else 0
            )
            pattern = f"*{name}*:rwlock_timeout:*"
            timeouts = [key async for key in raw.scan_iter(match=pattern, count=10_000)]
            if len(timeouts) != readers:
                self.fail(f"{len(timeouts)} read timeout keys for {readers} read holds")
        if kind is Kind.FAIR:
            queued = await raw.lrange(fair_queue_key(name), 0, -1)
            timeouts_z = await raw.zrange(fair_timeout_key(name), 0, -1)
            if queued or timeouts_z:
                self.fail(f"fair lock queue {queued} / timeouts {timeouts_z} left behind")
        if kind in FAIR_RW:
            leases = await raw.zrange(prefixed("aiolock_frw_leases", name), 0, -1)
            if sorted(leases) != holds:
                self.fail(f"lease entries {sorted(leases)} for holds {holds}")
            queued = await raw.lrange(prefixed("aiolock_frw_queue", name), 0, -1)
            deadlines = await raw.zrange(prefixed("aiolock_frw_deadlines", name), 0, -1)
            admitted = await raw.zrange(prefixed("aiolock_frw_admitted", name), 0, -1)
            if queued or deadlines or admitted:
                self.fail(
                    f"fair read-write queue {queued} / deadlines {deadlines} / admitted "
                    f"{admitted} left behind"
                )

    async def follow_up(self, forced: bool) -> None:
        """Invariant 3: the rival lets go, then the holder's next calls work."""
        rival = self.rival
        while self.sibling_count:
            assert self.sibling is not None
            await self._expect_ok(
                partial(self.sibling.call, self.sibling_h.unlock), "the sibling's unlock()"
            )
            self.sibling_count -= 1
        while self.rival_count:
            await self._expect_ok(rival.unlock, "the rival's unlock()")
            self.rival_count -= 1
        if self.rival_forced:
            await self._expect_lost(rival.unlock, "the rival's unlock() after force_unlock()")
        if forced and self.stack:
            releaser = self.stack.pop()
            await self._expect_lost(releaser, "the holder's unlock() after force_unlock()")
            self.stack.clear()
        h = self.h
        try:
            taken = await self.holder.call(lambda: h.try_lock(wait=0))
        except Exception as exc:
            self.fail(f"the holder's next try_lock(wait=0) raised {exc!r}")
            taken = False
        else:
            if not taken:
                self.fail("the holder's next try_lock(wait=0) failed on a lock free to it")
        if taken:
            await self._expect_ok(h.unlock, "the unlock() after the next try_lock")
        while self.stack:
            await self._expect_ok(self.stack.pop(), "releasing the holder's holds")

    async def _expect_ok(self, fn: Releaser, what: str) -> None:
        try:
            await self.holder.call(fn)
        except Exception as exc:
            self.fail(f"{what} raised {exc!r}")

    async def _expect_lost(self, fn: Releaser, what: str) -> None:
        try:
            await self.holder.call(fn)
        except aiolock.LockLostError:
            return
        except Exception as exc:
            self.fail(f"{what} raised {exc!r}, expected LockLostError")
            return
        self.fail(f"{what} returned, expected LockLostError")

    async def check_clean(self) -> None:
        """Invariant 4 for this case's name, and the holder's belief back to zero."""
        sweep = self.sweep
        await quiesce(sweep.a)
        await quiesce(sweep.b)
        truth, belief = await self.truth_and_belief()
        if truth or belief:
            self.fail(f"after releasing everything: Redis {truth}, belief {belief}")
        await self.check_no_leftovers(holder_count=0, rival_count=0)
        left = [
            key
            async for key in sweep.raw.scan_iter(match=f"*{self.name}*", count=10_000)
            if not key.startswith(_TRANSIENT)
        ]
        if left:
            self.fail(f"keys left behind: {sorted(left)}")
            await sweep.raw.delete(*left)

    async def run(self) -> CaseResult:
        try:
            await self.setup()
            before = len(self.stack)
            job, ticker = await self.run_call()
            outcome = self.judge_outcome(job, ticker)
            forced = await self.check_state(before, outcome)
            await self.follow_up(forced)
            await self.check_clean()
        finally:
            if self.rival_waiter is not None:
                self.rival_waiter.cancel()
            await self.holder.stop()
            if self.sibling is not None:
                await self.sibling.stop()
        messages = self.sweep.logs.take()
        if self.spec.call is Call.FORCE:
            # A forced hold is reported lost when its holder's unlock() finds it gone.
            messages = [m for m in messages if "was lost" not in m]
        self.violations.extend(f"aiolock logged: {m}" for m in messages)
        return CaseResult(self.k, ticker.untouched, outcome, self.violations)


def _short(value: object) -> str:
    """A value for a message that does not vary with k (a handle's repr names the lock)."""
    if value is None or isinstance(value, bool | int):
        return repr(value)
    return f"the {type(value).__name__} handle"


def _exit_of(cm: AbstractAsyncContextManager[Any]) -> Releaser:
    async def exit_() -> object:
        return await cm.__aexit__(None, None, None)

    return exit_


# -- a sweep ------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """The cases one sweep ran and what failed."""

    spec: Spec
    cases: int
    seconds: float
    #: Per round, the k at which the call completed untouched.
    completed_at: list[int]
    violations: dict[str, list[int]]
    #: What stopped the sweep early: a case that could not run to its end (a hang).
    crash: BaseException | None = None

    def report(self, limit: int = 12) -> str:
        """The distinct violations, each with the k at which it occurred."""
        lines = [
            f"{self.spec.id}: {sum(map(len, self.violations.values()))} violation(s) in "
            f"{self.cases} cases (the call completed untouched at k={self.completed_at})"
        ]
        for message, ks in list(self.violations.items())[:limit]:
            lines.append(f"  - {message}  [k={_ranges(ks)}]")
        if len(self.violations) > limit:
            lines.append(f"  ... {len(self.violations) - limit} more distinct messages")
        return "\n".join(lines)


def _ranges(ks: Sequence[int]) -> str:
    parts: list[str] = []
    for k in sorted(set(ks)):
        if parts and parts[-1].rsplit("-", 1)[-1] == str(k - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{k}"
        else:
            parts.append(str(k))
    return ",".join(parts)


class Sweep:
    """Sweeps one :class:`Spec` over k with one pair of clients (a fresh name per k)."""

    def __init__(
        self,
        spec: Spec,
        a: aiolock.Client,
        b: aiolock.Client,
        raw: Redis | RedisCluster,
        base: str,
    ) -> None:
        self.spec = spec
        self.a = a
        self.b = b
        self.raw = raw
        self.base = base
        self.logs = _Records()

    async def run(self, ks: Sequence[int], *, rounds: int = 1) -> SweepResult:
        """Run the cases for ``ks`` in order until one completes untouched, ``rounds`` times.

        Which code a given k lands in depends on how many iterations each round trip
        takes, which varies: more rounds hit more of the call's await points.
        """
        violations: dict[str, list[int]] = defaultdict(list)
        logger = logging.getLogger("aiolock")
        logger.addHandler(self.logs)
        started = time.perf_counter()
        cases = 0
        completed_at: list[int] = []
        crash: BaseException | None = None
        try:
            stretch = _stretch(ks[-1])
            for round_ in range(rounds):
                for k in [*ks, *stretch]:
                    case = _Case(self, k, round_)
                    cases += 1
                    try:
                        result = await case.run()
                    except Exception as exc:
                        # Its state is unknown: later cases would only report its leftovers.
                        case.fail(f"the case could not run to its end: {exc!r}")
                        for message in case.violations:
                            violations[message].append(k)
                        crash = exc
                        break
                    for message in result.violations:
                        violations[message].append(k)
                    if result.untouched:
                        completed_at.append(k)
                        break
                else:
                    last = stretch[-1] if stretch else ks[-1]
                    never = f"the call never completed before a cancel at k <= {last}"
                    violations[never].append(last)
                if crash is not None:
                    break
        finally:
            logger.removeHandler(self.logs)
        for ks_seen in violations.values():
            ks_seen.sort()
        seconds = time.perf_counter() - started
        return SweepResult(self.spec, cases, seconds, completed_at, dict(violations), crash)
