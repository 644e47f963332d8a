"""The acquire engine: one acquire and one release path for every primitive.

A primitive (``primitive.Primitive``) describes itself; the engine runs its scripts and
carries every rule that makes a call correct, each path in the module named for it:

* **acquire** (``acquire.py``): attempt in the holder's turn (``ordering``),
  from the count this client believes the holder has; wait subscribed, registered before
  each attempt, bounded by the lease seen; undo in the background what a cut-off attempt
  may have taken;
* **release** (``release.py``): in the holder's turn, with a latch that makes a resend
  replay it; a cut-off release is finished in the background, so ``async with`` never
  exits holding; a hand-over to a waiter of this client (``handover.py``);
* **extend** (``extend.py``), **force_unlock, delete and queries** (``commands.py``),
  the **counting objects** (``counting.py``), **aclose()'s releases** (``closing.py``), a
  **leader's watch** (``watch.py``);
* what they share (``core.py``): a call's start and cancel mark (``cancel.py``), the record
  of a hold the server granted (``holds.py``: changed only after the server answered), the
  resend of a call cut off until it is answered.

The handles hold an ``Engine`` and call its methods; the services of the client's event
loop reach the engine as one bundle (``services.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .acquire import Acquirer, Attempts
from .closing import Closing
from .commands import Commands
from .core import Core
from .counting import Counting
from .extend import Extender
from .release import Releases
from .watch import Watch

if TYPE_CHECKING:
    from .._config import Settings
    from .._emitter import Emitter
    from .affinity import Affinity
    from .guard import Guard
    from .holders import HolderIds
    from .primitive import Primitive
    from .services import Services

__all__ = ("Engine",)


class Engine:
    """One client's acquire engine; the handles' only way to the server."""

    def __init__(
        self,
        *,
        settings: Settings,
        ids: HolderIds,
        affinity: Affinity,
        events: Emitter,
        services: Services,
    ) -> None:
        self._core = core = Core(
            settings=settings, ids=ids, affinity=affinity, events=events, services=services
        )
        self.settings = settings
        self.events = events
        releases = Releases(core)
        acquirer = Acquirer(core, Attempts(core), releases)
        counting = Counting(core)
        commands = Commands(core)
        # The handles' calls, each bound once to the path that serves it (no extra frame
        # per call).
        self.check_open = core.check_open
        self.close = core.close
        self.holder = core.holder
        self.acquire = acquirer.acquire
        self.release = releases.release
        self.release_soon = releases.release_soon
        self.hold_of = releases.hold_of
        self.extend = Extender(core).extend
        closing = Closing(core)
        self.release_ended = closing.release_ended
        self.end_held = closing.end_held
        self.watch_taken = Watch(core).watch_taken
        self.force = commands.force
        self.delete = commands.delete
        self.query = commands.query
        self.ask = commands.ask
        self.query_all = commands.query_all
        self.change = counting.change
        self.take = counting.take
        self.took_permit = counting.took_permit
        self.let_go_permit = counting.let_go_permit
        self.await_condition = counting.await_condition

    def new_identity(self, client_id: str) -> None:
        """Hand out ids under ``client_id`` from now on: a forked child's (``affinity.py``).

        Holder ids and request ids both: a child sharing its parent's (or a sibling's)
        would hold a lock as a re-entry of another process's hold, and have its acquire
        answered with another process's receipt. Called before the client's first call.
        """
        core = self._core
        core._ids.renew(client_id)
        # The request ids' prefix, cached by the core (request_id() runs per script call).
        core._request_prefix = f"{client_id}:"

    def attach(self, services: Services) -> None:
        """Use ``services`` from now on (the client moved to a new event loop)."""
        self._core.attach(services)

    @property
    def services(self) -> Services:
        """The services of the client's current event loop."""
        return self._core.services

    @property
    def guard(self) -> Guard:
        """The guarded holds' watch (``guard.py``) of the client's current event loop."""
        return self._core.guard

    @property
    def closed(self) -> bool:
        """Whether the client is closed: every new call is then refused."""
        return self._core.closed

    @property
    def started(self) -> bool:
        """Whether a call was ever made (only then is a client never closed worth a warning)."""
        return self._core.started

    @property
    def client_id(self) -> str:
        """The client's id, the first part of every holder id it makes."""
        return self._core.client_id

    def believed(self, p: Primitive, owner: str | None) -> int:
        """The calling holder's count of holds as this client believes it."""
        holder, _ = self._core.holder(owner)
        hold = self._core.services.holds.get(p.key, p.field(holder))
        return hold.count if hold else 0

    def waiting(self, key: str) -> int:
        """How many of this client's calls wait on ``key``."""
        return self._core.services.waiting.waiting(key)
