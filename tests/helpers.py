"""Test helpers: waiting on conditions with a deadline, and gating a chosen command."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

import aiolock
from aiolock._net.scripts import Script, ScriptRunner, load_script
from aiolock.events import (
    SEMAPHORE_KINDS,
    Acquired,
    AcquireFailed,
    Event,
    Lost,
    Released,
    Waiting,
)

from . import inside


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], *, limit: float = 10.0, what: str = ""
) -> None:
    """Wait until ``predicate()`` is true; fail the test if ``limit`` seconds pass first.

    For state owned by Redis or by other tasks, where no event can be awaited directly.
    """
    deadline = time.monotonic() + limit
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {limit} s: {what or predicate}")
        await asyncio.sleep(0.005)


class Gate:
    """Holds the reply of one chosen script call: sent to the server, reply pending.

    Armed ``before_send``, it holds the call before it is sent instead (``sent`` is then
    set when the call is ready to go). Armed ``swallow_cancel``, a cancel that lands while
    the reply is held is swallowed and the reply returned all the same, as Python 3.11's
    ``asyncio.wait_for`` can do (aiolock's transport uses none, but the engine must hold
    even then). It sits on the client's command connection (:meth:`attach`).
    """

    def __init__(self) -> None:
        self.target: bytes | None = None
        self.before_send = False
        self.swallow_cancel = False
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    def arm(self, script: str, *, before_send: bool = False, swallow_cancel: bool = False) -> None:
        """Gate the next EVALSHA of the package script ``script``."""
        self.target = load_script(script).sha.encode()
        self.before_send = before_send
        self.swallow_cancel = swallow_cancel
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    def attach(self, client: aiolock.Client) -> aiolock.Client:
        """Gate ``client``'s command connection; returns the client."""
        transport: Any = inside.transport(client)
        original = transport.call

        async def call(command: bytes) -> Any:
            if self.target is None or self.target not in command:
                return await original(command)
            self.target = None
            if self.before_send:
                self.sent.set()
                await self.release.wait()
                return await original(command)
            # Written to the server, as the transport writes a call: its reply is then
            # held back until release, as if the server were slow to answer.
            wire = await inside.ready_wire(transport, 1)
            future = asyncio.get_running_loop().create_future()
            inside.put(transport, wire, command, future)
            self.sent.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                if not self.swallow_cancel:
                    future.cancel()  # what a cancelled caller's future is: its reply dropped
                    raise
                # What 3.11's wait_for does when the cancel and the result meet: it
                # returns the result and the task carries on with cancelling() > 0.
                await self.release.wait()
            reply = await future
            if isinstance(reply, Exception):
                raise reply
            return reply

        send = transport.send

        def send_ungated(command: bytes) -> Any:
            # The gated command goes through call() above (send's None says "call").
            if self.target is not None and self.target in command:
                return None
            return send(command)

        transport.call = call
        transport.send = send_ungated
        return client


def gated_redis(url: str) -> tuple[Redis, Gate]:
    """A redis client and a gate to :meth:`~Gate.attach` to the aiolock client built on it."""
    return Redis.from_url(url), Gate()


def dispatchers_of(client: Any) -> list[Any]:
    """The client's pub/sub dispatchers: its one, or one per primary on a cluster."""
    topology = inside.topology(client)
    return (
        topology.dispatchers() if hasattr(topology, "dispatchers") else [inside.dispatcher(client)]
    )


def subscriptions_confirmed(client: Any) -> bool:
    """Whether the client subscribes to some channel and the server confirmed every one.

    A task counts as waiting from the moment it enters the wait, before its SUBSCRIBE is
    answered: a test that looks at the server's subscriptions waits for this first.
    """
    channels = [c for d in dispatchers_of(client) for c in inside.channels_of(d).values()]
    return bool(channels) and all(c.confirmed.is_set() for c in channels)


def _settling(client: Any) -> set[Any]:
    """The client's background completions still running (rollbacks, releases, leaves).

    The long-lived background tasks (renewal, pub/sub readers, latch sweeper) do not count.
    """
    readers = {inside.reader_of(dispatcher) for dispatcher in dispatchers_of(client)}
    lasting = {
        inside.task_of(inside.renewal(client)),
        inside.task_of(inside.latches(client)),
        *readers,
    }
    return {task for task in inside.background(client).tasks if task not in lasting}


