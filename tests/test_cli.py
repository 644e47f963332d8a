"""The ``aiolock`` command line, run as a subprocess against real servers.

Objects are held by aiolock and by Redisson's own scripts (the "Java" side of the interop
tests): the CLI must read both layouts, decode both kinds of holder ids, and wake another
client's waiter when it force-unlocks. Each subprocess costs ~0.4 s, so one call checks
many objects (``list --json`` returns what ``inspect`` shows of each).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock

from .clusters import assert_nothing_left, names_on_every_primary
from .helpers import wait_until
from .test_fair_lock import JAVA_FAIR_ACQUIRE
from .test_lock import JAVA_ACQUIRE
from .topologies import ClusterHandle

ClientFactory = Callable[..., aiolock.Client]
# Safety net only: every wait ends on an event or on Redis state.
LIMIT = 20.0
# A Java client's id and thread id: holder id "<uuid>:<threadId>".
JAVA = "6f1c1a0e-5d2b-4c1e-9a57-0b8a8b7c2d10"
W_DEFAULT = 300_000


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def aiolock_cli(*args: str) -> Run:
    """``python -m aiolock ARGS`` with no terminal on stdin."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aiolock",
        *args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "error"},
    )
    async with asyncio.timeout(LIMIT):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def assert_one_line_error(run: Run, code: int, *words: str) -> None:
    assert run.code == code, run
    assert run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert run.err.startswith("aiolock: ")
    assert "Traceback" not in run.err
    for word in words:
        assert word in run.err, run.err


def by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {info["name"]: info for info in listing["objects"]}


