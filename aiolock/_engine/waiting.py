"""The waiting room: which calls of this client wait on which channel, and who a message wakes.

Pub/sub hands every message and every (re)confirmed subscription to the room
(`WaitingRoom.deliver()`, `WaitingRoom.wake_all()`); the room sets the events of the
waiters it concerns. Waking never grants anything: a woken call runs its acquire script
again, so a spurious wake-up costs one round trip and a lost message one bounded wait.

Plain sync bookkeeping throughout. Besides the waiters it counts waiting calls per lock
(statistics, repr) and per holder (a fair lock's queue entry is one per holder, left only
when its last waiting call gives up), and remembers the lease the waiters last saw: a
newcomer queued behind them waits at most that long for a message.

**Hand-over**: a release that gives the lock straight to a waiter of the same client.

Every release that frees a lock publishes a message; each client with waiters wakes one,
and every one of them runs its acquire script: one wins, the others have spent a round
trip for nothing. When the releasing client has a waiter of its own parked on the lock,
the release script can instead write that waiter's hold in place of the releaser's
(``lock_release.lua``, reply 3): one round trip for the release and the acquisition
together, no message, no attempt anywhere. The lock is never free in between, so the
state stays Redisson's.

Rules, all here as plain sync methods:

- **Who**: the oldest parked waiter of a task or of an aiolock.sync thread (not another
  ``owner=``, whose holder may have other calls under way), exclusive, not woken, whose
  holder has no call or background completion under way on this lock (a pending
  rollback of its earlier attempt could otherwise undo the hold it is handed), and only
  if its primitive takes a hand-over from the releaser's (``Primitive.takes_hand_over``).
  Kinds share a hash and channel (Lock, FencedLock, SpinLock): a fenced acquisition
  takes a token, which no release script does, so a fenced waiter is never an heir; nor
  is any call asking for a token.
- **How often**: at most ``IN_A_ROW`` hand-overs on one lock, then a release publishes as
  usual, so that waiters of other clients (other processes, Redisson) get their turn: a
  client cannot keep a contended lock among its own tasks for ever.
- **The offer**: made to one waiter for one release call, and settled with that call's
  outcome (handed, not handed, unknown). The waiter returns holding the lock if handed;
  a waiter that leaves first (deadline, cancellation) abandons it, and the engine then
  releases whatever it is handed, in that holder's turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .._net.subscriptions import wait_event

if TYPE_CHECKING:
    from .._net.subscriptions import Barrier, Subscription
    from .primitive import Call, Primitive

__all__ = (
    "IN_A_ROW",
    "SETTLES",
    "HandOvers",
    "Offer",
    "Step",
    "Turn",
    "Waiter",
    "WaitingRoom",
    "WakeCount",
    "wait_in_line",
)

#: How many exclusive waiters a message wakes (``None``: all of them). Every message also
#: wakes every shared waiter: what lets one of them in lets them all in.
WakeCount = Callable[[bytes], "int | None"]
#: A wake count meaning: the message itself is what every waiter waits for (a latch's "0":
#: the count reached zero). All wake, each marked ``settled``, so none of them misses it
#: because the state changed again before it looked.
SETTLES = -1


class Waiter:
    """One wait of one call: a fresh one-shot event, never cleared or reused.

    A *shared* waiter (a reader) is woken by every message; an exclusive one only when
    the message's count reaches it.
    """

    __slots__ = (
        "barrier",
        "event",
        "forced",
        "offer",
        "parked",
        "parked_as",
        "settled",
        "shared",
        "short",
        "trying",
        "woken_by_message",
    )

    def __init__(self, *, shared: bool) -> None:
        self.event = asyncio.Event()
        self.shared = shared
        self.woken_by_message = False
        #: Its call's attempt is in flight (a counting object's take): it may take what
        #: a message says is available, so the message counts on it (``_Line.wake``).
        self.trying = False
        #: Its call's last attempt found some available but fewer than it asks for: a
        #: newcomer does not queue behind it (``queues_behind``).
        self.short = False
        #: A message that is itself what the wait waits for reached it (see SETTLES).
        self.settled = False
        #: The call, while it is parked in wait() (and so may be offered a hand-over), and
        #: the primitive it waits for (which says whether it takes a hand-over).
        self.parked: Call | None = None
        self.parked_as: Primitive | None = None
        #: A hand-over offered to it (the module docstring's Hand-over), until it is gone.
        self.offer: Offer | None = None
        #: A watcher's (``Engine.watch_taken``): a barrier sent on its subscription's
        #: connection after the hold began, and what to call, at once, for a message heard
        #: after the barrier passed (published while the hold was held: it was forced away).
        self.barrier: Barrier | None = None
        self.forced: Callable[[], None] | None = None

    def park(self, primitive: Primitive, call: Call) -> None:
        """From now on a release may hand ``call`` the lock (if ``primitive`` takes it)."""
        self.parked = call
        self.parked_as = primitive

    def unpark(self) -> None:
        """The call no longer sits in wait(): no hand-over is offered to it any more."""
        self.parked = None
        self.parked_as = None

    def offer_settled(self) -> None:
        """Its hand-over's outcome is known: wake it to take it."""
        self.event.set()

    async def wait(self, limit: float | None) -> bool:
        """Wait until woken or ``limit`` seconds passed; True if woken."""
        return await wait_event(self.event, limit)


