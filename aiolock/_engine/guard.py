"""Guarded holds: a body that runs only while its lock is known to be held.

``LockHandle.guarded()`` takes the lock and runs its body in the calling task; at the moment of
loss the guard cancels that task directly (and takes that cancel back at the block's exit,
as ``asyncio.timeout()`` does, so a cancel from outside still wins and nested scopes
behave). The body is cancelled, and the block raises ``LockLostError``, when

* the hold is found gone or taken: the renewal's answer, a force_unlock() of this client,
  a later acquire finding a stale count; the hold registry tells each guarded hold
  watching a lost record at once (``holds.HoldRegistry.mark_lost``); or
* the hold can no longer be *confirmed*: each record carries ``confirmed``, a lower bound
  of its key's expiry on the server. Every call that sets that expiry (an acquire or
  re-entry, ``extend()``, a renewal, an unlock's or rollback's re-applied lease) lowers it
  at its send to its send time plus its lease, and sets it from its answer
  (``holds.HoldRecord.expiry_sent``): the server set that lease after the send, so it runs at
  least until then, and a shorter lease moves the deadline earlier at once. At
  ``confirmed_until`` (that, less the drift margin) with no newer answer, the body is
  cancelled: a holder cut off from Redis stops before anyone else can take the lock.

Data flows handle -> guard <- records: the handle builds a `Guarding` over the records
its acquire made; the engine and the renewal write the records, which tell their guarded
holds when a confirmation moves earlier. ONE timer per client (``Guard``): a heap of
guarded deadlines and one ``loop.call_at`` for the earliest, re-read lazily when it fires
(a renewal moved most of them on by then), so a renewal that confirms later costs the
guard nothing.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._exceptions import LockLostError, LockTimeoutError

if TYPE_CHECKING:
    from types import TracebackType

    from .holds import HoldRecord

__all__ = (
    "DRIFT_FACTOR",
    "DRIFT_S",
    "Guard",
    "Guarded",
    "Guarding",
    "Hold",
    "drift_margin",
    "guarding_of",
)

# The guard compares the local monotonic clock with an expiry the server keeps on its own
# clock, both counting from one instant (the server runs a command after it was sent). The
# margin covers the clocks' rates (two NTP-slewed clocks drift at most 0.1 % of the lease
# apart: 1 % is ten times that), the server's whole-millisecond expiry, and the cancel's
# delivery a loop iteration or two after the timer fires; its measured delivery latency is
# in docs/architecture.md ("The guard's drift margin"). A VM paused and resumed is not drift.
DRIFT_FACTOR = 0.01
DRIFT_S = 0.012


def drift_margin(lease: float) -> float:
    """How long before a ``lease`` (s) is confirmed to end the body is cancelled."""
    return lease * DRIFT_FACTOR + DRIFT_S


class Hold:
    """A guarded hold (``async with lock.guarded() as hold``): what the body can rely on.

    ``lost``: the hold was lost (the body is being cancelled, or was). ``confirmed_until``:
    until when (``loop.time()``) the lock is confirmed held, drift margin deducted: a lower
    bound of the lease on the server, which every call that sets the lease moves (a shorter
    ``extend()`` or re-entry earlier, a renewal on); the body is cancelled then unless an
    answer moved it on. ``token``: a fenced lock's fencing token (None for other kinds).
    ``await wait_lost()`` returns once the hold is lost, or over (released): check ``lost``.
    """

    __slots__ = ("_guarding",)

    def __init__(self, guarding: Guarding) -> None:
        self._guarding = guarding

    def __repr__(self) -> str:
        why = self._guarding.why
        state = f"lost ({why})" if why else "held"
        return f"<aiolock.Hold {state}, confirmed until {self.confirmed_until:.3f}>"

    @property
    def lost(self) -> bool:
        """Whether the hold was lost (the body is cancelled)."""
        return self._guarding.lost

    @property
    def confirmed_until(self) -> float:
        """Until when (``loop.time()``) the lock is confirmed held, less the drift margin."""
        return self._guarding.confirmed_until

    @property
    def token(self) -> int | None:
        """A fenced lock's fencing token (None for other kinds)."""
        return self._guarding.token

    async def wait_lost(self) -> None:
        """Return once the hold is lost or over; ``lost`` says which."""
        await self._guarding.wait_lost()


def guarding_of(hold: Hold) -> Guarding:
    """The guard's side of ``hold`` (for aiolock's own layers: the sync API, tests)."""
    return hold._guarding


