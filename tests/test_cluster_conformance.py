"""The conformance suite (``test_conformance.py``) again, every lock type on a 3+3 cluster.

The suite's tests are imported here; the fixtures below give them cluster clients instead
of single-server ones. Names are unique per test, so they spread over every primary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import aiolock

from .clusters import cluster_clients
from .test_conformance import *  # noqa: F403 - the suite, collected here once more
from .test_conformance import ClientFactory
from .topologies import ClusterHandle


@pytest.fixture(params=[0, 1], ids=["", "replica_acks"])
async def make_client(
    cluster: ClusterHandle, uid: str, request: pytest.FixtureRequest
) -> AsyncIterator[ClientFactory]:
    """Cluster clients, without and with ``replica_acks=1`` (each primary has a replica):
    all closed, then nothing of the test may remain on any primary."""
    async with cluster_clients(cluster, uid, replica_acks=request.param) as make:
        yield make


@pytest.fixture
async def client(make_client: ClientFactory) -> aiolock.Client:
    return make_client()
