"""The client's settings, derived from its options and its connections' timeouts.

The lifetimes that make a resend safe come from how long one call can take: every unlock
latch and acquire tombstone outlives the last resend of its call that can still reach the
server (``_call_seconds``), so no resend ever counts twice. Everything here runs at
construction, before any I/O, from a connection redis-py built but did not open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import Settings

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from ._config import ClientOptions

__all__ = ("send_deadline", "settings_for")

# A send with no socket timeout can wait without bound; past this many seconds a resend
# window is no longer derived from the connection's settings, only assumed.
_UNBOUNDED_SEND = 30.0
_BACKOFF_CAP = 10.0
# Margin on every latch and tombstone beyond the last resend that can still reach the server.
_LATCH_MARGIN = 5.0


def send_deadline(sample: AbstractConnection) -> float:
    """How long one send on such a connection may wait for its reply (seconds)."""
    return float(sample.socket_timeout or _UNBOUNDED_SEND)


def settings_for(options: ClientOptions, sample: AbstractConnection, *, cluster: bool) -> Settings:
    """The settings of a client with ``options`` whose connections are like ``sample``.

    ValueError if the options cannot work over such a connection (a replica wait no shorter
    than its socket timeout).
    """
    lease_ms = round(options.watchdog_timeout * 1000)
    deadline = send_deadline(sample)
    if options.replica_acks and options.replica_ack_timeout >= deadline:
        # WAIT holds its connection's replies back: past the deadline the connection
        # would be declared dead.
        raise ValueError(
            f"replica_ack_timeout must be shorter than the connection's socket_timeout "
            f"({deadline:g} s), got {options.replica_ack_timeout:g} s"
        )
    return Settings(
        lease_ms=lease_ms,
        # Every unlock latch and acquire tombstone outlives the first send of its call
        # by more than every resend can take, so no resend ever counts twice.
        latch_ttl_ms=round(
            (_call_seconds(sample, options) + options.watchdog_timeout + _LATCH_MARGIN) * 1000
        ),
        # A call cut off by a cancel or an outage is resent in the background for at
        # most a watchdog lease.
        resend_window_ms=lease_ms,
        ttl_cap=options.watchdog_timeout,
        fair_wait_ms=round(options.fair_lock_wait_timeout * 1000),
        retry_interval=options.retry_interval,
        key_prefix=options.key_prefix,
        # Where a cluster's servers have sharded pub/sub, Redisson publishes with
        # SPUBLISH; aiolock requires it there (see _net/cluster.py).
        publish="SPUBLISH" if cluster else "PUBLISH",
        cluster=cluster,
        replica_acks=options.replica_acks,
        replica_ack_timeout=options.replica_ack_timeout,
        server=server_of(sample, cluster=cluster),
    )


def server_of(sample: AbstractConnection, *, cluster: bool) -> str:
    """The server (or Sentinel group, or cluster) connections like ``sample`` talk to.

    What every process names alike from its settings alone, with no round trip: a
    MultiLock orders members of the same key on different servers by it, and two
    processes must agree on that order. A cluster is one key space: its seeds (which
    processes may list differently) are left out.
    """
    if cluster:
        return "cluster"
    db = getattr(sample, "db", 0)
    service = getattr(getattr(sample, "connection_pool", None), "service_name", None)
    if isinstance(service, str):
        return f"sentinel:{service}/{db}"
    path = getattr(sample, "path", None)
    if isinstance(path, str) and path:
        return f"unix:{path}/{db}"
    host = str(getattr(sample, "host", "")).lower()
    return f"{_LOOPBACK.get(host, host)}:{getattr(sample, 'port', '')}/{db}"


# The names of the loopback address a process may use for the same local server.
_LOOPBACK = {"localhost": "127.0.0.1", "::1": "127.0.0.1", "[::1]": "127.0.0.1"}


def _call_seconds(conn: AbstractConnection, options: ClientOptions) -> float:
    """The longest one script call can take from its first send to its last resend.

    Each of the client's tries (``retry_attempts`` + 1) is one redis-py command, which
    redis-py itself may retry on a fresh connection; each send may connect, write and wait
    for the reply, each bounded by the connection's own timeouts. A connection without a
    socket timeout, or a redis-py retry without end, bounds nothing: then a send is assumed
    to take at most ``_UNBOUNDED_SEND`` and redis-py to retry at most 3 times.
    """
    socket = conn.socket_timeout or _UNBOUNDED_SEND
    connect = conn.socket_connect_timeout or socket
    # get_retries() is newer than some redis-py releases the package accepts.
    get_retries = getattr(conn.retry, "get_retries", None)
    retries = get_retries() if get_retries is not None else 3
    if retries < 0:
        retries = 3
    # Each pause between redis-py's own tries is at most its backoff cap (10 s by default).
    one_try = (retries + 1) * (connect + 2 * socket) + retries * _BACKOFF_CAP
    tries = options.retry_attempts + 1
    return tries * one_try + options.retry_attempts * options.retry_interval