class Guarding:
    """The guard's side of one guarded hold: its records, deadline, body task and loss.

    The records (``holds.HoldRecord``) tell it when a member is lost or its confirmation moves;
    the client's ``Guard`` fires at its deadline; ``Guarded`` arms it with the body's task
    and ends it at the block's exit. The body sees only its ``view`` (``aiolock.Hold``).
    """

    __slots__ = (
        "_cancelled",
        "_ended",
        "_guards",
        "_left",
        "_margin",
        "_need",
        "_over",
        "_records",
        "_soon",
        "_task",
        "_until",
        "_why",
        "token",
        "view",
    )

    def __init__(
        self,
        records: Sequence[HoldRecord | None],
        *,
        need: int,
        margin: float,
        guards: Sequence[Guard],
        token: int | None = None,
    ) -> None:
        # Per member: its record (None: not taken, a RedLock's minority). Each record's
        # ``confirmed`` is a lower bound of its key's expiry, whatever set it last (an
        # acquire, a re-entry, extend(), a renewal, an unlock's re-applied lease).
        self._records = list(records)
        self._need = need
        self._margin = margin
        self._guards = list(dict.fromkeys(guards))
        self.token = token
        self._why: str | None = None
        self._until = self._compute_until()
        # The body's task (set by arm()), whether this hold cancelled it, and a cancel
        # scheduled from within that task itself (see _fire).
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._soon: asyncio.Handle | None = None
        self._ended = asyncio.Event()
        # Set once the body has left its block (whose exit started the release).
        self._left = asyncio.Event()
        self._over = False
        for record in self._records:
            if record is not None:
                record.attach_guard(self)
        #: What the body sees (``aiolock.Hold``).
        self.view = Hold(self)
        if self._alive() < need:
            # Lost between the acquire's answer and now (a RedLock short of its quorum):
            # arm() cancels the body at once.
            self._why = "it was not held when the body began"
            self._ended.set()

    @property
    def lost(self) -> bool:
        """Whether the hold was lost (the body is cancelled)."""
        return self._why is not None

    @property
    def confirmed_until(self) -> float:
        """Until when (``loop.time()``) the lock is confirmed held, less the drift margin."""
        if self._why is None and not self._over:
            self._until = self._compute_until()
        return self._until

    async def wait_lost(self) -> None:
        """Return once the hold is lost or over; ``lost`` says which."""
        await self._ended.wait()

    @property
    def why(self) -> str | None:
        """Why it was lost (None: it was not)."""
        return self._why

    @property
    def over(self) -> bool:
        """Whether the body has left its block."""
        return self._over

    def _alive(self) -> int:
        return sum(1 for r in self._records if r is not None and r.lost is None and r.leases)

    def _compute_until(self) -> float:
        """The ``need``-th latest confirmation among the members still held, less the margin."""
        times = sorted(
            (
                record.confirmed
                for record in self._records
                if record is not None and record.lost is None
            ),
            reverse=True,
        )
        if len(times) < self._need:
            return -math.inf
        return times[self._need - 1] - self._margin

    def member_lost(self, why: str) -> None:
        """A member's record was found lost (the registry calls this)."""
        if self._why is None and not self._over and self._alive() < self._need:
            self.lose(why)

    def confirmation_moved(self, until: float, *, earlier: bool) -> None:
        """A member's confirmation was set to ``until``; ``earlier``: it moved earlier.

        The drift margin grows with a longer lease (an ``extend()``). Earlier (a shorter
        lease was set), the guard's timer, armed for the old deadline, is re-armed now; a
        deadline already past (a lease shortened below the time the body has run) ends
        the body at once.
        """
        if self._why is not None or self._over:
            return
        margin = drift_margin(until - asyncio.get_running_loop().time())
        if margin > self._margin:
            self._margin, earlier = margin, True
        if earlier:
            self._rearm()

    def _rearm(self) -> None:
        deadline = self.confirmed_until
        if self._task is None:
            return  # not armed yet: arm() reads the deadline
        if deadline <= asyncio.get_running_loop().time():
            self.lose(_unconfirmed(self._margin))
            return
        for guard in self._guards:
            guard.rearm(self, deadline)

    def lose(self, why: str) -> None:
        """The hold is lost: cancel the body now (once)."""
        if self._why is not None or self._over:
            return
        self._why = why
        self._until = min(self._until, self._compute_until())
        self._ended.set()
        for guard in self._guards:
            guard.unwatch(self)
        self._fire()

    def _fire(self) -> None:
        task = self._task
        if task is None or self._cancelled:
            return
        if task is asyncio.current_task():
            # Found lost by the body's own call (an extend(), an unlock()): the cancel is
            # delivered at its next await, and withdrawn should the block end before it.
            if self._soon is None:
                self._soon = asyncio.get_running_loop().call_soon(self._cancel_body)
            return
        self._cancel_body()

    def _cancel_body(self) -> None:
        # Directly, not through a rescheduled timer: a body parked at an await resumes
        # with CancelledError, never with its await's result (after a stalled loop both
        # are ready in the same iteration).
        self._soon = None
        task = self._task
        if task is not None and not self._cancelled and not self._over:
            self._cancelled = True
            task.cancel()

    def arm(self, task: asyncio.Task[Any]) -> None:
        """The body runs in ``task`` from now on; a loss already found cancels it at once."""
        self._task = task
        for guard in self._guards:
            guard.watch(self)
        if self._why is not None:
            self._fire()
        else:
            # A member's confirmation may have moved earlier before the body began.
            self._rearm()

    def end(self) -> bool:
        """The body ended: stop watching, let go of the records; whether it was cancelled."""
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        self._over = True
        for guard in self._guards:
            guard.unwatch(self)
        for record in self._records:
            if record is not None and record.guards:
                # By identity: a Guarding compares as any object, but be explicit.
                record.guards[:] = [g for g in record.guards if g is not self]
        self._ended.set()
        self._left.set()
        return self._cancelled

    def deadline(self) -> float:
        """When the body must stop unless confirmed again (-inf: lost)."""
        return self.confirmed_until


