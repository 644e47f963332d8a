"""The interrupt sweep of aiolock.sync: an exception raised in a waiting thread, at every wait
point of every blocking call, leaves nothing behind by the time it reaches the caller.

What the cancellation sweep does for tasks, for threads: Ctrl-C (``KeyboardInterrupt``) and
a Celery-style soft time limit (``SoftTimeLimitExceeded``, an ``Exception`` raised by a
signal handler in the worker's main thread) are raised by a signal handler in the main
thread, blocked in the call, at each wait point:

- ``waiting``: the call found the object taken and waits (its ``Waiting`` event; a fair
  lock's queue entry is in Redis then);
- ``acquired``: the call took it, and is interrupted before it could return (its
  ``Acquired`` event; the undo gives it back);
- ``woken``: the holder lets go and the interruption comes at once (a race with the wake-up
  and the attempt in flight: the call may win it and return, then its caller releases).

The signal is sent from the event listener, in the loop thread, which then waits until the
main thread has run the handler: the interruption lands while the call is still under way,
never after it returned. Then, at once: nothing held, no queue entry, no permit taken (the
object's keys are gone once its holder let go, or its permits are all back). The undo must
be finished before the interruption reaches the caller (issue 37: a fair lock's queue entry
was left, and a process exiting on the Ctrl-C left it for everyone for minutes).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest
from redis import Redis

import aiolock
import aiolock.sync
from aiolock.events import Acquired, Waiting
from aiolock.sync._hold import TaskBlock
from aiolock.sync._portal import Call, Portal

# Safety net only: every wait below ends on an event or on Redis state.
LIMIT = 10.0
HOLDER = "sweep-holder"
# Keys that outlive a call by design, each with a TTL: a fenced lock's token counter, the
# tombstone of an interrupted acquire, the latch of an unlock (its resend's receipt).
TRANSIENT = (b"redisson_lock_token:", b"aiolock_acquire_cancel:", b"redisson_unlock_latch:")


class SoftTimeLimitExceeded(Exception):
    """Celery's soft time limit: an Exception a signal handler raises in the worker."""


INTERRUPTS: list[type[BaseException]] = [KeyboardInterrupt, SoftTimeLimitExceeded]
PHASES = ("waiting", "acquired", "woken")


# -- the objects and the calls swept ---------------------------------------------------


@dataclass
class Target:
    """One object under test: taken by a holder, waited for by the swept call."""

    take: Callable[[], None]  # the holder takes it (the call then waits)
    give: Callable[[], None]  # the holder lets go
    calls: dict[str, Callable[[], Callable[[], None]]]  # name: run it, answer its cleanup
    # Nothing left once the holder let go: raises AssertionError otherwise.
    check: Callable[[], None]
    # Clears what a call that got past its wait left (the interruption landed after it).
    reset: Callable[[], None]


def _clear(redis: Any, name: str) -> Callable[[], None]:
    def clear() -> None:
        redis.delete(*redis.keys(f"*{name}*") or ["-"])

    return clear


def _no_keys(redis: Any, name: str) -> Callable[[], None]:
    def check() -> None:
        left = [k for k in redis.keys(f"*{name}*") if not k.startswith(TRANSIENT)]
        assert left == [], f"left behind: {left}"

    return check


def _lock_calls(handle: Any) -> dict[str, Callable[[], Callable[[], None]]]:
    unlock: Callable[[], None] = handle.unlock

    def lock() -> Callable[[], None]:
        handle.lock()
        return unlock

    def try_lock() -> Callable[[], None]:
        assert handle.try_lock(wait=LIMIT)
        return unlock

    def acquired() -> Callable[[], None]:
        with handle.acquired():
            pass
        return lambda: None

    def guarded() -> Callable[[], None]:
        with handle.guarded():
            pass
        return lambda: None

    return {"lock": lock, "try_lock": try_lock, "acquired": acquired, "guarded": guarded}


def _lock_target(
    holder: Any, waiter: Any, redis: Redis, name: str
) -> Target:  # a holder with owner=: any thread lets go
    return Target(
        holder.lock, holder.unlock, _lock_calls(waiter), _no_keys(redis, name), _clear(redis, name)
    )


