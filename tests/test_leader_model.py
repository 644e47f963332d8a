"""Model-based test of leader election (hypothesis stateful): at most one term at a time.

Three candidates (two on one client, one on another), each a task that campaigns with
``leader.run(term)`` while it is told to. A step tells a candidate to campaign, to step down
(its term returns), cancels a candidate's task at a drawn loop iteration (campaigning or in
its term), or force-unlocks the election's lock from a fourth client. Throughout:

- no term begins while another term is under way, unless that one's lock was forced away
  (force_unlock deletes it at once; its holder learns of it at its next renewal, and
  that term is over for the model from the force on);
- once the step is done and the clients are quiet: at most one candidate is in a term; it,
  and only it, says ``is_leader``; the lock's hash in Redis holds exactly its holder id,
  once; with no term under way nobody holds the lock; and a candidate that campaigns
  while nobody is in a term is elected (no election is stalled).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from redis.asyncio import Redis

import aiolock

from .helpers import cancel_at, quiesce, wait_until
from .test_model import settings_for

LIMIT = 10.0
#: The client of each candidate.
CANDIDATES = (0, 0, 1)
#: A short watchdog lease, so that a forced unlock is noticed within a fraction of a second.
WATCHDOG = 0.6

candidates = st.integers(min_value=0, max_value=len(CANDIDATES) - 1)


@dataclass
class Candidate:
    """One candidate: its leader handle, its task, and what the model tells it."""

    leader: aiolock.Leader
    want: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    terms: int = 0


class LeaderMachine(RuleBasedStateMachine):
    """Candidates campaign, step down, are cancelled and forced out; one term at a time."""

    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.name = f"model:{uuid.uuid4().hex[:12]}:leader"
        self.clients: list[aiolock.Client] = self.runner.run(self._clients())
        self.admin = self.clients[-1]
        self.raw: Redis = Redis.from_url(self.redis_url, decode_responses=True)
        self.candidates = [Candidate(self.clients[c].leader(self.name)) for c in CANDIDATES]
        #: Candidates in a term (between the term's first and last line).
        self.active: set[int] = set()
        #: Of those, the ones whose lock was forced away.
        self.forced: set[int] = set()
        self.violations: list[str] = []

    @staticmethod
    async def _clients() -> list[aiolock.Client]:
        return [
            aiolock.Client.from_url(LeaderMachine.redis_url, watchdog_timeout=WATCHDOG)
            for _ in range(max(CANDIDATES) + 2)
        ]

    async def _campaign(self, i: int) -> None:
        me = self.candidates[i]

        async def term() -> None:
            others = self.active - self.forced
            if others:
                self.violations.append(f"candidate {i} elected while {others} in a term")
            self.active.add(i)
            me.terms += 1
            try:
                await me.stop.wait()
            finally:
                self.active.discard(i)
                self.forced.discard(i)

        while True:
            await me.want.wait()
            me.stop.clear()
            await me.leader.run(term)
            me.want.clear()

    def _start(self, i: int) -> None:
        me = self.candidates[i]
        if me.task is None or me.task.done():
            me.task = asyncio.get_running_loop().create_task(self._campaign(i))

    async def _settle(self) -> None:
        """Wait until the clients are quiet and every election due has happened."""
        for client in self.clients:
            await quiesce(client, limit=LIMIT)

        def settled() -> bool:
            wanting = any(
                c.want.is_set() and c.task is not None and not c.task.done()
                for c in self.candidates
            )
            return not self.forced and (bool(self.active) or not wanting)

        await wait_until(settled, limit=LIMIT, what="a campaigning candidate elected")
        for client in self.clients:
            await quiesce(client, limit=LIMIT)

    def step(self, action: Any) -> None:
        async def go() -> None:
            await action()
            await self._settle()

        self.runner.run(go())

    # -- rules ------------------------------------------------------------------------------

    @rule(i=candidates)
    def campaign(self, i: int) -> None:
        async def action() -> None:
            self._start(i)
            self.candidates[i].want.set()

        self.step(action)

    @rule(i=candidates)
    def step_down(self, i: int) -> None:
        async def action() -> None:
            if i in self.active:
                self.candidates[i].stop.set()
                await wait_until(lambda: i not in self.active, limit=LIMIT, what="stepped down")

        self.step(action)

    @rule(i=candidates, at=st.integers(min_value=0, max_value=30))
    def cancel(self, i: int, at: int) -> None:
        async def action() -> None:
            task = self.candidates[i].task
            if task is None or task.done():
                return
            cancel_at(task, at)
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), LIMIT)
            self.candidates[i].want.clear()
            assert i not in self.active

        self.step(action)

    @rule()
    def force_unlock(self) -> None:
        async def action() -> None:
            self.forced |= self.active
            held = await self.admin.lock(self.name).force_unlock()
            assert held is bool(self.active), (held, self.active)

        self.step(action)

    # -- the server agrees --------------------------------------------------------------------

    @invariant()
    def one_term_at_a_time(self) -> None:
        assert not self.violations, self.violations
        assert len(self.active) <= 1, self.active
        leaders = {i for i, c in enumerate(self.candidates) if c.leader.is_leader}
        assert leaders == self.active, f"is_leader says {leaders}, terms under way {self.active}"
        found = self.runner.run(self.raw.hgetall(self.name))
        if not self.active:
            assert not found, f"nobody in a term, the lock holds {found}"
            return
        (i,) = self.active
        client = self.clients[CANDIDATES[i]]
        assert list(found.values()) == ["1"], found
        assert next(iter(found)).startswith(client.id + ":"), (found, client.id)

    def teardown(self) -> None:
        async def close() -> None:
            for c in self.candidates:
                if c.task is not None:
                    c.task.cancel()
                    await asyncio.gather(c.task, return_exceptions=True)
            for client in self.clients:
                await client.aclose()
            await self.raw.delete(self.name)
            await self.raw.aclose()

        self.runner.run(close())
        self.runner.close()


@pytest.mark.timeout(1800)
def test_leader_model(redis_url: str, request: pytest.FixtureRequest) -> None:
    """At most one term at a time, under every sequence hypothesis tries."""
    LeaderMachine.redis_url = redis_url
    base = settings_for(request)
    # A step waits for an election or a renewal: a shorter default run than the lock models'.
    quick = settings(
        base,
        max_examples=base.max_examples if request.config.getoption("--faults") else 12,
        stateful_step_count=min(base.stateful_step_count, 20),
    )
    run_state_machine_as_test(LeaderMachine, settings=quick)
