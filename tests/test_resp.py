"""aiolock's own EVALSHA packer: the bytes hiredis would send, and what the server receives."""

from __future__ import annotations

import asyncio
import urllib.parse

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from aiolock._net.resp import pack, pack_script

from . import inside

_SHA = b"0123456789abcdef0123456789abcdef01234567"

# What the scripts are given: keys as str, arguments as str, int or bytes.
_args = st.lists(
    st.one_of(st.text(), st.integers(min_value=-(2**70), max_value=2**70), st.binary()),
    max_size=8,
)


@given(keys=st.lists(st.text(), max_size=5), args=_args)
@settings(max_examples=300, deadline=None)
def test_same_bytes_as_hiredis(keys: list[str], args: list[str | int | bytes]) -> None:
    expected = inside.pack_command((b"EVALSHA", _SHA, len(keys), *keys, *args))
    # Twice: the second time the arguments come from the cache.
    assert pack_script(_SHA, keys, args) == expected
    assert pack_script(_SHA, keys, args) == expected


def test_cache_is_bounded_and_stays_right_when_cleared() -> None:
    for n in range(2 * inside.packed_arguments_limit()):
        packed = pack_script(_SHA, [f"latch:{n}"], ["holder", n])
        assert packed == inside.pack_command((b"EVALSHA", _SHA, 1, f"latch:{n}", "holder", n))
        # Cleared before a call once full: at most one call's arguments beyond the limit.
        assert inside.packed_arguments_cached() <= inside.packed_arguments_limit() + 2


@pytest.mark.parametrize("bad", [None, object(), 1j])
def test_an_argument_redis_cannot_take_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="cannot send"):
        pack_script(_SHA, ["key"], [bad])  # type: ignore[list-item]


async def test_server_receives_every_key_and_argument(redis_url: str, raw: Redis) -> None:
    """Sent on a plain socket, the packed call reaches the script byte for byte."""
    sha = await raw.script_load("return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]}")
    keys = ["k:é{slot}", ""]
    args: list[str | int | bytes] = ["holder:1", -30000, b"\x00\r\n\xff"]
    parts = urllib.parse.urlsplit(redis_url)
    if parts.scheme != "redis":
        pytest.skip(f"a plain socket cannot speak {parts.scheme}://")
    setup = [pack("SELECT", parts.path.lstrip("/") or "0")]
    if parts.password:
        login = [urllib.parse.unquote(parts.username)] if parts.username else []
        setup.insert(0, pack("AUTH", *login, urllib.parse.unquote(parts.password)))
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(b"".join(setup) + pack_script(sha.encode(), keys, args))
        parser = hiredis.Reader()
        replies: list[object] = []
        while len(replies) < len(setup) + 1:
            parser.feed(await reader.read(65536))
            while (reply := parser.gets()) is not False:
                replies.append(reply)
    finally:
        writer.close()
        await writer.wait_closed()
    assert replies[-1] == [
        "k:é{slot}".encode(),
        b"",
        b"holder:1",
        b"-30000",
        b"\x00\r\n\xff",
    ]
