"""Forks: a client made before ``os.fork()``, first used in the parent, the children or both.

The Celery prefork pool and gunicorn ``--preload`` make a module-level client in the master
and fork the workers. Each process that first uses such a client must be a holder of its
own (its own client id, holder ids and request ids): two children sharing one id would
each hold a lock as a re-entry of the other's hold, and one child's semaphore acquire
would be answered with the other's receipt, as a resend (review-4 s1, s2). A client used
in the parent before the fork is refused in the child, before any I/O.

Every object kind runs in every process of one scenario, in turn: the first process takes
it (and keeps it), each next one tries without waiting and must be refused (the latch:
each counts down once, and every count-down must count). The processes are driven over
pipes, one step at a time, so no step depends on timing; a process that holds blocks in
its pipe read with its event loop stalled, which keeps its receipts on the server (its
sweeper cannot run) exactly as a busy worker would.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis import Redis as SyncRedis

import aiolock
import aiolock.sync

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork"),
    # Forking a process that runs threads (pytest-xdist's worker, a sync client's loop
    # thread) warns from Python 3.12 on; each child here uses only what it makes itself
    # or a client that is refused before any I/O.
    pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks"),
]

#: Every object kind; a MultiLock stands for the composites (RedLock is a MultiLock over
#: several servers, with the same identity rules).
#: The counting objects come first: there every process has made the same calls so far,
#: so two processes sharing a client id would also share request ids (review-4 s2).
KINDS = (
    "semaphore",
    "permit_semaphore",
    "latch",
    "lock",
    "fair_lock",
    "rw_lock",
    "fair_rw_lock",
    "fenced",
    "spin",
    "multilock",
)
#: A process's step is bounded: past this, the test fails (and kills its children).
_LIMIT = 30.0


_HANDLES: dict[str, Callable[[Any, str], Any]] = {
    "lock": lambda c, n: c.lock(n),
    "fair_lock": lambda c, n: c.fair_lock(n),
    "rw_lock": lambda c, n: c.read_write_lock(n).write_lock(),
    "fair_rw_lock": lambda c, n: c.fair_read_write_lock(n).write_lock(),
    "fenced": lambda c, n: c.fenced_lock(n),
    "spin": lambda c, n: c.spin_lock(n),
    "semaphore": lambda c, n: c.semaphore(n),
    "permit_semaphore": lambda c, n: c.permit_expirable_semaphore(n),
    "latch": lambda c, n: c.count_down_latch(n),
    "multilock": lambda c, n: (
        aiolock.sync.MultiLock if isinstance(c, aiolock.sync.Client) else aiolock.MultiLock
    )(c.lock(f"{n}:a"), c.lock(f"{n}:b")),
}


def _handle(client: Any, kind: str, name: str) -> Any:
    """``kind``'s handle on ``name`` from ``client`` (async or sync: the same calls)."""
    return _HANDLES[kind](client, name)


def _take(h: Any, kind: str) -> Any:
    """Take ``h`` without waiting: what was taken (falsy: nothing); awaitable if async."""
    if kind in {"semaphore", "permit_semaphore"}:
        return h.try_acquire(wait=0)
    if kind == "latch":
        return h.count_down()  # returns None: the caller counts it as taken
    return h.try_lock(wait=0)


def _give_back(h: Any, kind: str, taken: Any) -> Any:
    if kind == "semaphore":
        return h.release()
    if kind == "permit_semaphore":
        return h.release(taken)
    if kind == "latch":
        return None
    return h.unlock()


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _Pipe:
    """One process's side of the conversation: commands in, JSON lines out."""

    def __init__(self, commands: int, reports: int) -> None:
        self.commands = commands
        self.reports = reports

    def say(self, **what: Any) -> None:
        os.write(self.reports, (json.dumps(what) + "\n").encode())

    def wait_for(self, command: bytes) -> None:
        got = os.read(self.commands, 1)
        if got != command:
            raise RuntimeError(f"expected {command!r}, got {got!r}")


def _refusal(exc: RuntimeError) -> str:
    return "refused" if "forked" in str(exc) else repr(exc)