async def java_fair_acquire(raw: Redis, name: str, holder: str) -> Any:
    keys = (name, f"redisson_lock_queue:{{{name}}}", f"redisson_lock_timeout:{{{name}}}")
    now = int(time.time() * 1000)
    return await raw.eval(JAVA_FAIR_ACQUIRE, 3, *keys, 30_000, holder, W_DEFAULT, now)


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Waiters a test leaves waiting: cancelled at its end, before its clients close."""
    made: list[asyncio.Task[Any]] = []
    yield made
    for task in made:
        task.cancel()
    await asyncio.gather(*made, return_exceptions=True)


async def test_inspect_and_list_read_both_layouts(
    make_client: ClientFactory,
    raw: Redis,
    redis_url: str,
    uid: str,
    tasks: list[asyncio.Task[Any]],
) -> None:
    a, b = make_client(), make_client()
    base = f"cli:{uid}"
    # aiolock: a reentrant lock held twice with a waiter of another client, a fenced
    # lock, a read-write lock, its own fair read-write lock with a queued reader, a
    # latch with a waiter, a permit-expirable semaphore with a leased permit, and a
    # semaphore nobody waits on.
    lock = a.lock(f"{base}:lock")
    await lock.lock()
    await lock.lock()
    tasks.append(asyncio.create_task(b.lock(f"{base}:lock").lock()))
    fenced_lock = a.fenced_lock(f"{base}:fenced")
    token = await fenced_lock.lock_and_get_token()
    read = a.read_write_lock(f"{base}:rw", owner="reader").read_lock()
    await read.lock()
    write = a.fair_read_write_lock(f"{base}:frw").write_lock()
    await write.lock()
    tasks.append(asyncio.create_task(b.fair_read_write_lock(f"{base}:frw").read_lock().lock()))
    await a.count_down_latch(f"{base}:latch").try_set_count(2)
    tasks.append(asyncio.create_task(b.count_down_latch(f"{base}:latch").wait()))
    psem = a.permit_expirable_semaphore(f"{base}:psem")
    await psem.try_set_permits(2)
    permit = await psem.acquire(lease=60)
    await a.semaphore(f"{base}:sem").try_set_permits(3)
    # Java: a lock held by thread 57, and a fair lock held by thread 57 with an aiolock
    # waiter queued first and a Java waiter (thread 58) second.
    assert await raw.eval(JAVA_ACQUIRE, 1, f"{base}:java", 30_000, f"{JAVA}:57") is None
    fair = f"{base}:fair"
    assert await java_fair_acquire(raw, fair, f"{JAVA}:57") is None
    tasks.append(asyncio.create_task(b.fair_lock(fair).lock()))

    async def queued() -> bool:
        return bool(await raw.llen(f"redisson_lock_queue:{{{fair}}}"))

    await wait_until(queued, limit=LIMIT)
    assert await java_fair_acquire(raw, fair, f"{JAVA}:58") > 0

    async def subscribed() -> bool:
        counts = dict(
            await raw.pubsub_numsub(
                f"redisson_lock__channel:{{{base}:lock}}",
                f"aiolock_frw__channel:{{{base}:frw}}",
                f"redisson_countdownlatch__channel__{{{base}:latch}}",
            )
        )
        return all(counts.values())

    await wait_until(subscribed, limit=LIMIT)

    run = await aiolock_cli("list", redis_url, f"{base}:*", "--json")
    assert run.code == 0, run
    listing = run.json()
    assert listing["truncated"] is False
    found = by_name(listing)
    assert set(found) == {
        f"{base}:{n}"
        for n in ("lock", "fenced", "rw", "frw", "latch", "psem", "sem", "java", "fair")
    }

    held = found[f"{base}:lock"]
    assert held["kind"] == "lock"
    [holder] = held["holders"]
    assert holder["client"] == a.id
    assert holder["count"] == 2
    assert 0 < holder["lease_left"] <= 30
    assert held["waiters_subscribed"] == 1

    java = found[f"{base}:java"]
    assert java["kind"] == "lock"
    assert java["holders"] == [
        {
            "id": f"{JAVA}:57",
            "client": JAVA,
            "thread": 57,
            "owner": None,
            "count": 1,
            "lease_left": java["lease_left"],
        }
    ]

    fenced = found[f"{base}:fenced"]
    assert fenced["kind"] == "fenced_lock"
    assert fenced["fencing_token"] == token

    rw = found[f"{base}:rw"]
    assert rw["kind"] == "read_write_lock"
    assert rw["mode"] == "read"
    [reader] = rw["holders"]
    assert (reader["client"], reader["owner"], reader["side"]) == (a.id, "reader", "read")
    assert 0 < reader["lease_left"] <= 30

    frw = found[f"{base}:frw"]
    assert frw["kind"] == "fair_read_write_lock"
    assert frw["mode"] == "write"
    assert [(h["client"], h["side"]) for h in frw["holders"]] == [(a.id, "write")]
    assert [(w["position"], w["client"], w["side"]) for w in frw["queue"]] == [(1, b.id, "read")]
    # A reader queued behind a writer's hold is not let in yet.
    assert frw["admitted"] == []
    assert frw["waiters_subscribed"] == 1

    latch = found[f"{base}:latch"]
    assert (latch["kind"], latch["count"], latch["waiters_subscribed"]) == (
        "count_down_latch",
        2,
        1,
    )

    sem = found[f"{base}:psem"]
    assert (sem["kind"], sem["permits"]) == ("permit_expirable_semaphore", 1)
    [taken] = sem["acquired"]
    assert taken["permit_id"] == permit
    assert 0 < taken["expires_in"] <= 60

    # A semaphore nobody waits on stores what a latch stores: both readings are given.
    plain = found[f"{base}:sem"]
    assert (plain["kind"], plain["permits"], plain["count"]) == ("semaphore_or_latch", 3, 3)

    fair_info = found[fair]
    assert fair_info["kind"] == "fair_lock"
    assert [(h["client"], h["thread"]) for h in fair_info["holders"]] == [(JAVA, 57)]
    queue = fair_info["queue"]
    assert [(w["position"], w["client"]) for w in queue] == [(1, b.id), (2, JAVA)]
    assert queue[1]["thread"] == 58
    # The aiolock waiter listens on its own channel; the Java "waiter" is only a script.
    assert [w["subscribed"] for w in queue] == [1, 0]
    assert all(0 < w["timeout_in"] <= 2 * W_DEFAULT / 1000 + 30 for w in queue)

    # The same through inspect, as a person reads it.
    run = await aiolock_cli("inspect", redis_url, fair)
    assert run.code == 0, run
    for text in ("fair lock", JAVA, "57", "58", b.id, "queue", "waiters subscribed"):
        assert text in run.out, run.out

    assert_one_line_error(
        await aiolock_cli("inspect", redis_url, f"{base}:missing"), 1, "does not exist"
    )

    # Clean up what the Java side and the semaphores left.
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()
    await raw.delete(
        f"{base}:java",
        fair,
        f"redisson_lock_queue:{{{fair}}}",
        f"redisson_lock_timeout:{{{fair}}}",
        f"{base}:sem",
        f"{base}:latch",
    )
    await psem.release(permit)
    await raw.delete(f"{base}:psem", f"{{{base}:psem}}:timeout")
    for held_lock in (lock, lock, fenced_lock, read, write):
        await held_lock.unlock()


async def test_force_unlock_asks_and_wakes_another_clients_waiter(
    make_client: ClientFactory, raw: Redis, redis_url: str, name: str
) -> None:
    # Held by a Java thread; an aiolock client waits for it.
    assert await raw.eval(JAVA_ACQUIRE, 1, name, 30_000, f"{JAVA}:7") is None
    waiter = make_client().lock(name)

    async def hold_once() -> None:
        async with waiter:
            pass

    task = asyncio.create_task(hold_once())
    await wait_until(lambda: waiter.statistics().tasks_waiting == 1, limit=LIMIT)

    # No terminal to ask on, no --yes: refused, and the lock is untouched.
    assert_one_line_error(await aiolock_cli("force-unlock", redis_url, name), 2, "--yes")
    assert await raw.hget(name, f"{JAVA}:7") == "1"

    run = await aiolock_cli("force-unlock", redis_url, name, "--yes", "--json")
    assert run.code == 0, run
    assert run.json() == {"name": name, "kind": "lock", "unlocked": True}
    # Redisson's forceUnlock published 0: the waiter takes the lock (and lets it go).
    async with asyncio.timeout(LIMIT):
        await task

    # Nothing left to unlock: exit 1, one line.
    assert_one_line_error(
        await aiolock_cli("force-unlock", redis_url, name, "--yes"), 1, "does not exist"
    )


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


async def test_watch_refreshes_until_interrupted(
    make_client: ClientFactory, redis_url: str, name: str
) -> None:
    lock = make_client().lock(name)
    await lock.lock()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aiolock",
        "watch",
        redis_url,
        name,
        "--json",
        "--interval",
        "0.1",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # As a job started in the background by a shell without job control (CI) has it:
        # SIGINT ignored, so Python installs no KeyboardInterrupt of its own and the watch
        # must stop on Ctrl-C by itself (it went on for ever before).
        preexec_fn=_ignore_sigint,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(LIMIT):
            first = json.loads(await proc.stdout.readline())
            second = json.loads(await proc.stdout.readline())
        assert first["object"]["holders"][0]["count"] == 1
        assert second["at"] > first["at"]
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(LIMIT):
            _, err = await proc.communicate()
        assert proc.returncode == 0
        assert err == b""
    finally:
        # Whatever failed above, the process and its pipes end here: left to the garbage
        # collector, they would fail a later test with ResourceWarnings.
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    await lock.unlock()


async def test_errors_are_one_line(raw: Redis, redis_url: str, name: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens there once the socket is closed.
    assert_one_line_error(
        await aiolock_cli("inspect", f"redis://127.0.0.1:{port}", "x"), 3, str(port)
    )
    assert_one_line_error(await aiolock_cli("list", "http://localhost"), 2, "redis://")
    await raw.set(name, "not a count")
    try:
        assert_one_line_error(await aiolock_cli("inspect", redis_url, name), 2, "unknown kind")
    finally:
        await raw.delete(name)


def test_importing_aiolock_imports_neither_click_nor_rich() -> None:
    code = "import sys, aiolock; print(sorted({'click', 'rich'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.fixture
async def cluster_client(
    cluster: ClusterHandle, uid: str
) -> AsyncIterator[Callable[[], aiolock.Client]]:
    clients: list[aiolock.Client] = []

    def make() -> aiolock.Client:
        client = aiolock.Client.from_url(cluster.url, cluster=True)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    await assert_nothing_left(cluster, uid)


async def test_cluster_list_and_force_unlock(
    cluster: ClusterHandle, cluster_client: Callable[[], aiolock.Client], uid: str
) -> None:
    holder, other = cluster_client(), cluster_client()
    names = names_on_every_primary(cluster, uid)
    for name in names:
        await holder.lock(name).lock()
    waiter = other.lock(names[0])

    async def hold_once() -> None:
        async with waiter:
            pass

    task = asyncio.create_task(hold_once())
    await wait_until(lambda: waiter.statistics().tasks_waiting == 1, limit=LIMIT)

    async def listed() -> dict[str, dict[str, Any]]:
        run = await aiolock_cli("list", cluster.url, f"test:{uid}:*", "--cluster", "--json")
        assert run.code == 0, run
        return by_name(run.json())

    # Every primary is scanned; the waiter's sharded subscription is counted.
    found = await listed()
    assert set(found) == set(names)
    assert all(info["holders"][0]["client"] == holder.id for info in found.values())
    assert found[names[0]]["waiters_subscribed"] == 1

    run = await aiolock_cli("force-unlock", cluster.url, names[0], "--cluster", "--yes")
    assert run.code == 0, run
    async with asyncio.timeout(LIMIT):
        await task
    for name in names[1:]:
        await holder.lock(name).unlock()


async def test_force_unlock_refuses_a_key_that_is_not_a_lock(
    raw: Redis, redis_url: str, name: str
) -> None:
    """An application's hash under the name (a session, a mistyped name) is never deleted:
    one line, exit 1; inspect says it is no lock."""
    session = {"user": "alice", "cart": "[3 items]"}
    odd_mode = {"mode": "sideways", "a": "1"}
    await raw.hset(name, mapping={"user": "alice", "cart": "[3 items]"})
    await raw.hset(f"{name}:rw", mapping={"mode": "sideways", "a": "1"})
    await raw.set(f"{name}:text", "hello")
    try:
        for key in (name, f"{name}:rw", f"{name}:text"):
            run = await aiolock_cli("force-unlock", redis_url, key, "--yes")
            assert_one_line_error(run, 1, repr(key), "nothing was deleted")
        assert await raw.hgetall(name) == session
        assert await raw.hgetall(f"{name}:rw") == odd_mode
        assert await raw.get(f"{name}:text") == "hello"
        assert_one_line_error(await aiolock_cli("inspect", redis_url, name), 2, "not a lock")
    finally:
        await raw.delete(name, f"{name}:rw", f"{name}:text")


async def test_refusals_that_are_not_redis_errors_are_one_line(
    make_client: ClientFactory, raw: Redis, redis_url: str, name: str, uid: str
) -> None:
    # --cluster on a plain server: what to do instead, not redis-py's traceback.
    assert_one_line_error(await aiolock_cli("list", redis_url, "--cluster"), 2, "drop --cluster")
    # An ACL user that may not run scripts: aiolock's own message, exit 3 (refusing).
    user = f"noeval{uid}"
    await raw.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha", "-script"
    )
    holder = make_client().lock(name)
    await holder.lock()
    try:
        url = redis_url.replace("redis://", f"redis://{user}:pw@", 1)
        run = await aiolock_cli("force-unlock", url, name, "--yes")
        assert_one_line_error(run, 3, "EVALSHA")
        assert await holder.is_held_by_current_task()
    finally:
        await holder.unlock()
        await raw.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]


async def test_a_cluster_node_without_cluster_is_read_as_the_cluster(
    cluster: ClusterHandle, cluster_client: Callable[[], aiolock.Client], uid: str
) -> None:
    """Without --cluster, a URL naming one node: every primary's locks are listed (not a
    third of them), and inspect / force-unlock reach a lock on another node."""
    holder = cluster_client()
    names = names_on_every_primary(cluster, uid)
    for name in names:
        await holder.lock(name).lock()
    run = await aiolock_cli("list", cluster.url, f"test:{uid}:*", "--json")
    assert run.code == 0, run
    assert set(by_name(run.json())) == set(names)
    for name in names:
        run = await aiolock_cli("inspect", cluster.url, name, "--json")
        assert run.code == 0, run
        assert run.json()["holders"][0]["client"] == holder.id
    run = await aiolock_cli("force-unlock", cluster.url, names[-1], "--yes")
    assert run.code == 0, run
    for name in names[:-1]:
        await holder.lock(name).unlock()
    with pytest.raises(aiolock.LockLostError):
        await holder.lock(names[-1]).unlock()


async def test_list_under_a_key_prefix_finds_objects_known_by_derived_keys(
    make_client: ClientFactory, redis_url: str, uid: str
) -> None:
    """A fair read-write lock has no key of its own name (its keys carry the name in
    braces): under --key-prefix it is listed beside the plain lock."""
    prefix = f"app{uid}:"
    client = make_client(key_prefix=prefix)
    lock = client.lock("orders")
    write = client.fair_read_write_lock("catalog").write_lock()
    await lock.lock()
    await write.lock()
    try:
        run = await aiolock_cli("list", redis_url, "--key-prefix", prefix, "--json")
        assert run.code == 0, run
        kinds = {info["name"]: info["kind"] for info in run.json()["objects"]}
        assert kinds == {"orders": "lock", "catalog": "fair_read_write_lock"}
    finally:
        await write.unlock()
        await lock.unlock()


async def test_list_streams_json_and_tells_truncation(
    make_client: ClientFactory, redis_url: str, uid: str
) -> None:
    """--json is one document however it is written; --limit cuts it and says so."""
    client = make_client()
    locks = [client.lock(f"many:{uid}:{i}") for i in range(5)]
    for lock in locks:
        await lock.lock()
    try:
        run = await aiolock_cli("list", redis_url, f"many:{uid}:*", "--json")
        assert run.code == 0, run
        listing = run.json()
        assert (len(listing["objects"]), listing["truncated"]) == (5, False)
        run = await aiolock_cli("list", redis_url, f"many:{uid}:*", "--json", "--limit", "3")
        listing = run.json()
        assert (len(listing["objects"]), listing["truncated"]) == (3, True)
        # What list shows of an object is what inspect shows of it (leases aside).
        shown = listing["objects"][0]
        run = await aiolock_cli("inspect", redis_url, shown["name"], "--json")
        one = run.json()
        for view in (shown, one):
            view["lease_left"] = None
            for holder in view["holders"]:
                holder["lease_left"] = None
        assert shown == one
    finally:
        for lock in locks:
            await lock.unlock()


async def test_release_permit_gives_back_a_stuck_permit(
    make_client: ClientFactory, raw: Redis, redis_url: str, name: str
) -> None:
    """A dead holder's permit with a long lease: the CLI gives it back, with the same
    confirmation rules as force-unlock, and refuses what is not such a semaphore."""
    psem = make_client().permit_expirable_semaphore(name)
    assert await psem.try_set_permits(2)
    stuck = await psem.acquire(lease=3600)
    other = await psem.acquire(lease=3600)
    assert await psem.available_permits() == 0
    try:
        # force-unlock points to it.
        assert_one_line_error(
            await aiolock_cli("force-unlock", redis_url, name, "--yes"), 2, "release-permit"
        )
        # No terminal, no --yes; neither an id nor --all; an id not taken.
        assert_one_line_error(
            await aiolock_cli("release-permit", redis_url, name, stuck), 2, "--yes"
        )
        assert_one_line_error(
            await aiolock_cli("release-permit", redis_url, name, "--yes"), 2, "--all"
        )
        assert_one_line_error(
            await aiolock_cli("release-permit", redis_url, name, "0" * 32, "--yes"), 1, "no permit"
        )
        run = await aiolock_cli("release-permit", redis_url, name, stuck, "--yes", "--json")
        assert run.code == 0, run
        assert run.json() == {"name": name, "released": [stuck]}
        assert await psem.available_permits() == 1
        run = await aiolock_cli("release-permit", redis_url, name, "--all", "--yes")
        assert run.code == 0, run
        assert await psem.available_permits() == 2
        assert_one_line_error(
            await aiolock_cli("release-permit", redis_url, name, "--all", "--yes"),
            1,
            "no permit taken",
        )
    finally:
        await psem.delete()
    lock = make_client().lock(f"{name}:lock")
    async with lock:
        assert_one_line_error(
            await aiolock_cli("release-permit", redis_url, f"{name}:lock", "--all", "--yes"),
            2,
            "not a permit-expirable semaphore",
        )
    del other


async def test_list_reads_pages_without_scripts_for_a_user_that_may_not_run_them(
    make_client: ClientFactory, raw: Redis, redis_url: str, uid: str
) -> None:
    """list reads a page with one script; a user without EVAL gets the same listing."""
    user = f"noscripts{uid}"
    await raw.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha", "-script"
    )
    client = make_client()
    locks = [client.lock(f"paged:{uid}:{i}") for i in range(3)]
    for lock in locks:
        await lock.lock()
    try:
        listings = []
        for url in (redis_url, redis_url.replace("redis://", f"redis://{user}:pw@", 1)):
            run = await aiolock_cli("list", url, f"paged:{uid}:*", "--json")
            assert run.code == 0, run
            listings.append(
                sorted((o["name"], o["holders"][0]["client"]) for o in run.json()["objects"])
            )
        assert listings[0] == listings[1] == [(f"paged:{uid}:{i}", client.id) for i in range(3)]
    finally:
        for lock in locks:
            await lock.unlock()
        await raw.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]


async def test_inspect_and_list_tell_the_host_and_process_of_an_aiolock_holder(
    make_client: ClientFactory, redis_url: str, name: str
) -> None:
    client = make_client()
    async with client.lock(name):
        run = await aiolock_cli("inspect", redis_url, name, "--json")
        assert run.code == 0, run
        [holder] = run.json()["holders"]
        assert (holder["client"], holder["host"], holder["pid"]) == (
            client.id,
            socket.gethostname(),
            os.getpid(),
        )
        assert holder["address"].startswith("127.0.0.1:")
        run = await aiolock_cli("list", redis_url, name, "--json")
        [listed] = run.json()["objects"]
        assert listed["holders"][0]["pid"] == os.getpid()
        run = await aiolock_cli("inspect", redis_url, name)
        assert f"pid {os.getpid()}" in run.out, run.out


async def test_a_cluster_node_that_cannot_be_asked_says_to_pass_cluster(
    cluster: ClusterHandle, cluster_client: Callable[[], aiolock.Client], uid: str
) -> None:
    """A user that may not run INFO cannot be told a cluster node: a MOVED reply then
    says to pass --cluster, in one line, not the bare MOVED payload."""
    user = f"noinfo{uid}"
    nodes = [Redis(host="127.0.0.1", port=node.port) for node in cluster.nodes]
    for node in nodes:
        await node.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-info"
        )
    holder = cluster_client()
    names = names_on_every_primary(cluster, uid)
    elsewhere = [n for n in names if cluster.node_for_key(n).port != cluster.nodes[0].port]
    try:
        await holder.lock(elsewhere[0]).lock()
        url = cluster.url.replace("redis://", f"redis://{user}:pw@", 1)
        run = await aiolock_cli("inspect", url, elsewhere[0])
        assert_one_line_error(run, 2, "pass --cluster")
        await holder.lock(elsewhere[0]).unlock()
    finally:
        for node in nodes:
            await node.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
            await node.aclose()
