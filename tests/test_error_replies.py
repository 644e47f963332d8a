"""Error replies, not lost connections: every refusal at every call site, systematically.

A server refuses a command unrun with BUSY (another client's script runs long), TRYAGAIN
(a slot migration), CLUSTERDOWN, MASTERDOWN, LOADING, READONLY or OOM (both at a script's
first write, so it wrote nothing). The fault proxy answers a chosen script with one of them
in the server's place (``FaultProxy.refuse``): the server never runs it, as a real refusal.
Each call site is tried with each refusal, transient (refused a few times, then answered)
and for good, and the cancellation sweep runs with every first send refused; after each,
the client's belief and the server's state must agree: nothing tracked that is not on the
server, nothing on the server untracked without an expiry, and a refusal that outlasts the
retries is the caller's error (a release's is finished in the background, never renewed).

The default run takes one refusal per site and sweep in rotation (each refusal covered);
``--full-sweep=server`` runs the cross product.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

import aiolock
from aiolock._net.resp import error_reply

from . import inside
from .conftest import ClientFactory, full_sweep
from .faultproxy import REFUSALS, FaultProxy, Match, Words, script
from .helpers import FAST, quiesce, wait_until
from .sweep import Call, Kind, Scenario, Spec, Sweep, SweepResult, k_schedule

LIMIT = 10.0
CODES = sorted(REFUSALS)
#: The client's retries: a refusal that comes RETRIES + 1 times in a row outlasts them.
RETRIES = 2
#: The refusals of a state that passes (an acquire with a wait rides them out); OOM and
#: READONLY (outside Sentinel) get the client's retries only.
PASSING = frozenset({"BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "LOADING"})


#: The refusals a test runs by default where not every one (--full-sweep=server: every one).
_QUICK_CODES = {
    "test_acquire_refused_past_the_retries": ["TRYAGAIN", "OOM", "LOADING"],
    "test_renewal_refused_keeps_the_hold": ["READONLY"],
    # Each waits out a socket timeout (the acquire's reply dropped); the sweep's rollback
    # site covers CLUSTERDOWN and READONLY too.
    "test_rollback_refused_is_resent": ["BUSY", "OOM"],
    "test_semaphore_release_refused_past_the_retries_is_made_once": ["MASTERDOWN"],
    # c02's BUSY and b03's TRYAGAIN: each waits for a lease to end.
    "test_release_refused_for_good_is_reported_and_its_lease_ends": ["BUSY", "TRYAGAIN"],
}


def _full(config: pytest.Config) -> bool:
    return full_sweep(config, "server")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every refusal for every test with --full-sweep=server; by default those the test names."""
    if "code" in metafunc.fixturenames:
        quick = _QUICK_CODES.get(metafunc.function.__name__, CODES)
        codes = CODES if _full(metafunc.config) else quick
        metafunc.parametrize("code", codes)
    if "sweep_case" in metafunc.fixturenames:
        cases = _sweep_cases(full=_full(metafunc.config))
        metafunc.parametrize("sweep_case", cases, ids=[_sweep_id(*case) for case in cases])


def _expected(code: str) -> type[Exception]:
    """The exception redis-py (and aiolock) raises for refusal ``code``."""
    return type(error_reply(REFUSALS[code]))


@pytest.fixture
async def refused_client(proxy: FaultProxy, raw: Redis) -> AsyncIterator[aiolock.Client]:
    """A client through the proxy with quick retries (a lease of 3 s, renewed each 1 s).

    Closed before ``raw`` checks that nothing is left (its close sweeps its latches).
    """
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=3, retry_attempts=RETRIES, retry_interval=0.01
    )
    yield client
    await client.aclose()


async def _agree(client: aiolock.Client, raw: Redis, name: str, holder: str) -> int:
    """Check that ``client``'s belief about ``holder``'s holds on ``name`` is the server's.

    Once the background work is done: a count it tracks is on the server and renewed; a
    hold on the server it does not track has an expiry. Returns the count.
    """
    await quiesce(client)
    field = f"{client.id}:owner:{holder}"
    believed = client.lock(name, owner=holder).statistics().hold_count
    on_server = int(await raw.hget(name, field) or 0)
    if believed:
        assert on_server == believed, f"the client believes {believed}, Redis has {on_server}"
        assert len(inside.renewal(client)) > 0, "a hold the client believes in is not renewed"
    elif on_server:
        assert await raw.pttl(name) > 0, "a hold nobody tracks has no expiry"
    return believed