LockPair = Callable[[aiolock.sync.Client, str, str | None], Any]

# (the holder's side, the waiter's side) of each kind, made from a client, a name, owner=.
LOCK_KINDS: dict[str, tuple[LockPair, LockPair]] = {
    "Lock": (lambda c, n, o: c.lock(n, owner=o),) * 2,
    "FairLock": (lambda c, n, o: c.fair_lock(n, owner=o),) * 2,
    "FencedLock": (lambda c, n, o: c.fenced_lock(n, owner=o),) * 2,
    "SpinLock": (lambda c, n, o: c.spin_lock(n, owner=o),) * 2,
    "ReadLock": (
        lambda c, n, o: c.read_write_lock(n, owner=o).write_lock(),
        lambda c, n, o: c.read_write_lock(n, owner=o).read_lock(),
    ),
    "WriteLock": (lambda c, n, o: c.read_write_lock(n, owner=o).write_lock(),) * 2,
    "FairReadLock": (
        lambda c, n, o: c.fair_read_write_lock(n, owner=o).write_lock(),
        lambda c, n, o: c.fair_read_write_lock(n, owner=o).read_lock(),
    ),
    "FairWriteLock": (lambda c, n, o: c.fair_read_write_lock(n, owner=o).write_lock(),) * 2,
    "MultiLock": (
        lambda c, n, o: aiolock.sync.MultiLock(
            c.lock(f"{n}:a", owner=o), c.fair_lock(f"{n}:b", owner=o)
        ),
    )
    * 2,
    "RedLock": (
        lambda c, n, o: aiolock.sync.RedLock(*(c.lock(f"{n}:{i}", owner=o) for i in range(3))),
    )
    * 2,
}


def _semaphore_target(holder: Any, waiter: Any, redis: Redis, name: str) -> Target:
    h, w = holder.semaphore(name), waiter.semaphore(name)
    assert h.try_set_permits(1)

    release: Callable[[], None] = w.release

    def acquire() -> Callable[[], None]:
        w.acquire()
        return release

    def try_acquire() -> Callable[[], None]:
        assert w.try_acquire(wait=LIMIT)
        return release

    def acquired() -> Callable[[], None]:
        with w.acquired():
            pass
        return lambda: None

    def check() -> None:
        assert h.available_permits() == 1, "a permit was left taken"

    return Target(
        h.acquire,
        h.release,
        {"acquire": acquire, "try_acquire": try_acquire, "acquired": acquired},
        check,
        lambda: h.add_permits(1 - h.available_permits()),
    )


def _permits_target(holder: Any, waiter: Any, redis: Redis, name: str) -> Target:
    h, w = holder.permit_expirable_semaphore(name), waiter.permit_expirable_semaphore(name)
    assert h.try_set_permits(1)
    held: list[str] = []

    def acquire() -> Callable[[], None]:
        permit = w.acquire()
        return lambda: w.release(permit)

    def try_acquire() -> Callable[[], None]:
        permit = w.try_acquire(wait=LIMIT)
        assert permit is not None
        return lambda: w.release(permit)

    def acquired() -> Callable[[], None]:
        with w.acquired():
            pass
        return lambda: None

    def check() -> None:
        assert h.available_permits() == 1, "a permit was left taken"
        assert redis.zcard(f"{name}:timeout") == 0, "a permit was left taken"

    def reset() -> None:
        _clear(redis, name)()
        assert h.try_set_permits(1)

    return Target(
        lambda: held.append(h.acquire()),
        lambda: h.release(held.pop()),
        {"acquire": acquire, "try_acquire": try_acquire, "acquired": acquired},
        check,
        reset,
    )


def _leader_target(holder: Any, waiter: Any, redis: Redis, name: str) -> Target:
    h = holder.lock(name, owner=HOLDER)
    leader = waiter.leader(name)

    def run() -> Callable[[], None]:
        leader.run(lambda: None)
        return lambda: None

    def elected() -> Callable[[], None]:
        with leader.elected():
            pass
        return lambda: None

    return Target(
        h.lock,
        h.unlock,
        {"run": run, "elected": elected},
        _no_keys(redis, name),
        _clear(redis, name),
    )