class _Line:
    """The waiters of one channel, oldest first."""

    __slots__ = ("counts_available", "shared", "waiters", "wake_count", "watchers")

    def __init__(self, wake_count: WakeCount, *, counts_available: bool = False) -> None:
        self.wake_count = wake_count
        # A message's count is what is available now (a semaphore's permits), not what
        # the message frees: the waiters woken already, yet to try, are counted in it.
        self.counts_available = counts_available
        # Insertion-ordered set: the longest-registered waiter is woken first.
        self.waiters: dict[Waiter, None] = {}
        self.shared = 0
        # Of the shared ones, those that only watch the channel (Engine.watch_taken).
        self.watchers: set[Waiter] = set()

    def heard(self) -> None:
        """A message was heard on the channel: tell each watcher whose barrier has passed."""
        for waiter in list(self.watchers):
            barrier = waiter.barrier
            if waiter.forced is not None and barrier is not None and barrier.passed:
                waiter.forced()

    def wake(self, count: int | None, *, shared: bool = True, available: bool = False) -> int:
        """Wake up to ``count`` exclusive waiters (None or SETTLES: all), oldest first.

        Every shared waiter wakes too, unless ``shared=False``. ``available``: ``count`` is
        what is available in all, not how many turns are given (a turn passed on is one,
        whoever else is awake). Returns how many exclusive ones woke.
        """
        if count == SETTLES:
            for waiter in self.waiters:
                waiter.settled = True
            count = None
        elif count is not None and available and self.counts_available:
            # Releases in a row publish 1, 2, 3...: each wakes only those the permits
            # left for them let in, not that many more each. Those woken already and yet
            # to try take them first, then those whose attempt is in flight: each of
            # these it counts on is woken too, so that one whose attempt ran too early to
            # see them tries again (and one that took passes a turn on: Engine._wait_for).
            count -= sum(
                1 for waitable in self.waiters if waitable.event.is_set() and not waitable.shared
            )
            for waiter in self.waiters:
                if count <= 0:
                    break
                if waiter.trying and not waiter.event.is_set():
                    waiter.woken_by_message = True
                    waiter.event.set()
                    count -= 1
        # Shared waiters may sit anywhere in the order: then the whole line is walked.
        walk_all = shared and self.shared > 0
        woken = 0
        for waiter in self.waiters:
            full = count is not None and woken >= count
            if full and not walk_all:
                break
            if waiter.event.is_set() or (waiter.shared and not shared):
                continue
            if not waiter.shared:
                if full:
                    continue
                woken += 1
            waiter.woken_by_message = True
            waiter.event.set()
        return woken