# -- acquire ------------------------------------------------------------------------------


async def test_acquire_refused_past_the_retries(
    code: str, proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A try_lock(wait=0) refused past the retries raises the refusal and holds nothing;
    lock() (no deadline) rides out a passing refusal (TRYAGAIN, CLUSTERDOWN...: defect b08)
    and raises the others (OOM, READONLY); either way belief and server agree."""
    lock = refused_client.lock(name, owner="o")
    refuse = proxy.refuse(script("lock_acquire"), code, times=RETRIES + 1)
    with pytest.raises(_expected(code)):
        await lock.try_lock(wait=0)
    assert await _agree(refused_client, raw, name, "o") == 0
    assert await raw.exists(name) == 0
    refuse = proxy.refuse(script("lock_acquire"), code, times=2 * (RETRIES + 1))
    if code in PASSING:
        await asyncio.wait_for(lock.lock(), LIMIT)
        assert refuse.count == 2 * (RETRIES + 1)
        assert await _agree(refused_client, raw, name, "o") == 1
        await lock.unlock()
    else:
        with pytest.raises(_expected(code)):
            await lock.lock()
        refuse.remove()
        assert await _agree(refused_client, raw, name, "o") == 0
    assert await raw.exists(name) == 0


async def test_acquire_with_a_wait_gives_up_at_its_deadline_on_refusals(
    proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """try_lock(wait=w) keeps resending a passing refusal until its deadline, then raises
    it: bounded by the wait, never by the retries alone (0.02 s here)."""
    lock = refused_client.lock(name, owner="o")
    with proxy.refuse(script("lock_acquire"), "CLUSTERDOWN") as refuse:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(_expected("CLUSTERDOWN")):
            await asyncio.wait_for(lock.try_lock(wait=0.5), LIMIT)
        assert loop.time() - started >= 0.5
        assert refuse.count > RETRIES + 1
    assert await _agree(refused_client, raw, name, "o") == 0


async def test_acquire_refused_without_end_is_cancellable(
    proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """lock() riding out refusals (no deadline) stops at a cancel and leaves nothing."""
    lock = refused_client.lock(name, owner="o")
    with proxy.refuse(script("lock_acquire"), "TRYAGAIN") as refuse:
        task = asyncio.create_task(lock.lock())
        await wait_until(lambda: refuse.count > RETRIES + 2, what="resent past the retries")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await _agree(refused_client, raw, name, "o") == 0
    assert await raw.exists(name) == 0


# -- release ------------------------------------------------------------------------------


async def test_release_refused_past_the_retries_is_finished_in_the_background(
    code: str, proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Defect b03: an unlock() refused past the retries raises the refusal; the hold is no
    longer renewed, and the release is resent in the background until it lands."""
    lock = refused_client.lock(name, owner="o")
    await lock.lock()
    refuse = proxy.refuse(script("lock_release"), code, times=2 * (RETRIES + 1))
    with pytest.raises(_expected(code)):
        await lock.unlock()
    assert len(inside.renewal(refused_client)) == 0, "the hold is still renewed"
    await quiesce(refused_client)
    assert refuse.count == 2 * (RETRIES + 1)
    assert await _agree(refused_client, raw, name, "o") == 0
    assert await raw.exists(name) == 0
    assert await lock.try_lock(wait=0)
    await lock.unlock()


async def test_release_refused_for_good_is_reported_and_its_lease_ends(
    code: str,
    proxy: FaultProxy,
    raw: Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defects c02/b03: a release refused until the lease ends: the caller gets the error,
    renewal stops, the hold is reported (WARNING naming the lock and the holder) and
    dropped, and the lock runs out on the server (it is never renewed again)."""
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=0.5, retry_attempts=RETRIES, retry_interval=0.01
    )
    try:
        lock = client.lock(name, owner="o")
        await lock.lock()
        with (
            caplog.at_level(logging.WARNING, logger="aiolock"),
            proxy.refuse(script("lock_release"), code),
        ):
            with pytest.raises(_expected(code)):
                await lock.unlock()
            assert len(inside.renewal(client)) == 0, "the hold is still renewed"
            await quiesce(client)
            assert lock.statistics().hold_count == 0
            await wait_until(lambda: _raw_gone(raw, name), what="the lease ended", limit=LIMIT)
        assert f"could not release lock {name!r} held by {client.id}:owner:o" in caplog.text
        assert "refused it" in caplog.text
    finally:
        await client.aclose()


async def _raw_gone(raw: Redis, name: str) -> bool:
    return await raw.exists(name) == 0


async def test_cancelled_release_whose_resend_is_refused(
    code: str, proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """Defect c02: an unlock() cancelled while refused is finished in the background; while
    the server keeps refusing it the hold is not renewed, and once it answers the lock is
    released (before the fix the hold stayed tracked and renewed for the task's life)."""
    lock = refused_client.lock(name, owner="o")
    await lock.lock()
    with proxy.refuse(script("lock_release"), code) as refuse:
        unlock = asyncio.create_task(lock.unlock())
        await wait_until(lambda: refuse.count >= 1, what="the release was refused")
        unlock.cancel()
        with pytest.raises(asyncio.CancelledError):
            await unlock
        await wait_until(lambda: len(inside.renewal(refused_client)) == 0, what="renewal stopped")
        await wait_until(lambda: refuse.count > RETRIES + 2, what="resent in the background")
    await quiesce(refused_client)
    assert await _agree(refused_client, raw, name, "o") == 0
    assert await raw.exists(name) == 0


# -- rollback and renewal -------------------------------------------------------------------


async def test_rollback_refused_is_resent(
    code: str, proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """An acquire cancelled in flight, then its rollback refused past the retries: the
    rollback is resent until it lands, and the lock ends free."""
    lock = refused_client.lock(name, owner="o")
    drop = proxy.drop_reply(script("lock_acquire"))
    refuse = proxy.refuse(script("lock_rollback"), code, times=2 * (RETRIES + 1))
    acquire = asyncio.create_task(lock.lock())
    await asyncio.wait_for(drop.executed.wait(), LIMIT)
    acquire.cancel()
    with pytest.raises(asyncio.CancelledError):
        await acquire
    await quiesce(refused_client)
    assert refuse.count == 2 * (RETRIES + 1)
    assert await _agree(refused_client, raw, name, "o") == 0
    assert await raw.exists(name) == 0


async def test_renewal_refused_keeps_the_hold(
    code: str,
    proxy: FaultProxy,
    raw: Redis,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewal round refused past the retries is tried again next round: the hold is
    kept and renewed, and nothing is reported lost."""
    client = aiolock.Client.from_url(
        proxy.url + FAST, watchdog_timeout=0.9, retry_attempts=RETRIES, retry_interval=0.01
    )
    try:
        lock = client.lock(name, owner="o")
        await lock.lock()
        with caplog.at_level(logging.WARNING, logger="aiolock"):
            refuse = proxy.refuse(script("lock_renew"), code, times=RETRIES + 1)
            await wait_until(lambda: not refuse.active, what="a renewal round refused")
            rounds = inside.renewal(client).rounds
            await wait_until(
                lambda: inside.renewal(client).rounds >= rounds + 2, what="2 more rounds"
            )
        assert "was lost" not in caplog.text
        assert await _agree(client, raw, name, "o") == 1
        await lock.unlock()
        assert await raw.exists(name) == 0
    finally:
        await client.aclose()


# -- the cancellation sweep, every first send refused -----------------------------------------

#: The call sites of the sweep: which script of the lock type gets the refusals.
SITES = ("acquire", "release", "rollback")
_SCRIPTS = {
    Kind.LOCK: "lock",
    Kind.FAIR: "fair",
    Kind.READ: "rw_read",
    Kind.WRITE: "rw_write",
    Kind.FREAD: "frw",
    Kind.FWRITE: "frw",
}
# Per site, the calls that reach that script (a rollback follows a cancelled acquire).
_SITE_SPECS = {
    "acquire": ((Call.LOCK, Scenario.RACED), (Call.TRY0, Scenario.REENTRANT)),
    "release": ((Call.UNLOCK, Scenario.COUNT2), (Call.AEXIT, Scenario.WOKEN)),
    "rollback": ((Call.LOCK, Scenario.FREE), (Call.AENTER, Scenario.REENTRANT)),
}
# The default run: each refusal at one site, one call, the reentrant lock.
_QUICK = {
    "BUSY": "release",
    "TRYAGAIN": "acquire",
    "CLUSTERDOWN": "rollback",
    "MASTERDOWN": "release",
    "LOADING": "acquire",
    "READONLY": "rollback",
    "OOM": "release",
}

SweepCase = tuple[str, str, Spec]


def _sweep_cases(*, full: bool) -> list[SweepCase]:
    if not full:
        return [
            (code, site, Spec(Kind.LOCK, *_SITE_SPECS[site][0], None))
            for code, site in _QUICK.items()
        ]
    return [
        (code, site, Spec(kind, call, scenario, None))
        for code in CODES
        for site in SITES
        for kind in _SCRIPTS
        for call, scenario in _SITE_SPECS[site]
    ]


def _sweep_id(code: str, site: str, spec: Spec) -> str:
    return f"{code}-{site}-{spec.id}"


def first_sends(match: Match) -> Match:
    """Match the first send of each distinct command only: a resend of it (the same words:
    same target count, tombstone or latch) is let through."""
    seen: set[tuple[bytes, ...]] = set()

    def first(words: Words) -> bool:
        if not match(words):
            return False
        key = tuple(words)
        if key in seen:
            return False
        seen.add(key)
        return True

    return first


_totals: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _sweep_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Per refusal, the sweeps' size and time at the end of the module, past capture."""
    _totals.clear()
    yield
    if not _totals:
        return
    mode = "full" if _full(request.config) else "quick"
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for code, t in sorted(_totals.items()):
            reporter.write_line(
                f"refusal sweep ({mode}) {code}: {t['sweeps']:.0f} sweeps, "
                f"{t['cases']:.0f} cases, {t['seconds']:.1f} s"
            )


def _record(code: str, result: SweepResult, properties: list[tuple[str, Any]]) -> None:
    totals = _totals.setdefault(code, {"sweeps": 0, "cases": 0, "seconds": 0.0})
    totals["sweeps"] += 1
    totals["cases"] += result.cases
    totals["seconds"] += result.seconds
    properties.append(("sweep_cases", result.cases))
    properties.append(("sweep_seconds", round(result.seconds, 3)))


async def test_cancel_sweep_with_refusals(
    sweep_case: SweepCase,
    proxy: FaultProxy,
    make_client: ClientFactory,
    raw: Redis,
    name: str,
    request: pytest.FixtureRequest,
) -> None:
    """The cancellation sweep of a call whose script's every first send is refused (the
    client's retry resends it): cancelled at any loop iteration, including in the retry's
    pause, the call raises CancelledError and Redis holds exactly what the client believes;
    untouched, it does its job."""
    code, site, spec = sweep_case
    a = aiolock.Client.from_url(
        proxy.url + FAST, retry_attempts=RETRIES, retry_interval=0.001, watchdog_timeout=6
    )
    try:
        refuse = proxy.refuse(first_sends(script(f"{_SCRIPTS[spec.kind]}_{site}")), code)
        sweep = Sweep(spec, a, make_client(), raw, name)
        # Every k up to 40, then sparse, even with a full sweep: the cross product of refusals,
        # sites, lock types and calls is the full sweep's breadth (every k would take 4x).
        result = await sweep.run(k_schedule(full=False))
    finally:
        await a.aclose()
    _record(code, result, request.node.user_properties)
    if result.violations:
        raise AssertionError(result.report()) from result.crash
    assert refuse.count > 0, f"no {site} script was refused: the sweep missed its site"


def test_the_refusals_are_error_replies() -> None:
    """Each refusal is an error reply redis-py classes as an error (BUSY: a ResponseError)."""
    for code in CODES:
        assert issubclass(_expected(code), RedisError), code


# -- the counting objects -------------------------------------------------------------------


async def test_semaphore_release_refused_past_the_retries_is_made_once(
    code: str, proxy: FaultProxy, refused_client: aiolock.Client, raw: Redis, name: str
) -> None:
    """A semaphore's release() refused past the retries raises the refusal and is made in
    the background once the server answers: exactly once (its latch)."""
    sem = refused_client.semaphore(name)
    assert await sem.try_set_permits(1)
    assert await sem.try_acquire()
    refuse = proxy.refuse(script("semaphore_add"), code, times=2 * (RETRIES + 1))
    with pytest.raises(_expected(code)):
        await sem.release()
    await quiesce(refused_client)
    assert refuse.count == 2 * (RETRIES + 1)
    assert await raw.get(name) == "1"
    await raw.delete(name)