# -- delivering the interruption -------------------------------------------------------


# A sync call's waits: the calling thread blocked on its call's end (Call.wait), or on a
# task-backed block's entry (a concurrent.futures.Future's Condition), or on its way there
# once the call is made (scheduling it).
WAIT_POINTS = {
    Call.wait.__code__,
    Call.interrupt.__code__,
    Call.schedule.__code__,
    concurrent.futures.Future.result.__code__,
}
# Where a call is made and waited for: a landing there counts once the call exists.
CALLERS = {Portal.run.__code__, TaskBlock.__enter__.__code__}


@dataclass
class Delivery:
    """Raises ``exc`` in the main thread (a signal), once, when ``fire()`` is called."""

    exc: type[BaseException]
    wait_for_handler: bool
    handled: threading.Event = field(default_factory=threading.Event)
    fired: bool = False

    in_wait: bool = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.handled.is_set():
            return
        # Where it landed: in a wait of a sync call (or not: a woken call can win the race
        # and be past its wait, e.g. entering a block's exit, when the signal is handled).
        while frame is not None:
            code = frame.f_code
            if code in WAIT_POINTS or (code in CALLERS and "call" in frame.f_locals):
                self.in_wait = True
            frame = frame.f_back
        self.handled.set()
        raise self.exc

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        if self.wait_for_handler:
            # In the loop thread: the call cannot end before the main thread is interrupted.
            self.handled.wait(LIMIT)


@dataclass
class Tally:
    cases: int = 0
    interrupted: int = 0
    returned: int = 0
    past_the_wait: int = 0
    by_phase: dict[str, int] = field(default_factory=dict)


def _sweep_one(  # noqa: PLR0917 - one case of the sweep, every part of it named
    target: Target,
    call: Callable[[], Callable[[], None]],
    phase: str,
    exc: type[BaseException],
    waiter: aiolock.sync.Client,
    name: str,
    tally: Tally,
) -> None:
    delivery = Delivery(exc, wait_for_handler=phase != "woken")
    waiting = threading.Event()

    def listener(event: object) -> None:
        if getattr(event, "name", "").find(name) < 0:
            return
        if isinstance(event, Waiting) and event.waiting > 0:
            waiting.set()
            if phase == "waiting":
                delivery.fire()
        elif isinstance(event, Acquired) and phase == "acquired":
            delivery.fire()

    def let_go() -> None:
        if not waiting.wait(LIMIT):
            delivery.fire()  # no Waiting event: the case fails below, the test ends
            return
        target.give()
        if phase == "woken":
            delivery.fire()

    target.take()
    previous = signal.signal(signal.SIGUSR1, delivery.handler)
    waiter.add_listener(listener)
    helper = threading.Thread(target=let_go) if phase != "waiting" else None
    if helper is not None:
        helper.start()
    cleanup: Callable[[], None] | None = None
    try:
        try:
            cleanup = call()
            # It won the race (woken only): the interruption may still be on its way.
            # Short waits: a signal that comes just before a blocking wait starts is only
            # handled when it ends (CPython), at the next turn of this loop.
            deadline = time.monotonic() + LIMIT
            while not delivery.handled.wait(0.01):
                assert time.monotonic() < deadline, "the signal was never handled"
            time.sleep(0)  # a pending signal handler runs here, caught below
        except exc:
            pass
    finally:
        waiter.remove_listener(listener)
        if helper is not None:
            helper.join(LIMIT)
        signal.signal(signal.SIGUSR1, previous)
    assert waiting.is_set(), f"{name}: the call never waited"
    tally.cases += 1
    tally.by_phase[phase] = tally.by_phase.get(phase, 0) + 1
    if phase == "waiting":
        target.give()
    if cleanup is not None:
        assert phase == "woken", f"{name}: the interruption came after the call returned"
        tally.returned += 1
        cleanup()
    elif delivery.in_wait:
        tally.interrupted += 1
    else:
        # Woken: the call won the race and the signal was handled past its waits (at a
        # function's entry in a block's exit, say), where Python code cannot be made
        # atomic; what it holds is the caller's, as after any return.
        assert phase == "woken", f"{name}: the interruption missed the wait it was sent at"
        tally.past_the_wait += 1
        target.reset()
    # At once, no waiting: the undo was done before the interruption reached the caller.
    target.check()