class WaitingRoom:
    """One client's waiting calls: their waiters per channel, their counts per lock."""

    __slots__ = ("_by_field", "_by_key", "_closed", "_lease_until", "_lines")

    def __init__(self) -> None:
        self._lines: dict[str, _Line] = {}
        self._closed = False
        self._by_key: dict[str, int] = {}
        self._by_field: dict[tuple[str, str], int] = {}
        # Lock key -> loop time its lease runs out, as this client's waiters last saw it.
        self._lease_until: dict[str, float] = {}

    # -- waiters --------------------------------------------------------------------------

    def add(
        self,
        channel: str,
        wake_count: WakeCount,
        *,
        shared: bool,
        watch: bool = False,
        counts_available: bool = False,
    ) -> Waiter:
        """Register a fresh waiter on ``channel``; messages from now on may wake it.

        ``watch``: a shared waiter of a holder watching its own lock's channel, which
        waits for no lock: no newcomer queues behind it (``has_waiters``).
        ``counts_available``: the channel's messages say how many are available in all
        (a semaphore's), so a message wakes that many less those woken already.
        """
        line = self._lines.get(channel)
        if line is None:
            line = self._lines[channel] = _Line(wake_count, counts_available=counts_available)
        waiter = Waiter(shared=shared or watch)
        line.waiters[waiter] = None
        if waiter.shared:
            line.shared += 1
        if watch:
            line.watchers.add(waiter)
        if self._closed:
            waiter.event.set()
        return waiter

    def remove(
        self, channel: str, waiter: Waiter, *, leaving: bool, mid_attempt: bool = False
    ) -> None:
        """Unregister ``waiter``.

        A waiter ``leaving`` without the lock (deadline, cancellation, error) passes its
        turn to try on to the oldest exclusive waiter not woken yet. Newcomers that queued
        behind it without trying (no barging) count on that turn; if the lock is free, no
        release message will ever come to wake them. It has a turn if a wake-up reached
        it, or if it leaves ``mid_attempt``: its acquire script was never answered, and the
        lock may be free. A waiter whose attempt lost to a holder and that nothing woke
        since has none to pass on: that holder's release wakes a waiter still here.
        Readers pass theirs to a writer too, since writers queue behind readers.
        """
        line = self._lines.get(channel)
        if line is None or waiter not in line.waiters:
            return
        del line.waiters[waiter]
        if waiter.shared:
            line.shared -= 1
        line.watchers.discard(waiter)
        if leaving and (mid_attempt or waiter.woken_by_message):
            line.wake(1, shared=False)
        if not line.waiters:
            del self._lines[channel]

    def heir(
        self, channel: str, releaser: Primitive, eligible: Callable[[Call], bool]
    ) -> tuple[Waiter, Call, Primitive] | None:
        """Who a release of ``releaser`` on ``channel`` hands the lock to (see Hand-over above).

        The oldest exclusive waiter parked, not woken, with no offer yet and whose call is
        ``eligible``, with its call and primitive; None if there is none, or if it takes
        no hand-over from ``releaser`` (a fenced lock's waiter behind a plain lock's
        holder, on their shared channel). That waiter is not passed
        over for a younger one: the release then frees the lock and its message wakes
        that waiter to try itself, in its turn. Nor is a reader waiting longer than the
        oldest exclusive waiter passed over (a read-write lock's channel).
        """
        line = self._lines.get(channel)
        if line is None:
            return None
        for waiter in line.waiters:
            if waiter.shared and waiter not in line.watchers:
                # A reader waits longer than any writer after it: the release frees the
                # lock, and its message lets the readers in (a write lock's release).
                return None
            call = waiter.parked
            primitive = waiter.parked_as
            if (
                call is not None
                and primitive is not None
                and waiter.offer is None
                and not waiter.shared
                and not waiter.event.is_set()
                and eligible(call)
            ):
                # A call asking for a token never takes one: the release script takes no
                # token (its primitive says no too; this holds whatever it says).
                takes = call.receipt is None and primitive.takes_hand_over(releaser)
                return (waiter, call, primitive) if takes else None
        return None

    def queues_behind(self, channel: str) -> bool:
        """Whether a newcomer on ``channel`` waits behind this client's waiters untried.

        Not behind those only that found too few for them: what is there may be enough
        for the newcomer, and no message may come to say so.
        """
        line = self._lines.get(channel)
        return line is not None and any(
            not (waitable.shared or waitable.short) for waitable in line.waiters
        )

    def has_waiters(self, channel: str) -> bool:
        """Whether calls of this client wait on ``channel`` (watchers wait for nothing)."""
        line = self._lines.get(channel)
        return line is not None and len(line.waiters) > len(line.watchers)

    def waiters(self, channel: str) -> list[Waiter]:
        """The waiters registered on ``channel``, oldest first."""
        line = self._lines.get(channel)
        return list(line.waiters) if line is not None else []

    # -- what pub/sub tells ---------------------------------------------------------------

    def deliver(self, channel: str, data: bytes, *, heard: bool = True) -> None:
        """A message on ``channel``: wake as many waiters as it lets in.

        ``heard``: it came from pub/sub (False: this client's own call stands in for a
        message nobody published, a spin lock's release): only then may it tell a watcher
        that its hold was forced away.
        """
        line = self._lines.get(channel)
        if line is not None:
            if heard and line.watchers:
                line.heard()
            line.wake(line.wake_count(data), available=True)

    def wake_left(self, channel: str, left: int) -> None:
        """A take left ``left`` available (a semaphore's permits): wake that many waiters.

        Less those woken already or trying (as a message's count): a waiter that queued
        behind this client's waiters without trying (no barging) gets in without a
        message.
        """
        line = self._lines.get(channel)
        if line is not None:
            line.wake(left, shared=False, available=True)

    def pass_turn(self, channel: str) -> None:
        """Wake the oldest exclusive waiter not awake: a wake-up given on goes on."""
        line = self._lines.get(channel)
        if line is not None:
            line.wake(1, shared=False)

    def wake_all(self, channel: str) -> None:
        """Wake every waiter on ``channel``: messages may have been lost (a resubscribe)."""
        line = self._lines.get(channel)
        if line is not None:
            line.wake(None)

    def wake_shared(self, channel: str) -> None:
        """Wake every shared waiter on ``channel`` and no exclusive one.

        The lock went to read mode without a message: a write lock downgraded to its
        holder's read holds.
        """
        line = self._lines.get(channel)
        if line is not None:
            line.wake(0)

    def close(self) -> None:
        """The client closes: wake every waiter now and every one registered later."""
        self._closed = True
        for line in self._lines.values():
            line.wake(None)

    # -- counts ---------------------------------------------------------------------------

    def enter(self, key: str, field: str) -> None:
        """A call of ``field``'s holder starts waiting on ``key``."""
        self._by_key[key] = self._by_key.get(key, 0) + 1
        line = (key, field)
        self._by_field[line] = self._by_field.get(line, 0) + 1

    def leave(self, key: str, field: str) -> None:
        """That call stopped waiting (acquired, gave up, failed or was cancelled)."""
        count = self._by_key[key] - 1
        if count:
            self._by_key[key] = count
        else:
            del self._by_key[key]
            self._lease_until.pop(key, None)
        line = (key, field)
        held = self._by_field[line] - 1
        if held:
            self._by_field[line] = held
        else:
            del self._by_field[line]

    def waiting(self, key: str) -> int:
        """How many of this client's calls wait on ``key``."""
        return self._by_key.get(key, 0)

    def field_waiting(self, key: str, field: str) -> int:
        """How many calls of ``field``'s holder wait on ``key``."""
        return self._by_field.get((key, field), 0)

    def total(self) -> int:
        """How many of this client's calls wait, on any lock."""
        return sum(self._by_key.values())

    def saw_lease(self, key: str, ttl_ms: int) -> None:
        """A waiter's attempt found ``ttl_ms`` left on the lease (-1: no expiry)."""
        if ttl_ms >= 0:
            self._lease_until[key] = asyncio.get_running_loop().time() + ttl_ms / 1000

    def lease_left_ms(self, key: str) -> int:
        """Ms left on ``key``'s lease as local waiters last saw it; -1 if unknown."""
        until = self._lease_until.get(key)
        if until is None:
            return -1
        return max(0, round((until - asyncio.get_running_loop().time()) * 1000))