async def _async_session(client: aiolock.Client, name: str, pipe: _Pipe) -> None:
    pipe.say(id=client.id)
    try:
        for kind in KINDS:
            pipe.wait_for(b"t")
            h = _handle(client, kind, f"{name}:{kind}")
            taken: Any = None
            try:
                taken = await _resolved(_take(h, kind)) or kind == "latch"
            except RuntimeError as exc:
                pipe.say(took=_refusal(exc))
            else:
                pipe.say(took=bool(taken))
            pipe.wait_for(b"r")
            if taken:
                await _resolved(_give_back(h, kind, taken))
            pipe.say(released=True)
    finally:
        with contextlib.suppress(RuntimeError):  # a refused client: nothing of its own
            await client.aclose()


def _sync_session(client: aiolock.sync.Client, name: str, pipe: _Pipe) -> None:
    pipe.say(id=client.id)
    try:
        for kind in KINDS:
            pipe.wait_for(b"t")
            h = _handle(client, kind, f"{name}:{kind}")
            taken: Any = None
            try:
                taken = _take(h, kind) or kind == "latch"
            except RuntimeError as exc:
                pipe.say(took=_refusal(exc))
            else:
                pipe.say(took=bool(taken))
            pipe.wait_for(b"r")
            if taken:
                _give_back(h, kind, taken)
            pipe.say(released=True)
    finally:
        client.close()


