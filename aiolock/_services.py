"""Building the services of a client that belong to one event loop, together.

Connections (commands, pub/sub, the Sentinel watch or the cluster's), the background tasks,
the renewal, the waiting room, the holders' ordering lines, the bookkeeping of holds, the
latch sweeper, the hand-over policy and the guard's timer: each is in the module named for
it, and the bundle is ``_engine.engine.LoopServices``; this module only wires them. Nothing
connects here: the first call does, in its loop. The client builds them at construction
and again when it moves to a new event loop (``Client._rebind``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.asyncio.sentinel import SentinelConnectionPool

from ._engine.background import Background, LatchSweeper
from ._engine.engine import LoopServices
from ._engine.guard import Guard
from ._engine.holds import HoldRegistry
from ._engine.ordering import CallOrder
from ._engine.renewal import RenewalService
from ._engine.waiting import HandOvers, WaitingRoom
from ._net.acked import AckedTransport
from ._net.cluster import Address, Cluster, Connector
from ._net.cluster_pubsub import ClusterPubSub
from ._net.pubsub import Dispatcher
from ._net.restarts import RestartGrace
from ._net.scripts import ScriptRunner
from ._net.sentinel import SentinelWatch
from ._net.subscriptions import PubSub
from ._net.topology import OneServer
from ._net.transport import CommandTransport

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.connection import AbstractConnection

    from ._config import ClientOptions, Settings
    from ._emitter import Emitter

__all__ = ("build_services",)


def build_services(
    options: ClientOptions,
    settings: Settings,
    events: Emitter,
    *,
    redis: Redis | RedisCluster,
    deadline: float,
    lease_ms: int,
    seeds: list[Address],
    connector: Connector | None,
    make_connection: Callable[[], AbstractConnection] | None,
    on_switch: Callable[[str], None],
    connected_to: Callable[[], list[str]],
) -> LoopServices:
    """Build a client's pieces for the running (or next) event loop.

    ``connector`` and ``seeds``: a cluster's (None: one server, whose connections
    ``make_connection`` opens). ``on_switch`` and ``connected_to``: the Sentinel watch's
    hooks into the client (a switched primary; where its connections go).
    """
    on_cluster = settings.cluster
    background = Background()
    waiting = WaitingRoom()

    def dispatcher(
        make: Callable[[], AbstractConnection], on_change: Callable[[], None] | None = None
    ) -> Dispatcher:
        return Dispatcher(
            make,
            waiting,
            subscribe_timeout=options.subscribe_timeout,
            # A quarter of the renewal period (2.5 s with the default watchdog): a silent,
            # half-open connection is dropped within half a period and every watch looks its
            # hold up on the new one, so a force it missed ends a guarded body within half a
            # renewal period (at most a whole one from the renewal itself), not 20 s.
            keepalive=min(10.0, options.watchdog_timeout / 12),
            spawn=background.serve,
            sharded=on_cluster,
            on_change=on_change,
            events=events,
        )

    sentinel: SentinelWatch | None = None
    topology: OneServer | Cluster
    pubsub: PubSub
    transport: CommandTransport | None = None
    one_dispatcher: Dispatcher | None = None
    if connector is not None:
        cluster = Cluster(
            seeds, connector, deadline=deadline, make_dispatcher=dispatcher, events=events
        )
        topology = cluster
        pubsub = ClusterPubSub(
            cluster,
            retry_attempts=options.retry_attempts,
            retry_interval=options.retry_interval,
        )
    else:
        assert make_connection is not None
        pool = getattr(redis, "connection_pool", None)
        if isinstance(pool, SentinelConnectionPool):
            sentinel = SentinelWatch(pool, on_switch, background.serve, connected_to)
            # Its connections find the primary by asking every sentinel at once.
            make_connection = sentinel.connections(make_connection)
        transport = AckedTransport(
            make_connection,
            deadline=deadline,
            on_open=None if sentinel is None else sentinel.start,
            events=events,
        )
        topology = OneServer(transport, sentinel=sentinel is not None)
        one_dispatcher = pubsub = dispatcher(make_connection)
    runner = ScriptRunner(
        topology,
        retry_attempts=options.retry_attempts,
        retry_interval=options.retry_interval,
        replica_acks=options.replica_acks,
        replica_ack_timeout=options.replica_ack_timeout,
    )
    renewal = RenewalService(
        runner,
        lease_ms=lease_ms,
        interval=options.watchdog_timeout / 3,
        retry=options.retry_interval,
        spawn=background.serve,
        # A lambda: the registry it reports to is built after this service.
        on_lost=lambda hold, why: holds.report_lost(hold, why),  # noqa: PLW0108
        events=events,
    )
    holds = HoldRegistry(renewal, watchdog_ms=lease_ms, events=events)
    # A connection that comes back (a restart without persistence lost every key) has its
    # holds settled by a renewal round at once, not at the next period.
    events.on_reconnected = renewal.reconnected
    return LoopServices(
        background=background,
        waiting=waiting,
        sentinel=sentinel,
        topology=topology,
        pubsub=pubsub,
        transport=transport,
        dispatcher=one_dispatcher,
        runner=runner,
        handovers=HandOvers(),
        # The guarded holds' timer is the loop's own.
        guard=Guard(settings.lease_ms / 1000),
        renewal=renewal,
        holds=holds,
        latches=LatchSweeper(runner, background.serve),
        # Each holder's calls on each lock, one after the other (see _engine/ordering.py).
        order=CallOrder(),
        restarts=(
            None if options.restart_grace is None else RestartGrace(runner, options.restart_grace)
        ),
    )