#: Hand-overs in a row on one lock before a release frees it for everyone: each free-for-all
#: costs one attempt per client with waiters, and more in a row mean longer turns per client
#: (the measured choice is in docs/architecture.md, "Hand-overs in a row").
IN_A_ROW = 8


class Offer:
    """One release call's hand-over to one parked waiter."""

    __slots__ = ("_wake", "abandoned", "call", "heir", "outcome", "sent")

    def __init__(self, call: Call, heir: Primitive, wake: Callable[[], None]) -> None:
        #: The waiting call it is offered to, the primitive it waits for (the hold is
        #: recorded as that one's), and how to wake it.
        self.call = call
        self.heir = heir
        self._wake = wake
        #: True: handed (the hold is recorded); False: not handed; None: unknown (the
        #: release went unanswered: an attempt of the waiter finds out).
        loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[bool | None] = loop.create_future()
        #: Made just before the release is sent: the heir's lease runs at least until this
        #: plus its lease (the guard's confirmation of a handed hold; a guarded heir's).
        self.sent = loop.time() if call.timed else None
        #: The waiter left before the outcome: whatever it is handed is released for it.
        self.abandoned = False

    def settle(self, *, handed: bool | None) -> None:
        """Record the release's outcome and wake the waiter to take it (once)."""
        if self.outcome.done():
            return
        self.outcome.set_result(handed)
        self._wake()


