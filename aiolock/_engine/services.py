"""The services of the event loop a client runs in, as the engine uses them: ONE bundle.

The client builds them (``Client._build``) and builds them again when it moves to a new
event loop; the engine is handed the bundle each time (``Engine.attach``), never the
pieces one by one, so a service added here is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._net.restarts import RestartGrace
    from .._net.scripts import ScriptRunner
    from .._net.subscriptions import PubSub
    from .background import Background
    from .holds import HoldRegistry
    from .latches import LatchSweeper
    from .ordering import CallOrder
    from .renewal import RenewalService
    from .waiting import WaitingRoom

__all__ = ("Services",)


@dataclass(frozen=True, slots=True)
class Services:
    """What the engine uses of the client's loop-bound pieces, each in its module."""

    #: Runs the scripts and commands on the server that serves each key.
    runner: ScriptRunner
    #: What this client believes it holds.
    holds: HoldRegistry
    #: The watchdog: renews every watchdog-held lease.
    renewal: RenewalService
    #: Each holder's calls on each lock, one after the other.
    order: CallOrder
    #: Which calls wait on which channel, and who a message wakes.
    waiting: WaitingRoom
    #: The pub/sub connection(s): subscriptions by channel.
    dispatcher: PubSub
    #: The work done beside the callers' calls, and the calls aclose() waits for.
    background: Background
    #: The deferred deletion of unlock latches.
    latches: LatchSweeper
    #: Strict restarts: how long acquires on a server must wait still (None: off).
    restarts: RestartGrace | None = None
