"""The cancellation sweep: every public call of every lock type, cancelled at every loop
iteration until it completes untouched, with the contract checked after each case.

The default run sweeps a quick subset (every k up to 40, then sparse; the combinations
that matter most, every lock type covered); ``--full-sweep=server``
sweeps every k of every combination. See tests/sweep.py for the harness and the invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

import aiolock

from .conftest import ClientFactory, full_sweep
from .helpers import EventLedger, quiesce, wait_until
from .sweep import (
    CAP,
    GUARDED_CALLS,
    LEADER_CALLS,
    AnyLock,
    Holder,
    Kind,
    Scenario,
    Spec,
    Sweep,
    SweepResult,
    all_specs,
    cut_off_ks,
    handle,
    k_schedule,
    parked,
    rival_handle,
    rival_kind,
    state_key,
    unlock_cut_off_then_lock,
)

#: Rounds of the whole k sweep per combination in full mode: which await point a given k
#: lands on varies with the round trips' timing, so each round hits a slightly different set.
FULL_ROUNDS = 3
#: Rounds of the j sweep in the defect 1 test (which j hits the re-attempt varies).
DEFECT1_ROUNDS = 6


def _quick(spec: Spec) -> bool:
    """The combinations the default run sweeps: every call and scenario of every lock type
    for a task holder, and also for an ``owner=`` holder of the plain lock; the releases
    racing the first attempt or the subscription (rather than waking a parked waiter) only
    in full mode."""
    if spec.scenario in {Scenario.RACED_EARLY, Scenario.RACED_SUBSCRIBING}:
        return False
    if spec.call in GUARDED_CALLS | LEADER_CALLS:
        # Its acquire and release are those of the calls above: the plain lock's sweep
        # covers what the guard adds (its scope entered and left at every iteration).
        return spec.kind is Kind.LOCK and spec.owner is None
    return spec.owner is None or spec.kind is Kind.LOCK


# Their scripts are the reentrant lock's (with a token counter; without a publish): the
# quick sweep of each of their calls and scenarios covers what differs, and the full one of
# the lock the rest. Kept out of the full sweep, which must fit CI's hour.
_AS_THE_LOCK = frozenset({Kind.FENCED, Kind.SPIN})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the sweep: the quick subset by default, all with --full-sweep=server."""
    if "spec" in metafunc.fixturenames:
        full = full_sweep(metafunc.config, "server")
        specs = [
            spec for spec in all_specs() if _quick(spec) or (full and spec.kind not in _AS_THE_LOCK)
        ]
        metafunc.parametrize("spec", specs, ids=[spec.id for spec in specs])


_totals: dict[str, float] = {"sweeps": 0, "cases": 0, "seconds": 0.0}


@pytest.fixture(scope="module", autouse=True)
def _sweep_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """One line with the size of the sweep at the end of the module, past output capture."""
    _totals.update(sweeps=0, cases=0, seconds=0.0)
    yield
    if not _totals["sweeps"]:
        return
    mode = "full" if full_sweep(request.config, "server") else "quick"
    line = (
        f"cancel sweep ({mode}): {_totals['sweeps']:.0f} sweeps, {_totals['cases']:.0f} cases, "
        f"{_totals['seconds']:.1f} s"
    )
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is not None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(line)


async def test_cancel_sweep(
    spec: Spec,
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    request: pytest.FixtureRequest,
) -> None:
    """Cancelled at any loop iteration, the call raises CancelledError and leaves Redis
    holding exactly what the client believes; untouched, it does exactly its job."""
    full = full_sweep(request.config, "server")
    client, rival = make_client(), make_client()
    # The event stream through every case: each hold begun ends once, in order.
    ledger = EventLedger(client, rival)
    sweep = Sweep(spec, client, rival, raw, name)
    result = await sweep.run(k_schedule(full=full), rounds=FULL_ROUNDS if full else 1)
    _record(result, request.node.user_properties)
    if result.violations:
        raise AssertionError(result.report()) from result.crash
    assert ledger.events, "the sweep made no event"
    ledger.check_closed()


def _record(result: SweepResult, properties: list[tuple[str, object]]) -> None:
    """Count the sweep for the module's summary line; record it as record_property does."""
    _totals["sweeps"] += 1
    _totals["cases"] += result.cases
    _totals["seconds"] += result.seconds
    properties.append(("sweep_cases", result.cases))
    properties.append(("sweep_seconds", round(result.seconds, 3)))
    properties.append(("sweep_completed_at_k", result.completed_at))
    print(f"sweep {result.spec.id}: {result.cases} cases in {result.seconds:.2f} s")


