"""The redis client a CLI command reads through: one server, a Sentinel group or a Cluster.

The same URL forms as ``Client.from_url`` (``redis://``, ``rediss://``, ``unix://``), with
``--cluster`` as its ``cluster=True``. Sentinel, which ``from_url`` does not take, is
``--sentinel PRIMARY`` with the URL naming the sentinels (``redis://h1:26379,h2:26379``):
the client then goes to the primary through ``master_for``, as ``Client(redis)`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

__all__ = ("BadUrlError", "connected")

# A command line tool must not hang on an unreachable host, nor retry a refused connection
# with back-off: it says so at once. The URL's own query options win over these.
_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 10.0,
    "retry": Retry(NoBackoff(), 0),
}


class BadUrlError(ValueError):
    """The URL (or its combination with --cluster / --sentinel) cannot be used."""


@contextlib.asynccontextmanager
async def connected(
    url: str, *, cluster: bool, sentinel: str | None
) -> AsyncIterator[Redis | RedisCluster]:
    """A redis client for ``url``, closed (the sentinels' connections too) at the end.

    Without ``--cluster`` or ``--sentinel`` the server is asked whether it is a cluster
    node (``INFO cluster``); if it is, the client is a cluster client, as with ``--cluster``.
    """
    sentinels: list[Redis] = []
    redis = _client(url, cluster=cluster, sentinel=sentinel, sentinels=sentinels)
    try:
        if isinstance(redis, Redis) and sentinel is None and await _cluster_node(redis):
            # A plain client on a cluster node sees that node's keys only (a list would
            # silently show a third of the locks) and MOVED for the others: the command
            # runs on the whole cluster, as with --cluster.
            await redis.aclose()
            redis = RedisCluster.from_url(url, **_DEFAULTS)
        yield redis
    finally:
        try:
            await redis.aclose()
        finally:
            for one in sentinels:
                await one.aclose()


async def _cluster_node(redis: Redis) -> bool:
    """Whether ``redis`` is connected to a node of a Redis Cluster (``INFO cluster``).

    A user that may not run INFO is taken as a plain server's: a MOVED reply then tells
    it to pass --cluster.
    """
    try:
        info = await redis.info("cluster")
    except ResponseError:
        return False
    return bool(info.get("cluster_enabled"))


def _client(
    url: str, *, cluster: bool, sentinel: str | None, sentinels: list[Redis]
) -> Redis | RedisCluster:
    if cluster and sentinel is not None:
        raise BadUrlError("--cluster and --sentinel exclude each other")
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise BadUrlError(f"URL must start with redis://, rediss:// or unix://, got {url!r}")
    try:
        if sentinel is not None:
            return _sentinel_primary(url, sentinel, sentinels)
        if cluster:
            return RedisCluster.from_url(url, **_DEFAULTS)
        return Redis.from_url(url, **_DEFAULTS)
    except ValueError as exc:
        raise BadUrlError(f"bad URL {url!r}: {exc}") from None


def _sentinel_primary(url: str, primary: str, sentinels: list[Redis]) -> Redis:
    """The primary ``primary`` of the sentinels the URL lists (``host:port`` by commas).

    The URL's user, password and database are the primary's; the sentinels are asked
    without them, as they usually need none.
    """
    parts = urlsplit(url)
    if parts.scheme == "unix":
        raise BadUrlError("--sentinel takes redis:// or rediss:// URLs naming the sentinels")
    hosts = parts.netloc.rpartition("@")[2]
    addresses: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        if not name or not port.isdigit():
            raise BadUrlError(f"bad sentinel address {host!r} in {url!r}")
        addresses.append((name, int(port)))
    options: dict[str, Any] = dict(_DEFAULTS)
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    db = parts.path.strip("/")
    if db:
        if not db.isdigit():
            raise BadUrlError(f"bad database number {db!r} in {url!r}")
        options["db"] = int(db)
    if parts.scheme == "rediss":
        options["ssl"] = True
    group = Sentinel(  # type: ignore[no-untyped-call]
        addresses, sentinel_kwargs={"socket_connect_timeout": 5.0, "ssl": parts.scheme == "rediss"}
    )
    sentinels.extend(group.sentinels)
    redis: Redis = group.master_for(primary, **options)
    return redis
