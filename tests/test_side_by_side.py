"""Model-based test of ``side_by_side``: coroutines stepped by the calling task behave as
they would each in a task of its own (asyncio's Task is the reference model).

Hypothesis draws a few coroutines (each a list of steps: wait on a future the test
resolves, yield to the loop, set a context variable, raise, swallow a cancel) and a
schedule of what happens to them (a future resolved with a value or an error, a cancel, a
future resolved and cancelled in the same pass). The same coroutines and schedule run once
in tasks and once side by side; each coroutine must see the same things (its trace) and
end the same way. Between two events of the schedule, every coroutine still running is
waiting on its future, in both runs, so the schedule means the same thing to both.

The composites that run their members this way are tested on real servers
(test_multilock.py, test_multilock_model.py, tests/faults).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiolock._objects.side_by_side import SideBySide

#: A context variable each coroutine sets and reads: its own copy, as in a task.
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("side_by_side_test", default="-")
#: Loop passes the test waits at most for the coroutines to be waiting again.
PASS_BOUND = 1_000

WAIT, YIELD, SET, RAISE, CANCEL = "wait", "yield", "set", "raise", "cancel"

steps = st.lists(
    st.one_of(
        st.tuples(st.just(WAIT), st.booleans()),  # swallow a cancel there?
        st.tuples(st.just(YIELD), st.just(False)),
        st.tuples(st.just(SET), st.just(False)),
        st.tuples(st.just(RAISE), st.just(False)),
        st.tuples(st.just(CANCEL), st.just(False)),  # it cancels itself (as a task can)
    ),
    max_size=6,
)
EVENTS = ("value", "error", "cancel", "value+cancel")
schedules = st.lists(
    st.tuples(st.integers(min_value=0, max_value=3), st.sampled_from(EVENTS)), max_size=12
)


class Harness:
    """The futures the coroutines wait on, and what each coroutine saw."""

    def __init__(self, count: int) -> None:
        self.waiting: list[asyncio.Future[int] | None] = [None] * count
        self.traces: list[list[object]] = [[] for _ in range(count)]
        #: Cancels coroutine i (each run sets its own).
        self.cancel: Callable[[int], object] = lambda index: None

    def blocked(self, index: int) -> bool:
        """Whether coroutine ``index`` waits on a future not yet resolved."""
        future = self.waiting[index]
        return future is not None and not future.done()

    async def program(self, index: int, plan: list[tuple[str, bool]]) -> str:
        trace = self.traces[index]
        # Past its first step (run in SideBySide's constructor), so that it can reach it.
        await asyncio.sleep(0)
        trace.append(("var", VAR.get()))
        for number, (step, swallow) in enumerate(plan):
            if step == WAIT:
                future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                self.waiting[index] = future
                try:
                    trace.append(("got", await future))
                except asyncio.CancelledError:
                    # Its future cancelled with it, or resolved before the cancel came.
                    trace.append(("cancelled", future.cancelled()))
                    if not swallow:
                        raise
                except LookupError as exc:
                    trace.append(("error", str(exc)))
                finally:
                    self.waiting[index] = None
            elif step == YIELD:
                await asyncio.sleep(0)
            elif step == CANCEL:
                self.cancel(index)
                trace.append("cancel asked")
            elif step == SET:
                VAR.set(f"{index}:{number}")
                trace.append(("var", VAR.get()))
            else:
                raise ValueError(f"{index}:{number}")
        return f"done {index} {VAR.get()}"


def _outcome(cancelled: bool, error: BaseException | None, value: object) -> object:
    if cancelled:
        return "cancelled"
    if error is not None:
        return (type(error).__name__, str(error))
    return value


async def _play(
    harness: Harness,
    ended: Callable[[int], bool],
    cancel: Callable[[int], object],
    schedule: list[tuple[int, str]],
) -> None:
    """Apply ``schedule``, then resolve what still waits, each once all are waiting."""
    count = len(harness.waiting)

    async def settled() -> None:
        for _ in range(PASS_BOUND):
            if all(ended(i) or harness.blocked(i) for i in range(count)):
                return
            await asyncio.sleep(0)
        raise AssertionError("the coroutines never all waited")

    tail = [(i, "value") for _ in range(8) for i in range(count)]
    for serial, (index, event) in enumerate([*schedule, *tail]):
        await settled()
        if index >= count or ended(index):
            continue
        future = harness.waiting[index]
        if event == "cancel":
            cancel(index)
        elif future is not None and event == "error":
            future.set_exception(LookupError(f"e{serial}"))
        elif future is not None:
            future.set_result(serial)
            if event == "value+cancel":
                cancel(index)  # its future is done: the cancel comes at its next step
    await settled()


async def _in_tasks(plans: list[list[tuple[str, bool]]], schedule: list[tuple[int, str]]) -> Any:
    harness = Harness(len(plans))
    tasks = [asyncio.create_task(harness.program(i, plan)) for i, plan in enumerate(plans)]
    harness.cancel = lambda i: tasks[i].cancel()
    await _play(harness, lambda i: tasks[i].done(), harness.cancel, schedule)
    await asyncio.wait(tasks)
    values = [_task_outcome(task) for task in tasks]
    return harness.traces, values


def _task_outcome(task: asyncio.Task[str]) -> object:
    if task.cancelled():
        return _outcome(True, None, None)
    error = task.exception()
    return _outcome(False, error, None if error is not None else task.result())


async def _side_by_side(
    plans: list[list[tuple[str, bool]]], schedule: list[tuple[int, str]]
) -> Any:
    harness = Harness(len(plans))
    made: list[SideBySide[str]] = []

    async def caller() -> None:
        programs = [harness.program(i, plan) for i, plan in enumerate(plans)]
        harness.cancel = lambda i: made[0].cancel(made[0].sides[i])
        sides = SideBySide(programs)
        made.append(sides)
        assert await sides.finish() is None

    calling = asyncio.create_task(caller())
    await asyncio.sleep(0)
    sides = made[0]
    await _play(harness, lambda i: sides.sides[i].done, harness.cancel, schedule)
    await calling
    values = [_outcome(s.cancelled(), s.error, s.value) for s in sides.sides]
    return harness.traces, values


@settings(max_examples=300, deadline=None)
@given(plans=st.lists(steps, min_size=1, max_size=4), schedule=schedules)
def test_coroutines_side_by_side_behave_as_in_tasks(
    plans: list[list[tuple[str, bool]]], schedule: list[tuple[int, str]]
) -> None:
    """Each coroutine sees the same values, errors, cancels and context, and ends the same."""
    expected = asyncio.run(_in_tasks(plans, schedule))
    got = asyncio.run(_side_by_side(plans, schedule))
    assert got == expected


async def test_the_coroutines_run_in_the_calling_task() -> None:
    """A coroutine side by side acts for the calling task: what it takes is the caller's."""

    async def whose() -> asyncio.Task[Any] | None:
        await asyncio.sleep(0)
        return asyncio.current_task()

    sides = SideBySide(whose() for _ in range(2))
    await sides.finish()
    assert [side.value for side in sides.sides] == [asyncio.current_task()] * 2


