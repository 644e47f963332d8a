"""What the CLI reads of one object: its kind told from the keys present, and its state.

Read-only, and for both layouts: Redisson's (a Java client's locks) and aiolock's own (the
fair read-write lock). Every key and channel name comes from ``aiolock._keys``; the object
kind is told from which keys exist and their types, as Redisson itself stores no kind.

Everything here returns plain JSON-ready dicts: ``--json`` prints them as they are and the
tables are drawn from them (``_render.py``).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from .._keys import (
    fair_channel_base,
    fair_queue_key,
    fair_timeout_key,
    fenced_token_key,
    latch_channel,
    lock_channel,
    prefixed,
    rwlock_channel,
    rwlock_timeout_prefix,
    semaphore_channel,
    suffixed,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ("KINDS", "NOT_LOCKS", "Inspector", "UnknownKindError", "decode_holder")

#: Every kind the CLI tells apart, with the words its tables use.
KINDS = {
    "lock": "lock (reentrant / spin)",
    "fenced_lock": "fenced lock",
    "fair_lock": "fair lock",
    "read_write_lock": "read-write lock",
    "fair_read_write_lock": "fair read-write lock (aiolock)",
    "semaphore": "semaphore",
    "permit_expirable_semaphore": "permit-expirable semaphore",
    "count_down_latch": "count-down latch",
    # A string of an integer with nobody waiting on either channel: both store just that.
    "semaphore_or_latch": "semaphore or count-down latch",
}
#: The kinds with no holder to unlock.
NOT_LOCKS = frozenset(
    {"semaphore", "permit_expirable_semaphore", "count_down_latch", "semaphore_or_latch"}
)

# A permit-expirable semaphore's "no lease" expiry (redisson-spec-2.md 3.1).
_NO_LEASE = 922337203685477
# A holder id: a client's UUID (Java's text form) then ``:<thread or task number>`` or
# aiolock's ``:owner:<owner>``.
_HOLDER = re.compile(
    r"(?P<client>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r":(?:(?P<thread>-?\d+)|owner:(?P<owner>.*))$"
)
# How many per-hold timeout keys of one read holder are looked at (a holder's read-hold
# count is usually 1 or 2; past this the lease shown is of the first ones).
_READ_HOLDS_SHOWN = 32


def _pairs(reply: list[Any]) -> list[tuple[Any, Any]]:
    """A WITHSCORES reply as (member, score) pairs: flat on RESP2, nested on RESP3."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(member, score) for member, score in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


class UnknownKindError(Exception):
    """The name holds a key that is no object aiolock or Redisson recognises."""


def decode_holder(holder: str) -> dict[str, Any]:
    """A holder id's parts: the client's UUID, and the thread (task) number or the owner.

    Redisson's ``<uuid>:<threadId>`` and aiolock's ``<uuid>:<n>`` (a task) have one form;
    aiolock's ``<uuid>:owner:<owner>`` is an explicit ``owner=``. Anything else is shown
    as it is (client None).
    """
    match = _HOLDER.match(holder)
    if match is None:
        return {"id": holder, "client": None, "thread": None, "owner": None}
    thread = match["thread"]
    return {
        "id": holder,
        "client": match["client"],
        "thread": int(thread) if thread is not None else None,
        "owner": match["owner"],
    }


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _seconds(ms: int | None) -> float | None:
    return None if ms is None or ms < 0 else round(ms / 1000, 3)


def _until(at_ms: float | None, now_ms: float) -> float | None:
    """Seconds from ``now_ms`` to the epoch-ms moment ``at_ms`` (None stays None)."""
    return None if at_ms is None else round((at_ms - now_ms) / 1000, 3)


def _unwrap(rest: str) -> str:
    """The name inside a derived key's ``{name}`` part (prefix or suffix form)."""
    if rest.startswith("{") and rest.endswith("}") and rest.count("{") == 1:
        return rest[1:-1]
    return rest


