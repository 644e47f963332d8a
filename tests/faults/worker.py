"""One worker process of the fault suite's checker: run as a script, not imported by pytest.

Usage: python worker.py SPEC_JSON

The spec (written by ``checker.py``) names the lock server (or a cluster node, or a Sentinel
group's sentinels and name) and the client's retries, the resource server that holds the
counters, this process's index, its task count, the lock kinds and names, the run's length
and the faults this process injects on itself (cancellations, tasks that exit while
holding, a starved event loop). Each task loops until the run ends or its iteration bound:

    acquire -> GET counter, SET counter + 1 on the resource server (not atomic) -> release

and logs every hold as one JSON line: kind, name, the instants it held the lock
(``time.monotonic``, which is system-wide on Linux and so comparable across processes) and
how the hold ended, and when its acquire began. The last line of stdout is a JSON summary
of the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

import aiolock

# Run as a script (by checker.py): the repository root on the path lets it import the
# tests' one module that reads aiolock's internals.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import inside

Handle = (
    aiolock.Lock
    | aiolock.FairLock
    | aiolock.ReadLock
    | aiolock.WriteLock
    | aiolock.FencedLock
    | aiolock.SpinLock
    | aiolock.FairReadLock
    | aiolock.FairWriteLock
)

#: Every lock type under test: kind -> how to get a handle. A new type plugs in here.
KINDS: dict[str, Callable[[aiolock.Client, str], Handle]] = {
    "lock": lambda client, name: client.lock(name),
    "fair": lambda client, name: client.fair_lock(name),
    "read": lambda client, name: client.read_write_lock(name).read_lock(),
    "write": lambda client, name: client.read_write_lock(name).write_lock(),
    "fenced": lambda client, name: client.fenced_lock(name),
    "spin": lambda client, name: client.spin_lock(name),
    "fread": lambda client, name: client.fair_read_write_lock(name).read_lock(),
    "fwrite": lambda client, name: client.fair_read_write_lock(name).write_lock(),
}
#: Kinds whose holders share the lock with each other (but never with another kind), and
#: the exclusive kind on the same lock.
SHARED = {"read": "write", "fread": "fwrite"}


@contextlib.asynccontextmanager
async def _held(handle: Handle) -> AsyncIterator[int | None]:
    """``async with handle``, yielding a fenced lock's token (None for the others)."""
    if not isinstance(handle, aiolock.FencedLock):
        async with handle:
            yield None
        return
    token = await handle.lock_and_get_token()
    try:
        yield token
    finally:
        await handle.unlock()


# What a user's code sees when the server is unreachable for longer than the retries.
# What a service catches around a lock's block when the server is unreachable: the
# acquire's redis-py error, or the exit's ReleaseError (the work was done, the release not).
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError, aiolock.ReleaseError)


# The library's WARNINGs, told apart by a phrase each contains.
_WARNING_KINDS = (
    ("ended while", "task ended holding"),
    ("was lost (", "lease lost"),
    ("pub/sub connection", "pub/sub reconnects"),
    ("could not renew", "renewal retried"),
    ("works again", "renewal recovered"),
    ("could not release", "release abandoned"),
    ("sentinels switched", "primary switches heard"),
    # The move at a promotion's announcement, before the switch (which then moves nothing).
    ("is promoting", "promotions heard"),
)
_SWITCH = ("primary switches heard", "promotions heard")