async def _forever(started: list[int], index: int) -> None:
    started.append(index)
    await asyncio.get_running_loop().create_future()


async def test_a_cancel_of_the_caller_reaches_no_coroutine_until_passed_on() -> None:
    """``wait()`` raises the caller's cancel and leaves the coroutines running; they end once
    cancelled themselves, and ``finish()`` runs them to their end through another cancel."""
    started: list[int] = []
    made: list[SideBySide[None]] = []
    waiting = asyncio.Event()

    async def caller() -> object:
        sides = SideBySide(_forever(started, i) for i in range(3))
        made.append(sides)
        assert started == [0, 1, 2], "each starts at once, in the constructor"
        waiting.set()
        try:
            await sides.wait()
        except asyncio.CancelledError:
            assert sides.running == 3
            sides.cancel_running()
            return await sides.finish()
        raise AssertionError("wait() returned with every coroutine waiting")

    task = asyncio.create_task(caller())
    await waiting.wait()
    task.cancel()
    assert await task is None
    assert all(side.cancelled() for side in made[0].sides)


async def test_wait_returns_at_its_deadline_or_condition() -> None:
    """A deadline ends ``wait()`` with the coroutines still running; so does ``until``."""
    started: list[int] = []
    loop = asyncio.get_running_loop()
    sides = SideBySide(_forever(started, i) for i in range(2))
    await sides.wait(deadline=loop.time() + 0.01)
    assert sides.running == 2
    await sides.wait(until=lambda: True)
    assert sides.running == 2
    sides.cancel_running()
    assert await sides.finish() is None
    assert sides.running == 0


@pytest.mark.parametrize("bad", [1, "x"])
async def test_a_coroutine_yielding_a_non_future_gets_an_error(bad: object) -> None:
    """As in a task: a coroutine that yields something not a future gets a RuntimeError."""

    class Odd:
        def __await__(self) -> Any:
            yield bad

    async def odd() -> None:
        await Odd()

    coro: Coroutine[Any, Any, None] = odd()
    sides = SideBySide([coro])
    await sides.finish()
    assert isinstance(sides.sides[0].error, RuntimeError)
