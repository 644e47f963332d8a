"""Model-based test of the guard (hypothesis stateful): its deadline never outlives the lease.

One guarded hold per example, of a drawn lock kind and outer lease (the watchdog's or an
explicit one). Its body runs what each step tells it, in its own task (the holder): a
re-entry with a lease (shorter or longer than the one set), ``extend()`` both ways, an
unlock of a re-entry (which re-applies the remaining holds' lease); the machine itself runs
renewal rounds and forces the lock open from another client. After every step, while the
hold is not lost:

- ``confirmed_until`` is never later than the key's expiry read on the server (PTTL, from
  its send time): the guard cannot let a body run once another client could hold the lock;
- the guard's one timer is armed no later than that deadline (a shortened lease re-arms it);

and a forced hold is found lost, and its body ended, within a bound.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.asyncio import Redis

import aiolock

from . import inside
from .helpers import wait_until
from .test_model import settings_for

LIMIT = 10.0
Kind = Callable[[aiolock.Client, str], Any]
KINDS: dict[str, Kind] = {
    "lock": lambda c, n: c.lock(n),
    "fair": lambda c, n: c.fair_lock(n),
    "write": lambda c, n: c.read_write_lock(n).write_lock(),
    "spin": lambda c, n: c.spin_lock(n),
}
# Leases long enough to outlast an example on a loaded machine, in both directions of
# every change: a re-entry or extend() shorter or longer than what is set.
leases = st.sampled_from([3.0, 8.0, 40.0])
# The kinds whose guarded holds watch their channel for a force (Primitive.watched).
WATCHED = ("lock", "write")
outer_leases = st.sampled_from([None, 3.0, 40.0])

Op = Callable[[], Awaitable[object]]


class GuardMachine(RuleBasedStateMachine):
    """One guarded hold, changed by its body's calls, renewals and a force."""

    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.name = f"model:{uuid.uuid4().hex[:12]}:guard"
        self.client, self.admin = self.runner.run(self._clients())
        self.raw: Redis = Redis.from_url(self.redis_url, decode_responses=True)
        self.lock: Any = None
        self.hold: aiolock.Hold | None = None
        self.task: asyncio.Task[None] | None = None
        self.ops: asyncio.Queue[Op] | None = None
        self.done: asyncio.Queue[BaseException | None] | None = None
        #: Re-entries taken by the body on top of the guarded hold.
        self.depth = 0
        self.forced = False
        self.kind = ""
        self.outer: float | None = None

    @staticmethod
    async def _clients() -> tuple[aiolock.Client, aiolock.Client]:
        url = GuardMachine.redis_url
        return aiolock.Client.from_url(url), aiolock.Client.from_url(url)

    async def _body(self, ready: asyncio.Event, lease: float | None) -> None:
        assert self.ops is not None
        assert self.done is not None
        async with self.lock.guarded(lease=lease) as hold:
            self.hold = hold
            ready.set()
            while True:
                op = await self.ops.get()
                try:
                    await op()
                except Exception as exc:
                    self.done.put_nowait(exc)
                else:
                    self.done.put_nowait(None)

    async def _start(self, kind: str, lease: float | None) -> None:
        self.lock = KINDS[kind](self.client, self.name)
        self.ops, self.done = asyncio.Queue(), asyncio.Queue()
        ready = asyncio.Event()
        self.task = asyncio.create_task(self._body(ready, lease))
        await asyncio.wait_for(ready.wait(), LIMIT)

    async def _run(self, op: Op) -> BaseException | None:
        assert self.ops is not None
        assert self.done is not None
        self.ops.put_nowait(op)
        return await asyncio.wait_for(self.done.get(), LIMIT)

    # -- steps ------------------------------------------------------------------------------

    @initialize(kind=st.sampled_from(sorted(KINDS)), lease=outer_leases)
    def begin(self, kind: str, lease: float | None) -> None:
        self.kind, self.outer = kind, lease
        self.runner.run(self._start(kind, lease))

    @precondition(lambda self: self.forced)
    @rule(lease=outer_leases)
    def again(self, lease: float | None) -> None:
        """A new guarded hold after a forced one ended."""
        self.forced, self.depth, self.outer = False, 0, lease
        self.runner.run(self._start(self.kind, lease))

    @precondition(lambda self: not self.forced)
    @rule(lease=st.one_of(st.none(), leases))
    def reenter(self, lease: float | None) -> None:
        error = self.runner.run(self._run(lambda: self.lock.lock(lease=lease)))
        assert error is None, error
        self.depth += 1

    @precondition(lambda self: not self.forced and self.depth > 0)
    @rule()
    def unlock_reentry(self) -> None:
        error = self.runner.run(self._run(self.lock.unlock))
        assert error is None, error
        self.depth -= 1

    @precondition(lambda self: not self.forced)
    @rule(lease=leases)
    def extend(self, lease: float) -> None:
        error = self.runner.run(self._run(lambda: self.lock.extend(lease)))
        assert error is None, error

    @precondition(lambda self: not self.forced)
    @rule()
    def renewal_round(self) -> None:
        self.runner.run(inside.renewal(self.client).renew_once())

    # A kind whose channel tells a force ends the body on the message; another kind's hold
    # is found gone by the renewal (a hold of an explicit lease is not renewed: its force
    # is found at its unlock, which this model does not try).
    @precondition(lambda self: not self.forced and (self.kind in WATCHED or self.outer is None))
    @rule()
    def force(self) -> None:
        self.forced = True

        async def forced() -> None:
            assert await KINDS[self.kind](self.admin, self.name).force_unlock()
            if self.kind not in WATCHED:
                await inside.renewal(self.client).renew_once()
            assert self.task is not None
            with pytest.raises(aiolock.LockLostError):
                await asyncio.wait_for(self.task, LIMIT)

        self.runner.run(forced())

    # -- what holds after every step ---------------------------------------------------------

    @invariant()
    def deadline_within_the_lease(self) -> None:
        hold = self.hold
        if hold is None or self.forced:
            return

        async def check() -> None:
            assert hold is not None
            loop = asyncio.get_running_loop()
            # The guard's view first, then the server's: a renewal answered in between may
            # only have moved the expiry on (or lowered the view at its send already).
            confirmed = hold.confirmed_until
            armed = inside.armed_at(inside.engine(self.client).guard)
            sent = loop.time()
            pttl = await self.raw.pttl(inside.key_of(self.lock))
            if hold.lost:
                return
            if pttl < 0:
                # Expired on the server (a slow machine outran a short lease): the guard
                # must have given up on it by then.
                assert confirmed <= sent
                return
            expiry = sent + pttl / 1000
            assert confirmed <= expiry, (confirmed - sent, pttl)
            assert armed <= confirmed + 1e-6, (armed - sent, confirmed - sent)

        self.runner.run(check())

    def teardown(self) -> None:
        async def close() -> None:
            if self.task is not None and not self.task.done():
                self.task.cancel()
                await asyncio.wait([self.task])
            await wait_until(lambda: not len(inside.renewal(self.client)), limit=LIMIT)
            await self.client.aclose()
            await self.admin.aclose()
            await self.raw.aclose()

        try:
            self.runner.run(close())
        finally:
            self.runner.close()


@pytest.mark.timeout(1800)
def test_guard_model(redis_url: str, request: pytest.FixtureRequest) -> None:
    """The guard's deadline never outlives the lease, under every sequence tried."""
    GuardMachine.redis_url = redis_url
    run_state_machine_as_test(GuardMachine, settings=settings_for(request))
