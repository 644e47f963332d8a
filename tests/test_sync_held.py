"""aiolock.sync holds kept past the watchdog: every kind, every way of holding, from threads.

The async suites' "held past watchdog_timeout" case, run through the blocking API: each
hold is taken in a thread of its own (the way Django, Flask and Celery code holds), kept
for 3 x ``watchdog_timeout`` and then checked from another client (it cannot be taken)
and released without error. What the sync API binds to the task that ran the acquire in
the loop thread (a permit's renewal was, issue 37) dies with that short-lived task: a
hold kept past the watchdog is the case that shows it. Also the leader's term: ``run(work)``
hands ``work`` its term, whose ``sleep()`` and ``check()`` stop a work loop once it is lost.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis import Redis

import aiolock
import aiolock.sync

# Short, so that 3 x watchdog stays cheap; long enough that a loaded 2-core machine renews
# in time (renewal every watchdog / 3).
WATCHDOG = 1.0
HELD_FOR = 3 * WATCHDOG
# Safety net only: every wait below ends on an event or on Redis state.
LIMIT = 20.0

SyncFactory = Callable[..., aiolock.sync.Client]


@pytest.fixture
def make_sync(redis_url: str, uid: str) -> Iterator[SyncFactory]:
    clients: list[aiolock.sync.Client] = []

    def make(**options: Any) -> aiolock.sync.Client:
        client = aiolock.sync.Client.from_url(redis_url, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
    with Redis.from_url(redis_url) as redis:
        transient = (b"redisson_lock_token:", b"aiolock_acquire_cancel:")
        left = [k for k in redis.keys(f"*{uid}*") if not k.startswith(transient)]
        assert left == [], "a test left keys behind"
        redis.delete(*redis.keys(f"*{uid}*") or ["-"])


# -- every kind of lock, every way of holding it -----------------------------------------

# (the holder's handle, the other client's probe: True if it could take the lock now).
Kind = Callable[[aiolock.sync.Client, aiolock.sync.Client, str], tuple[Any, Callable[[], bool]]]


def _probe_exclusive(handle: Any) -> Callable[[], bool]:
    def probe() -> bool:
        if handle.try_lock(wait=0):
            handle.unlock()
            return True
        return False

    return probe


def _simple(make: Callable[[aiolock.sync.Client, str], Any]) -> Kind:
    return lambda c, other, n: (make(c, n), _probe_exclusive(make(other, n)))


def _read(fair: bool) -> Kind:
    def kind(c: aiolock.sync.Client, other: aiolock.sync.Client, n: str) -> Any:
        pair = c.fair_read_write_lock if fair else c.read_write_lock
        other_pair = other.fair_read_write_lock if fair else other.read_write_lock
        # A read hold shuts writers out: the other client's writer is the probe.
        return pair(n).read_lock(), _probe_exclusive(other_pair(n).write_lock())

    return kind


def _multi(c: aiolock.sync.Client, other: aiolock.sync.Client, n: str) -> Any:
    members = (f"{n}:a", f"{n}:b")
    probes = [_probe_exclusive(other.lock(m)) for m in members]
    held = aiolock.sync.MultiLock(c.lock(members[0]), c.fair_lock(members[1]))
    return held, lambda: any(probe() for probe in probes)


def _red(c: aiolock.sync.Client, other: aiolock.sync.Client, n: str) -> Any:
    members = [f"{n}:{i}" for i in range(3)]
    probes = [_probe_exclusive(other.lock(m)) for m in members]
    held = aiolock.sync.RedLock(*(c.lock(m) for m in members))
    return held, lambda: any(probe() for probe in probes)


LOCK_KINDS: dict[str, Kind] = {
    "Lock": _simple(lambda c, n: c.lock(n)),
    "FairLock": _simple(lambda c, n: c.fair_lock(n)),
    "FencedLock": _simple(lambda c, n: c.fenced_lock(n)),
    "SpinLock": _simple(lambda c, n: c.spin_lock(n)),
    "ReadLock": _read(fair=False),
    "WriteLock": _simple(lambda c, n: c.read_write_lock(n).write_lock()),
    "FairReadLock": _read(fair=True),
    "FairWriteLock": _simple(lambda c, n: c.fair_read_write_lock(n).write_lock()),
    "MultiLock": _multi,
    "RedLock": _red,
}


@contextlib.contextmanager
def _lock_unlock(handle: Any) -> Iterator[None]:
    handle.lock()
    try:
        yield
    finally:
        handle.unlock()


@contextlib.contextmanager
def _try_lock(handle: Any) -> Iterator[None]:
    assert handle.try_lock(wait=LIMIT)
    try:
        yield
    finally:
        handle.unlock()


@contextlib.contextmanager
def _guarded(handle: Any) -> Iterator[None]:
    with handle.guarded() as hold:
        yield
        assert not hold.lost
        hold.check()


WAYS: dict[str, Callable[[Any], contextlib.AbstractContextManager[Any]]] = {
    "lock/unlock": _lock_unlock,
    "try_lock/unlock": _try_lock,
    "with": lambda handle: handle,
    "acquired": lambda handle: handle.acquired(),
    "guarded": _guarded,
}


class Holders:
    """Holds taken in threads of their own, all kept until ``release()``."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, BaseException]] = []
        self._inside: list[threading.Event] = []
        self._release = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, label: str, hold: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        inside = threading.Event()

        def run() -> None:
            try:
                with hold():
                    inside.set()
                    self._release.wait(LIMIT + HELD_FOR)
            except BaseException as exc:
                self.errors.append((label, exc))
            finally:
                inside.set()  # a failed acquire must not leave the test waiting

        thread = threading.Thread(target=run, name=f"holder {label}")
        self._inside.append(inside)
        self._threads.append(thread)
        thread.start()

    def wait_inside(self) -> None:
        for inside in self._inside:
            assert inside.wait(LIMIT), "a holder did not get its hold"
        assert self.errors == []

    def release(self) -> None:
        self._release.set()
        for thread in self._threads:
            thread.join(LIMIT)
            assert not thread.is_alive(), "a holder did not leave its block"