class Inspector:
    """Reads objects through one redis client (single server, Sentinel or Cluster)."""

    def __init__(self, redis: Redis | RedisCluster, *, key_prefix: str = "") -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._cluster = isinstance(redis, RedisCluster)

    async def _do(self, *args: Any) -> Any:
        return await self._redis.execute_command(*args)

    async def _exists(self, key: str) -> bool:
        return bool(await self._do("EXISTS", key))

    async def _pttl(self, key: str) -> float | None:
        return _seconds(int(await self._do("PTTL", key)))

    async def _server_ms(self, key: str) -> int:
        """The server's clock (TIME), on the node that holds ``key``."""
        if isinstance(self._redis, RedisCluster):
            node = self._redis.get_node_from_key(key)
            reply = await self._redis.execute_command("TIME", target_nodes=node)
        else:
            reply = await self._do("TIME")
        seconds, micros = reply if isinstance(reply, list | tuple) else (reply, 0)
        return int(seconds) * 1000 + int(micros) // 1000

    async def subscribers(self, channel: str) -> int:
        """Clients subscribed to ``channel``.

        Sharded on a cluster, as aiolock and Redisson subscribe there; plain on one server.
        """
        if isinstance(self._redis, RedisCluster):
            node = self._redis.get_node_from_key(channel)
            reply = await self._redis.execute_command(
                "PUBSUB", "SHARDNUMSUB", channel, target_nodes=node
            )
        else:
            reply = await self._do("PUBSUB", "NUMSUB", channel)
        return int(reply[1]) if len(reply) > 1 else 0

    # -- one object -------------------------------------------------------------------------

    async def kind(self, name: str) -> str | None:
        """The object's kind, from the keys present; None if it does not exist."""
        key = self._prefix + name
        kind = _text(await self._do("TYPE", key))
        if kind == "hash":
            fields = {_text(k): _text(v) for k, v in (await self._do("HGETALL", key)).items()}
            if not _hold_counts(fields):
                raise UnknownKindError(
                    f"{name!r} is a Redis hash that is not a lock (its fields are not hold counts)"
                )
            return await self._hash_kind(key, fields)
        if kind == "string":
            if _int(await self._do("GET", key)) is None:
                raise UnknownKindError(f"{name!r} holds a string that is not a count")
            return await self._string_kind(key)
        if kind != "none":
            raise UnknownKindError(
                f"{name!r} is a Redis {kind}, not an object aiolock or Redisson recognises"
            )
        return await self._keyless_kind(key)

    async def _hash_kind(self, key: str, fields: dict[str, str]) -> str:
        if "mode" in fields:
            return "read_write_lock"
        if await self._exists(fair_queue_key(key)) or await self._exists(fair_timeout_key(key)):
            return "fair_lock"
        if await self._exists(fenced_token_key(key)):
            return "fenced_lock"
        return "lock"

    async def _string_kind(self, key: str) -> str:
        if await self._exists(suffixed(key, "timeout")):
            return "permit_expirable_semaphore"
        # A semaphore and a latch store the same integer: only their waiters tell them apart.
        latch = await self.subscribers(latch_channel(key))
        semaphore = await self.subscribers(semaphore_channel(key))
        if latch and not semaphore:
            return "count_down_latch"
        if semaphore and not latch:
            return "semaphore"
        return "semaphore_or_latch"

    async def _keyless_kind(self, key: str) -> str | None:
        """No main key: an object of aiolock's own layout, or one with waiters only."""
        checks = (
            (prefixed("aiolock_frw", key), "fair_read_write_lock"),
            (prefixed("aiolock_frw_queue", key), "fair_read_write_lock"),
            (fair_queue_key(key), "fair_lock"),
            (suffixed(key, "timeout"), "permit_expirable_semaphore"),
            (fenced_token_key(key), "fenced_lock"),
        )
        for aux, kind in checks:
            if await self._exists(aux):
                return kind
        return None

    async def inspect(self, name: str) -> dict[str, Any] | None:
        """Everything the CLI shows of ``name``; None if it does not exist."""
        kind = await self.kind(name)
        if kind is None:
            return None
        key = self._prefix + name
        info: dict[str, Any] = {
            "name": name,
            "key": key,
            "kind": kind,
            "kind_text": KINDS[kind],
            "lease_left": None,
            "holders": [],
            "queue": [],
            "waiters_subscribed": 0,
        }
        reader = getattr(self, f"_read_{kind}")
        await reader(key, info)
        await self.locate([info])
        return info

    async def locate(self, infos: list[dict[str, Any]]) -> None:
        """Add host, pid and address to each aiolock holder of ``infos`` that is connected.

        aiolock names its connections ``aiolock:<client id>:<host>:<pid>``: one CLIENT
        LIST (on a cluster, of the node of the first object) tells them. A user that may
        not run CLIENT LIST sees the holders without them.
        """
        if not any(info["holders"] for info in infos):
            return
        try:
            if isinstance(self._redis, RedisCluster):
                node = self._redis.get_node_from_key(infos[0]["key"])
                reply: Any = await self._redis.client_list(target_nodes=node)
            else:
                reply = await self._redis.client_list()
        except ResponseError:
            return
        if isinstance(reply, dict):  # per node
            reply = [entry for entries in reply.values() for entry in entries]
        where = _named_connections(reply)
        for info in infos:
            for holder in info["holders"]:
                found = where.get(holder["client"] or "")
                if found is not None:
                    holder.update(found)

    async def _hash_holders(self, key: str, info: dict[str, Any]) -> dict[str, str]:
        fields = {_text(k): _text(v) for k, v in (await self._do("HGETALL", key)).items()}
        info["lease_left"] = await self._pttl(key)
        return fields

    async def _read_lock(self, key: str, info: dict[str, Any]) -> None:
        fields = await self._hash_holders(key, info)
        info["holders"] = [
            {**decode_holder(field), "count": _int(count), "lease_left": info["lease_left"]}
            for field, count in fields.items()
        ]
        info["channel"] = lock_channel(key)
        info["waiters_subscribed"] = await self.subscribers(info["channel"])

    async def _read_fenced_lock(self, key: str, info: dict[str, Any]) -> None:
        await self._read_lock(key, info)
        info["fencing_token"] = _int(await self._do("GET", fenced_token_key(key)))

    async def _read_fair_lock(self, key: str, info: dict[str, Any]) -> None:
        await self._read_lock(key, info)
        base = fair_channel_base(key)
        waiters = [_text(w) for w in await self._do("LRANGE", fair_queue_key(key), 0, -1)]
        # The eviction deadlines are the waiters' own clocks (epoch ms): compared with ours.
        now_ms = time.time() * 1000
        total = 0
        for position, waiter in enumerate(waiters, start=1):
            score = await self._do("ZSCORE", fair_timeout_key(key), waiter)
            deadline = None if score is None else float(score)
            subscribed = await self.subscribers(f"{base}:{waiter}")
            total += subscribed
            info["queue"].append(
                {
                    "position": position,
                    **decode_holder(waiter),
                    "timeout_at_ms": None if deadline is None else int(deadline),
                    "timeout_in": _until(deadline, now_ms),
                    "subscribed": subscribed,
                }
            )
        # Waiters subscribe to their own channel (base:<holder id>), not to the base.
        info["channel"] = f"{base}:<holder id>"
        info["waiters_subscribed"] = total

    async def _read_read_write_lock(self, key: str, info: dict[str, Any]) -> None:
        fields = await self._hash_holders(key, info)
        info["mode"] = fields.pop("mode", None)
        for field, count in fields.items():
            write = field.endswith(":write")
            holder = field.removesuffix(":write")
            entry = {**decode_holder(holder), "side": "write" if write else "read"}
            entry["count"] = _int(count)
            entry["lease_left"] = info["lease_left"]
            if not write and entry["count"]:
                # Each read hold has a timeout key of its own: the holder's lease is the
                # longest of them.
                prefix = rwlock_timeout_prefix(key, holder)
                leases = [
                    await self._pttl(f"{prefix}:{k}")
                    for k in range(1, min(entry["count"], _READ_HOLDS_SHOWN) + 1)
                ]
                live = [lease for lease in leases if lease is not None]
                entry["lease_left"] = max(live) if live else None
            info["holders"].append(entry)
        info["channel"] = rwlock_channel(key)
        info["waiters_subscribed"] = await self.subscribers(info["channel"])

    async def _read_fair_read_write_lock(self, key: str, info: dict[str, Any]) -> None:
        holds = prefixed("aiolock_frw", key)
        leases = prefixed("aiolock_frw_leases", key)
        fields = {_text(k): _text(v) for k, v in (await self._do("HGETALL", holds)).items()}
        info["mode"] = fields.pop("mode", None)
        info["lease_left"] = await self._pttl(holds)
        # Lease ends and queue deadlines are the server's clock (epoch ms).
        now_ms = await self._server_ms(holds)
        sides = {"r": "read", "w": "write"}
        for field, count in fields.items():
            side, _, holder = field.partition(":")
            score = await self._do("ZSCORE", leases, field)
            info["holders"].append(
                {
                    **decode_holder(holder),
                    "side": sides.get(side, side),
                    "count": _int(count),
                    "lease_left": _until(None if score is None else float(score), now_ms),
                }
            )
        queue = prefixed("aiolock_frw_queue", key)
        deadlines = prefixed("aiolock_frw_deadlines", key)
        for position, waiter in enumerate(await self._do("LRANGE", queue, 0, -1), start=1):
            side, _, holder = _text(waiter).partition(":")
            score = await self._do("ZSCORE", deadlines, waiter)
            info["queue"].append(
                {
                    "position": position,
                    **decode_holder(holder),
                    "side": sides.get(side, side),
                    "timeout_at_ms": None if score is None else int(float(score)),
                    "timeout_in": _until(None if score is None else float(score), now_ms),
                }
            )
        # Readers let in together from the head of the queue, each yet to take its hold
        # (score: the waiter's deadline; they have left the queue list).
        admitted = prefixed("aiolock_frw_admitted", key)
        info["admitted"] = [
            {
                **decode_holder(_text(waiter).partition(":")[2]),
                "side": "read",
                "timeout_in": _until(float(score), now_ms),
            }
            for waiter, score in _pairs(await self._do("ZRANGE", admitted, 0, -1, "WITHSCORES"))
        ]
        info["channel"] = prefixed("aiolock_frw__channel", key)
        info["waiters_subscribed"] = await self.subscribers(info["channel"])

    async def _read_counter(self, key: str, info: dict[str, Any], channel: str) -> int | None:
        value = _int(await self._do("GET", key))
        info["lease_left"] = await self._pttl(key)
        info["channel"] = channel
        info["waiters_subscribed"] = await self.subscribers(channel)
        return value

    async def _read_semaphore(self, key: str, info: dict[str, Any]) -> None:
        info["permits"] = await self._read_counter(key, info, semaphore_channel(key))

    async def _read_count_down_latch(self, key: str, info: dict[str, Any]) -> None:
        info["count"] = await self._read_counter(key, info, latch_channel(key)) or 0

    async def _read_semaphore_or_latch(self, key: str, info: dict[str, Any]) -> None:
        # Nobody waits on either channel: the value is a semaphore's permits or a latch's
        # count. Both are shown.
        value = await self._read_counter(key, info, semaphore_channel(key))
        info["permits"] = info["count"] = value
        info["channels"] = [semaphore_channel(key), latch_channel(key)]

    async def _read_permit_expirable_semaphore(self, key: str, info: dict[str, Any]) -> None:
        info["permits"] = await self._read_counter(key, info, semaphore_channel(key)) or 0
        # Expiries are the acquirers' clocks (epoch ms): compared with ours.
        now_ms = time.time() * 1000
        taken = await self._do("ZRANGE", suffixed(key, "timeout"), 0, -1, "WITHSCORES")
        # RESP2 gives a flat list, RESP3 pairs.
        pairs = (
            list(zip(taken[::2], taken[1::2], strict=True))
            if taken and not isinstance(taken[0], list | tuple)
            else [tuple(pair) for pair in taken]
        )
        info["acquired"] = [
            {
                "permit_id": member.hex() if isinstance(member, bytes) else str(member),
                "expires_in": None
                if int(float(score)) == _NO_LEASE
                else round((float(score) - now_ms) / 1000, 3),
            }
            for member, score in pairs
        ]


def _named_connections(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The connections aiolock named in a CLIENT LIST: client id -> host, pid, address.

    The command connection's address is kept (the first listed of a client).
    """
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = _text(entry.get("name") or "")
        if not name.startswith("aiolock:"):
            continue
        _, client, rest = name.split(":", 2)
        host, _, pid = rest.rpartition(":")
        if client not in found and pid.isdigit():
            found[client] = {"host": host, "pid": int(pid), "address": _text(entry.get("addr", ""))}
    return found


def _hold_counts(fields: dict[str, str]) -> bool:
    """Whether a hash's fields are a lock's: hold counts > 0 (and a read-write lock's mode).

    An application's hash that happens to have the name (a session, a cart) is not, and
    is never shown nor deleted as a lock.
    """
    holds = dict(fields)
    if holds.pop("mode", "read") not in ("read", "write"):
        return False
    return all((count := _int(value)) is not None and count > 0 for value in holds.values())