@pytest.fixture
def clients(redis_url: str) -> Iterator[tuple[aiolock.sync.Client, aiolock.sync.Client]]:
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("the interrupt sweep delivers signals: it must run in the main thread")
    with (
        aiolock.sync.Client.from_url(redis_url) as holder,
        aiolock.sync.Client.from_url(redis_url) as waiter,
    ):
        yield holder, waiter


def _sweep(
    make: Callable[[str], Target],
    calls: list[str],
    waiter: aiolock.sync.Client,
    base: str,
) -> Tally:
    tally = Tally()
    n = 0
    for call_name in calls:
        for phase in PHASES:
            for exc in INTERRUPTS:
                n += 1
                name = f"{base}:{n}"
                target = make(name)
                _sweep_one(target, target.calls[call_name], phase, exc, waiter, name, tally)
    return tally


@pytest.mark.parametrize("kind", list(LOCK_KINDS))
def test_interrupt_sweep_locks(
    kind: str,
    clients: tuple[aiolock.sync.Client, aiolock.sync.Client],
    redis_url: str,
    name: str,
) -> None:
    holder, waiter = clients
    hold_side, wait_side = LOCK_KINDS[kind]
    with Redis.from_url(redis_url) as redis:

        def make(n: str) -> Target:
            h = hold_side(holder, n, HOLDER)
            return _lock_target(h, wait_side(waiter, n, None), redis, n)

        tally = _sweep(make, ["lock", "try_lock", "acquired", "guarded"], waiter, name)
    assert tally.cases == 4 * len(PHASES) * len(INTERRUPTS)
    assert tally.interrupted >= 4 * 2 * len(INTERRUPTS)  # waiting and acquired: all of them


@pytest.mark.parametrize(
    ("kind", "calls"),
    [
        ("semaphore", ["acquire", "try_acquire", "acquired"]),
        ("permit_expirable_semaphore", ["acquire", "try_acquire", "acquired"]),
        ("leader", ["run", "elected"]),
    ],
)
def test_interrupt_sweep_semaphores_and_leader(
    kind: str,
    calls: list[str],
    clients: tuple[aiolock.sync.Client, aiolock.sync.Client],
    redis_url: str,
    name: str,
) -> None:
    holder, waiter = clients
    of_kind = {
        "semaphore": _semaphore_target,
        "permit_expirable_semaphore": _permits_target,
        "leader": _leader_target,
    }[kind]
    with Redis.from_url(redis_url) as redis:
        tally = _sweep(lambda n: of_kind(holder, waiter, redis, n), calls, waiter, name)
        redis.delete(*redis.keys(f"*{name}*") or ["-"])
    assert tally.cases == len(calls) * len(PHASES) * len(INTERRUPTS)
    assert tally.interrupted >= len(calls) * 2 * len(INTERRUPTS)


@pytest.mark.parametrize("exc", INTERRUPTS)
def test_interrupt_while_waiting_on_a_latch(
    exc: type[BaseException],
    clients: tuple[aiolock.sync.Client, aiolock.sync.Client],
    redis_url: str,
    name: str,
) -> None:
    holder, waiter = clients
    latch = waiter.count_down_latch(name)
    assert holder.count_down_latch(name).try_set_count(1)
    delivery = Delivery(exc, wait_for_handler=False)

    def interrupt_once_waiting() -> None:
        deadline = time.monotonic() + LIMIT
        while latch.tasks_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        delivery.fire()

    previous = signal.signal(signal.SIGUSR1, delivery.handler)
    helper = threading.Thread(target=interrupt_once_waiting)
    helper.start()
    try:
        with pytest.raises(exc):
            latch.wait()
    finally:
        helper.join(LIMIT)
        signal.signal(signal.SIGUSR1, previous)
    assert latch.tasks_waiting == 0
    # The latch works on: a later wait ends when it is counted down.
    holder.count_down_latch(name).count_down()
    assert latch.wait(LIMIT)
    with Redis.from_url(redis_url) as redis:
        assert [k for k in redis.keys(f"*{name}*") if not k.startswith(TRANSIENT)] == []


