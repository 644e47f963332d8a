"""aiolock names its connections (issue 37): ``aiolock:<client id>:<host>:<pid>``.

An operator's ``CLIENT LIST`` (and ``aiolock inspect``) tells which host and process hold a
lock, with no key written.
"""

from __future__ import annotations

import os

from redis.asyncio import Redis

import aiolock
from aiolock._client import connection_name


async def names(raw: Redis) -> list[str]:
    return [c.get("name", "") for c in await raw.client_list()]


async def test_every_connection_of_a_client_is_named(redis_url: str, raw: Redis, name: str) -> None:
    async with aiolock.Client.from_url(redis_url) as client:
        async with client.lock(name):
            pass
        mine = [n for n in await names(raw) if n.startswith(f"aiolock:{client.id}:")]
        # The command connection (pub/sub connects only when something waits).
        assert mine, await names(raw)
        assert all(n == connection_name(client.id) for n in mine)
        assert mine[0].endswith(f":{os.getpid()}")


async def test_a_name_the_user_gave_is_kept(redis_url: str, raw: Redis, name: str) -> None:
    redis = Redis.from_url(redis_url, client_name="billing-worker")
    async with aiolock.Client(redis) as client:
        async with client.lock(name):
            pass
        assert not [n for n in await names(raw) if n.startswith(f"aiolock:{client.id}")]
        assert "billing-worker" in await names(raw)
    await redis.aclose()
