"""Model-based tests of the semaphore and the count-down latch (hypothesis stateful).

Each example runs on its own event loop with two clients on one name. A step is a call of
either client, run to its end or cancelled at a drawn loop iteration; once the clients are
quiet, Redis must say what the reference model says:

- semaphore: the permits are the set ones, plus every release and add, minus every take
  that returned True and every drain (a cancelled one took nothing in the end); a take
  succeeds exactly when the model has enough; a waiter is woken by a release of the other client;
- permit-expirable semaphore: the ids taken are the ids acquire() answered and nobody
  released, and the permits held in acquired() blocks (renewed by the watchdog: a renewal
  round renews every one of them, none lost); an unknown id's release raises
  LockNotOwnedError; set_permits sets the total, the permits taken included;
- latch: the count goes down by one per count-down, cancelled or not, never below zero;
  wait() returns True exactly when the model's count is zero.
"""

from __future__ import annotations

import asyncio
import uuid
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
from .helpers import CANCELLED, run_cancellable, wait_until
from .test_model import settings_for

LIMIT = 10.0


class _Counting(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.name = f"model:{uuid.uuid4().hex[:12]}"
        self.clients = self.run(self._clients())
        self.raw: Redis = Redis.from_url(self.redis_url, decode_responses=True)

    @staticmethod
    async def _clients() -> list[aiolock.Client]:
        return [aiolock.Client.from_url(_Counting.redis_url) for _ in range(2)]

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    async def call(self, coro: Any, cancel: int | None) -> Any:
        """Run ``coro``, cancelled at loop iteration ``cancel`` if given (CANCELLED)."""
        return await run_cancellable(coro, cancel, self.clients, limit=LIMIT)

    def teardown(self) -> None:
        async def close() -> None:
            for client in self.clients:
                await client.aclose()
            await self.raw.delete(self.name)
            await self.raw.aclose()

        self.run(close())
        self.runner.close()


cancels = st.one_of(st.none(), st.integers(min_value=0, max_value=12))
clients = st.integers(min_value=0, max_value=1)


class SemaphoreMachine(_Counting):
    """The semaphore against a count."""

    @initialize(start=st.integers(min_value=0, max_value=4))
    def set_permits(self, start: int) -> None:
        self.permits = start
        assert self.run(self.clients[0].semaphore(self.name).try_set_permits(start))

    @rule(client=clients, n=st.integers(min_value=1, max_value=3), cancel=cancels)
    def try_acquire(self, client: int, n: int, cancel: int | None) -> None:
        sem = self.clients[client].semaphore(self.name)
        result = self.run(self.call(sem.try_acquire(n), cancel))
        if result is True:
            assert self.permits >= n, f"took {n} of {self.permits}"
            self.permits -= n
        elif result is False:
            assert self.permits < n, f"refused {n} of {self.permits}"

    @rule(client=clients, n=st.integers(min_value=1, max_value=3), cancel=cancels)
    def release(self, client: int, n: int, cancel: int | None) -> None:
        sem = self.clients[client].semaphore(self.name)
        self.run(self.call(sem.release(n), cancel))
        self.permits += n  # made once, cancelled or not

    @rule(client=clients, n=st.integers(min_value=-2, max_value=3))
    def add_permits(self, client: int, n: int) -> None:
        self.run(self.call(self.clients[client].semaphore(self.name).add_permits(n), None))
        self.permits += n

    @rule(client=clients, cancel=cancels)
    def drain(self, client: int, cancel: int | None) -> None:
        """drain_permits takes what there is (cancelled: nothing, it is given back)."""
        sem = self.clients[client].semaphore(self.name)
        result = self.run(self.call(sem.drain_permits(), cancel))
        if result != CANCELLED:
            assert result == self.permits
            self.permits = 0

    @rule(client=clients, n=st.integers(min_value=1, max_value=3))
    def woken(self, client: int, n: int) -> None:
        """A waiter for more than there is gets them once the other client releases."""
        # No precondition on what earlier steps took: a cancel's outcome varies from run
        # to run, and hypothesis needs the same rules enabled when it replays a sequence.
        if self.permits < 0:
            return
        short = n + max(self.permits, 0)
        waiting = self.clients[client].semaphore(self.name)
        other = self.clients[1 - client].semaphore(self.name)

        async def scenario() -> bool:
            waiter = asyncio.ensure_future(waiting.try_acquire(short, wait=LIMIT))
            await wait_until(
                lambda: (
                    inside.waiting_room(self.clients[client]).waiting(self.name) == 1
                    or waiter.done()
                )
            )
            await other.release(n)
            return bool(await waiter)

        assert self.run(self.call(scenario(), None)) is True
        self.permits -= short - n

    @rule(client=clients, n=st.integers(min_value=1, max_value=3), cancel=cancels)
    def queued(self, client: int, n: int, cancel: int | None) -> None:
        """A call of a client whose task waits queues behind it (no barging), cancelled or
        not; a release of what both need lets them in (the queued one: not if cancelled)."""
        if self.permits < 0:
            return
        short = n + max(self.permits, 0)
        c = self.clients[client]
        waiting = c.semaphore(self.name)
        other = self.clients[1 - client].semaphore(self.name)

        async def scenario() -> tuple[bool, Any]:
            waiter = asyncio.ensure_future(waiting.try_acquire(short, wait=LIMIT))
            await wait_until(
                lambda: inside.waiting_room(c).waiting(self.name) == 1 or waiter.done()
            )
            behind = asyncio.ensure_future(self.call(waiting.try_acquire(1, wait=LIMIT), cancel))
            await wait_until(
                lambda: inside.waiting_room(c).waiting(self.name) == 2 or behind.done()
            )
            await other.release(n + 1)
            return bool(await waiter), await behind

        took, queued = self.run(scenario())
        assert took is True
        assert queued in {True, CANCELLED}
        self.permits -= short - n - 1 + (1 if queued is True else 0)

    @invariant()
    def permits_match(self) -> None:
        if not hasattr(self, "permits"):
            return
        value = self.run(self.raw.get(self.name))
        assert int(value or 0) == self.permits


class LatchMachine(_Counting):
    """The count-down latch against a count."""

    @initialize(start=st.integers(min_value=0, max_value=4))
    def set_count(self, start: int) -> None:
        self.count = start
        assert self.run(self.clients[0].count_down_latch(self.name).try_set_count(start))

    @rule(client=clients, cancel=cancels)
    def count_down(self, client: int, cancel: int | None) -> None:
        latch = self.clients[client].count_down_latch(self.name)
        self.run(self.call(latch.count_down(), cancel))
        self.count = max(0, self.count - 1)

    @rule(client=clients, n=st.integers(min_value=0, max_value=3))
    def try_set(self, client: int, n: int) -> None:
        latch = self.clients[client].count_down_latch(self.name)
        result = self.run(self.call(latch.try_set_count(n), None))
        assert result is (self.count == 0)
        if result:
            self.count = n

    @rule(client=clients, cancel=cancels)
    def wait_now(self, client: int, cancel: int | None) -> None:
        latch = self.clients[client].count_down_latch(self.name)
        result = self.run(self.call(latch.wait(timeout=0), cancel))
        if result != CANCELLED:
            assert result is (self.count == 0)

    @precondition(lambda self: self.count > 0)
    @rule(client=clients)
    def waiters_opened(self, client: int) -> None:
        """Waiters of one client return True once the other counts the latch to zero."""
        waiting = self.clients[client].count_down_latch(self.name)
        other = self.clients[1 - client].count_down_latch(self.name)

        async def scenario() -> list[bool]:
            waiters = [asyncio.ensure_future(waiting.wait(timeout=LIMIT)) for _ in range(2)]
            await wait_until(
                lambda: inside.waiting_room(self.clients[client]).waiting(self.name) == 2
            )
            for _ in range(self.count):
                await other.count_down()
            return list(await asyncio.gather(*waiters))

        assert self.run(self.call(scenario(), None)) == [True, True]
        self.count = 0

    @invariant()
    def count_matches(self) -> None:
        if not hasattr(self, "count"):
            return
        value = self.run(self.raw.get(self.name))
        assert int(value or 0) == self.count


async def _hold(
    psem: aiolock.PermitExpirableSemaphore, got: asyncio.Future[str], done: asyncio.Event
) -> None:
    """A task holding a renewed permit (``acquired()``) until ``done`` is set."""
    async with psem.acquired(wait=0) as permit:
        got.set_result(permit)
        await done.wait()


class PermitMachine(_Counting):
    """The permit-expirable semaphore against the set of ids taken (no explicit leases: a
    permit that expires would make the model depend on time; the renewed ones never do)."""

    @initialize(start=st.integers(min_value=0, max_value=3))
    def set_permits(self, start: int) -> None:
        self.total = start
        self.held: list[str] = []
        # Permits held in acquired() blocks: (client, holder task, its "leave" event).
        self.renewed: list[tuple[int, asyncio.Task[None], asyncio.Event]] = []
        psem = self.clients[0].permit_expirable_semaphore(self.name)
        assert self.run(psem.try_set_permits(start))

    @rule(client=clients, cancel=cancels)
    def try_acquire(self, client: int, cancel: int | None) -> None:
        psem = self.clients[client].permit_expirable_semaphore(self.name)
        result = self.run(self.call(psem.try_acquire(), cancel))
        if result is None:
            assert self.taken >= self.total, "refused with a permit free"
        elif result != CANCELLED:
            assert self.taken < self.total, "took a permit that was not there"
            self.held.append(result)

    @property
    def taken(self) -> int:
        return len(self.held) + len(self.renewed)

    @rule(client=clients, cancel=cancels)
    def hold_renewed(self, client: int, cancel: int | None) -> None:
        """Enter an acquired() block in a task of its own, cancelled while entering at a
        drawn loop iteration; it holds its permit until release_renewed."""
        psem = self.clients[client].permit_expirable_semaphore(self.name)

        async def enter() -> tuple[asyncio.Task[None], asyncio.Event] | None:
            got: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            done = asyncio.Event()
            task = asyncio.ensure_future(_hold(psem, got, done))
            for _ in range(cancel or 0):
                await asyncio.sleep(0)
            if cancel is not None and not got.done():
                task.cancel()  # only the entering: a block entered stays held
            either: list[asyncio.Future[Any]] = [got, task]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if got.done():
                return task, done
            try:
                await task
            except aiolock.LockTimeoutError:
                assert self.taken >= self.total, "refused with a permit free"
            except asyncio.CancelledError:
                pass
            return None

        entered = self.run(self.call(enter(), None))
        if entered is not None:
            assert self.taken < self.total, "took a permit that was not there"
            self.renewed.append((client, *entered))

    @rule(index=st.integers(min_value=0, max_value=7), cancel=cancels)
    def release_renewed(self, index: int, cancel: int | None) -> None:
        """Leave an acquired() block, cancelled at a drawn loop iteration or not: the
        permit is back either way."""
        if not self.renewed:
            return
        _, task, done = self.renewed.pop(index % len(self.renewed))

        async def leave() -> None:
            done.set()
            await task

        self.run(self.call(leave(), cancel))
        if not task.done():
            self.run(self.call(asyncio.wait([task]), None))

    @rule(client=clients)
    def renew(self, client: int) -> None:
        """A renewal round renews every renewed permit of the client; none is lost."""
        renewal = inside.renewal(self.clients[client])
        assert self.run(renewal.renew_once())
        mine = sum(1 for c, _, _ in self.renewed if c == client)
        assert len(renewal) == mine

    @rule(client=clients, n=st.integers(min_value=0, max_value=4), cancel=cancels)
    def set_total(self, client: int, n: int, cancel: int | None) -> None:
        psem = self.clients[client].permit_expirable_semaphore(self.name)
        self.run(self.call(psem.set_permits(n), cancel))  # made once, cancelled or not
        self.total = n

    @rule(client=clients, index=st.integers(min_value=0, max_value=7), cancel=cancels)
    def release(self, client: int, index: int, cancel: int | None) -> None:
        if not self.held:
            return  # see SemaphoreMachine.woken: no precondition on outcomes
        permit = self.held.pop(index % len(self.held))
        psem = self.clients[client].permit_expirable_semaphore(self.name)
        self.run(self.call(psem.release(permit), cancel))  # made once, cancelled or not

    @rule(client=clients)
    def release_unknown(self, client: int) -> None:
        psem = self.clients[client].permit_expirable_semaphore(self.name)

        async def unknown() -> None:
            with pytest.raises(aiolock.LockNotOwnedError):
                await psem.release(uuid.uuid4().hex)

        self.run(self.call(unknown(), None))

    @invariant()
    def permits_match(self) -> None:
        if not hasattr(self, "total"):
            return
        available = self.run(self.raw.get(self.name))
        taken = self.run(self.raw.zcard(f"{{{self.name}}}:timeout"))
        assert (int(available or 0), taken) == (self.total - self.taken, self.taken)

    def teardown(self) -> None:
        async def leave_all() -> None:
            for _, task, done in getattr(self, "renewed", []):
                done.set()
                await task

        self.run(leave_all())
        self.run(self.raw.delete(f"{{{self.name}}}:timeout"))
        super().teardown()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "machine",
    [SemaphoreMachine, PermitMachine, LatchMachine],
    ids=["semaphore", "permit_expirable_semaphore", "count_down_latch"],
)
def test_model(machine: type[_Counting], redis_url: str, request: pytest.FixtureRequest) -> None:
    """The object behaves as its model says, under every sequence hypothesis tries."""
    _Counting.redis_url = redis_url
    run_state_machine_as_test(machine, settings=settings_for(request))