class HandOvers:
    """The client's hand-over policy: which waiter, and how many times in a row."""

    __slots__ = ("_in_a_row",)

    def __init__(self) -> None:
        self._in_a_row: dict[str, int] = {}

    def allowed(self, key: str) -> bool:
        """Whether a release of ``key`` may hand over now."""
        return self._in_a_row.get(key, 0) < IN_A_ROW

    def handed(self, key: str) -> None:
        """A release of ``key`` handed it over."""
        self._in_a_row[key] = self._in_a_row.get(key, 0) + 1

    def freed(self, key: str) -> None:
        """A release of ``key`` freed it for everyone (or the lock went away)."""
        self._in_a_row.pop(key, None)


# -- the one wait loop ---------------------------------------------------------------------


class Step(NamedTuple):
    """What one attempt of a waiting call found."""

    #: It has what it waits for (the lock, the permits, the latch at zero).
    done: bool
    #: How long to wait at most before trying again (s): a lost message costs no more.
    bound: float = 0.0
    #: Not done, but something is left that a waiter behind could use: this call's
    #: wake-up goes on to it, and this call waits behind it.
    spare: bool = False
    #: Done, and this many are left that waiters behind could use (a semaphore's permits).
    left: int = 0


class Turn(Protocol):
    """A waiting call's own steps, which ``wait_in_line`` runs in the one wait loop.

    The lock's (``acquire.py``) takes a hand-over and leaves a fair queue; the counting
    objects' (``counting.py``) pass on what a take left and settle on a latch's zero.
    """

    #: When the call gives up (loop time; None: never).
    deadline: float | None

    async def subscribe(self) -> Subscription | None:
        """Subscribe to the call's channel; None if its deadline came first."""

    def register(self) -> Waiter:
        """A fresh waiter of the call's, on its channel."""

    async def attempt(self, waiter: Waiter) -> Step:
        """Try once, registered as ``waiter`` (a message meanwhile wakes it)."""

    def took(self, waiter: Waiter, step: Step) -> None:
        """The call has what it waits for: take ``waiter`` out of line, wake whom it lets in."""

    def check_open(self) -> None:
        """Raise if the client was closed (before and after each wait)."""

    def park(self, waiter: Waiter) -> None:
        """``waiter`` is about to wait: from now on a release may hand it the lock."""

    async def woken(self, waiter: Waiter) -> bool | None:
        """After a wait: True if done without trying, False if given up, None: try again.

        Done: handed the lock, or a latch settled. Given up: the deadline passed while a
        hand-over was being decided.
        """

    def leave(self, waiter: Waiter, *, leaving: bool, mid_attempt: bool = False) -> None:
        """Take ``waiter`` out of line (``WaitingRoom.remove``)."""

    def abandon(self, waiter: Waiter) -> None:
        """The call leaves without what ``waiter`` may still be handed: give it back."""

    async def give_up(self) -> None:
        """The deadline passed: what the call owes the server (a fair queue's exit)."""