# -- focused reproductions ------------------------------------------------------------------


# A spin lock's waiter is woken by no message: its race is the sweep's (spin_lock-*-raced).
WOKEN_BY_MESSAGE = [kind for kind in Kind if kind is not Kind.SPIN]


@pytest.mark.parametrize("kind", WOKEN_BY_MESSAGE, ids=[kind.value for kind in WOKEN_BY_MESSAGE])
async def test_defect1_async_with_waiter_cancelled_after_wake_does_not_enter_body(
    kind: Kind, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Defect 1: an ``async with lock:`` waiter woken by a release and cancelled an
    iteration or two later never enters its body (on 3.11 it did, with cancelling() == 1).

    The cancel is placed at every iteration j after the rival's release was sent, until
    the waiter enters its body before the cancel lands; at no j may it enter with a
    cancel already delivered. Which j hits the re-attempt depends on the round trips'
    timing: the sweep runs a few rounds.
    """
    client, other = make_client(), make_client()
    entered_cancelling: list[tuple[int, int]] = []
    for round_ in range(DEFECT1_ROUNDS):
        for j in range(CAP + 1):
            entered, untouched = await _defect1_case(
                kind, (client, other), raw, f"{name}/{round_}.{j}/", j
            )
            if entered is not None:
                entered_cancelling.append((j, entered))
            if untouched:
                break
        if entered_cancelling:
            break
    assert not entered_cancelling, (
        "the waiter entered its body with a cancel delivered (j, task.cancelling()): "
        f"{entered_cancelling}"
    )


async def _defect1_case(
    kind: Kind, clients: tuple[aiolock.Client, aiolock.Client], raw: Redis, lock_name: str, j: int
) -> tuple[int | None, bool]:
    """One j: (task.cancelling() if the body was entered after a cancel, else None;
    whether the waiter entered its body before the cancel was due)."""
    client, other = clients
    rival = rival_handle(other, kind, lock_name)
    lock = handle(client, kind, lock_name, None)
    await rival.lock()
    in_body = asyncio.Event()
    cancelling_in_body: list[int] = []

    async def waiter() -> None:
        async with lock:
            task = asyncio.current_task()
            assert task is not None
            cancelling_in_body.append(task.cancelling())
            in_body.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(waiter())
    await wait_until(lambda: parked(client, lock_name, kind), what="the waiter waits, subscribed")
    # The release and the cancel chain start in the same step: hop j is j iterations
    # after the release was sent.
    release = asyncio.create_task(rival.unlock())
    delivered = _cancel_at(task, j, in_body)
    await release
    with pytest.raises(asyncio.CancelledError):
        await task
    untouched = not delivered[0]
    assert cancelling_in_body or not untouched, f"j={j}: neither cancelled nor entered"
    await quiesce(client)
    assert await raw.exists(state_key(kind, lock_name)) == 0, (
        f"j={j}: the body's exit did not release"
    )
    if cancelling_in_body and (delivered[0] or cancelling_in_body[0]):
        return cancelling_in_body[0], untouched
    return None, untouched


def _cancel_at(task: asyncio.Task[None], j: int, entered: asyncio.Event) -> list[bool]:
    """Cancel ``task`` at the j-th loop iteration from now unless it entered its body first.

    Returns a one-item list: whether that cancel was delivered before the body was entered.
    A task found in its body is cancelled (again) to end it: a body cancellation, whose
    exit must release.
    """
    loop = asyncio.get_running_loop()
    delivered = [False]

    def hop(i: int) -> None:
        if task.done():
            return
        if entered.is_set():
            task.cancel()
            return
        if i == j:
            delivered[0] = task.cancel()
        loop.call_soon(hop, i + 1)

    loop.call_soon(hop, 0)
    return delivered


@pytest.mark.parametrize("owner", [None, "holder"], ids=["task", "owner"])
@pytest.mark.parametrize("kind", list(Kind), ids=[kind.value for kind in Kind])
async def test_defect8_reentry_is_immediate_while_another_local_task_waits(
    kind: Kind, owner: str | None, make_client: ClientFactory, raw: Redis, name: str
) -> None:
    """Defect 8: a holder's re-entrant ``lock()`` completes at once even while another task
    of the same client waits for the lock (it used to queue behind that waiter, which
    cannot get in before the holder lets go: stuck until the lease-bounded wait ran out).
    """
    client = make_client(watchdog_timeout=6)
    lock = handle(client, kind, name, owner)
    holder = Holder("holder")
    await holder.call(lock.lock)
    # Another task of the same client, on the side that the holder's hold excludes.
    other_kind = rival_kind(kind)
    other = handle(client, other_kind, name, None)

    async def other_waits_then_takes_it() -> None:
        await other.lock()
        await other.unlock()

    other_task = asyncio.create_task(other_waits_then_takes_it())
    await wait_until(
        lambda: parked(client, name, other_kind), what="the other task waits, subscribed"
    )
    reentry = holder.submit(lock.lock)
    try:
        # "At once": before 50 sequential round trips of a plain command on another
        # connection complete; a re-entry that waits for the other waiter takes seconds.
        pings = 0
        while not reentry.finished and pings < 50:
            await raw.ping()
            pings += 1
        assert reentry.finished, "the re-entrant lock() still waited after 50 round trips"
        assert reentry.error is None, repr(reentry.error)
        assert not other_task.done(), "the other task got in while the holder held the lock"
        assert _waiting(client, kind, name), "the other task stopped waiting"
        assert await holder.call(lock.hold_count) == 2
    finally:
        # Whatever happened, let go (a stuck re-entry ends within its lease-bounded wait).
        async with asyncio.timeout(20):
            await reentry.done.wait()
        for _ in range(await holder.call(lock.hold_count)):
            await holder.call(lock.unlock)
        async with asyncio.timeout(10):
            await other_task
        await holder.stop()
    await quiesce(client)
    assert await raw.exists(state_key(kind, name)) == 0


def _waiting(client: aiolock.Client, kind: Kind, name: str) -> bool:
    return handle(client, kind, name, "probe").statistics().tasks_waiting == 1


#: Rounds of the k sweep of a read unlock cut off: a release takes only a few iterations,
#: and which step a given k lands on varies with the round trip's timing.
CUT_OFF_ROUNDS = 5


@pytest.mark.parametrize("owner", [None, "holder"], ids=["task", "owner"])
@pytest.mark.parametrize("kind", [Kind.READ, Kind.FREAD], ids=["read_lock", "fair_read_lock"])
async def test_write_lock_after_a_read_unlock_cut_off_at_every_step(
    *,
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    kind: Kind,
    owner: str | None,
    request: pytest.FixtureRequest,
) -> None:
    """A read unlock() cut off by a timeout at every loop iteration k (finished in the
    background), then the same task's write lock(): it waits for that release and gets in,
    never refused as an upgrade (the read hold is on its way out)."""
    full = full_sweep(request.config, "server")
    client = make_client()
    write_kind = rival_kind(kind)
    problems: list[str] = []
    cut_at: list[int] = []
    for round_ in range(FULL_ROUNDS * CUT_OFF_ROUNDS if full else CUT_OFF_ROUNDS):
        for k in cut_off_ks(full=full):
            key = f"{name}/{round_}.{k}"
            reader = handle(client, kind, key, owner)
            writer = handle(client, write_kind, key, owner)

            async def case(reader: AnyLock = reader, writer: AnyLock = writer, k: int = k) -> bool:
                await reader.lock()
                cut = await unlock_cut_off_then_lock(reader, writer, k)
                # The write lock waited for the release: the read hold is gone.
                if reader.statistics().hold_count or await writer.hold_count() != 1:
                    problems.append(f"k={k}: the read hold outlived the write lock()")
                await writer.unlock()
                return cut

            try:
                cut = await asyncio.create_task(case())
            except Exception as exc:
                problems.append(f"k={k}: {exc!r}")
                cut = True
            await quiesce(client)
            left = [key async for key in raw.scan_iter(match=f"*{key}*") if "latch" not in key]
            if left:
                problems.append(f"k={k}: left behind {left}")
                await raw.delete(*left)
            if not cut:
                break
            cut_at.append(k)
    assert not problems, "\n".join(problems)
    assert cut_at, "no case was cut off"
    print(f"cut off at k={sorted(set(cut_at))}")