async def quiesce(client: Any, *, limit: float = 30.0) -> None:
    """Wait until every background completion of ``client`` has finished.

    A cancelled or cut-off call finishes its work (undo an acquire, complete a release,
    leave a fair queue) in the background; checks of Redis state against the client's
    belief are made once that work is done.
    """
    await wait_until(lambda: not _settling(client), limit=limit, what="background work settled")


#: Short socket timeouts, so that a reply a fault proxy drops costs a fraction of a second.
FAST = "?socket_timeout=0.3&socket_connect_timeout=0.3"


def cancel_at(task: asyncio.Task[Any], k: int) -> None:
    """Cancel ``task`` at the k-th event-loop iteration from now, if it still runs."""
    loop = asyncio.get_running_loop()

    def hop(i: int) -> None:
        if task.done():
            return
        if i == k:
            task.cancel()
            return
        loop.call_soon(hop, i + 1)

    loop.call_soon(hop, 0)


#: What :func:`run_cancellable` answers for a call that was cancelled.
CANCELLED = "cancelled"


async def run_cancellable(
    coro: Awaitable[Any],
    cancel: int | None,
    clients: list[aiolock.Client],
    *,
    errors: tuple[type[BaseException], ...] = (),
    limit: float = 10.0,
) -> Any:
    """Run ``coro`` in a task, cancelled at loop iteration ``cancel`` if given, then wait
    until ``clients`` are quiet: its value, CANCELLED, or one of ``errors`` it raised."""
    task = asyncio.ensure_future(coro)
    if cancel is not None:
        cancel_at(task, cancel)
    try:
        async with asyncio.timeout(limit):
            return await task
    except asyncio.CancelledError:
        return CANCELLED
    except errors as exc:
        return exc
    finally:
        for client in clients:
            await quiesce(client)


async def subscribe_confirmed(pubsub: PubSub, *channels: str) -> None:
    """Subscribe ``pubsub`` and wait until the server counts each subscription.

    A bare ``subscribe()`` only sends the command: a message published on another
    connection right after may reach the server first and be missed.
    """
    reader = Redis(connection_pool=pubsub.connection_pool)
    try:
        before = {str(c): int(n) for c, n in await reader.pubsub_numsub(*channels)}
        await pubsub.subscribe(*channels)

        async def counted() -> bool:
            now = {str(c): int(n) for c, n in await reader.pubsub_numsub(*channels)}
            return all(now[c] > before[c] for c in channels)

        await wait_until(counted, what=f"subscribed to {channels}")
    finally:
        await reader.aclose()