def _unconfirmed(margin: float) -> str:
    return f"not confirmed by the server in time: its lease may end {margin * 1000:.0f} ms from now"


class Guard:
    """One client's watch over its guarded holds: ONE timer for all their deadlines."""

    __slots__ = ("_armed", "_handle", "_heap", "_loop", "_seq", "_watched", "lease")

    def __init__(self, lease: float) -> None:
        #: The client's watchdog lease (s): a guarded hold's drift margin without a lease.
        self.lease = lease
        self._heap: list[tuple[float, int, Guarding]] = []
        self._seq = itertools.count()
        self._watched: dict[Guarding, asyncio.Task[Any] | None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._watched)

    def watch(self, hold: Guarding) -> None:
        """Cancel ``hold``'s body at its deadline unless confirmed again by then."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A new event loop (the first one closed): whatever was scheduled died with it.
            self._loop, self._heap, self._handle, self._armed = loop, [], None, math.inf
        self._watched[hold] = asyncio.current_task()
        self._push(hold.deadline(), hold)

    def rearm(self, hold: Guarding, deadline: float) -> None:
        """``hold``'s deadline moved earlier, to ``deadline``: fire then."""
        if hold in self._watched:
            self._push(deadline, hold)

    def unwatch(self, hold: Guarding) -> None:
        """Stop watching ``hold`` (its heap entry is skipped when reached)."""
        self._watched.pop(hold, None)
        if not self._watched:
            # Nothing left to watch: no timer, no stale entries (in place: _fire may be
            # walking this very list).
            self._heap.clear()
            if self._handle is not None:
                self._handle.cancel()
                self._handle, self._armed = None, math.inf

    def cancel_all_and_wait(self, why: str = "the client is closing") -> Awaitable[bool]:
        """Cancel every guarded body now; the awaitable ends once each has left its block.

        Each block's exit starts its release in the background. ``aclose()`` cancels first,
        then waits (bounded: a body that swallows the cancel runs on): True if all left.
        """
        holds = list(self._watched)
        self.cancel_all(why)
        return _all_set([hold._left for hold in holds])

    def cancel_all(self, why: str = "the client is closing") -> list[asyncio.Task[Any]]:
        """Cancel every guarded body (``aclose()`` calls this first); their tasks.

        Each block raises ``LockLostError`` (``why``) and releases in the background.
        """
        tasks = [task for task in self._watched.values() if task is not None]
        for hold in list(self._watched):
            hold.lose(why)
        return tasks

    def _push(self, when: float, hold: Guarding) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), hold))
        if when < self._armed:
            self._arm(when)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._armed = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle, self._armed = None, math.inf
        assert self._loop is not None
        now = self._loop.time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, hold = heapq.heappop(heap)
            if hold not in self._watched:
                continue
            deadline = hold.deadline()
            if deadline > now:
                # Confirmed again since it was pushed: watch the new deadline.
                heapq.heappush(heap, (deadline, next(self._seq), hold))
            else:
                hold.lose(_unconfirmed(hold._margin))
        if heap:
            self._arm(heap[0][0])


