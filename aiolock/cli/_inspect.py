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
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster

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
# Keys per SCAN page: each page is read in two pipelines.
_SCAN_COUNT = 1000
# The Redis types of every key an object has (scanned one type at a time, SCAN's TYPE).
_OBJECT_TYPES = ("hash", "zset", "list", "string")
# The auxiliary keys ``list`` maps back to their object's name: (prefix-form prefix).
_AUX_PREFIXES = (
    "redisson_lock_queue",
    "redisson_lock_timeout",
    "redisson_lock_token",
    "aiolock_frw",
    "aiolock_frw_queue",
)
# Keys that are never an object's own: latches and tombstones of calls, lease books.
_SKIPPED_PREFIXES = (
    "redisson_unlock_latch:",
    "aiolock_acquire_cancel:",
    "aiolock_frw_leases:",
    "aiolock_frw_deadlines:",
    "aiolock_frw_admitted:",
)


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
        #: Whether the last :meth:`objects` was cut short (by its limit or scan budget).
        self.truncated = False

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
        return info

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

    # -- many objects -------------------------------------------------------------------------

    async def _scan_pages(
        self, pattern: str, kind: str, budget: list[int]
    ) -> AsyncIterator[list[str]]:
        """The keys of Redis type ``kind`` matching ``pattern``, a SCAN page at a time.

        Every primary of a cluster is scanned. ``budget[0]``: how many more keys may be
        looked at (lowered here); when it runs out, ``self.truncated`` is set and the
        scan ends.
        """
        if isinstance(self._redis, RedisCluster):
            # The node table is filled by the first command: make sure it has been.
            await self._redis.initialize()
            nodes: list[Any] = list(self._redis.get_primaries())
        else:
            nodes = [None]
        for node in nodes:
            cursor = 0
            while True:
                # TYPE: the server leaves out the other types (an application's many
                # strings cost a page, not a command each).
                args = ("SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT, "TYPE", kind)
                if node is None:
                    reply = await self._do(*args)
                else:
                    assert isinstance(self._redis, RedisCluster)
                    reply = await self._redis.execute_command(*args, target_nodes=node)
                # redis-py's cluster client merges SCAN replies per node: {node: cursor}.
                head = reply[0]
                cursor = int(next(iter(head.values())) if isinstance(head, dict) else head)
                batch = [_text(k) for k in reply[1]]
                budget[0] -= len(batch)
                if batch:
                    yield batch
                if budget[0] <= 0:
                    self.truncated = True
                    return
                if cursor == 0:
                    break

    def _name_of(self, key: str) -> str | None:
        """The object name (without the key prefix) a key found by ``list`` belongs to."""
        if key.startswith(_SKIPPED_PREFIXES) or ":rwlock_timeout:" in key:
            return None
        for prefix in _AUX_PREFIXES:
            if key.startswith(prefix + ":"):
                key = _unwrap(key[len(prefix) + 1 :])
                break
        else:
            if key.endswith(":timeout"):
                key = _unwrap(key[: -len(":timeout")])
        if not key.startswith(self._prefix):
            return None
        return key[len(self._prefix) :]

    async def objects(
        self, pattern: str, *, limit: int, scan_budget: int
    ) -> AsyncIterator[dict[str, Any]]:
        """The lock-like objects whose names match ``pattern``, as they are found.

        A SCAN page at a time: its names are told apart and read in two pipelines (one
        round trip each), so the cost is per page, not per key, and the output can be
        written as it comes (sorted within a page, not across). After the iteration,
        ``self.truncated`` says whether ``limit`` or ``scan_budget`` cut it short.

        With the default pattern ``*``, a plain integer string that nobody waits on is left
        out: it may be a semaphore or a latch, or any application's counter. A pattern of
        one's own shows them.
        """
        self.truncated = False
        everything = pattern == "*"
        full = self._prefix + pattern
        # An object of aiolock's own layout, or a fair lock with only waiters, has no key
        # named by the pattern itself: its derived keys carry the name in braces (also
        # under a key prefix, where the pattern is no longer "*").
        patterns = [full] if full == "*" else [full, f"*{{{full}}}*"]
        names: set[str] = set()
        shown = 0
        for glob in patterns:
            budget = [scan_budget]
            for kind in _OBJECT_TYPES:
                if budget[0] <= 0:
                    break
                async for found in self._scan_pages(glob, kind, budget):
                    keys = found
                    if kind == "string" and everything:
                        keys = await self._strings_to_read(found)
                    mapped = {key: self._name_of(key) for key in keys}
                    page = sorted({name for name in mapped.values() if name is not None} - names)
                    names.update(page)
                    # An object's own key (not a derived one) is of the type scanned.
                    known = {
                        name: kind
                        for key, name in mapped.items()
                        if name is not None and key == self._prefix + name
                    }
                    for info in await self._read_page(page, known):
                        if not _lock_like(info, everything=everything):
                            continue
                        if shown >= limit:
                            self.truncated = True
                            return
                        shown += 1
                        yield info

    async def _strings_to_read(self, keys: list[str]) -> list[str]:
        """The string keys of a page that may be shown under the pattern ``*``.

        An object's own string (a semaphore's or latch's count) is shown only when someone
        waits on it (a permit-expirable semaphore is found by its expiry set, a key of
        another type): one PUBSUB NUMSUB for the page, instead of reading every
        application string. Derived keys (a fencing token) are read as ever.
        """
        own = {key for key in keys if self._name_of(key) == key[len(self._prefix) :]}
        if not own:
            return keys
        if self._cluster:
            # Channels are sharded by slot there: asked one by one.
            waited = {key for key in own if await self._waited_on(key)}
        else:
            channels = [ch for key in own for ch in (semaphore_channel(key), latch_channel(key))]
            reply = await self._do("PUBSUB", "NUMSUB", *channels)
            counts = {_text(channel): int(n) for channel, n in _pairs(reply)}
            waited = {
                key
                for key in own
                if counts.get(semaphore_channel(key)) or counts.get(latch_channel(key))
            }
        return [key for key in keys if key not in own or key in waited]

    async def _waited_on(self, key: str) -> bool:
        return bool(
            await self.subscribers(semaphore_channel(key))
            or await self.subscribers(latch_channel(key))
        )

    async def _inspect_known(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.inspect(name)
        except UnknownKindError:
            return None

    async def _read_page(self, names: list[str], known: dict[str, str]) -> list[dict[str, Any]]:
        """What ``inspect`` shows of each of ``names`` that exists and is an object.

        ``known``: the Redis type of the names whose own key the scan found. A lock (or
        a semaphore's or latch's count) is read with the rest of the page in ONE
        pipeline: its hash (or value), lease, whether keys of the rarer kinds exist, and
        one PUBSUB NUMSUB for every channel. The rarer kinds (fair, fenced, read-write,
        permit-expirable, aiolock's own layout), names found by a derived key only, and
        every name on a cluster (whose pipelines split by slot) are read one by one, as
        ``inspect`` reads them.
        """
        if not names:
            return []
        if self._cluster:
            return [info for name in names if (info := await self._inspect_known(name))]
        hashes = [name for name in names if known.get(name) == "hash"]
        strings = [name for name in names if known.get(name) == "string"]
        others = [name for name in names if known.get(name) not in ("hash", "string")]
        found = await self._read_common(hashes, strings, others) if hashes or strings else []
        for name in others:
            info = await self._inspect_known(name)
            if info is not None:
                found.append(info)
        found.sort(key=lambda info: info["name"])
        return found

    async def _read_common(
        self, hashes: list[str], strings: list[str], others: list[str]
    ) -> list[dict[str, Any]]:
        """The views of plain locks and counters, in one pipeline; the rest to ``others``."""
        pipe = self._redis.pipeline(transaction=False)
        channels: list[str] = []
        for name in hashes:
            key = self._prefix + name
            pipe.hgetall(key)
            pipe.pttl(key)
            # Any of these: a fair or fenced lock (or a key shared oddly): read by inspect.
            pipe.exists(
                fair_queue_key(key),
                fair_timeout_key(key),
                fenced_token_key(key),
                suffixed(key, "timeout"),
            )
            channels.append(lock_channel(key))
        for name in strings:
            key = self._prefix + name
            pipe.get(key)
            pipe.pttl(key)
            pipe.exists(suffixed(key, "timeout"))  # a permit-expirable semaphore
            channels += (semaphore_channel(key), latch_channel(key))
        pipe.execute_command("PUBSUB", "NUMSUB", *channels)
        data = await pipe.execute()
        waiting = {_text(c): int(n) for c, n in _pairs(data[-1])}
        found: list[dict[str, Any]] = []
        replies = iter(data)
        for name in hashes:
            raw, pttl, rarer = next(replies), next(replies), next(replies)
            fields = {_text(k): _text(v) for k, v in raw.items()}
            if rarer or "mode" in fields:
                others.append(name)
            elif fields and _hold_counts(fields):
                found.append(_lock_info(self._prefix, name, fields, pttl, waiting))
        for name in strings:
            value, pttl, rarer = next(replies), next(replies), next(replies)
            if rarer:
                others.append(name)
            elif _int(value) is not None:
                found.append(_counter_info(self._prefix, name, _int(value), pttl, waiting))
        return found

    async def list(
        self, pattern: str, *, limit: int, scan_budget: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """:meth:`objects` as a list; and whether it was cut short."""
        found = [info async for info in self.objects(pattern, limit=limit, scan_budget=scan_budget)]
        return found, self.truncated


def _base_info(prefix: str, name: str, kind: str) -> dict[str, Any]:
    return {
        "name": name,
        "key": prefix + name,
        "kind": kind,
        "kind_text": KINDS[kind],
        "lease_left": None,
        "holders": [],
        "queue": [],
        "waiters_subscribed": 0,
    }


def _lock_info(
    prefix: str, name: str, fields: dict[str, str], pttl: Any, waiting: dict[str, int]
) -> dict[str, Any]:
    """A lock's view from its hash, PTTL and subscribers, as inspect's."""
    info = _base_info(prefix, name, "lock")
    key = info["key"]
    info["lease_left"] = _seconds(int(pttl))
    info["holders"] = [
        {**decode_holder(field), "count": _int(count), "lease_left": info["lease_left"]}
        for field, count in fields.items()
    ]
    info["channel"] = lock_channel(key)
    info["waiters_subscribed"] = waiting.get(info["channel"], 0)
    return info


def _counter_info(
    prefix: str, name: str, value: int | None, pttl: Any, waiting: dict[str, int]
) -> dict[str, Any]:
    """A semaphore's or latch's view, told apart by who waits on which channel."""
    key = prefix + name
    sem, latch = semaphore_channel(key), latch_channel(key)
    on_sem, on_latch = waiting.get(sem, 0), waiting.get(latch, 0)
    if on_latch and not on_sem:
        kind, channel, count = "count_down_latch", latch, on_latch
    else:
        kind = "semaphore" if on_sem and not on_latch else "semaphore_or_latch"
        channel, count = sem, on_sem
    info = _base_info(prefix, name, kind)
    info["lease_left"] = _seconds(int(pttl))
    info["channel"] = channel
    info["waiters_subscribed"] = count
    if kind == "semaphore":
        info["permits"] = value
    elif kind == "count_down_latch":
        info["count"] = value or 0
    else:
        info["permits"] = info["count"] = value
        info["channels"] = [sem, latch]
    return info


def _hold_counts(fields: dict[str, str]) -> bool:
    """Whether a hash's fields are a lock's: hold counts > 0 (and a read-write lock's mode).

    An application's hash that happens to have the name (a session, a cart) is not, and
    is never shown nor deleted as a lock.
    """
    holds = dict(fields)
    if holds.pop("mode", "read") not in ("read", "write"):
        return False
    return all((count := _int(value)) is not None and count > 0 for value in holds.values())


def _lock_like(info: dict[str, Any], *, everything: bool) -> bool:
    """Not an application's own hash or number that happens to match the pattern."""
    if info["kind"] in ("lock", "fenced_lock", "fair_lock", "read_write_lock"):
        return all(isinstance(h["count"], int) and h["count"] > 0 for h in info["holders"])
    if info["kind"] == "semaphore_or_latch":
        # Nobody waits on it (else its kind would be known): maybe any application's
        # counter, so shown only where a pattern asks for it.
        return not everything
    return True
