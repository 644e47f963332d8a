"""Redisson (the Java client) as a peer: its RLock measured by interop/redisson's Bench.

The Maven project of the interop tests (``interop/redisson``, Redisson a dependency, the version
from ``REDISSON_VERSION``) holds a second main class, ``aiolock.interop.Bench``: one JVM runs
one group of threads of one scenario and prints their records on the same clock as the Python
workers' (``System.nanoTime()`` and ``time.monotonic()`` both read ``CLOCK_MONOTONIC`` on
Linux), so the same functions turn them into the table's numbers. The JVMs (one per process of
a scenario: four for 4x8) are started on first use and kept for the run; per measurement each
makes its threads and warms them up in the measurement's shape (the JIT compiles the lock path,
the pools open) before it says it is ready, and only then are the server's counters read and
the common start instant given: JVM start-up and warm-up never fall in the window.

Without ``java`` (or without ``mvn`` and no build yet), or when the build fails, the peer is
"cannot run: <one line why>" and the run goes on without it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

__all__ = (
    "DEFAULT_VERSION",
    "PROJECT",
    "VARIANTS",
    "WARMUP_S",
    "JvmUnavailable",
    "classpath",
    "close",
    "describe",
    "reason",
    "run_jvms",
    "version",
)

PROJECT = Path(__file__).resolve().parent.parent / "interop" / "redisson"
#: The Redisson of the interop tests' default (tests/redisson_driver.py's DEFAULT_VERSION).
DEFAULT_VERSION = "4.7.0"
#: The scenarios Redisson runs in (issue 38): 1 and 32 threads uncontended, 16 threads on one
#: lock, 4 JVMs x 8 threads on one lock.
VARIANTS = frozenset({"1 task", "32 tasks", "N=16", "4x8"})
#: A JVM's warm-up before its first measurement: the lock loop on names of its own, long
#: enough for the JIT's C2 to compile it on a loaded 2-core machine (after 3 s the first
#: 1-thread measurement gave 633 pairs/s at load 5-7, after 10 s 6,603, the later ones
#: 5,935-8,562).
WARMUP_S = 10.0
#: The warm-up of a JVM's later measurements: its new threads, the measurement's shape.
REWARM_S = 0.3
START_LIMIT_S = 60.0  # JVM start, Redisson's connections, the warm-up
GRACE_S = 5.0  # as the Python workers': acquisitions already waiting at the deadline
JVM_OPTIONS = ("-Xmx256m",)


class JvmUnavailable(Exception):
    """Redisson cannot be measured here; ``str(exc)`` is the table's text."""


def version() -> str:
    """The Redisson release measured: ``REDISSON_VERSION``, else the interop tests' default."""
    return os.environ.get("REDISSON_VERSION", "").strip() or DEFAULT_VERSION


def _newest_source() -> float:
    return max(p.stat().st_mtime for p in [PROJECT / "pom.xml", *PROJECT.rglob("*.java")])


def describe() -> str:
    """``Redisson <version> on <the JVM's version line>``, for the report's header."""
    try:
        done = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, check=False, timeout=30
        )
        jvm = (done.stderr or done.stdout).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        jvm = "java ?"
    return f"Redisson {version()} on {jvm}"


def reason() -> str | None:
    """``None`` if Redisson can be measured here (building it if needed), else why not."""
    try:
        classpath()
    except JvmUnavailable as exc:
        return str(exc)
    return None


