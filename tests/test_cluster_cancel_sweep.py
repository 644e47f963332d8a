"""The cancellation sweep (``test_cancel_sweep.py``) on a 3+3 cluster.

Each call is cancelled at every loop iteration and Redis is checked against the client's
belief after each case, as on one server: here the calls go through the slot map, the
per-primary connections and sharded pub/sub. The default run sweeps every call and
scenario of every lock type for a task holder; ``--full-sweep=cluster`` adds ``owner=``
holders and the early races.
"""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from . import clusters
from .conftest import ClientFactory, full_sweep
from .sweep import Kind, Scenario, Spec, Sweep, all_specs, k_schedule
from .test_cancel_sweep import FULL_ROUNDS, _record

# The cluster's fixtures, in place of the single server's (tests/clusters.py).
make_client = clusters.make_client
raw = clusters.raw


def _quick(spec: Spec) -> bool:
    return spec.owner is None and spec.scenario not in {
        Scenario.RACED_EARLY,
        Scenario.RACED_SUBSCRIBING,
    }


# Past the quick subset (every kind), the cluster sweeps in full the kinds whose waking and
# queueing differ: the fenced and spin locks run the lock's scripts, the fair read-write
# lock is swept in full on one server, and what the cluster adds (routing, sharded pub/sub)
# is the same for every kind. So the full run fits CI's hour.
_FULL_ON_CLUSTER = frozenset({Kind.LOCK, Kind.FAIR, Kind.READ, Kind.WRITE})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spec" in metafunc.fixturenames:
        full = full_sweep(metafunc.config, "cluster")
        specs = [
            spec for spec in all_specs() if _quick(spec) or (full and spec.kind in _FULL_ON_CLUSTER)
        ]
        metafunc.parametrize("spec", specs, ids=[spec.id for spec in specs])


async def test_cancel_sweep_on_cluster(
    spec: Spec,
    make_client: ClientFactory,
    raw: RedisCluster,
    name: str,
    request: pytest.FixtureRequest,
) -> None:
    """Cancelled at any loop iteration, the call raises CancelledError and leaves the
    slot's primary holding exactly what the client believes."""
    full = full_sweep(request.config, "cluster")
    sweep = Sweep(spec, make_client(), make_client(), raw, name)
    result = await sweep.run(k_schedule(full=full), rounds=FULL_ROUNDS if full else 1)
    _record(result, request.node.user_properties)
    if result.violations:
        raise AssertionError(result.report()) from result.crash