def _kept_past_the_watchdog(holders: Holders, probes: dict[str, Callable[[], bool]]) -> None:
    holders.wait_inside()
    # Holding for a duration IS the behaviour under test; what is asserted is state.
    time.sleep(HELD_FOR)
    taken = [label for label, probe in probes.items() if probe()]
    holders.release()
    assert taken == [], f"held past 3 x watchdog_timeout, yet another client took {taken}"
    assert holders.errors == []


def test_every_lock_kind_held_from_threads_past_the_watchdog(
    make_sync: SyncFactory, name: str
) -> None:
    """10 kinds x 5 ways, each hold in a thread, kept for 3 x watchdog_timeout."""
    client = make_sync(watchdog_timeout=WATCHDOG)
    other = make_sync()
    holders = Holders()
    probes: dict[str, Callable[[], bool]] = {}
    for kind, make in LOCK_KINDS.items():
        for way, hold in WAYS.items():
            label = f"{kind} {way}"
            handle, probes[label] = make(client, other, f"{name}:{kind}:{way}")
            holders.start(label, lambda hold=hold, handle=handle: hold(handle))  # type: ignore[misc]
    _kept_past_the_watchdog(holders, probes)


def test_permits_and_terms_held_from_threads_past_the_watchdog(
    make_sync: SyncFactory, name: str
) -> None:
    """A permit in ``acquired()`` with no lease is renewed while the thread is in the
    block (issue 37: it was bound to the loop task that took it, and handed out again
    after watchdog_timeout); a leader's term likewise."""
    client = make_sync(watchdog_timeout=WATCHDOG)
    other = make_sync()
    holders = Holders()
    probes: dict[str, Callable[[], bool]] = {}

    psem = client.permit_expirable_semaphore(f"{name}:psem")
    assert psem.try_set_permits(1)
    other_psem = other.permit_expirable_semaphore(f"{name}:psem")

    def psem_probe() -> bool:
        permit = other_psem.try_acquire(wait=0)
        if permit is not None:
            other_psem.release(permit)
        return permit is not None

    holders.start("psem acquired", psem.acquired)
    probes["psem acquired"] = psem_probe

    leader = client.leader(f"{name}:leader")
    holders.start("leader elected", leader.elected)
    probes["leader elected"] = _probe_exclusive(other.lock(f"{name}:leader"))

    _kept_past_the_watchdog(holders, probes)
    assert psem.available_permits() == 1
    assert psem.delete()


# -- the leader's term -----------------------------------------------------------------


