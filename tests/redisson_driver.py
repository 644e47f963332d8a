"""Real Redisson in the loop: the Java driver of interop/redisson, built and run for the tests.

The driver is a small Maven project (interop/redisson) reading one JSON command a line and
answering one JSON line each, every command run on the Java worker thread it names (Redisson's
holder identity is the thread). :func:`build` compiles it once per Redisson version
(``REDISSON_VERSION``, default :data:`DEFAULT_VERSION`) with Maven's own cache (~/.m2), offline
first; :class:`Driver` is one JVM, usable from any event loop and from plain threads (a reader
thread resolves each reply's future).

Without ``java`` or ``mvn`` (or when the build cannot fetch Redisson) the tests that need it
skip with one line; ``AIOLOCK_REQUIRE_REDISSON=1`` (CI) turns that skip into a failure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest

PROJECT = Path(__file__).resolve().parent.parent / "interop" / "redisson"
#: The newest Redisson verified here; CI also runs the newest 3.x and the oldest 3.x whose
#: layout docs/redisson.md claims (.ci/run, noxfile.py's ``interop`` session).
DEFAULT_VERSION = "4.7.0"
#: How long the driver may take to start (a JVM, then Redisson's first connections).
START_LIMIT = 45.0
#: How long a command may take to be answered when nothing makes it wait.
REPLY_LIMIT = 30.0


def version() -> str:
    return os.environ.get("REDISSON_VERSION", "").strip() or DEFAULT_VERSION


def required() -> bool:
    return os.environ.get("AIOLOCK_REQUIRE_REDISSON", "") not in {"", "0"}


def unavailable(reason: str, *, module: bool = False) -> NoReturn:
    """Skip with ``reason`` or, where Redisson is required, fail with it (``module``: the
    whole test module, at its import, so the skip is one line)."""
    if required():
        pytest.fail(f"Redisson interop required (AIOLOCK_REQUIRE_REDISSON): {reason}")
    pytest.skip(f"Redisson interop skipped: {reason}", allow_module_level=module)


def check_tools() -> None:
    """At a test module's import: skip it whole (one line) without ``java`` and ``mvn``, or
    without the driver's sources (an sdist, say)."""
    if not (PROJECT / "pom.xml").exists():
        unavailable(f"no driver sources at {PROJECT}", module=True)
    if shutil.which("java") is None or shutil.which("mvn") is None:
        unavailable(
            "no java or mvn on PATH (a JDK 17+ and Maven build interop/redisson)", module=True
        )


@dataclass(frozen=True)
class Build:
    version: str
    classpath: str


def _newest_source() -> float:
    return max(path.stat().st_mtime for path in [PROJECT / "pom.xml", *PROJECT.rglob("*.java")])