async def wait_in_line(
    turn: Turn, sub: Subscription | None, waiter: Waiter | None, bound: float
) -> bool:
    """The one wait loop: attempt, registered first, and wait, bounded, until done or late.

    ``sub``: the call's subscription, if it has one already (None: subscribed here, and
    again whenever it goes stale: its cluster slot moved). ``waiter`` and ``bound``: the
    call is registered already and waits that long at most before its next attempt.
    The waiter registers before each attempt, so a message published while the attempt is
    in flight wakes it; each wait is bounded, so a lost message costs latency, never
    liveness; a waiter that leaves without what it waits for passes a wake-up it was
    given on (``WaitingRoom.remove``).
    """
    while True:
        if sub is None:
            sub = await turn.subscribe()
            if sub is None:
                await turn.give_up()
                return False
            waiter = None  # subscribed only now: attempt again before waiting
        try:
            outcome = await _in_line(turn, sub, waiter, bound)
        finally:
            sub.release()
        if outcome is not None:
            return outcome
        sub = None


async def _in_line(
    turn: Turn, sub: Subscription, waiter: Waiter | None, bound: float
) -> bool | None:
    """``wait_in_line`` on one subscription; None once it went stale (its slot moved)."""
    loop = asyncio.get_running_loop()
    # Until the channel's cluster slot moves (its waiters are woken then): the call then
    # subscribes where it is served now, before the next attempt.
    while waiter is not None or not sub.stale:
        if waiter is None:
            waiter = turn.register()
            waiter.trying = True
            try:
                step = await turn.attempt(waiter)
            except BaseException:
                turn.leave(waiter, leaving=True, mid_attempt=True)
                raise
            waiter.trying = False
            if step.done:
                turn.took(waiter, step)
                return True
            if step.spare:
                # Too little left for this call, but some: a waiter behind may fit. It
                # gets this call's wake-up, and this call waits behind it (nothing is
                # delivered in between: no await).
                turn.leave(waiter, leaving=True, mid_attempt=True)
                waiter = turn.register()
                waiter.short = True
            bound = step.bound
        if turn.deadline is not None:
            remaining = turn.deadline - loop.time()
            if remaining <= 0:
                turn.leave(waiter, leaving=True)
                await turn.give_up()
                return False
            bound = min(bound, remaining)
        try:
            turn.check_open()
            turn.park(waiter)
            try:
                await waiter.wait(bound)
            finally:
                waiter.unpark()
            turn.check_open()
            woken = await turn.woken(waiter)
        except BaseException:
            turn.abandon(waiter)
            turn.leave(waiter, leaving=True)
            raise
        if woken is not None:
            if not woken:
                turn.abandon(waiter)
            turn.leave(waiter, leaving=not woken)
            if not woken:
                await turn.give_up()
            return woken
        turn.leave(waiter, leaving=False)
        waiter = None
    return None