def test_leader_work_takes_the_term_and_stops_when_it_is_lost(
    make_sync: SyncFactory, name: str
) -> None:
    """``run(work)`` hands ``work`` its term; a forced unlock (an operator, a restart
    without persistence) ends the term, ``term.sleep()`` raises at once, ``run()``
    campaigns again and ``work`` runs in the new term: never two calls of it at once."""
    client = make_sync(watchdog_timeout=WATCHDOG)
    other = make_sync()
    leader = client.leader(name)
    terms: list[aiolock.sync.Hold] = []
    running = 0
    overlaps = 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def work(term: aiolock.sync.Hold) -> str:
        nonlocal running, overlaps
        running += 1
        overlaps += running > 1
        terms.append(term)
        try:
            while not stop.is_set():
                term.check()
                term.sleep(0.05)
            return "done"
        finally:
            running -= 1

    result: list[str] = []

    def run() -> None:
        try:
            result.append(leader.run(work))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    _until(lambda: len(terms) == 1, "the first term")
    assert other.lock(name).force_unlock()
    # The loss is seen (the renewal finds the lock gone): the first term's sleep raised,
    # and run() campaigned again.
    _until(lambda: len(terms) == 2, "a second term after the forced unlock")
    assert terms[0].lost
    assert not terms[1].lost
    stop.set()
    thread.join(LIMIT)
    assert errors == []
    assert result == ["done"]
    assert overlaps == 0
    assert not other.lock(name).is_locked()


def test_leader_sleep_raises_at_once_when_the_term_is_lost(
    make_sync: SyncFactory, name: str
) -> None:
    """``term.sleep(long)`` does not sleep through a loss: it raises LockLostError when
    the loss is found, long before its time."""
    client = make_sync(watchdog_timeout=WATCHDOG)
    other = make_sync()
    outcome: list[BaseException | None] = []
    elected = threading.Event()

    def work(term: aiolock.sync.Hold) -> None:
        elected.set()
        try:
            term.sleep(LIMIT * 10)
        except aiolock.LockLostError as exc:
            outcome.append(exc)
            raise
        outcome.append(None)

    def run() -> None:
        with contextlib.suppress(aiolock.LockLostError), client.leader(name).elected() as term:
            work(term)

    thread = threading.Thread(target=run)
    thread.start()
    assert elected.wait(LIMIT)
    assert other.lock(name).force_unlock()
    thread.join(LIMIT)
    assert not thread.is_alive(), "term.sleep() slept through the loss"
    assert len(outcome) == 1
    assert isinstance(outcome[0], aiolock.LockLostError)


def test_leader_run_calls_work_without_an_argument_when_it_takes_none(
    make_sync: SyncFactory, name: str
) -> None:
    client = make_sync()
    assert client.leader(name).run(lambda: "plain") == "plain"
    seen: list[Any] = []

    def with_default(term: Any = None) -> str:
        seen.append(term)
        return "term"

    assert client.leader(name).run(with_default) == "term"
    assert isinstance(seen[0], aiolock.sync.Hold)


def test_hold_sleep_refuses_bad_input(make_sync: SyncFactory, name: str) -> None:
    client = make_sync()
    with client.lock(name).guarded() as hold:
        with pytest.raises(TypeError, match="seconds"):
            hold.sleep(None)
        with pytest.raises(ValueError, match="seconds"):
            hold.sleep(-1)
        hold.sleep(0)  # a check, no wait


# -- per-thread state ------------------------------------------------------------------


def _async_handles_named(name: str) -> int:
    gc.collect()
    return sum(
        1
        for obj in gc.get_objects()
        if isinstance(obj, aiolock.Lock) and getattr(obj, "name", None) == name
    )


def test_a_long_lived_handle_keeps_no_state_of_ended_threads(
    make_sync: SyncFactory, name: str
) -> None:
    """A thread-per-request server: 200 short threads use one long-lived sync handle (a
    lock, a leader); the async handles of ended threads are freed (issue 37: one per
    thread ever, about 0.5 KB each, kept for ever)."""
    client = make_sync()
    lock = client.lock(name)
    leader = client.leader(f"{name}:leader")

    def request() -> None:
        with lock:
            pass
        leader.run(lambda: None)

    for _ in range(200):
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(LIMIT)
    # Left: at most the main thread's (from the handle's creation), not one per thread.
    assert _async_handles_named(name) <= 2
    assert _async_handles_named(f"{name}:leader") <= 2


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)