class Guardable(Protocol):
    """What ``Guarded`` needs of a lock (a handle, a MultiLock, a RedLock)."""

    @property
    def name(self) -> str: ...

    def _guard_acquire(self, wait: float | None, lease: float | None) -> Awaitable[Guarding | None]:
        """Acquire within ``wait`` and build the guarded hold; None if ``wait`` ran out."""
        ...

    def _guard_release(self, body_error: BaseException | None) -> Awaitable[None]:
        """Release the hold (it was not lost), never hiding ``body_error``."""
        ...

    def _guard_release_soon(self) -> None:
        """Release the hold in the background (it was lost)."""
        ...

    def _guard_holder(self) -> str:
        """Who holds it, for the error."""
        ...

    def _guard_watch(self, armed: asyncio.Event) -> asyncio.Task[None] | None:
        """Watch the hold's channel for a forced unlock (``armed``: in place); None: not."""
        ...


class Guarded:
    """``async with lock.guarded(wait, lease) as hold``: see the module docstring."""

    __slots__ = ("_entry", "_hold", "_lease", "_lock", "_task", "_wait", "_watch")

    def __init__(self, lock: Guardable, wait: float | None, lease: float | None) -> None:
        self._lock = lock
        self._wait = wait
        self._lease = lease
        self._hold: Guarding | None = None
        self._task: asyncio.Task[Any] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._entry = 0

    async def __aenter__(self) -> Hold:
        if self._hold is not None:
            raise RuntimeError("a guarded() block is entered once: call guarded() again")
        hold = await self._lock._guard_acquire(self._wait, self._lease)
        if hold is None:
            assert self._wait is not None
            raise LockTimeoutError(self._lock.name, self._wait)
        task = asyncio.current_task()
        assert task is not None  # the acquire ran in one
        # No await from the acquire's answer to here: nothing can come in between.
        self._hold, self._task = hold, task
        # Cancel requests left over from before (a TaskGroup's, Python 3.11) are not ours.
        self._entry = task.cancelling()
        hold.arm(task)
        armed = asyncio.Event()
        self._watch = self._lock._guard_watch(armed)
        if self._watch is not None:
            # The body begins once the watch of its channel is in place (a round trip on
            # the pub/sub connection, see ``Engine.watch_taken``): from then on a force ends it
            # on the unlock message itself, before the next holder's acquire is answered.
            try:
                await armed.wait()
            except BaseException as exc:
                # Lost meanwhile (LockLostError), or cancelled: the block ends here.
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        return hold.view

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold, task, watch = self._hold, self._task, self._watch
        assert hold is not None
        assert task is not None
        cancelled: asyncio.CancelledError | None = None
        if watch is not None:
            # Its end (the subscription given back) before the release. A cancel of this
            # task meanwhile does not skip the release: it is raised once that is done.
            self._watch = None
            watch.cancel()
            try:
                await asyncio.wait([watch])
            except asyncio.CancelledError as error:
                cancelled = error
        try:
            await self._exit(hold, task, exc)
        finally:
            if cancelled is not None:
                raise cancelled  # a cancel from outside wins

    async def _exit(
        self, hold: Guarding, task: asyncio.Task[Any], exc: BaseException | None
    ) -> None:
        lost = hold.why
        # The cancel the loss caused (if any) is taken back, as asyncio.timeout() does: a
        # CancelledError with no other request pending was ours, and becomes the loss.
        ours = (
            hold.end()
            and task.uncancel() <= self._entry
            and isinstance(exc, asyncio.CancelledError)
        )
        if lost is None:
            # As at the end of `async with lock:`: a failed release is a note on the
            # body's exception, or ReleaseError after a body that raised nothing.
            await self._lock._guard_release(exc)
            return
        # Lost: not waited on. The block ends now, the release lands when it can.
        self._lock._guard_release_soon()
        error = LockLostError(self._lock.name, self._lock._guard_holder(), lost)
        if ours or exc is None:
            # The body's CancelledError (if any) as the context, as for any error raised
            # while handling it.
            error.__context__ = exc
            raise error
        # Another error ended the body (or a cancel from outside, which wins): it goes on,
        # with the loss noted.
        exc.add_note(f"aiolock: {error}")
        return


def guarded_hold(
    records: Sequence[HoldRecord | None],
    *,
    need: int,
    leases: Sequence[float | None],
    guards: Sequence[Guard],
    token: int | None = None,
) -> Guarding:
    """A guarded hold over ``records``, its margin from the longest lease it relies on."""
    longest = max(
        (lease if lease is not None else guard.lease)
        for lease, guard in zip(leases, guards, strict=True)
    )
    return Guarding(records, need=need, margin=drift_margin(longest), guards=guards, token=token)


async def _all_set(events: list[asyncio.Event]) -> bool:
    for event in events:
        await event.wait()
    return True