# -- a process that exits on Ctrl-C ------------------------------------------------------

_EXITING_CHILD = """
import signal
import sys
from aiolock.sync import Client


def on_sigint(signum, frame):  # Python's own, but it says so: the parent waits for it
    print("interrupted", flush=True)
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, on_sigint)

# Django/Celery style: a module-level client, never closed; Ctrl-C ends the process.
client = Client.from_url(sys.argv[1])
kind, name = sys.argv[2], sys.argv[3]
lock = client.fair_lock(name) if kind == "fair" else client.fair_read_write_lock(name).write_lock()
client.add_listener(
    lambda e: print("waiting", flush=True) if getattr(e, "waiting", 0) > 0 else None
)
lock.lock()
"""


@pytest.mark.parametrize("kind", ["fair", "fair_write"])
@pytest.mark.parametrize("wire", ["direct", "redis-py"])
def test_ctrl_c_then_exit_leaves_no_queue_entry(
    redis_url: str, name: str, kind: str, wire: str
) -> None:
    """Ctrl-C of a script waiting on a fair lock, whose uncaught KeyboardInterrupt ends the
    process with its client never closed: no queue entry left (issue 37: the entry stayed,
    and every other client's acquire waited behind it for about 330 s), and the process
    ends, on either wire (the fallback's reader task, opened as the Ctrl-C came, passed for
    the undo of the call and held the exit for twice the undo's bound)."""
    with aiolock.sync.Client.from_url(redis_url) as holder:
        held = (
            holder.fair_lock(name)
            if kind == "fair"
            else holder.fair_read_write_lock(name).write_lock()
        )
        held.lock()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), AIOLOCK_WIRE=wire)
        with subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_EXITING_CHILD), redis_url, kind, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as child:
            try:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "waiting"
                child.send_signal(signal.SIGINT)
                child.wait(LIMIT)
                assert child.stderr is not None
                assert "KeyboardInterrupt" in child.stderr.read()
            finally:
                child.kill()
        held.unlock()
        # Nobody holds it, no entry left: another thread takes it at once.
        other = (
            holder.fair_lock(name)
            if kind == "fair"
            else holder.fair_read_write_lock(name).write_lock()
        )
        assert aiolock.sync.Client is not None
        with contextlib.ExitStack() as stack:
            assert other.try_lock(wait=0), "a queue entry of the dead process blocks the lock"
            stack.callback(other.unlock)
    with Redis.from_url(redis_url) as redis:
        assert [k for k in redis.keys(f"*{name}*") if not k.startswith(TRANSIENT)] == []


def test_undo_cut_short_by_a_second_ctrl_c_is_finished_at_exit(redis_url: str, name: str) -> None:
    """Two Ctrl-Cs while the undo cannot reach Redis (paused): the second stops the wait
    for the undo, the process exits, and the exit lets the undo finish first (the loop
    thread is a daemon: stopped mid-step otherwise, leaving the queue entry)."""
    with aiolock.sync.Client.from_url(redis_url) as holder, Redis.from_url(redis_url) as redis:
        held = holder.fair_lock(name)
        held.lock()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        with subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_EXITING_CHILD), redis_url, "fair", name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as child:
            try:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "waiting"
                assert redis.llen(f"redisson_lock_queue:{{{name}}}") == 1
                # Writes wait 1 s: the queue exit is held up while both Ctrl-Cs come.
                redis.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
                child.send_signal(signal.SIGINT)
                # Two separate Ctrl-Cs, not one (pending signals coalesce): the second
                # once the first was handled, the child waiting for its undo.
                assert child.stdout.readline().strip() == "interrupted"
                child.send_signal(signal.SIGINT)
                assert child.stdout.readline().strip() == "interrupted"
                assert child.wait(LIMIT) != 0
            finally:
                child.kill()
        redis.execute_command("CLIENT", "UNPAUSE")
        assert redis.llen(f"redisson_lock_queue:{{{name}}}") == 0, "the exit cut the undo off"
        held.unlock()
        assert [k for k in redis.keys(f"*{name}*") if not k.startswith(TRANSIENT)] == []
