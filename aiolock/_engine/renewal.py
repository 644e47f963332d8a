"""The watchdog: ONE task per client renews every watchdog-held lease in batches.

Every ``watchdog_timeout / 3`` it sends each server its share: one script call per batch
of at most 100 holds renewed alike. How a hold renews is its primitive's to say
(``primitive.Renewing``: a script and a batch's KEYS and ARGV, kept on the hold's record);
this service knows no lock kind, only that a script renews a batch to the lease in its
first argument and answers 1 or 0 per hold. A hold found gone is reported lost (WARNING,
then ``LockLostError`` at the holder's unlock); an error is logged and that server is
tried again a quarter period later, or after the client's retry interval when the server
refused for a state that passes (a restarted cluster primary's first seconds).

Each server is renewed on its own time: a server that does not answer (frozen, cut off)
delays only its own holds. Its share stays in flight until the connection gives up on it,
and meanwhile it is sent no other, while the other servers' shares go out every period.
Its holds are reported lost once it answers again and they are found gone.

An outage is logged once per server (``_Outages``): a WARNING at its first failed share,
nothing for the next ones (there is one every quarter period), and a WARNING with the
count and the length of the outage when a share is answered again. Each round ends with a
``RenewalRound`` event (``_emitter.Emitter``) once its last share is back.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import FIRST_COMPLETED
from collections.abc import Callable, Collection
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeAlias

from redis.exceptions import RedisError

from .._emitter import Emitter
from .cancel import cancel_mark, cancelled_since

if TYPE_CHECKING:
    from .._net.scripts import ScriptRunner
    from .._net.transport import CommandTransport
    from .holds import HoldRecord
    from .holds import Renews as Renewing

__all__ = ("BATCH_SIZE", "RenewalService")

log = logging.getLogger("aiolock")

BATCH_SIZE = 100

#: A server, as the connection its keys' commands go to (None: not located yet).
Server: TypeAlias = "CommandTransport | None"


def _holds_in(by_kind: dict[Renewing, list[list[HoldRecord]]]) -> int:
    return sum(len(batch) for batches in by_kind.values() for batch in batches)


class _Schedule:
    """When each server's share is next due: plain state, the renewal task does the I/O.

    Every server is due each period (``tick``); one whose share failed is due again a
    quarter period after it was sent, or ``soon`` after a refusal for a state that passes
    (a cluster primary's first seconds after a restart: the holds there must be settled
    before a waiter's acquire, resent as eagerly, takes the lock); one whose share is
    unanswered is not due at all (another share would only queue behind it).
    """

    __slots__ = ("_interval", "_retry", "_sent", "_soon", "tick")

    def __init__(self, interval: float, now: float, soon: float) -> None:
        self._interval = interval
        # Never a busy loop, whatever retry_interval says (it may be 0).
        self._soon = min(max(soon, 0.05), interval / 4)
        self.tick = now + interval
        # Servers whose last share failed, and when to send them another (none in flight).
        self._retry: dict[Server, float] = {}
        # Servers with a share in flight, and when it was sent.
        self._sent: dict[Server, float] = {}

    def wake(self) -> float:
        """When the next share is due."""
        return min([self.tick, *self._retry.values()])

    def now(self, now: float) -> None:
        """Every server's share is due now (a connection came back: settle its holds)."""
        self.tick = now

    def answered(self, server: Server, *, ok: bool, now: float, passing: bool = False) -> None:
        """``server``'s share came back (``ok``: every call in it answered).

        ``passing``: refused for a state that passes by itself (TRYAGAIN, CLUSTERDOWN,
        LOADING...).
        """
        sent = self._sent.pop(server)
        if not ok:
            # Again well before the leases run out: a full period later, two failures in a
            # row would already lose them.
            self._retry[server] = (
                now + self._soon if passing else max(now, sent + self._interval / 4)
            )

    def due(self, now: float, servers: Collection[Server]) -> tuple[bool, list[Server]]:
        """Whether a period began, and which of ``servers`` (those with holds) to send now.

        They count as sent from ``now`` on.
        """
        ticked = now >= self.tick
        if ticked:
            self.tick = max(self.tick + self._interval, now)
        for server in [server for server in self._retry if server not in servers]:
            del self._retry[server]  # none of its holds is left
        due = [
            server
            for server in servers
            if server not in self._sent and (ticked or self._retry.get(server, self.tick) <= now)
        ]
        for server in due:
            self._retry.pop(server, None)
            self._sent[server] = now
        return ticked, due


def _server_name(server: Server) -> str:
    peer = None if server is None else server.last_peer
    return peer or "the server"


class _Outages:
    """Which servers' renewals fail now: one WARNING when that starts, one when it ends.

    A share is retried while it fails (``_Schedule``): logging each failure would repeat
    the same line for as long as the outage lasts.
    """

    __slots__ = ("_down",)

    def __init__(self) -> None:
        # Per failing server: when its first failure came, and how many failed since.
        self._down: dict[Server, list[float]] = {}

    def failed(self, server: Server, holds: int, exc: BaseException) -> None:
        down = self._down.get(server)
        if down is not None:
            down[1] += 1
            log.debug("aiolock: renewal on %s failed again (%s)", _server_name(server), exc)
            return
        self._down[server] = [monotonic(), 1]
        log.warning(
            "aiolock: could not renew %d lock lease(s) on %s (%s); retrying, logged again "
            "when it works",
            holds,
            _server_name(server),
            exc,
        )

    def answered(self, server: Server) -> None:
        down = self._down.pop(server, None)
        if down is not None:
            since, count = down
            log.warning(
                "aiolock: renewal on %s works again after %d failed attempt(s) over %.1f s",
                _server_name(server),
                int(count),
                monotonic() - since,
            )

    def forget(self, servers: Collection[Server]) -> None:
        """Drop the servers not in ``servers`` (no hold left there: nothing to recover)."""
        for server in [server for server in self._down if server not in servers]:
            del self._down[server]


class _Round:
    """One period's shares still in flight, for its ``RenewalRound`` event."""

    __slots__ = ("failed", "holds", "pending", "servers", "started")

    def __init__(self, pending: set[asyncio.Task[bool]], holds: int) -> None:
        self.started = monotonic()
        self.pending = pending
        self.servers = len(pending)
        self.holds = holds
        self.failed = 0


class RenewalService:
    """Renews the leases of tracked holds until they are untracked or found lost."""

    def __init__(
        self,
        runner: ScriptRunner,
        *,
        lease_ms: int,
        interval: float,
        spawn: Callable[[Any], asyncio.Task[Any]],
        on_lost: Callable[[HoldRecord, str], None],
        batch_size: int = BATCH_SIZE,
        events: Emitter | None = None,
        retry: float = 0.2,
    ) -> None:
        self._runner = runner
        # How soon a share refused for a passing state is sent again (the client's
        # retry_interval, at most a quarter period).
        self._retry = retry
        # Servers whose last share was refused so (read as the share is answered).
        self._passing: set[Server] = set()
        self._events = events if events is not None else Emitter()
        self._outages = _Outages()
        self._lease_ms = lease_ms
        self._interval = interval
        self._spawn = spawn
        self._on_lost = on_lost
        self._batch_size = batch_size
        self._holds: dict[HoldRecord, None] = {}
        self._task: asyncio.Task[None] | None = None
        # Done when a round is wanted at once (``reconnected``): the task waits on it.
        self._soon: asyncio.Future[None] | None = None
        self._closed = False
        #: Renewal script calls sent so far (benchmarks and tests read it).
        self.calls = 0
        #: Renewal rounds run so far: each renews every tracked hold once (but those of a
        #: server whose previous share is still unanswered).
        self.rounds = 0
        #: Script calls the last round sent.
        self.last_round_calls = 0

    def __len__(self) -> int:
        return len(self._holds)

    def track(self, hold: HoldRecord) -> None:
        """Renew ``hold`` from the next period on."""
        self._holds[hold] = None
        if self._task is None and not self._closed:
            self._task = self._spawn(self._run())

    def untrack(self, hold: HoldRecord) -> None:
        """Stop renewing ``hold``."""
        self._holds.pop(hold, None)

    def reconnected(self) -> None:
        """A connection came back (a server restarted, say): renew every hold at once.

        A restart without persistence lost every key: the round finds the holds gone and
        reports them, within a round trip of the connection's return, instead of at the
        next period while another client may already hold the locks.
        """
        soon = self._soon
        if soon is not None and not soon.done():
            soon.set_result(None)

    async def _run(self) -> None:
        # One task schedules every server's share; each share in flight is a child task of
        # this one (at most one per server, so a frozen server holds one task, not one per
        # period), cancelled with it: aclose() stops them all by cancelling this task.
        loop = asyncio.get_running_loop()
        schedule = _Schedule(self._interval, loop.time(), self._retry)
        flying: dict[asyncio.Task[bool], Server] = {}
        # The rounds whose shares are not all back yet (a frozen server's may span several).
        rounds: list[_Round] = []
        try:
            while self._holds or flying:
                # Sleep to an absolute time: the renewal's own duration must not stretch
                # the period (10,000 locks take a noticeable fraction of it). An answer
                # wakes it too: a server that failed is tried again on its own time.
                delay = max(0.0, schedule.wake() - loop.time())
                soon = self._soon = loop.create_future()
                await asyncio.wait([*flying, soon], timeout=delay, return_when=FIRST_COMPLETED)
                self._soon = None
                now = loop.time()
                if soon.done():
                    schedule.now(now)
                done = [task for task in flying if task.done()]
                for task in done:
                    server = flying.pop(task)
                    passing = server in self._passing
                    self._passing.discard(server)
                    schedule.answered(server, ok=task.result(), now=now, passing=passing)
                if rounds and done:
                    self._rounds_answered(rounds, done)
                # With no hold left, this only moves the schedule on (holds tracked while a
                # share is still in flight are due at the next period, as any).
                shares = self._shares()
                self._outages.forget(shares)
                ticked, due = schedule.due(now, shares)
                calls = 0
                sent: set[asyncio.Task[bool]] = set()
                for server in due:
                    calls += self._count(shares[server])
                    task = loop.create_task(self._renew_share(server, shares[server]))
                    flying[task] = server
                    sent.add(task)
                if ticked:
                    # Each hold has its own threshold (a leader's term, say): looked at per hold.
                    self._log_slow_holds()
                if ticked and shares:
                    self.rounds += 1
                    self.last_round_calls = calls
                    if sent:
                        holds = sum(_holds_in(shares[server]) for server in due)
                        rounds.append(_Round(sent, holds))
        finally:
            self._task = None
            for task in flying:
                task.cancel()
            if flying:
                # Their end is this task's: wait for it, whatever cancels this one.
                await asyncio.wait(flying)

    def _log_slow_holds(self) -> None:
        """Log, once per hold, each watchdog hold held past its ``slow_hold`` so far.

        Once a period, from the renewal's own pass over its holds: a hold with a lease of
        its own is not renewed, and its slow hold is logged at its release only. The
        threshold is the hold's (``Announcement.slow_hold``: the client's, or its object's).
        """
        events = self._events
        now = monotonic()
        for hold in self._holds:
            announced = hold.announced
            if (
                announced is not None
                and (limit := announced.slow_hold) is not None
                and not announced.slow_logged
                and now - announced.at > limit
            ):
                events.held_long(announced, hold.name, hold.holder, now - announced.at)

    def _rounds_answered(self, rounds: list[_Round], done: list[asyncio.Task[bool]]) -> None:
        """Count the shares back in ``done``; a round whose last share is back ends."""
        for round_ in list(rounds):
            for task in done:
                if task in round_.pending:
                    round_.pending.discard(task)
                    if not task.result():
                        round_.failed += 1
            if not round_.pending:
                rounds.remove(round_)
                self._events.renewal_round(
                    round_.servers, round_.holds, monotonic() - round_.started, round_.failed
                )

    async def renew_once(self) -> bool:
        """Renew every tracked hold now, one share per server, all at once; False on error.

        Tests and benchmarks call it; the watchdog sends each server its share on that
        server's own time (see ``_run``).
        """
        shares = self._shares()
        self.rounds += 1
        self.last_round_calls = sum(self._count(by_kind) for by_kind in shares.values())
        started = monotonic()
        answers = await asyncio.gather(
            *(self._renew_share(server, by_kind) for server, by_kind in shares.items())
        )
        if shares:
            self._events.renewal_round(
                len(shares),
                sum(_holds_in(by_kind) for by_kind in shares.values()),
                monotonic() - started,
                answers.count(False),
            )
        return all(answers)

    def _count(self, by_kind: dict[Renewing, list[list[HoldRecord]]]) -> int:
        """The script calls of one share, counted as it is sent."""
        calls = sum(len(batches) for batches in by_kind.values())
        self.calls += calls
        return calls

    def _shares(self) -> dict[Server, dict[Renewing, list[list[HoldRecord]]]]:
        """The tracked holds, per server, per kind, in batches of one shard each.

        One script call renews holds of one kind in one shard (a cluster's slot: a script
        touches one slot only).
        """
        runner = self._runner
        by_shard: dict[tuple[Renewing, int], list[HoldRecord]] = {}
        for hold in self._holds:
            by_shard.setdefault((hold.renewing, runner.shard(hold.key)), []).append(hold)
        shares: dict[Server, dict[Renewing, list[list[HoldRecord]]]] = {}
        size = self._batch_size
        for (renewing, _), holds in by_shard.items():
            batches = shares.setdefault(runner.server(holds[0].key), {}).setdefault(renewing, [])
            batches.extend(holds[start : start + size] for start in range(0, len(holds), size))
        return shares

    async def _renew_share(
        self, server: Server, by_kind: dict[Renewing, list[list[HoldRecord]]]
    ) -> bool:
        """Renew one server's holds: one script call per batch; False if any failed.

        The calls of every kind go out together, in one round trip: sent one by one, each
        would wait for a free connection behind whatever burst of lock calls is queued,
        and a share stretched that way past the lease loses locks that are still held.
        """
        sent = [self._renew_kind(kind, batches) for kind, batches in by_kind.items()]
        if len(sent) == 1:
            errors = [await sent[0]]  # the usual case: one kind, no task for it
        else:
            errors = await asyncio.gather(*sent)
        error = next((exc for exc in errors if exc is not None), None)
        if error is None:
            self._outages.answered(server)
            return True
        self._outages.failed(server, _holds_in(by_kind), error)
        if self._runner.passing(error):
            self._passing.add(server)
        return False

    async def _renew_kind(
        self, renewing: Renewing, batches: list[list[HoldRecord]]
    ) -> BaseException | None:
        """Renew holds renewed alike, one script call per batch; the first error, if any."""
        script = renewing.script
        calls: list[tuple[list[str], list[str | int | bytes]]] = [
            (renewing.keys(batch), [self._lease_ms, *renewing.args(batch)]) for batch in batches
        ]
        # The lease runs at least until this send time plus the lease (the server sets it
        # later than that), perhaps shorter than a re-entry's longer lease confirmed: each
        # hold's expiry is bracketed (holds.HoldRecord.expiry_sent), for the guard.
        until = asyncio.get_running_loop().time() + self._lease_ms / 1000
        expiries = [[hold.expiry_sent(until) for hold in batch] for batch in batches]
        # A release in flight when the round is sent, or begun before its answer, may run
        # first on the server and change what the round checks (a read hold's numbers): an
        # answer of "gone" then judges a hold that has changed, and the next round decides.
        releases = [[(hold.releases, hold.releasing) for hold in batch] for batch in batches]
        try:
            replies = await self._runner.run_batch(script, calls)
        except (RedisError, OSError) as exc:
            replies = [exc] * len(calls)
        except BaseException:
            # Cancelled in flight: the round may have run, or not.
            for batch, expiring in zip(batches, expiries, strict=True):
                for hold, expiry in zip(batch, expiring, strict=True):
                    hold.expiry_settled(expiry, applied=False)
            raise
        error: BaseException | None = None
        for batch, reply, expiring, released in zip(
            batches, replies, expiries, releases, strict=True
        ):
            if isinstance(reply, BaseException):
                error = error or reply
                for hold, expiry in zip(batch, expiring, strict=True):
                    hold.expiry_settled(expiry, applied=False)
                continue
            for hold, held, expiry, sent in zip(batch, reply, expiring, released, strict=True):
                hold.expiry_settled(expiry, applied=bool(int(held)))
                # An unlock in flight, at the send or since, may already have deleted the
                # key or one of its read holds: not a loss.
                if (
                    not int(held)
                    and hold in self._holds
                    and not hold.releasing
                    and sent == (hold.releases, 0)
                ):
                    self._on_lost(hold, "the watchdog found its hold gone")
        return error

    async def aclose(self) -> None:
        """Stop renewing; leases still held run out on their own."""
        self._closed = True
        task = self._task
        if task is not None:
            # Not the caller's count of cancel requests, which may be left over from
            # before (a TaskGroup with a failed child on Python 3.11/3.12): a request
            # since this call began.
            mark = cancel_mark()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if cancelled_since(mark):
                    raise
