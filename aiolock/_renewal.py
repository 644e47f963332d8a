"""The watchdog: ONE task per client renews every watchdog-held lease in batches.

Every ``watchdog_timeout / 3`` it sends one script call per batch of at most 100 holds of
one kind: ``hash`` holds (a holder field in a hash: lock, fair lock, write lock) through
``lock_renew.lua``, ``read`` holds (a read-write lock's reader) through ``rw_read_renew.lua``,
which renews that holder's own per-hold timeout keys, and nobody else's, and judges each
read hold alive by its own timeout key, not by the holder's field. A hold whose
holder field is gone is reported lost (WARNING, then ``LockLostError`` at the holder's
unlock); an error is logged and the next period tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from ._cancel import cancel_mark, cancelled_since
from ._scripts import load_script

if TYPE_CHECKING:
    from ._holds import Hold
    from ._scripts import Script, ScriptRunner

__all__ = ("BATCH_SIZE", "RenewalService")

log = logging.getLogger("aiolock")

BATCH_SIZE = 100

KeysOf = Callable[[list["Hold"]], list[str]]
ArgsOf = Callable[[list["Hold"]], list[str]]


def _hash_kind() -> tuple[Script, KeysOf, ArgsOf]:
    # KEYS[i] = the hash of hold i; ARGV[i+1] = its holder field.
    return (
        load_script("lock_renew"),
        lambda batch: [hold.key for hold in batch],
        lambda batch: [hold.field for hold in batch],
    )


def _watchdog_holds(hold: Hold) -> str:
    # Read hold k (1-based, in acquisition order) has its own timeout key and lease; only
    # those taken without an explicit lease are the watchdog's to renew.
    return ",".join(str(k) for k, lease in enumerate(hold.leases, 1) if lease is None)


def _read_kind() -> tuple[Script, KeysOf, ArgsOf]:
    # KEYS[2i-1], KEYS[2i] = the hash of hold i and its holder's timeout-key prefix;
    # ARGV[2i], ARGV[2i+1] = its holder field and the numbers of its watchdog holds.
    return (
        load_script("rw_read_renew"),
        lambda batch: [key for hold in batch for key in (hold.key, hold.extra)],
        lambda batch: [arg for hold in batch for arg in (hold.field, _watchdog_holds(hold))],
    )


def _fair_rw_kind() -> tuple[Script, KeysOf, ArgsOf]:
    # KEYS[2i-1], KEYS[2i] = the holds' hash of hold i and its leases ZSET; ARGV[i+1] = its
    # field.
    return (
        load_script("frw_renew"),
        lambda batch: [key for hold in batch for key in (hold.key, hold.extra)],
        lambda batch: [hold.field for hold in batch],
    )


#: Per hold kind: its renewal script and how a batch of holds becomes its KEYS and ARGV.
_KINDS: dict[str, Callable[[], tuple[Script, KeysOf, ArgsOf]]] = {
    "hash": _hash_kind,
    "read": _read_kind,
    "frw": _fair_rw_kind,
}


class RenewalService:
    """Renews the leases of tracked holds until they are untracked or found lost."""

    def __init__(
        self,
        runner: ScriptRunner,
        *,
        lease_ms: int,
        interval: float,
        spawn: Callable[[Any], asyncio.Task[Any]],
        on_lost: Callable[[Hold, str], None],
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self._runner = runner
        self._lease_ms = lease_ms
        self._interval = interval
        self._spawn = spawn
        self._on_lost = on_lost
        self._batch_size = batch_size
        self._holds: dict[Hold, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Renewal script calls sent so far (benchmarks and tests read it).
        self.calls = 0
        #: Renewal rounds run so far: each renews every tracked hold once.
        self.rounds = 0
        #: Script calls the last finished round took.
        self.last_round_calls = 0

    def __len__(self) -> int:
        return len(self._holds)

    def track(self, hold: Hold) -> None:
        """Renew ``hold`` from the next period on."""
        assert hold.kind in _KINDS, f"no renewal for hold kind {hold.kind!r}"
        self._holds[hold] = None
        if self._task is None and not self._closed:
            self._task = self._spawn(self._run())

    def untrack(self, hold: Hold) -> None:
        """Stop renewing ``hold``."""
        self._holds.pop(hold, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self._interval
        try:
            while True:
                # Sleep to an absolute time: the renewal's own duration must not stretch
                # the period (10,000 locks take a noticeable fraction of it).
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not self._holds:
                    return
                ok = await self.renew_once()
                # After a failure, try again well before the leases run out: a full
                # period later, two failures in a row would already lose them.
                due += self._interval if ok else self._interval / 4
                due = max(due, loop.time())
        finally:
            self._task = None

    async def renew_once(self) -> bool:
        """Renew every tracked hold now, one script call per batch per kind; False on error.

        The calls of one kind go out in one round trip: sent one by one, each would wait
        for a free connection behind whatever burst of lock calls is queued, and a round
        stretched that way past the lease loses locks that are still held.
        """
        all_sent = True
        self.rounds += 1
        calls_before = self.calls
        # One script call renews holds of one kind in one shard (a cluster's slot: a script
        # touches one slot only); all calls of a kind go out together, one write per server.
        shard = self._runner.shard
        by_kind: dict[str, dict[int, list[Hold]]] = {}
        for hold in self._holds:
            by_kind.setdefault(hold.kind, {}).setdefault(shard(hold.key), []).append(hold)
        for kind, shards in by_kind.items():
            script, keys_of, args_of = _KINDS[kind]()
            batches = [
                holds[start : start + self._batch_size]
                for holds in shards.values()
                for start in range(0, len(holds), self._batch_size)
            ]
            calls: list[tuple[list[str], list[str | int]]] = [
                (keys_of(batch), [self._lease_ms, *args_of(batch)]) for batch in batches
            ]
            self.calls += len(calls)
            try:
                replies = await self._runner.run_batch(script, calls)
            except (RedisError, OSError) as exc:
                replies = [exc] * len(calls)
            for batch, reply in zip(batches, replies, strict=True):
                if isinstance(reply, BaseException):
                    log.warning(
                        "aiolock: could not renew %d lock lease(s) (%s); retrying in %.3g s",
                        len(batch),
                        reply,
                        self._interval / 4,
                    )
                    all_sent = False
                    continue
                for hold, held in zip(batch, reply, strict=True):
                    # An unlock in flight may already have deleted the key: not a loss.
                    if not int(held) and hold in self._holds and not hold.releasing:
                        self._on_lost(hold, "the watchdog found its hold gone")
        self.last_round_calls = self.calls - calls_before
        return all_sent

    async def aclose(self) -> None:
        """Stop renewing; leases still held run out on their own."""
        self._closed = True
        task = self._task
        if task is not None:
            # Not the caller's count of cancel requests, which may be left over from
            # before (a TaskGroup with a failed child on Python 3.11/3.12): a request
            # since this call began.
            mark = cancel_mark()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if cancelled_since(mark):
                    raise
