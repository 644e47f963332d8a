"""Model-based test of the MultiLock and the RedLock (hypothesis stateful).

Three lock names, two clients, three holders (``owner=`` handles, so that any task may act
for them). A step takes or gives back a composite over a drawn subset of the names, or one
plain member lock, each run to its end or cancelled at a drawn loop iteration. Once the
clients are quiet, every name's hash in Redis must hold exactly the counts of the model:

- a MultiLock's ``try_lock(wait=0)`` takes every member, each once more, when none is held
  by another holder, else nothing;
- a RedLock's takes each member nobody else holds, and keeps them when they are a majority
  (n // 2 + 1), else nothing;
- an unlock gives back one hold of each member held (a RedLock's: of each member its
  client believes held, when those are a majority), and raises when one was not held
  (a RedLock only when fewer than a majority were);
- a cancelled acquire leaves nothing; a cancelled unlock still releases;
- the queries (asked of the members at once) answer as the counts say, or, cancelled,
  raise CancelledError;
- a guarded block (``guarded(wait=0)``) enters as ``try_lock(wait=0)`` takes; a member
  force-unlocked in its body cancels it with ``LockLostError`` (a MultiLock's always, a
  RedLock's when fewer than a majority stay held), and whatever it held is released in
  the background; else the body ends and releases as an unlock does.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from redis.asyncio import Redis

import aiolock

from .helpers import CANCELLED, run_cancellable
from .test_model import settings_for

LIMIT = 10.0
NAMES = 3
#: (client, owner) of each holder.
HOLDERS = ((0, "h0"), (0, "h1"), (1, "h2"))

subsets = st.sampled_from(
    [combo for n in range(1, NAMES + 1) for combo in itertools.combinations(range(NAMES), n)]
)
holders = st.integers(min_value=0, max_value=len(HOLDERS) - 1)
cancels = st.one_of(st.none(), st.integers(min_value=0, max_value=40))


class CompositeMachine(RuleBasedStateMachine):
    """Composites and plain member locks against per-(holder, name) hold counts."""

    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        uid = uuid.uuid4().hex[:12]
        self.names = [f"model:{uid}:multi:{i}" for i in range(NAMES)]
        self.clients: list[aiolock.Client] = self.runner.run(self._clients())
        self.raw: Redis = Redis.from_url(self.redis_url, decode_responses=True)
        #: (holder, name index) -> hold count.
        self.counts: Counter[tuple[int, int]] = Counter()

    @staticmethod
    async def _clients() -> list[aiolock.Client]:
        return [aiolock.Client.from_url(CompositeMachine.redis_url) for _ in range(2)]

    def member(self, holder: int, index: int) -> aiolock.Lock:
        client, owner = HOLDERS[holder]
        return self.clients[client].lock(self.names[index], owner=owner)

    def composite(self, holder: int, subset: tuple[int, ...], red: bool) -> Any:
        kind = aiolock.RedLock if red else aiolock.MultiLock
        return kind(*(self.member(holder, i) for i in subset))

    def holder_id(self, holder: int) -> str:
        client, owner = HOLDERS[holder]
        return f"{self.clients[client].id}:owner:{owner}"

    def free_for(self, holder: int, index: int) -> bool:
        return not any(c for (h, i), c in self.counts.items() if i == index and h != holder)

    async def call(self, coro: Any, cancel: int | None) -> Any:
        """Run ``coro``, cancelled at loop iteration ``cancel`` if given: its value, its
        LockError, or CANCELLED."""
        return await run_cancellable(
            coro, cancel, self.clients, errors=(aiolock.LockError,), limit=LIMIT
        )

    # -- rules ------------------------------------------------------------------------------

    @rule(holder=holders, subset=subsets, red=st.booleans(), cancel=cancels)
    def acquire(self, holder: int, subset: tuple[int, ...], red: bool, cancel: int | None) -> None:
        composite = self.composite(holder, subset, red)
        got = self.runner.run(self.call(composite.try_lock(wait=0), cancel))
        free = [i for i in subset if self.free_for(holder, i)]
        wanted = len(subset) // 2 + 1 if red else len(subset)
        if got == CANCELLED:
            return  # nothing taken (the invariant checks it)
        assert got is (len(free) >= wanted), f"try_lock answered {got!r}, free: {free}"
        if got:
            for i in free:
                self.counts[holder, i] += 1

    @rule(holder=holders, subset=subsets, red=st.booleans(), cancel=cancels)
    def release(self, holder: int, subset: tuple[int, ...], red: bool, cancel: int | None) -> None:
        composite = self.composite(holder, subset, red)
        held = [i for i in subset if self.counts[holder, i]]
        to_release = list(subset)
        if red and len(held) >= len(subset) // 2 + 1:
            to_release = held
        got = self.runner.run(self.call(composite.unlock(), cancel))
        for i in to_release:
            if self.counts[holder, i]:
                self.counts[holder, i] -= 1
        if got == CANCELLED:
            return  # the releases finish in the background
        quorum = len(subset) // 2 + 1 if red else len(subset)
        released = sum(1 for i in to_release if i in held)
        if released >= quorum:
            assert got is None, f"unlock raised {got!r} with {held} held"
        else:
            assert isinstance(got, aiolock.LockNotOwnedError), f"unlock answered {got!r}"

    @rule(holder=holders, subset=subsets, red=st.booleans(), cancel=cancels)
    def query(self, holder: int, subset: tuple[int, ...], red: bool, cancel: int | None) -> None:
        composite = self.composite(holder, subset, red)

        async def ask() -> tuple[bool, int, bool]:
            return (
                await composite.is_held_by_current_task(),
                await composite.hold_count(),
                await composite.is_locked(),
            )

        got = self.runner.run(self.call(ask(), cancel))
        if got == CANCELLED:
            return
        quorum = len(subset) // 2 + 1 if red else len(subset)
        counts = sorted((self.counts[holder, i] for i in subset), reverse=True)
        locked = sum(any(c for (_, j), c in self.counts.items() if j == i) for i in subset)
        expected = (counts[quorum - 1] > 0, counts[quorum - 1], locked >= quorum)
        assert got == expected, f"queries answered {got}, model {expected}"

    @rule(
        holder=holders,
        subset=subsets,
        red=st.booleans(),
        lose=st.one_of(st.none(), st.integers(0, NAMES - 1)),
        cancel=cancels,
    )
    def guarded(
        self, holder: int, subset: tuple[int, ...], red: bool, lose: int | None, cancel: int | None
    ) -> None:
        """A guarded block, a member force-unlocked in its body if ``lose`` is drawn."""
        composite = self.composite(holder, subset, red)
        free = [i for i in subset if self.free_for(holder, i)]
        quorum = len(subset) // 2 + 1 if red else len(subset)
        if lose is not None and (lose not in free or self.counts[holder, lose]):
            lose = None  # a loss only of the block's own hold, touching no other
        forced = None if lose is None else self.member(holder, lose)

        async def block() -> str:
            async with composite.guarded(wait=0):
                if forced is not None:
                    await forced.force_unlock()
                await asyncio.sleep(0)  # a loss cancels the body here
                return "done"

        got = self.runner.run(self.call(block(), cancel))
        if len(free) < quorum:
            expected: Any = aiolock.LockTimeoutError
        elif lose is not None and len(free) - 1 < quorum:
            expected = aiolock.LockLostError
        else:
            expected = "done"
        if got == CANCELLED:
            return  # what it held is released in the background (the invariant checks it)
        if isinstance(expected, type):
            assert isinstance(got, expected), f"guarded block answered {got!r}, not {expected}"
        else:
            assert got == expected, f"guarded block answered {got!r}"

    @rule(holder=holders, index=st.integers(0, NAMES - 1), take=st.booleans())
    def member_alone(self, holder: int, index: int, take: bool) -> None:
        """A plain lock on one of the names, taken or given back outside any composite."""
        lock = self.member(holder, index)
        if take:
            got = self.runner.run(self.call(lock.try_lock(wait=0), None))
            assert got is self.free_for(holder, index)
            if got:
                self.counts[holder, index] += 1
            return
        got = self.runner.run(self.call(lock.unlock(), None))
        if self.counts[holder, index]:
            assert got is None
            self.counts[holder, index] -= 1
        else:
            assert isinstance(got, aiolock.LockNotOwnedError)

    # -- the server agrees --------------------------------------------------------------------

    @invariant()
    def redis_holds_the_model(self) -> None:
        for index, name in enumerate(self.names):
            found = self.runner.run(self._hash(name))
            expected = {
                self.holder_id(h): str(c) for (h, i), c in self.counts.items() if i == index and c
            }
            assert found == expected, f"{name}: {found}, model {expected}"
            for holder in range(len(HOLDERS)):
                local = self.member(holder, index).statistics().hold_count
                assert local == self.counts[holder, index], (holder, index, local)

    async def _hash(self, name: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in (await self.raw.hgetall(name)).items()}

    def teardown(self) -> None:
        async def close() -> None:
            for client in self.clients:
                await client.aclose()
            await self.raw.delete(*self.names)
            await self.raw.aclose()

        self.runner.run(close())
        self.runner.close()


@pytest.mark.timeout(1800)
def test_model(redis_url: str, request: pytest.FixtureRequest) -> None:
    """MultiLock and RedLock behave as the model says, under every sequence hypothesis tries."""
    CompositeMachine.redis_url = redis_url
    run_state_machine_as_test(CompositeMachine, settings=settings_for(request))
