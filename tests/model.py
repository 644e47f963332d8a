"""The reference model of one lock name, for the stateful tests in test_model.py.

Pure and synchronous: what the contract (API.md) says the server holds after each call, and
what each call may answer. A *holder* is a string (``"A.t0"``: client A's actor task 0,
``"B.owner:o1"``: client B's ``owner="o1"``); a *field* is a holder and a view of the lock:
``"x"`` for the reentrant and the fair lock, ``"r"``/``"w"`` for the read and write side of a
read-write lock (``"rw"``, Redisson's, and ``"frw"``, the fair one: the same rules between
holders; the fair one also keeps waiters in arrival order, which the model leaves to the
driver). The model never sees the server: test_model.py compares the two.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = (
    "BLOCKS",
    "CANCELLED",
    "FALSE",
    "LOST",
    "NOT_OWNED",
    "OK",
    "RW_KINDS",
    "TRUE",
    "UPGRADE",
    "Field",
    "Kind",
    "Model",
    "Op",
    "OpKind",
    "View",
    "linearizations",
)

# "fenced" and "spin" follow the reentrant lock's rules ("lock"); their machines check that
# the rules hold with a token taken per acquisition, and with waiters that poll. "mixed" is
# one name used through Lock, FencedLock and SpinLock handles in turn (they share Redisson's
# lock hash and channel): one reentrant lock, whichever handle a call goes through.
Kind = Literal["lock", "fair", "rw", "fenced", "spin", "frw", "mixed"]
#: The kinds with a read and a write view.
RW_KINDS: frozenset[Kind] = frozenset({"rw", "frw"})
View = Literal["x", "r", "w"]
OpKind = Literal["lock", "try0", "trywait", "unlock", "force", "extend"]
Field = tuple[str, View]

# What a call answered: its value, or the name of what it raised.
OK = "ok"  # lock() / unlock() returned
TRUE = "True"
FALSE = "False"
NOT_OWNED = "LockNotOwnedError"
LOST = "LockLostError"
UPGRADE = "LockUpgradeError"
CANCELLED = "CancelledError"
#: Not an answer: the call would wait for another holder (the driver never lets it).
BLOCKS = "blocks"

Grant = Literal["yes", "no", "upgrade"]


@dataclass(frozen=True, slots=True)
class Op:
    """One call: ``kind`` by ``holder`` on ``view`` (``force`` ignores the holder)."""

    holder: str
    view: View
    kind: OpKind

    @property
    def field(self) -> Field:
        return (self.holder, self.view)

    def __str__(self) -> str:
        return f"{self.holder}.{self.kind}({self.view})"


@dataclass(slots=True)
class Model:
    """Per field, the reentrancy count the server must hold; and the holds lost meanwhile.

    ``lost``: fields whose holds were deleted by ``force_unlock()`` while their holder held
    them. Such a holder still believes it holds the lock; its next ``unlock()`` raises
    ``LockLostError`` (API.md), after which it knows. A new acquisition replaces the lost
    hold. The client's local belief (``statistics()``) is not modelled for lost fields: the
    holder's client learns of the loss only when the watchdog or an unlock tells it.
    """

    kind: Kind
    counts: dict[Field, int] = field(default_factory=dict)
    lost: set[Field] = field(default_factory=set)
    #: Set by a driver running an acquire that may queue beside others: a fair read-write
    #: lock's try_lock() never goes ahead of a queued waiter, so any acquire may then
    #: answer False (or wait its bound out) although the holders alone would admit it.
    may_yield: bool = False

    # -- reading ---------------------------------------------------------------------------

    def clone(self) -> Model:
        return Model(self.kind, dict(self.counts), set(self.lost), self.may_yield)

    def state(self) -> tuple[frozenset[tuple[Field, int]], frozenset[Field]]:
        """A hashable summary: two models with equal states are the same."""
        held = frozenset((f, c) for f, c in self.counts.items() if c > 0)
        return held, frozenset(self.lost)

    def count(self, f: Field) -> int:
        return self.counts.get(f, 0)

    def held_fields(self) -> list[Field]:
        return sorted(f for f, c in self.counts.items() if c > 0)

    def holders(self) -> list[str]:
        """Holders with at least one hold, in a stable order."""
        return sorted({h for (h, _), c in self.counts.items() if c > 0})

    def holds_anything(self, holder: str) -> bool:
        return any(c > 0 for (h, _), c in self.counts.items() if h == holder)

    def involved(self, holder: str) -> bool:
        """Holds something, or has a lost hold it does not know about yet."""
        return self.holds_anything(holder) or any(h == holder for h, _ in self.lost)

    def mode(self) -> str | None:
        """The read-write lock's ``mode`` field (None: free); "held" for the other kinds."""
        if not self.held_fields():
            return None
        if self.kind not in RW_KINDS:
            return "held"
        if any(v == "w" for _, v in self.held_fields()):
            return "write"
        return "read"

    def grant(self, f: Field) -> Grant:
        """Whether an acquire of ``f`` succeeds now, waits, or is a refused upgrade."""
        holder, view = f
        others = any(c > 0 for (h, _), c in self.counts.items() if h != holder)
        if self.kind not in RW_KINDS:
            return "no" if others else "yes"
        if view == "r":
            # A read hold is granted unless ANOTHER holder writes (a writer may downgrade).
            writer = any(c > 0 and v == "w" and h != holder for (h, v), c in self.counts.items())
            return "no" if writer else "yes"
        if self.count((holder, "w")) > 0:
            return "yes"
        if self.count((holder, "r")) > 0:
            return "upgrade"
        return "no" if others else "yes"

    def believed_upgrade(self, f: Field) -> bool:
        """A write request by a holder whose only read holds were lost, unknown to it.

        The client detects an upgrade from its own bookkeeping (API.md: "a holder of read
        locks"), which still shows the lost read holds: refusing is then allowed too.
        """
        holder, view = f
        return (
            self.kind in RW_KINDS
            and view == "w"
            and (holder, "r") in self.lost
            and self.count((holder, "r")) == 0
            and self.count((holder, "w")) == 0
        )

    # -- transitions -----------------------------------------------------------------------

    def _acquired(self, f: Field) -> Model:
        m = self.clone()
        m.counts[f] = m.count(f) + 1
        m.lost.discard(f)
        return m

    def _unlocked(self, f: Field) -> Model:
        m = self.clone()
        m.counts[f] = m.count(f) - 1
        if not m.counts[f]:
            del m.counts[f]
        return m

    def _forgotten(self, f: Field) -> Model:
        m = self.clone()
        m.lost.discard(f)
        return m

    def _forced(self) -> Model:
        m = self.clone()
        m.lost |= set(self.held_fields())
        m.counts.clear()
        return m

    def outcomes(self, op: Op) -> list[tuple[str, Model]]:
        """Every answer the contract allows for ``op`` now, each with the model after it."""
        if op.kind == "unlock":
            return [self._unlock_outcome(op.field)]
        if op.kind == "extend":
            return [self._extend_outcome(op.field)]
        if op.kind == "force":
            return [self._force_outcome(op.view)]
        grant = self.grant(op.field)
        result: list[tuple[str, Model]] = []
        if grant == "yes":
            result.append((OK if op.kind == "lock" else TRUE, self._acquired(op.field)))
            if self.may_yield and op.kind != "lock" and not self._reentry(op.field):
                result.append((FALSE, self))
        elif grant == "no":
            result.append((BLOCKS if op.kind == "lock" else FALSE, self))
        if grant == "upgrade" or self.believed_upgrade(op.field):
            result.append((UPGRADE, self))
            if op.kind == "try0":
                # API.md: try_lock(wait=0) may return False instead.
                result.append((FALSE, self))
            if op.field in self.lost:
                # It asks for the write lock it believes it still holds, with read holds:
                # told of the loss instead is fine too (waiting on its own reads is not).
                result.append((LOST, self._forgotten(op.field)))
        return result

    def _reentry(self, f: Field) -> bool:
        """Whether an acquire of ``f`` re-enters (a fair lock never queues those)."""
        holder, view = f
        return self.count(f) > 0 or (view == "r" and self.count((holder, "w")) > 0)

    def _unlock_outcome(self, f: Field) -> tuple[str, Model]:
        if self.count(f) > 0:
            return OK, self._unlocked(f)
        if f in self.lost:
            return LOST, self._forgotten(f)
        return NOT_OWNED, self

    def _extend_outcome(self, f: Field) -> tuple[str, Model]:
        # As unlock() answers, but nothing changes: a lost hold stays believed (its
        # unlock() still raises LockLostError).
        if self.count(f) > 0:
            return OK, self
        if f in self.lost:
            return LOST, self
        return NOT_OWNED, self

    def _force_outcome(self, view: View) -> tuple[str, Model]:
        mode = self.mode()
        if self.kind == "rw":
            # Each side of Redisson's deletes the lock only when it is held in its own mode;
            # either side of the fair one deletes every hold.
            wanted = "read" if view == "r" else "write"
            hit = mode == wanted
        else:
            hit = mode is not None
        return (TRUE, self._forced()) if hit else (FALSE, self)

    def cancelled_unlock(self, f: Field) -> Model:
        """The model after an unlock() cancelled mid-way: the release still happens."""
        return self._unlock_outcome(f)[1]

    # -- the server's side -----------------------------------------------------------------

    def expected_hash(self, field_name: dict[str, str]) -> dict[str, str]:
        """The lock hash as HGETALL must show it; ``field_name`` maps holders to ids."""
        result: dict[str, str] = {}
        for (holder, view), c in self.counts.items():
            if c <= 0:
                continue
            if self.kind == "frw":
                name = f"{view}:{field_name[holder]}"
            else:
                name = field_name[holder] + (":write" if view == "w" else "")
            result[name] = str(c)
        mode = self.mode()
        if self.kind in RW_KINDS and mode is not None:
            result["mode"] = mode
        return result

    def read_counts(self) -> dict[str, int]:
        """Read holds per holder (each has one timeout key per hold)."""
        return {h: c for (h, v), c in self.counts.items() if v == "r" and c > 0}


def linearizations(model: Model, ops: Sequence[Op]) -> list[tuple[tuple[str, ...], Model]]:
    """Every (answers, final model) of ``ops`` run one after the other, in any order."""
    found: list[tuple[tuple[str, ...], Model]] = []
    for order in itertools.permutations(range(len(ops))):
        states: list[tuple[Model, list[str]]] = [(model, [""] * len(ops))]
        for i in order:
            after: list[tuple[Model, list[str]]] = []
            for m, answers in states:
                for answer, m2 in m.outcomes(ops[i]):
                    again = list(answers)
                    again[i] = answer
                    after.append((m2, again))
            states = after
        found.extend((tuple(answers), m) for m, answers in states)
    return found


def blocks_somewhere(model: Model, ops: Sequence[Op]) -> set[int]:
    """Indices of the ops that would wait in at least one order."""
    return {
        i
        for answers, _ in linearizations(model, ops)
        for i, answer in enumerate(answers)
        if answer == BLOCKS
    }


def distinct(models: Iterable[Model]) -> list[Model]:
    """The models with distinct states, in first-seen order."""
    seen: dict[object, Model] = {}
    for m in models:
        seen.setdefault(m.state(), m)
    return list(seen.values())