class _Warnings(logging.Handler):
    """Counts the library's WARNINGs by what they report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        #: When this process moved at each Sentinel switch (logged as it is acted on), and
        #: whether that was at the promotion's announcement (before the switch).
        self.switched_at: list[float] = []
        self.early: list[bool] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for marker, what in _WARNING_KINDS:
            if marker in message:
                self.counts[what] += 1
                if what in _SWITCH:
                    self.switched_at.append(time.monotonic())
                    self.early.append(what == "promotions heard")
                return
        self.counts[f"other: {message[:80]}"] += 1


class Worker:
    """The tasks of one process, sharing one client as one service process would."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.proc: int = spec["proc"]
        self.rng = random.Random(spec["seed"] * 1000 + self.proc)
        self.stop_at = time.monotonic() + spec["duration"]
        self.log = Path(spec["log"]).open("w")  # noqa: SIM115 - closed in run()
        self.outcomes: Counter[str] = Counter()
        self.increments: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.max_wait: dict[str, float] = {}
        self.warnings = _Warnings()
        self.exits_holding = 0
        self.rounds = 0

    def record(
        self,
        kind: str,
        name: str,
        holder: str,
        *,
        called: float,
        start: float,
        end: float,
        how: str,
        token: int | None = None,
    ) -> None:
        """Log one hold; ``how``: ok, lost, cancelled, unlock-error, exited-holding."""
        self.outcomes[how] += 1
        line = {
            "p": self.proc,
            "k": kind,
            "n": name,
            "h": holder,
            "c": called,
            "s": start,
            "e": end,
            "o": how,
        }
        if token is not None:
            line["t"] = token
        self.log.write(json.dumps(line) + "\n")

    async def run(self) -> dict[str, Any]:
        """Run every task to the end of the run; return the process summary."""
        logging.getLogger("aiolock").addHandler(self.warnings)
        spec = self.spec
        client, owned = self.client()
        resource = Redis.from_url(
            spec["resource_url"],
            decode_responses=True,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.01), 20),
        )
        started = time.monotonic()
        try:
            tasks = [
                asyncio.create_task(
                    self.task(client, resource, index), name=f"p{self.proc}t{index}"
                )
                for index in range(spec["tasks"])
            ]
            orphans = [
                asyncio.create_task(self.exit_holding(client, index))
                for index in range(spec.get("exit_holding", 0))
            ]
            await asyncio.gather(*tasks, *orphans)
            waiting = inside.waiting_room(client).total()
        finally:
            await client.aclose()
            for redis in owned:
                await redis.aclose()
            await resource.aclose()
            self.log.close()
        return {
            "proc": self.proc,
            "outcomes": dict(self.outcomes),
            "increments": dict(self.increments),
            "errors": dict(self.errors),
            "warnings": dict(self.warnings.counts),
            "switched_at": self.warnings.switched_at,
            "switched_early": self.warnings.early,
            "max_wait": self.max_wait,
            "waiting_at_end": waiting,
            "exits_holding": self.exits_holding,
            "rounds": self.rounds,
            "took": time.monotonic() - started,
        }

    def client(self) -> tuple[aiolock.Client, list[Redis]]:
        """The process's client, on one server, a cluster or a Sentinel group's primary,
        and the redis clients to close after it."""
        where: dict[str, Any] = self.spec["client"]
        options: dict[str, Any] = {
            "watchdog_timeout": self.spec["watchdog_timeout"],
            "retry_attempts": self.spec.get("retry_attempts", 3),
            "retry_interval": self.spec.get("retry_interval", 0.2),
        }
        if "sentinels" in where:
            sentinel = Sentinel(  # type: ignore[no-untyped-call]
                [tuple(address) for address in where["sentinels"]], socket_timeout=5
            )
            primary = sentinel.master_for(where["master"])
            return aiolock.Client(primary, **options), [primary, *sentinel.sentinels]
        if "cluster" in where:
            return aiolock.Client.from_url(where["cluster"], cluster=True, **options), []
        return aiolock.Client.from_url(where["url"], **options), []

    def assignment(self, index: int) -> tuple[str, str]:
        """The kind and lock name task ``index`` works on, spread over kinds and names."""
        kinds: list[str] = self.spec["kinds"]
        names: dict[str, list[str]] = self.spec["names"]
        kind = kinds[(self.proc + index) % len(kinds)]
        choices = names[kind]
        return kind, choices[index // len(kinds) % len(choices)]

    async def task(self, client: aiolock.Client, resource: Redis, index: int) -> None:
        """Acquire, non-atomic increment, release: until the run ends."""
        kind, name = self.assignment(index)
        handle = KINDS[kind](client, name)
        cancel_share: float = self.spec.get("cancel", 0.0)
        starve_every: int = self.spec.get("starve_every", 0)
        for iteration in range(self.spec["iterations"]):
            if time.monotonic() >= self.stop_at:
                return
            starve = bool(starve_every) and index == 0 and iteration % starve_every == 1
            cancel_after = self.rng.uniform(0, 0.015) if self.rng.random() < cancel_share else None
            self.rounds += 1
            await self.once(handle, kind, name, resource, cancel_after, starve=starve)
            # Think time between rounds, as real work has. Without it the eight readers of
            # a name always overlap and a writer, as in Redisson (readers are not held back
            # for a waiting writer), waits for the end of the run.
            await asyncio.sleep(self.rng.uniform(0, 0.002))

    async def once(
        self,
        handle: Handle,
        kind: str,
        name: str,
        resource: Redis,
        cancel_after: float | None,
        *,
        starve: bool,
    ) -> None:
        """One acquire-work-release round, cancelled after ``cancel_after`` s if given."""
        called = time.monotonic()
        start = end = None
        how = "ok"
        holder = inside.engine(handle).holder(inside.owner_of(handle))[0]
        try:
            async with asyncio.timeout(cancel_after):
                async with _held(handle) as token:
                    start = time.monotonic()
                    self.max_wait[kind] = max(self.max_wait.get(kind, 0.0), start - called)
                    try:
                        await self.work(kind, name, resource, starve=starve)
                    finally:
                        end = time.monotonic()
        except TimeoutError:
            how = "cancelled"
            self.errors["cancelled (by the worker)"] += 1
        except aiolock.LockLostError:
            how = "lost"
        except _TRANSIENT as exc:
            how = "unlock-error" if end is not None else "acquire-error"
            self.errors[f"{how}: {type(exc).__name__}"] += 1
            # What a service would do: back off briefly, then carry on.
            await asyncio.sleep(self.rng.uniform(0.01, 0.05))
        if start is not None:
            assert end is not None
            self.record(
                kind, name, holder, called=called, start=start, end=end, how=how, token=token
            )

    async def work(self, kind: str, name: str, resource: Redis, *, starve: bool) -> None:
        """The critical section: a non-atomic increment (only by exclusive holders)."""
        await asyncio.sleep(self.rng.uniform(0, 0.001))  # a point where cancellation can land
        if starve:
            # Block the event loop past the lease: the watchdog cannot run, the lease ends.
            time.sleep(self.spec["watchdog_timeout"] * 1.6)  # noqa: ASYNC251 - the fault itself
        if kind in SHARED:
            await resource.get(f"counter:{name}")
            return
        # Finish the read-modify-write even when cancelled, so the counter stays an exact
        # tally of completed increments; cancellation then lands right after it.
        rmw = asyncio.ensure_future(self.increment(resource, name))
        try:
            await asyncio.shield(rmw)
        except asyncio.CancelledError:
            await rmw
            raise
        await asyncio.sleep(self.rng.uniform(0, 0.001))

    async def increment(self, resource: Redis, name: str) -> None:
        """GET then SET: correct only under mutual exclusion; counts completed increments."""
        value = int(await resource.get(f"counter:{name}") or 0)
        await resource.set(f"counter:{name}", value + 1)
        self.increments[name] += 1

    async def exit_holding(self, client: aiolock.Client, index: int) -> None:
        """A task that takes a lock and ends without releasing it (a bug in user code)."""
        kind, name = self.assignment(index)
        kind = SHARED.get(kind, kind)
        handle = KINDS[kind](client, name)
        await asyncio.sleep(self.rng.uniform(0, self.spec["duration"] / 2))
        await handle.lock()
        now = time.monotonic()
        self.exits_holding += 1
        holder = inside.engine(handle).holder(inside.owner_of(handle))[0]
        self.record(kind, name, holder, called=now, start=now, end=now, how="exited-holding")


def main() -> None:
    """Run the worker described by the spec file named on the command line."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(level=logging.WARNING, format=f"[worker {spec['proc']}] %(message)s")
    summary = asyncio.run(Worker(spec).run())
    sys.stdout.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