class EventLedger:
    """A listener that checks the event stream's balance (``aiolock.events``).

    Holds: every ``Released`` or ``Lost`` ends a hold that an ``Acquired`` (not reentrant)
    began, once: per (kind, name, holder) the count of open holds never goes below 0 nor
    above 1; once everything is released, none is open (what a metric of holds held relies
    on). Waits: per client and (kind, name), each ``Waiting`` moves the count by one from
    the last, never below 0; every wait started is followed by an ``Acquired`` or
    ``AcquireFailed`` of that lock (the call's end: just before its last ``Waiting`` if it
    got the lock, after it if not); once nothing waits, the count is 0 (what
    ``aiolock.waiting`` relies on). Attach clients with ``attach()`` (or the constructor):
    called directly, the ledger takes every event for one client's.
    """

    def __init__(self, *clients: aiolock.Client) -> None:
        self.open: dict[tuple[str, str, str], int] = {}
        # Per (client id, kind, name): the client's last told count of waiting calls.
        self.waiting: dict[tuple[str, str, str], int] = {}
        # Per (kind, name): waits started whose call has not yet told its end.
        self.unended: dict[tuple[str, str], int] = {}
        self.faults: list[str] = []
        self.events = 0
        self.waits = 0
        for client in clients:
            self.attach(client)

    def attach(self, client: aiolock.Client) -> None:
        """Check ``client``'s events (each client counts its own waiting calls)."""
        client.add_listener(lambda event: self.record(event, client.id))

    def __call__(self, event: Event) -> None:
        self.record(event, "")

    def record(self, event: Event, source: str) -> None:
        """Check one event of the client ``source``."""
        self.events += 1
        if isinstance(event, Waiting):
            self._waiting(event, source)
            return
        if isinstance(event, Acquired | AcquireFailed):
            lock = (event.kind, event.name)
            if self.unended.get(lock, 0) > 0:
                # Events name no call: this end is taken for a waiting call's. A call that
                # never waited may end meanwhile, so this checks that waits end at least
                # as often as they start, which a wait left without its end fails.
                self.unended[lock] -= 1
                if not self.unended[lock]:
                    del self.unended[lock]
        if isinstance(event, Acquired):
            if event.reentrant or event.kind in SEMAPHORE_KINDS:
                return  # nothing ends a semaphore's acquisition: permits have no holder
            delta = 1
            key = (event.kind, event.name, event.holder)
        elif isinstance(event, Released | Lost):
            delta = -1
            key = (event.kind, event.name, event.holder)
        else:
            return
        count = self.open.get(key, 0) + delta
        if not 0 <= count <= 1:
            self.faults.append(f"{event!r} makes {count} open hold(s) of {key}")
        if count:
            self.open[key] = count
        else:
            self.open.pop(key, None)

    def _waiting(self, event: Waiting, source: str) -> None:
        lock = (event.kind, event.name)
        counted = (source, *lock)
        last = self.waiting.get(counted, 0)
        if event.waiting < 0 or abs(event.waiting - last) != 1:
            self.faults.append(f"{event!r} after a count of {last}")
        if event.waiting > last:
            self.waits += 1
            self.unended[lock] = self.unended.get(lock, 0) + 1
        if event.waiting:
            self.waiting[counted] = event.waiting
        else:
            self.waiting.pop(counted, None)

    def check_closed(self) -> None:
        """Every hold begun has ended, every wait too; no event was out of order."""
        assert not self.faults, self.faults
        assert not self.open, f"holds begun and never ended in the events: {self.open}"
        assert not self.waiting, f"waits started and never ended in the events: {self.waiting}"
        assert not self.unended, f"waits whose call never told its end: {self.unended}"


async def forced_term_ends_on_its_message(
    client: aiolock.Client, admin: aiolock.Client, name: str, limit: float = 10.0
) -> None:
    """A leader term of ``client`` forced away by ``admin`` ends on the unlock message itself.

    The term's body starts once its watch's barrier (a PING on the pub/sub connection that
    carries the channel) is back; the force then ends it with no renewal run (the loss's
    reason names the message), whatever the protocol or topology (sharded pub/sub on a
    cluster, the primary Sentinel names).
    """
    leader = client.leader(name)
    entered = asyncio.Event()

    async def term() -> None:
        async with leader.elected():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(term())
    try:
        await asyncio.wait_for(entered.wait(), limit)
        rounds = inside.renewal(client).rounds
        assert await admin.lock(name).force_unlock()
        with pytest.raises(aiolock.LockLostError, match="deleted while it held it"):
            await asyncio.wait_for(task, limit)
        assert inside.renewal(client).rounds == rounds
    finally:
        task.cancel()
        await asyncio.wait([task])


#: Set while a watched ``ScriptRunner.run`` runs (its own ``send()`` is not counted again).
_in_run: contextvars.ContextVar[bool] = contextvars.ContextVar("_in_run", default=False)


def watch_script_runs(
    monkeypatch: pytest.MonkeyPatch,
    started: Callable[[Script, list[str]], None],
    finished: Callable[[Script], None] = lambda _script: None,
) -> None:
    """Call ``started(script, keys)`` for every script a client sends, and ``finished``
    once its reply is in: through ``ScriptRunner.run`` and through its coroutine-less
    first send (``ScriptRunner.send``, the plain attempt's and unlock's path), counted once
    where ``run()`` itself sends through ``send()``."""
    run, send = ScriptRunner.run, ScriptRunner.send

    async def running(self: ScriptRunner, script: Script, keys: list[str], args: Any) -> Any:
        started(script, keys)
        inner = _in_run.set(True)
        try:
            return await run(self, script, keys, args)
        finally:
            _in_run.reset(inner)
            finished(script)

    def sending(self: ScriptRunner, script: Script, keys: list[str], args: Any) -> Any:
        future = send(self, script, keys, args)
        # None: the caller goes through run(), counted there; so is a send of run()'s own.
        if future is not None and not _in_run.get():
            started(script, keys)
            future.add_done_callback(lambda _f: finished(script))
        return future

    monkeypatch.setattr(ScriptRunner, "run", running)
    monkeypatch.setattr(ScriptRunner, "send", sending)