def build(redisson_version: str) -> Build:
    """Compile the driver against ``redisson_version`` (into target/<version>) unless it is
    already built from the current sources; return its class path. Concurrent builds (xdist
    workers) wait for one another on a file lock."""
    mvn = shutil.which("mvn")
    if shutil.which("java") is None or mvn is None:
        unavailable("no java or mvn on PATH (a JDK 17+ and Maven build interop/redisson)")
    target = PROJECT / "target" / redisson_version
    classpath_file = target / "classpath.txt"
    (PROJECT / "target").mkdir(exist_ok=True)
    with open(PROJECT / "target" / ".build.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        fresh = classpath_file.exists() and classpath_file.stat().st_mtime >= _newest_source()
        if not fresh:
            command = [mvn, "-q", "-B", "package", f"-Dredisson.version={redisson_version}"]
            # Offline first (Maven's cache has it after one run); online if something lacks.
            done = subprocess.run(
                [*command, "-o"], cwd=PROJECT, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                done = subprocess.run(
                    command, cwd=PROJECT, capture_output=True, text=True, check=False
                )
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                unavailable(
                    f"building the driver for Redisson {redisson_version} failed: "
                    + " | ".join(tail)
                )
    classpath = f"{target / 'classes'}{os.pathsep}{classpath_file.read_text().strip()}"
    return Build(redisson_version, classpath)


class RedissonError(Exception):
    """An exception the driver's Java call raised (``error``: its class's simple name)."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message


class Driver:
    """One JVM running the driver with one Redisson client.

    :meth:`send` queues a command on a Java thread and returns a future for its reply (a
    blocking op blocks only that thread); :meth:`call` awaits it; :meth:`call_sync` waits for
    it from a plain thread.
    """

    def __init__(self, built: Build, redis_url: str, **options: Any) -> None:
        parts = urlsplit(redis_url)
        database = (parts.path or "/0").strip("/") or "0"
        argv = [
            "java",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xmx256m",
            "-Xss512k",
            "-cp",
            built.classpath,
            "aiolock.interop.Driver",
            "--address",
            f"redis://{parts.hostname}:{parts.port or 6379}",
            "--database",
            database,
            "--version",
            built.version,
        ]
        for option, value in options.items():
            argv += [f"--{option.replace('_', '-')}", str(value)]
        self.version = built.version
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self._guard = threading.Lock()
        self._ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self._reader = threading.Thread(target=self._read, name="redisson-driver", daemon=True)
        self._reader.start()
        try:
            ready = self._ready.result(START_LIMIT)
        except BaseException:
            self.close()
            raise
        #: Redisson's client id: the first part of every holder id of this JVM.
        self.client_id: str = ready["client"]
        self.features: dict[str, Any] = ready
        self.watchdog: float = ready["watchdog"] / 1000

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                continue  # not a reply (nothing else should print to stdout; never fatal)
            if reply.get("ready"):
                self._ready.set_result(reply)
                continue
            if "id" not in reply:
                continue
            with self._guard:
                future = self._pending.pop(reply["id"], None)
            if future is None or future.done():
                continue
            if reply["ok"]:
                future.set_result(reply.get("value"))
            else:
                future.set_exception(RedissonError(reply["error"], reply["message"]))
        # The JVM ended (exit, crash or death): nothing more will be answered.
        ended = RuntimeError(f"the Redisson driver ended: {self.stderr()}")
        if not self._ready.done():
            self._ready.set_exception(ended)
        with self._guard:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ended)

    def stderr(self) -> str:
        with contextlib.suppress(ValueError):
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").splitlines()
            return " | ".join(line for line in lines if not line.startswith("SLF4J"))[-2000:]
        return ""

    def _write(self, command: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()

    def send(
        self, thread: str, kind: str, name: str, op: str, **args: Any
    ) -> concurrent.futures.Future[Any]:
        """Run ``op`` on the object ``kind``/``name`` on Java thread ``thread``; times in
        ``args`` are seconds (sent as milliseconds), ``None`` where Redisson takes -1."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._guard:
            command_id = next(self._ids)
            self._pending[command_id] = future
        for key in ("wait", "lease", "timeout"):
            if key in args:
                args[key] = -1 if args[key] is None else round(args[key] * 1000)
        self._write(
            {"id": command_id, "thread": thread, "kind": kind, "name": name, "op": op, "args": args}
        )
        return future

    async def call(self, thread: str, kind: str, name: str, op: str, **args: Any) -> Any:
        future = self.send(thread, kind, name, op, **args)
        async with asyncio.timeout(REPLY_LIMIT):
            return await asyncio.wrap_future(future)

    def call_sync(self, thread: str, kind: str, name: str, op: str, **args: Any) -> Any:
        return self.send(thread, kind, name, op, **args).result(REPLY_LIMIT)

    async def holder(self, thread: str) -> str:
        """The holder id Redisson writes for Java thread ``thread``: ``<client id>:<thread id>``."""
        return f"{self.client_id}:{await self.call(thread, 'thread', '', 'id')}"

    def crash(self) -> None:
        """Halt the JVM at once: no unlock, no shutdown; its watchdog stops with it."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self._write({"id": 0, "op": "crash"})
        self._process.wait(REPLY_LIMIT)

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._write({"op": "exit"})
            try:
                self._process.wait(REPLY_LIMIT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._reader.join(REPLY_LIMIT)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()


class Java:
    """One test's view of a driver: its Java thread names are made unique to the test (a
    thread a test left blocked cannot hold up the next), and :meth:`holder` gives Redisson's
    holder id for one."""

    def __init__(self, driver: Driver, uid: str) -> None:
        self.driver = driver
        self.uid = uid
        self.sent: list[concurrent.futures.Future[Any]] = []

    @property
    def version(self) -> str:
        return self.driver.version

    @property
    def watchdog(self) -> float:
        return self.driver.watchdog

    def has(self, feature: str) -> bool:
        return bool(self.driver.features.get(feature))

    def _thread(self, thread: str) -> str:
        return f"{self.uid}-{thread}"

    def send(
        self, thread: str, kind: str, name: str, op: str, **args: Any
    ) -> concurrent.futures.Future[Any]:
        future = self.driver.send(self._thread(thread), kind, name, op, **args)
        self.sent.append(future)
        return future

    async def call(self, thread: str, kind: str, name: str, op: str, **args: Any) -> Any:
        return await self.driver.call(self._thread(thread), kind, name, op, **args)

    def call_sync(self, thread: str, kind: str, name: str, op: str, **args: Any) -> Any:
        return self.driver.call_sync(self._thread(thread), kind, name, op, **args)

    async def holder(self, thread: str) -> str:
        return await self.driver.holder(self._thread(thread))

    def unanswered(self) -> list[concurrent.futures.Future[Any]]:
        return [future for future in self.sent if not future.done()]


@contextlib.contextmanager
def running(built: Build, redis_url: str, **options: Any) -> Iterator[Driver]:
    """A driver of ``built``, closed (or reaped, if crashed) after."""
    driver = Driver(built, redis_url, **options)
    try:
        yield driver
    finally:
        driver.close()