def classpath(redisson_version: str | None = None) -> str:
    """The JVM class path of the Bench built against ``redisson_version``; builds it first
    unless built from the current sources (target/<version>, shared with the interop tests,
    under the same file lock)."""
    release = redisson_version or version()
    if not (PROJECT / "pom.xml").exists():
        raise JvmUnavailable(f"cannot run: no interop/redisson sources at {PROJECT}")
    if shutil.which("java") is None:
        raise JvmUnavailable("cannot run: no java on PATH (a JDK 17+ runs Redisson)")
    target = PROJECT / "target" / release
    classpath_file = target / "classpath.txt"
    (PROJECT / "target").mkdir(exist_ok=True)
    with open(PROJECT / "target" / ".build.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        fresh = classpath_file.exists() and classpath_file.stat().st_mtime >= _newest_source()
        if not fresh:
            _build(release)
            # Maven leaves an unchanged class path file as it was, older than the sources
            # that made the build: marked as built from them, or every run would build.
            classpath_file.touch()
    return f"{target / 'classes'}{os.pathsep}{classpath_file.read_text().strip()}"


def _build(release: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JvmUnavailable("cannot run: no mvn on PATH (Maven builds interop/redisson)")
    command = [mvn, "-q", "-B", "package", f"-Dredisson.version={release}"]
    print(f"Redisson: building interop/redisson against Redisson {release} (Maven)", flush=True)
    # Offline first (Maven's cache has it after one run); online if something lacks.
    done = subprocess.run(
        [*command, "-o"], cwd=PROJECT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        done = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise JvmUnavailable(
            f"cannot run: building interop/redisson for Redisson {release} failed: "
            + " | ".join(tail)
        )


def argv(url: str, cp: str) -> list[str]:
    """The command line of one Bench JVM against the server at ``url``."""
    parts = urlsplit(url)
    database = (parts.path or "/0").strip("/") or "0"
    address = f"redis://{parts.hostname}:{parts.port or 6379}"
    return ["java", *JVM_OPTIONS, "-cp", cp, "aiolock.interop.Bench", "--address", address,
            "--database", database]  # fmt: skip


class _Scenario(Protocol):
    """What a JVM is told of a measured configuration (``_cases.Scenario``)."""

    @property
    def tasks(self) -> int: ...
    @property
    def processes(self) -> int: ...
    @property
    def shared(self) -> bool: ...


class Job(Protocol):
    """What the JVMs are told of one measurement (``_cases.Job``, which imports this)."""

    @property
    def url(self) -> str: ...
    @property
    def tag(self) -> str: ...
    @property
    def scen(self) -> _Scenario: ...
    @property
    def duration(self) -> float: ...


def prepare(job: Job, index: int, warmup_s: float) -> str:
    """The command that readies JVM ``index`` (of ``job.scen.processes``) for ``job``."""
    scen = job.scen
    words = ("prepare", job.tag, scen.tasks, index * scen.tasks, str(scen.shared).lower(),
             round(job.duration * 1000), round(warmup_s * 1000))  # fmt: skip
    return " ".join(str(w) for w in words)


class _Jvm:
    """One Bench JVM: its stdout lines through a queue (so every read has a time limit)."""

    def __init__(self, command: list[str]) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._paused = False

    def pause(self) -> None:
        """Stop the JVM (SIGSTOP) while other implementations are measured.

        Its idle threads (the JIT, the collector, Netty's event loops) would otherwise run
        on the pinned core beside the case measured, and be counted against it.
        """
        if self.process.poll() is None and not self._paused:
            os.kill(self.process.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """Let the JVM run again (SIGCONT) before its own measurement or its exit."""
        if self._paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self._paused = False

    def _read(self) -> None:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        for line in stdout:
            self._lines.put(line)
        self._lines.put(None)

    def reply(self, key: str, timeout: float) -> dict[str, Any]:
        """The next JSON line holding ``key`` (other output skipped)."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"the Redisson JVM said no {key!r} in {timeout:.0f} s") from None
            if line is None:
                raise RuntimeError(f"the Redisson JVM ended: {self.stderr()}")
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and key in data:
                    return data

    def say(self, line: str) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            stdin.write(line + "\n")
            stdin.flush()

    def stderr(self) -> str:
        with contextlib.suppress(ValueError, OSError):
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").splitlines()
            return " | ".join(line for line in lines if not line.startswith("SLF4J"))[-300:]
        return ""

    def close(self) -> None:
        self.resume()
        if self.process.poll() is None:
            self.say("exit")
            try:
                self.process.wait(10.0)
            except subprocess.TimeoutExpired:
                self.process.kill()  # our own child, stuck past every bound
                self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._reader.join(5.0)
        self._stderr.close()


class _Pool:
    """The run's JVMs: started when Redisson is first measured, kept for the whole run (a
    JVM's start-up and Redisson's connections cost seconds on a loaded machine, and a Java
    service runs long: its JIT has compiled the lock path), one per process of a scenario."""

    def __init__(self) -> None:
        self.url = ""
        self.jvms: list[_Jvm] = []
        self.warm: list[bool] = []

    def get(self, url: str, count: int) -> list[_Jvm]:
        if url != self.url:
            self.close()
            self.url = url
        if len(self.jvms) < count:
            cp = classpath()
            fresh = [_Jvm(argv(url, cp)) for _ in range(count - len(self.jvms))]
            self.jvms += fresh
            self.warm += [False] * len(fresh)
            for jvm in fresh:
                jvm.reply("started", START_LIMIT_S)
        for jvm in self.jvms:
            jvm.resume()
        return self.jvms[:count]

    def pause(self) -> None:
        """Stop every JVM until Redisson is measured again."""
        for jvm in self.jvms:
            jvm.pause()

    def close(self) -> None:
        jvms, self.jvms, self.warm = self.jvms, [], []
        for jvm in jvms:
            jvm.close()


_POOL = _Pool()


def close() -> None:
    """End the run's JVMs (the run's end; also at interpreter exit)."""
    _POOL.close()


atexit.register(close)


def run_jvms(
    job: Job, before: Callable[[], None], after: Callable[[], None]
) -> list[dict[str, Any]]:
    """One measurement of Redisson: ``job.scen.processes`` JVMs of ``job.scen.tasks`` threads,
    readied and warmed up (``WARMUP_S`` on a JVM's first measurement, ``REWARM_S`` after),
    then ``before()`` (the server's counters), one common start, the window, ``after()`` once
    every JVM has reported. Each JVM's report: ``records`` (lists of worker, t_wait, t_acq,
    t_rel, t_done), ``stuck``, ``cpu_s``, ``round_trips``, ``stragglers``, ``errors`` and
    ``t_start``. A JVM that left a thread blocked, or any failure, ends the JVMs concerned
    (the next measurement starts fresh ones)."""
    try:
        jvms = _POOL.get(job.url, job.scen.processes)
        for index, jvm in enumerate(jvms):
            jvm.say(prepare(job, index, REWARM_S if _POOL.warm[index] else WARMUP_S))
        for index, jvm in enumerate(jvms):
            jvm.reply("ready", START_LIMIT_S)
            _POOL.warm[index] = True
        before()
        start_ns = time.monotonic_ns() + 50_000_000  # every JVM told before it comes
        for jvm in jvms:
            jvm.say(f"go {start_ns}")
        reports = [jvm.reply("records", job.duration + GRACE_S + 30.0) for jvm in jvms]
        after()
    except BaseException:
        _POOL.close()
        raise
    if any(report["stragglers"] for report in reports):
        _POOL.close()
    else:
        _POOL.pause()
    return reports
