"""aiolock's own connections over TLS, opened from a ``rediss://`` URL as redis-py opens them.

The test servers speak plain TCP (the embedded Valkey has no TLS build), so a small TLS
terminator in front of the server stands in for a TLS-enabled one: the client side is real
TLS, certificate verification included.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock

from . import inside

_OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(_OPENSSL is None, reason="needs openssl to make a certificate")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key for 127.0.0.1."""
    assert _OPENSSL is not None
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            _OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
    finally:
        writer.close()


@pytest.fixture
async def tls_url(redis_url: str, certificate: tuple[Path, Path]) -> AsyncIterator[str]:
    """A ``rediss://`` URL whose TLS ends in front of the test server."""
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    target = urlsplit(redis_url)
    tasks: set[asyncio.Task[None]] = set()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
        pair = (_pipe(reader, up_writer), _pipe(up_reader, writer))
        tasks.update(asyncio.create_task(p) for p in pair)

    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    yield f"rediss://127.0.0.1:{port}{target.path}?ssl_ca_certs={quote(str(cert))}"
    server.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await server.wait_closed()


@pytest.mark.parametrize("wire", ["direct", "redis-py"])
async def test_locks_and_wake_ups_over_tls(
    tls_url: str, wire: str, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("AIOLOCK_WIRE", wire)
    async with aiolock.Client.from_url(tls_url) as client:
        lock = client.lock(name)
        started = asyncio.Event()

        async def waiter() -> bool:
            started.set()
            got = await lock.try_lock(10)
            await lock.unlock()
            return got

        async with lock:
            task = asyncio.create_task(waiter())
            await started.wait()
        assert await task  # woken through the pub/sub connection, over TLS too
        transport_wire = inside.wire_of(inside.transport(client))
        assert transport_wire is not None
        assert transport_wire.direct == (wire == "direct")


async def test_an_unverified_certificate_is_refused(tls_url: str, name: str) -> None:
    """The user's TLS settings are used as they are: without the CA, no connection."""
    url = tls_url.split("?", 1)[0]
    async with aiolock.Client.from_url(url, retry_attempts=0) as client:
        with pytest.raises(RedisConnectionError) as info:
            await client.lock(name).lock()
    # The TLS failure itself is in the chain (redis-py before 5.1 words the error as
    # "Error 1 connecting", without the reason).
    chain: list[BaseException] = []
    error: BaseException | None = info.value
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in chain), chain
