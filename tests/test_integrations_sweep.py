"""The cancellation sweep and the fault proxy over the helpers built on guarded holds (issue 22).

tests/sweep.py sweeps ``guarded()`` and ``leader.elected()`` call by call. What the helpers
add around them is swept here, whole: a call of a ``@client.locked`` function, a request
through a FastAPI ``hold`` dependency (httpx's ASGI transport runs the app in the calling
task, so a cancel reaches it at any await), and ``held()``, the request hold the FastAPI
and aiohttp helpers share (its disconnect watcher and timeout scope). Each is cancelled at
the k-th loop iteration after it started, k = 0, 1, 2, ... until one completes first; the
lock is free, or held by a rival that releases it at the first iteration the call is
parked. After each case, both clients quiet:

1. a cancel that was delivered raised ``CancelledError`` (never an answer, never a
   return), and a body that ran either ran to its end or was cancelled;
2. nothing is left: the lock's key is gone, neither client believes a hold or has a
   waiter, and the event stream balanced;
3. the client takes the lock at once afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import httpx
import pytest
from fastapi import Depends, FastAPI
from redis.asyncio import Redis

import aiolock
from aiolock.integrations._common import Refused, Route, held
from aiolock.integrations.fastapi import hold, lifespan

from .conftest import ClientFactory
from .faultproxy import FaultProxy
from .helpers import CANCELLED, EventLedger, quiesce, wait_until
from .sweep import k_schedule, parked

LIMIT = 10.0
CALLERS = ("decorator", "held", "fastapi")
SCENARIOS = ("free", "raced")

Runner = Callable[[str], Awaitable[object]]
#: What an untouched call of each helper returns.
EXPECTED: dict[str, object] = {"decorator": "done", "held": "done", "fastapi": (200, "done")}


class Bodies:
    """What the bodies of the swept calls did: entered, finished."""

    def __init__(self) -> None:
        self.entered = 0
        self.finished = 0

    async def body(self) -> str:
        self.entered += 1
        # A few iterations inside the body, so that some k land there.
        for _ in range(3):
            await asyncio.sleep(0)
        self.finished += 1
        return "done"


async def _never() -> None:
    await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def runner(
    caller: str, client: aiolock.Client, url: str, bodies: Bodies
) -> AsyncIterator[tuple[Runner, aiolock.Client]]:
    """``run(name)``: one call of ``caller`` holding ``name``, the body ``bodies.body()``;
    and the client that holds it (the app's own, for FastAPI)."""
    if caller == "decorator":

        async def run_decorated(name: str) -> object:
            @client.locked(name, wait=5)
            async def work() -> str:
                return await bodies.body()

            return await work()

        yield run_decorated, client
    elif caller == "held":
        route = Route("locked", "{name}", wait=5, lease=None, kind="lock", retry_after=1)

        async def run_held(name: str) -> object:
            try:
                async with held(route, route.handle(client, {"name": name}), _never):
                    return await bodies.body()
            except Refused as refused:
                return refused.status

        yield run_held, client
    else:
        app = FastAPI(lifespan=lifespan(url))

        @app.post("/{name}", dependencies=[Depends(hold("{name}", wait=5))])
        async def work(name: str) -> str:
            return await bodies.body()

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
                swept = app.state.aiolock_client
                assert isinstance(swept, aiolock.Client)

                async def run_request(name: str) -> object:
                    response = await http.post(f"/{name}")
                    return response.status_code, response.json()

                yield run_request, swept


def chain(
    task: asyncio.Future[object],
    k: int,
    due: Callable[[], bool] | None,
    release: Callable[[], Awaitable[None]] | None,
    releases: list[asyncio.Future[None]],
) -> asyncio.Event:
    """Count loop iterations from now: cancel ``task`` at the k-th (if it still runs), and
    start ``release()`` at the first where ``due()`` holds (or the task is over).

    A chain of call_soon hops, as tests/sweep.py's Ticker: the release is placed by the
    call's progress (its waiter parked), not by a poll that iterations would outrun.
    Returns an event set once the chain is over (the task done, the release started).
    """
    loop = asyncio.get_running_loop()
    over = asyncio.Event()

    def hop(i: int) -> None:
        if release is not None and not releases and (task.done() or (due is not None and due())):
            releases.append(asyncio.ensure_future(release()))
        if i == k and not task.done():
            task.cancel()
        if task.done() and (release is None or releases):
            over.set()
            return
        loop.call_soon(hop, i + 1)

    loop.call_soon(hop, 0)
    return over


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("caller", CALLERS)
async def test_cancel_sweep_of_the_helpers(  # noqa: PLR0917 - pytest's fixtures
    caller: str,
    scenario: str,
    make_client: ClientFactory,
    raw: Redis,
    redis_url: str,
    name: str,
    request: pytest.FixtureRequest,
) -> None:
    """Cancelled at any loop iteration, a helper's call raises CancelledError and leaves
    nothing; untouched, it runs its body once holding the lock and releases it."""
    full = bool(request.config.getoption("--faults"))
    rival = make_client()
    bodies = Bodies()
    expected = EXPECTED[caller]
    async with runner(caller, make_client(), redis_url, bodies) as (run, client):
        ledger = EventLedger(client, rival)
        untouched = False
        cases = 0
        for k in k_schedule(full=full):
            cases += 1
            case = f"{name}:{k}"
            entered, finished = bodies.entered, bodies.finished
            if scenario == "raced":
                await rival.lock(case, owner="rival").lock()
            task = asyncio.ensure_future(run(case))
            releases: list[asyncio.Future[None]] = []
            if scenario == "raced":
                due = partial(parked, client, case)
                unlock = partial(rival.lock(case, owner="rival").unlock)
                chained = chain(task, k, due, unlock, releases)
            else:
                chained = chain(task, k, None, None, releases)
            try:
                async with asyncio.timeout(LIMIT):
                    outcome = await task
            except asyncio.CancelledError:
                outcome = CANCELLED
            # The chain starts the release at its next hop at the latest.
            async with asyncio.timeout(LIMIT):
                await chained.wait()
                await asyncio.gather(*releases)
            untouched = outcome != CANCELLED
            # 1. A delivered cancel raised; a completed call answered what it should.
            assert outcome in (CANCELLED, expected), f"k={k}: {outcome!r}"
            ran = bodies.entered - entered
            done = bodies.finished - finished
            assert ran <= 1
            if outcome == CANCELLED:
                assert done <= ran
            else:
                assert (ran, done) == (1, 1), f"k={k}: the body ran {ran}, finished {done}"
            # 2. Nothing left once both clients are quiet.
            for c in (client, rival):
                await quiesce(c)
            assert await raw.exists(case) == 0, f"k={k} ({outcome!r}): the lock left held"
            stats = client.lock(case).statistics()
            assert (stats.hold_count, stats.tasks_waiting) == (0, 0), f"k={k}: {stats}"
            # 3. The lock is free for this client at once.
            lock = client.lock(case)
            assert await lock.try_lock(wait=0)
            await lock.unlock()
            if untouched:
                break
        assert untouched, f"still cancelled at k={k}: widen k_schedule"
        ledger.check_closed()
    request.node.user_properties.append(("sweep_cases", cases))
    print(f"{caller}-{scenario}: {cases} cases, untouched from k={k}")


async def test_helpers_cut_off_by_the_proxy(
    make_client: ClientFactory, proxy: FaultProxy, raw: Redis, name: str
) -> None:
    """The link cut while a decorated call and a FastAPI request hold their locks: both
    bodies are cancelled by confirmed_until (LockLostError; 503), neither waits on the
    unreachable server, and once the link is back both locks are free."""
    url = proxy.url + "?socket_timeout=10"
    client = aiolock.Client.from_url(url, watchdog_timeout=0.9)
    entered = asyncio.Event(), asyncio.Event()
    app = FastAPI(lifespan=lifespan(url, watchdog_timeout=0.9))

    @client.locked(name + ":{n}")
    async def work(n: int) -> None:
        entered[0].set()
        await _never()

    @app.post("/{n}", dependencies=[Depends(hold(name + ":web:{n}"))])
    async def web(n: int) -> None:
        entered[1].set()
        await _never()

    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
                decorated = asyncio.create_task(work(1))
                posted = asyncio.create_task(http.post("/1"))
                async with asyncio.timeout(LIMIT):
                    await entered[0].wait()
                    await entered[1].wait()
                proxy.cut()
                async with asyncio.timeout(LIMIT):
                    with pytest.raises(aiolock.LockLostError):
                        await decorated
                    response = await posted
                assert response.status_code == 503
                assert "was lost" in response.json()["detail"]
                await proxy.restore("resume")
                for key in (f"{name}:1", f"{name}:web:1"):
                    await wait_until(partial(_absent, raw, key), limit=LIMIT, what=key)
    finally:
        await proxy.restore("resume")
        await client.aclose()


async def _absent(raw: Redis, key: str) -> bool:
    return await raw.exists(key) == 0
