"""What ``aiolock list`` reads: the lock-like objects of a keyspace, a SCAN page at a time.

The keys are scanned one Redis type at a time (SCAN's TYPE: an application's many strings
cost a page, not a command each), and each page is read in one pipeline (a lock's hash,
lease and the existence of the rarer kinds' keys; one PUBSUB NUMSUB for the page's
channels), so the cost is per page, not per key, and the output can be written as it
comes. Names of the rarer kinds (fair, read-write, permit-expirable, aiolock's own layout)
and every name on a cluster are read one by one, as ``inspect`` reads them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError

from .._keys import (
    fair_queue_key,
    fair_timeout_key,
    fenced_token_key,
    latch_channel,
    lock_channel,
    semaphore_channel,
    suffixed,
)
from .._net.scripts import load_script
from ._inspect import (
    KINDS,
    Inspector,
    UnknownKindError,
    _hold_counts,
    _int,
    _pairs,
    _seconds,
    _text,
    _unwrap,
    decode_holder,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ("Lister",)

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


class Lister(Inspector):
    """An `Inspector` that also lists (``objects``, ``list``)."""

    def __init__(self, redis: Redis | RedisCluster, *, key_prefix: str = "") -> None:
        super().__init__(redis, key_prefix=key_prefix)
        #: Whether the last `objects()` was cut short (by its limit or scan budget).
        self.truncated = False
        # Pages are read by list_page.lua until the server refuses scripts to this user.
        self._scripted = True

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
                    infos = await self._read_page(page, known)
                    await self.locate(infos)
                    for info in infos:
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
        """The views of plain locks and counters, in one round trip; the rest to ``others``."""
        channels = [lock_channel(self._prefix + name) for name in hashes]
        for name in strings:
            channels += (semaphore_channel(self._prefix + name), latch_channel(self._prefix + name))
        rows, numsub = await self._rows(hashes, strings, channels)
        waiting = {_text(c): int(n) for c, n in _pairs(numsub)}
        found: list[dict[str, Any]] = []
        for name, (raw, pttl, rarer) in zip(hashes, rows, strict=False):
            fields = {_text(k): _text(v) for k, v in raw.items()} if raw else {}
            if rarer or "mode" in fields:
                others.append(name)
            elif fields and _hold_counts(fields):
                found.append(_lock_info(self._prefix, name, fields, pttl, waiting))
        for name, (value, pttl, rarer) in zip(strings, rows[len(hashes) :], strict=True):
            if rarer:
                others.append(name)
            elif _int(value) is not None:
                found.append(_counter_info(self._prefix, name, _int(value), pttl, waiting))
        return found

    async def _rows(
        self, hashes: list[str], strings: list[str], channels: list[str]
    ) -> tuple[list[tuple[Any, Any, int]], Any]:
        """Per name (hashes, then strings): data, PTTL, how many rarer kinds' keys exist.

        Data: a hash's fields as a dict, a string's value; and the channels' NUMSUB. One
        pipeline: ``list_page.lua`` for the page (one reply instead of three a name)
        and PUBSUB NUMSUB. A user that may not run scripts gets the same in plain
        commands.
        """
        if self._scripted:
            keys: list[str] = []
            for name in (*hashes, *strings):
                key = self._prefix + name
                keys += (
                    key,
                    fair_queue_key(key),
                    fair_timeout_key(key),
                    fenced_token_key(key),
                    suffixed(key, "timeout"),
                )
            types = ["hash"] * len(hashes) + ["string"] * len(strings)
            pipe = self._redis.pipeline(transaction=False)
            pipe.eval(load_script("list_page").text, len(keys), *keys, *types)
            pipe.execute_command("PUBSUB", "NUMSUB", *channels)
            try:
                page, numsub = await pipe.execute()
            except NoPermissionError:
                self._scripted = False
            else:
                rows = [
                    (dict(_pairs(data)) if i < len(hashes) and data else data, pttl, int(rarer))
                    for i, (data, pttl, rarer) in enumerate(page)
                ]
                return rows, numsub
        pipe = self._redis.pipeline(transaction=False)
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
        for name in strings:
            key = self._prefix + name
            pipe.get(key)
            pipe.pttl(key)
            pipe.exists(suffixed(key, "timeout"))  # a permit-expirable semaphore
        pipe.execute_command("PUBSUB", "NUMSUB", *channels)
        data = await pipe.execute()
        replies = iter(data[:-1])
        return [(d, p, int(r)) for d, p, r in zip(replies, replies, replies, strict=True)], data[-1]

    async def list(
        self, pattern: str, *, limit: int, scan_budget: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """`objects()` as a list; and whether it was cut short."""
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


def _lock_like(info: dict[str, Any], *, everything: bool) -> bool:
    """Not an application's own hash or number that happens to match the pattern."""
    if info["kind"] in ("lock", "fenced_lock", "fair_lock", "read_write_lock"):
        return all(isinstance(h["count"], int) and h["count"] > 0 for h in info["holders"])
    if info["kind"] == "semaphore_or_latch":
        # Nobody waits on it (else its kind would be known): maybe any application's
        # counter, so shown only where a pattern asks for it.
        return not everything
    return True