@dataclass
class _Peer:
    """A process (a forked child, or a thread of the test's own process) in the scenario."""

    commands: int
    reports: int
    pid: int | None = None
    thread: threading.Thread | None = None
    _buffer: bytes = b""
    said: list[dict[str, Any]] = field(default_factory=list)

    def tell(self, command: bytes) -> None:
        os.write(self.commands, command)

    def hear(self) -> dict[str, Any]:
        deadline = time.monotonic() + _LIMIT
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.reports], [], [], max(left, 0))
            if not ready:
                raise AssertionError(f"no report within {_LIMIT} s (heard {self.said})")
            chunk = os.read(self.reports, 4096)
            if not chunk:
                raise AssertionError(f"the process ended (heard {self.said})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        heard: dict[str, Any] = json.loads(line)
        self.said.append(heard)
        if "error" in heard:
            raise AssertionError(f"the process failed: {heard['error']}")
        return heard


def _start(run: Callable[[_Pipe], None], *, child: bool) -> _Peer:
    """Run ``run`` in a forked child (``child``) or in a thread of this process."""
    commands_r, commands_w = os.pipe()
    reports_r, reports_w = os.pipe()
    pipe = _Pipe(commands_r, reports_w)

    def guarded() -> None:
        try:
            run(pipe)
        except BaseException as exc:  # told to the test, which fails with it
            with contextlib.suppress(OSError):
                pipe.say(error=repr(exc))

    if child:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; it never returns into pytest
            status = 1
            try:
                os.close(commands_w)
                os.close(reports_r)
                guarded()
                status = 0
            finally:
                os._exit(status)
        os.close(commands_r)
        os.close(reports_w)
        return _Peer(commands_w, reports_r, pid=pid)
    thread = threading.Thread(target=guarded)
    thread.start()
    return _Peer(commands_w, reports_r, thread=thread)


def _stop(peers: list[_Peer], *, failed: bool) -> None:
    """Reap every child and thread; close the pipes.

    After a failure the children are killed at once; otherwise each is given the limit to
    end (its reports' pipe closes as it exits).
    """
    for peer in peers:
        os.close(peer.commands)  # a thread still waiting for a command reads EOF and ends
    for peer in peers:
        if peer.pid is not None:
            if not failed:
                ready, _, _ = select.select([peer.reports], [], [], _LIMIT)
                while ready and os.read(peer.reports, 4096):
                    ready, _, _ = select.select([peer.reports], [], [], _LIMIT)
            if os.waitpid(peer.pid, os.WNOHANG) == (0, 0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(peer.pid, signal.SIGKILL)
                os.waitpid(peer.pid, 0)
        if peer.thread is not None:
            peer.thread.join(_LIMIT)
        os.close(peer.reports)


@contextlib.contextmanager
def _peers() -> Iterator[list[_Peer]]:
    peers: list[_Peer] = []
    failed = True
    try:
        yield peers
        failed = False
    finally:
        _stop(peers, failed=failed)


def _admin(url: str, name: str, participants: int) -> dict[str, int]:
    """Set the latch to one count per participant and each semaphore to one permit; then
    (``participants`` 0) read what they hold."""

    async def run() -> dict[str, int]:
        async with aiolock.Client.from_url(url) as admin:
            latch = admin.count_down_latch(f"{name}:latch")
            if participants:
                assert await latch.try_set_count(participants)
                assert await admin.semaphore(f"{name}:semaphore").try_set_permits(1)
                psem = admin.permit_expirable_semaphore(f"{name}:permit_semaphore")
                assert await psem.try_set_permits(1)
                return {}
            return {
                "latch": await latch.get_count(),
                "semaphore": await admin.semaphore(f"{name}:semaphore").available_permits(),
                "permit_semaphore": await admin.permit_expirable_semaphore(
                    f"{name}:permit_semaphore"
                ).available_permits(),
            }

    return asyncio.run(run())


#: Who takes part, in turn: (where it runs, which client it uses). "prefork" is the client
#: made before the fork; "own" a client made in that process. "used" is the prefork
#: client used in the parent before the fork: the children's copies are refused.
SCENARIOS = {
    "parent": [("parent", "prefork"), ("child", "own")],
    "children": [("child", "prefork"), ("child", "prefork")],
    "both": [("child", "prefork"), ("parent", "prefork"), ("child", "prefork")],
    "used": [("parent", "prefork"), ("child", "prefork")],
}


@pytest.mark.parametrize("api", ["async", "sync"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_client_made_before_a_fork_excludes_across_processes(
    api: str, scenario: str, redis_url: str, name: str
) -> None:
    """Every kind: one process holds, every other is refused (or, the prefork client used
    before the fork, refused as a forked copy); every latch count-down counts; semaphores
    end with their one permit; every process that used the prefork client has its own id,
    and the parent's is the one it had before the fork."""
    who = SCENARIOS[scenario]
    _admin(redis_url, name, len(who))
    prefork: Any = (
        aiolock.Client.from_url(redis_url)
        if api == "async"
        else aiolock.sync.Client.from_url(redis_url)
    )
    id_before = prefork.id
    if scenario == "used":
        if api == "async":
            asyncio.run(prefork.lock(f"{name}:before").is_locked())
        else:
            assert not prefork.lock(f"{name}:before").is_locked()

    def runner(which: str) -> Callable[[_Pipe], None]:
        def run(pipe: _Pipe) -> None:
            if api == "async":

                async def session() -> None:
                    client = prefork if which == "prefork" else aiolock.Client.from_url(redis_url)
                    await _async_session(client, name, pipe)

                asyncio.run(session())
            else:
                client = prefork if which == "prefork" else aiolock.sync.Client.from_url(redis_url)
                _sync_session(client, name, pipe)

        return run

    with _peers() as peers:
        # Every child is forked first, before the parent's own session uses anything.
        order = sorted(range(len(who)), key=lambda i: who[i][0] != "child")
        started = {i: _start(runner(who[i][1]), child=who[i][0] == "child") for i in order}
        peers.extend(started.values())
        turn = [started[i] for i in range(len(who))]
        ids = [peer.hear()["id"] for peer in turn]
        took: dict[str, list[Any]] = {}
        for kind in KINDS:
            for peer in turn:
                peer.tell(b"t")
                took.setdefault(kind, []).append(peer.hear()["took"])
            for peer in turn:
                peer.tell(b"r")
                assert peer.hear() == {"released": True}
    if api == "sync" and scenario == "children":
        prefork.close()  # never used in this process: closes nothing of the children's
    after = _admin(redis_url, name, 0)
    with contextlib.closing(SyncRedis.from_url(redis_url)) as raw:
        for key in raw.scan_iter(match=f"*{name}*"):
            raw.delete(key)

    refused = [where == "child" and scenario == "used" for where, _ in who]
    expected = {
        kind: ["refused" if refused[i] else (kind == "latch" or i == 0) for i in range(len(who))]
        for kind in KINDS
    }
    assert took == expected
    assert after == {"latch": sum(refused), "semaphore": 1, "permit_semaphore": 1}
    own = [i for i in range(len(who)) if not refused[i]]
    assert len({ids[i] for i in own}) == len(own), f"two processes share an id: {ids}"
    for i, (where, which) in enumerate(who):
        if where == "parent" and which == "prefork":
            assert ids[i] == id_before, "the parent's client changed its id"
